"""Reverse-mode derivatives of mod regions: the chain rule over the scalar ops a traced mod is
made of, built with the MLIR Python builders.

`RegionDerivative` copies a region's ops into a new block (the forward values the derivative
needs) and walks them backwards from the yielded value, writing the gradient of each op's float
operands at that op's location, so a derivative op points at the user's source line of the
operation it differentiates. Integer values (index arithmetic, comparisons, casts to integers)
carry no gradient. A read of a float closure tensor (`tensor.extract`) ends the walk there; it is
reported as a `ClosureRead`, the gradient with respect to the element read. Ties of max/min and
the kinks of abs, floor, ceil and round take the subgradients torch's autograd takes.
"""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass

from .l1_ops import fail

_FLOATS = ("f16", "bf16", "f32", "f64")


def is_float(value) -> bool:
    return str(value.type) in _FLOATS


def is_float_element(tensor_type) -> bool:
    return str(tensor_type.element_type) in _FLOATS


@dataclass
class ClosureRead:
    closure: object  # the tensor read from, as the target block sees it
    indices: list
    grad: object  # f32: the gradient with respect to the element read


class _Builder:
    """Constants and ops at the end of one block, each at the location in effect."""

    def __init__(self, block):
        self.block = block
        self._constants: dict[float, object] = {}

    def const(self, value: float):
        from mlir import ir
        from mlir.dialects import arith

        # One constant per value per block: built once at the end, it dominates every later use.
        if value not in self._constants:
            with ir.InsertionPoint(self.block):
                self._constants[value] = arith.constant(ir.F32Type.get(), value)
        return self._constants[value]

    def __call__(self, build, *args, **kwargs):
        from mlir import ir

        with ir.InsertionPoint(self.block):
            return build(*args, **kwargs)


def _pred(name: str):
    from mlir.dialects import arith

    return getattr(arith.CmpFPredicate, name)


def _where(b: _Builder, condition, if_true, if_false):
    from mlir.dialects import arith

    return b(arith.select, condition, if_true, if_false)


def _extremum(first_wins: str):
    """max (first_wins "OGT") or min ("OLT"): the gradient goes to the winner, split at a tie."""

    def rule(b, op, g, a, c, r):
        from mlir.dialects import arith

        half = b(arith.mulf, g, b.const(0.5))
        tie = b(arith.cmpf, _pred("OEQ"), a, c)
        zero = b.const(0.0)
        grad_a = _where(b, b(arith.cmpf, _pred(first_wins), a, c), g, _where(b, tie, half, zero))
        grad_c = _where(b, b(arith.cmpf, _pred(first_wins), c, a), g, _where(b, tie, half, zero))
        return [(0, grad_a), (1, grad_c)]

    return rule


def _pow(b, op, g, a, c, r):
    """torch's pow backward: no gradient to the base where the exponent is 0, none to the
    exponent where the base is 0 and the exponent non-negative."""
    from mlir.dialects import arith
    from mlir.dialects import math as math_d

    zero = b.const(0.0)
    base = b(arith.mulf, g, b(arith.mulf, c, b(math_d.powf, a, b(arith.subf, c, b.const(1.0)))))
    base = _where(b, b(arith.cmpf, _pred("OEQ"), c, zero), zero, base)
    exponent = b(arith.mulf, b(arith.mulf, g, r), b(math_d.log, a))
    flat = b(arith.andi, b(arith.cmpf, _pred("OEQ"), a, zero), b(arith.cmpf, _pred("OGE"), c, zero))
    return [(0, base), (1, _where(b, flat, zero, exponent))]


def _binary_rules():
    from mlir.dialects import arith

    def div(b, op, g, a, c, r):
        over = b(arith.divf, g, c)
        return [(0, over), (1, b(arith.negf, b(arith.mulf, over, r)))]

    def rem(b, op, g, a, c, r):
        # r = a - trunc(a / c) * c, so d r / d c = -trunc(a / c) = -(a - r) / c.
        quotient = b(arith.divf, b(arith.subf, a, r), c)
        return [(0, g), (1, b(arith.negf, b(arith.mulf, g, quotient)))]

    return {
        "arith.addf": lambda b, op, g, a, c, r: [(0, g), (1, g)],
        "arith.subf": lambda b, op, g, a, c, r: [(0, g), (1, b(arith.negf, g))],
        "arith.mulf": lambda b, op, g, a, c, r: [(0, b(arith.mulf, g, c)), (1, b(arith.mulf, g, a))],
        "arith.divf": div,
        "arith.remf": rem,
        "arith.maximumf": _extremum("OGT"),
        "arith.minimumf": _extremum("OLT"),
        "math.powf": _pow,
    }


