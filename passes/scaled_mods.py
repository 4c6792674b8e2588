"""Constant factors folded into the score's scale where a score_mod (or its gradient) is inlined.

The kernels compute x = score_mod(s * scale) per score, and the log2-domain softmax then
exp2(x log2(e) - m). Multiplying the mod's result by log2(e) costs one multiply per score; for
the common mods it can ride on work the mod does anyway. `rewrite(..., factor)` rebuilds
`factor * value` top-down through additions, subtractions, negations, selects, divisions and
products, until it reaches

* the score itself: the raw product times scale * factor, one multiply as without a mod;
* a term that reads no score (a bias): the factor goes to its least varying operand, a constant
  (folded here) or a value the tile does not vary (ALiBi's slope[h], computed once per program);
* anything else: one multiply, as before.

It does so only where every term the factor reaches takes it for free (the score, a constant, a
value the tile does not vary); otherwise the mod's value is multiplied once, as before (a bias
gathered per score from a table would take a multiply of its own).

Products and quotients of the score by constants inside the mod are first read from the unscaled
score with the constant in its scale, and other quotients of scores or gradients by constants
become products by the reciprocal. So ALiBi's s * scale + slope[h] * (j - i) becomes
s * (scale log2 e) + (slope[h] log2 e) * (j - i), and a soft cap's tanh(s * scale / c) * c
becomes tanh(s * (scale / c)) * (c log2 e): a multiply where there were a multiply and a divide.
The results differ from the original order only by the rounding of the reassociated multiplies
(the kernels already fold the scale into log2(e) where no mod comes between); index arithmetic
is left as it is. The rewritten ops are built at the insertion point; the ones they replace are
erased when nothing reads them.
"""
from __future__ import annotations

from .l1_builders import f32


class _Distributor:
    def __init__(self, score, raw_times, body_owner):
        self.score = score
        self.raw_times = raw_times
        self.body_owner = body_owner
        self.reads_score: dict = {}
        self.varies_memo: dict = {}

    def _op(self, value):
        """The defining op of `value` inside the body being built, else None (a block argument,
        or a value from outside the body: the same for every element of the tile)."""
        from mlir import ir

        if isinstance(value.owner, ir.Block):
            return None
        op = value.owner.operation
        return op if op.parent == self.body_owner else None

    def _depends(self, value, memo: dict, leaf) -> bool:
        if value in memo:
            return memo[value]
        op = self._op(value)
        found = leaf(value, op) or (op is not None and any(self._depends(v, memo, leaf) for v in op.operands))
        memo[value] = found
        return found

    def reads_score_of(self, value) -> bool:
        return self._depends(value, self.reads_score, lambda v, op: v == self.score)

    def reads_any(self, value, sources: list, memo: dict) -> bool:
        """Whether `value` is computed from one of `sources`."""
        return self._depends(value, memo, lambda v, op: any(v == s for s in sources))

    def varies(self, value) -> bool:
        """Whether `value` differs between the tile's elements: it reads a block argument of the
        body or a linalg.index."""
        from mlir import ir

        def leaf(v, op):
            if op is None:
                return isinstance(v.owner, ir.Block) and v.owner.owner == self.body_owner
            return op.name == "linalg.index"

        return self._depends(value, self.varies_memo, leaf)

    def free(self, value) -> bool:
        """Whether the factor can ride on work `value` does anyway: every term it distributes
        to is the score (its scale), a constant or a value the tile does not vary. A term that
        varies per score (a bias read from a table) would take the multiply itself, and in the
        H200 measurements that order ran 4% slower than one multiply of the sum."""
        if value == self.score:
            return True
        if not self.varies(value):
            return True
        op = self._op(value)
        if op is None:  # a block argument of the body
            return False
        name, operands = op.name, list(op.operands)
        if name in ("arith.addf", "arith.subf"):
            return self.free(operands[0]) and self.free(operands[1])
        if name == "arith.select":
            return self.free(operands[1]) and self.free(operands[2])
        if name in ("arith.negf", "arith.divf"):
            return self.free(operands[0])
        if name == "arith.mulf":
            return self.free(operands[0]) or self.free(operands[1])
        return False

    def times(self, value, factor: float):
        if value == self.score:
            return self.raw_times(factor)
        if not self.reads_score_of(value):
            return self.push(value, factor)
        op = self._op(value)
        if op is None:
            return self.product(value, factor)
        with op.location:  # the replacement keeps the user's line of what it replaces
            return self._times(op, value, factor)

    def _times(self, op, value, factor: float):
        from mlir.dialects import arith

        name = op.name
        operands = list(op.operands)
        if name in ("arith.addf", "arith.subf"):
            build = arith.addf if name == "arith.addf" else arith.subf
            return build(self.times(operands[0], factor), self.times(operands[1], factor))
        if name == "arith.negf":
            return arith.negf(self.times(operands[0], factor))
        if name == "arith.select":
            return arith.select(operands[0], self.times(operands[1], factor), self.times(operands[2], factor))
        if name == "arith.mulf":
            a, b = operands
            if not self.reads_score_of(b):
                return arith.mulf(a, self.push(b, factor))
            if not self.reads_score_of(a):
                return arith.mulf(self.push(a, factor), b)
            return arith.mulf(self.times(a, factor), b)
        if name == "arith.divf":
            return arith.divf(self.times(operands[0], factor), operands[1])
        return self.product(value, factor)

    @staticmethod
    def product(value, factor: float):
        from mlir.dialects import arith

        return arith.mulf(value, f32(factor))

    def push(self, value, factor: float):
        """`factor * value` for a value that reads no score, the multiply on its least varying
        operand."""
        op = self._op(value)
        if op is None:
            return self.product(value, factor)
        with op.location:
            return self._push(op, value, factor)

    def _push(self, op, value, factor: float):
        from mlir.dialects import arith

        constant = _float_constant(value)
        if constant is not None:
            return f32(constant * factor)
        if self.varies(value):
            if op.name == "arith.mulf":
                a, b = op.operands
                if not self.varies(b):
                    return arith.mulf(a, self.push(b, factor))
                if not self.varies(a):
                    return arith.mulf(self.push(a, factor), b)
            if op.name == "arith.divf" and not self.varies(op.operands[0]):
                return arith.divf(self.push(op.operands[0], factor), op.operands[1])
            if op.name == "arith.negf":
                return arith.negf(self.push(op.operands[0], factor))
        return arith.mulf(value, f32(factor))