def _unary_rules():
    from mlir.dialects import arith
    from mlir.dialects import math as math_d

    def mul(b, *factors):
        out = factors[0]
        for f in factors[1:]:
            out = b(arith.mulf, out, f)
        return out

    def absf(b, g, a, r):
        zero = b.const(0.0)
        negative = _where(b, b(arith.cmpf, _pred("OLT"), a, zero), b(arith.negf, g), zero)
        return _where(b, b(arith.cmpf, _pred("OGT"), a, zero), g, negative)

    def erf(b, g, a, r):
        gauss = b(math_d.exp, b(arith.negf, b(arith.mulf, a, a)))
        return mul(b, g, b.const(2.0 / math.sqrt(math.pi)), gauss)

    table = {
        "arith.negf": lambda b, g, a, r: b(arith.negf, g),
        "arith.extf": lambda b, g, a, r: g,
        "arith.truncf": lambda b, g, a, r: g,
        "math.exp": lambda b, g, a, r: b(arith.mulf, g, r),
        "math.exp2": lambda b, g, a, r: mul(b, g, r, b.const(math.log(2.0))),
        "math.expm1": lambda b, g, a, r: b(arith.mulf, g, b(arith.addf, r, b.const(1.0))),
        "math.log": lambda b, g, a, r: b(arith.divf, g, a),
        "math.log2": lambda b, g, a, r: b(arith.divf, g, b(arith.mulf, a, b.const(math.log(2.0)))),
        "math.log1p": lambda b, g, a, r: b(arith.divf, g, b(arith.addf, a, b.const(1.0))),
        "math.sqrt": lambda b, g, a, r: b(arith.divf, g, b(arith.mulf, r, b.const(2.0))),
        "math.rsqrt": lambda b, g, a, r: mul(b, g, b.const(-0.5), r, r, r),
        "math.tanh": lambda b, g, a, r: b(arith.mulf, g, b(arith.subf, b.const(1.0), b(arith.mulf, r, r))),
        "math.sin": lambda b, g, a, r: b(arith.mulf, g, b(math_d.cos, a)),
        "math.cos": lambda b, g, a, r: b(arith.negf, b(arith.mulf, g, b(math_d.sin, a))),
        "math.absf": absf,
        "math.erf": erf,
    }
    rules = {name: (lambda fn: lambda b, op, g, a, r: [(0, fn(b, g, a, r))])(fn) for name, fn in table.items()}
    # Piecewise constant: zero gradient almost everywhere, as torch defines it everywhere.
    rules.update({name: lambda b, op, g, a, r: [] for name in ("math.floor", "math.ceil", "math.roundeven")})
    # Constants and floats made from integers end the chain.
    rules.update({name: lambda b, op, g, a, r: [] for name in ("arith.sitofp", "arith.uitofp")})
    return rules


def _select(b, op, g):
    zero = b.const(0.0)
    condition = op.operands[0]
    return [(1, _where(b, condition, g, zero)), (2, _where(b, condition, zero, g))]


_RULES = None


def rules() -> dict:
    """Op name -> rule(builder, op, g) giving [(operand index, gradient contribution)]."""
    global _RULES
    if _RULES is None:
        _RULES = {}
        for name, rule in _binary_rules().items():
            _RULES[name] = (lambda rule: lambda b, op, g: rule(b, op, g, op.operands[0], op.operands[1],
                                                                 op.results[0]))(rule)
        for name, rule in _unary_rules().items():
            _RULES[name] = (lambda rule: lambda b, op, g: rule(b, op, g, op.operands[0], op.results[0]))(rule)
        _RULES["arith.select"] = _select
        _RULES["arith.constant"] = lambda b, op, g: []
    return _RULES