def _float_constant(value):
    from mlir import ir

    owner = value.owner
    if isinstance(owner, ir.Block) or owner.operation.name != "arith.constant":
        return None
    attr = owner.operation.attributes["value"]
    return ir.FloatAttr(attr).value if isinstance(attr, ir.FloatAttr) else None


def _absorb_constant_factors(distributor: _Distributor, inlined: list, data: list) -> dict:
    """Each product or quotient of the score by a constant in the inlined mod, read from the
    unscaled score with the constant folded into its scale (s / c: one multiply by scale / c
    instead of a multiply and a divide per score); any other quotient of a value computed from
    `data` (the score, an incoming gradient) by a constant, a product by its reciprocal (a
    gradient's chain rule through s / c divides by c: a divide costs a GPU several
    instructions, and x (1 / c) is within an ulp of x / c). Quotients of index arithmetic keep
    their division: T5's bucket truncates (i - j) / c, exactly."""
    from mlir import ir
    from mlir.dialects import arith

    score, raw_times = distributor.score, distributor.raw_times
    replaced, memo = {}, {}
    for op in inlined:
        if op.name not in ("arith.mulf", "arith.divf"):
            continue
        a, b = op.operands
        k, replacement = None, None
        if a == score and _float_constant(b):
            k = _float_constant(b) if op.name == "arith.mulf" else 1.0 / _float_constant(b)
        elif op.name == "arith.mulf" and b == score and _float_constant(a):
            k = _float_constant(a)
        with ir.InsertionPoint(op), op.location:
            if k is not None:
                replacement = raw_times(k)
            elif op.name == "arith.divf" and _float_constant(b) and distributor.reads_any(a, data, memo):
                replacement = arith.mulf(a, f32(1.0 / _float_constant(b)))
        if replacement is not None:
            op.result.replace_all_uses_with(replacement)
            replaced[op.result] = replacement
    return replaced


def rewrite(value, score, raw_times, inlined: list, factor: float | None = None, data: list | None = None):
    """The inlined mod's `value` with its products and quotients of the score by constants
    folded into the score's scale, and with `factor`, times the factor distributed as the
    module docstring says; `score` is the mod's score argument as inlined, `raw_times(k)` builds
    the unscaled score times scale * k, `inlined` are the ops the mod's inlining created (those
    left unread afterwards are erased), `data` the mod's other float arguments (an incoming
    gradient). Call with the insertion point inside the linalg.generic body that holds them,
    f32 values."""
    from mlir import ir

    distributor = _Distributor(score, raw_times, ir.InsertionPoint.current.block.owner)
    value = _absorb_constant_factors(distributor, inlined, [score] + list(data or [])).get(value, value)
    result = value
    if factor is not None:
        result = distributor.times(value, factor) if distributor.free(value) else distributor.product(value, factor)
    for op in reversed(inlined):
        # The result is read by what the caller builds next: it is unread only so far.
        if result not in list(op.results) and all(not list(r.uses) for r in op.results):
            op.erase()
    return result