class RegionDerivative:
    """A copy of `source` (a one-block mod region ending in gpu.yield) at the end of `block`,
    and the chain rule back through it.

    `args` are `block`'s values standing for the source block's arguments; `outer` maps each
    value the region reads from outside (closure tensors, constants) to the value `block` sees
    in its place. `where` names the region in diagnostics.
    """

    def __init__(self, source, block, args: list, outer: dict, where: str):
        self.where = where
        self.builder = _Builder(block)
        source_block = source.blocks[0]
        values = dict(zip(source_block.arguments, args))
        self.copies: list[tuple[object, object]] = []
        ops = list(source_block.operations)
        for op in ops[:-1]:
            op = op.operation
            copy = self.builder(op.clone).operation
            for i, value in enumerate(op.operands):
                copy.operands[i] = self._lookup(values, outer, value, op)
            values.update(zip(op.results, copy.results))
            self.copies.append((op, copy))
        terminator = ops[-1].operation
        self.yielded = [self._lookup(values, outer, v, terminator) for v in terminator.operands]
        self.args = list(args)

    def _lookup(self, values: dict, outer: dict, value, op):
        if value in values:
            return values[value]
        if value in outer:
            return outer[value]
        raise fail(op, f"reads a value defined outside the {self.where} region that is neither a "
                       "function argument nor a constant; it cannot be differentiated")

    def gradients(self, seed, wrt: list[int]) -> tuple[list, list[ClosureRead]]:
        """With `seed` (f32) the gradient of the first yielded value: the gradient of each source
        block argument listed in `wrt` (a zero constant where none flows) and every float closure
        read the gradient reaches, in reverse program order.

        Every rule is linear in the gradient it is given, so an adjoint is kept as a value times a
        constant factor: a product with or a quotient by a constant, or a negation, changes the
        factor and writes no op, and the factor is multiplied in once where adjoints of different
        factors meet and at the end. A soft-cap c * tanh(s / c) then costs no multiply by c and
        none by 1 / c per score."""
        # value -> (gradient, constant factor, location of the op that last changed the factor)
        adjoint: dict = {}
        if is_float(self.yielded[0]):
            adjoint[self.yielded[0]] = (seed, 1.0, None)
        reads = []
        b = self.builder
        for source_op, op in reversed(self.copies):
            if len(op.results) != 1 or op.results[0] not in adjoint:
                continue
            g, factor, where = adjoint[op.results[0]]
            with op.location:
                if op.name == "tensor.extract":
                    reads.append(ClosureRead(op.operands[0], list(op.operands)[1:], self._scaled(g, factor, where)))
                    continue
                for index, contribution, scale in self._contributions(source_op, op, g):
                    operand = op.operands[index]
                    if not is_float(operand):
                        continue
                    entry = (contribution, factor * scale, op.location if scale != 1.0 else where)
                    if operand in adjoint:
                        entry = self._sum(adjoint[operand], entry)
                    adjoint[operand] = entry
        grads = [self._scaled(*adjoint[self.args[i]]) if self.args[i] in adjoint else b.const(0.0) for i in wrt]
        return grads, reads

    def _sum(self, earlier: tuple, later: tuple) -> tuple:
        """The adjoint entry of two contributions to one value."""
        from mlir.dialects import arith

        if earlier[1] == later[1]:
            return self.builder(arith.addf, earlier[0], later[0]), earlier[1], earlier[2]
        return self.builder(arith.addf, self._scaled(*earlier), self._scaled(*later)), 1.0, None

    def _contributions(self, source_op, op, g) -> list:
        """[(operand index, contribution, constant factor)] of `op`'s rule given the gradient `g`;
        a product with a constant, a quotient by one and a negation only change the factor."""
        constant = [_float_constant(v) for v in op.operands]
        if op.name == "arith.mulf" and (constant[0] is not None or constant[1] is not None):
            index = 1 if constant[0] is not None else 0
            return [(index, g, constant[1 - index])]
        if op.name == "arith.divf" and constant[1] not in (None, 0.0):
            return [(0, g, 1.0 / constant[1])]
        if op.name == "arith.negf":
            return [(0, g, -1.0)]
        return [(index, contribution, 1.0) for index, contribution in self._rule(source_op, op)(self.builder, op, g)]

    def _scaled(self, value, factor: float, where=None):
        """`value` times the f32 constant `factor` at `where` (the location in effect if None): a
        factor that rounds to 1 in f32 (30 * f32(1 / 30)) is none."""
        from mlir.dialects import arith

        factor = struct.unpack("f", struct.pack("f", factor))[0]
        if factor == 1.0:
            return value
        if where is None:
            return self.builder(arith.mulf, value, self.builder.const(factor))
        with where:
            return self.builder(arith.mulf, value, self.builder.const(factor))

    def _rule(self, source_op, op):
        rule = rules().get(op.name)
        if rule is None:
            raise fail(source_op, f"has no derivative rule (in the {self.where} region)")
        if op.name not in ("arith.extf", "arith.truncf") and str(op.results[0].type) != "f32":
            raise fail(source_op, f"is {op.results[0].type} arithmetic; derivatives are built for f32 "
                                  f"values only (in the {self.where} region)")
        return rule


def _float_constant(value) -> float | None:
    """The value of an f32 `arith.constant`, or None."""
    from mlir import ir

    owner = value.owner
    if getattr(owner, "name", None) != "arith.constant" or str(value.type) != "f32":
        return None
    return ir.FloatAttr(owner.attributes["value"]).value


def prune(block) -> None:
    """Erase the copied forward ops nothing uses any more (every op a mod region holds is pure)."""
    for op in reversed(list(block.operations)[:-1]):
        if all(not list(r.uses) for r in op.operation.results):
            op.operation.erase()


def copy_region(source, target, outer: dict, where: str) -> None:
    """Fill the empty region `target` with a copy of the mod region `source`."""
    from mlir import ir
    from mlir.dialects import gpu

    source_block = source.blocks[0]
    block = target.blocks.append(*[a.type for a in source_block.arguments],
                                 arg_locs=[a.location for a in source_block.arguments])
    copy = RegionDerivative(source, block, list(block.arguments), outer, where)
    terminator = list(source_block.operations)[-1].operation
    with ir.InsertionPoint(block), terminator.location:
        gpu.yield_(copy.yielded)
