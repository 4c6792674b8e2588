"""`ElementwiseOps`: the handler of elementwise arith/math ops (copied as they are, operands
broadcast to a common shape), with the index arithmetic that must run in 64 bits, the 64-bit
round trips between `index` and floats taken in 32 bits, the hardware's tanh where a value stays
continuous, and math ops Triton does not lower everywhere expanded (`MathExpansions`)."""
from __future__ import annotations

import math
import re
from dataclasses import replace

from ..index_bounds import I32
from .expansions import EXPANSIONS, MathExpansions
from .values import Value, bit_width, constant_value, element_type, fail, is_float, is_index, logical_shape

# Ops copied as they are (operands broadcast to a common shape); everything else has a handler.
ELEMENTWISE = re.compile(r"(arith|math)\.\w+")
_CASTS = ("arith.index_cast", "arith.index_castui")


class ElementwiseOps(MathExpansions):
    """Needs `get`, `full`, `generic_shape`, `wide_bounds` and `fast_tanh` from the kernel."""

    def elementwise(self, op) -> None:
        name = op.name
        operands = [self._elementwise_operand(v, op) for v in op.operands]
        if len(op.results) != 1:
            raise fail(op, "must have one result")
        rtype = op.results[0].type
        elt = element_type(rtype)
        wide = self._wide_index(op, operands)
        if wide:
            operands = [self.cast_int(x, "i64") if is_index(v.type) else x for x, v in zip(operands, op.operands)]
            elt = "i64" if is_index(rtype) else elt
        expand = EXPANSIONS.get(name)
        narrowed = self._narrowed(op, elt)
        # With fast-tanh, tanh and the logistic take the hardware's approximation where their value
        # stays continuous: a value that reaches a comparison (a mask's) keeps the exact one.
        logistic = _logistic_argument(op) if self.fast_tanh and name == "arith.divf" else None
        fast = self.fast_tanh and elt == "f32" and (name == "math.tanh" or logistic is not None) \
            and not _reaches_decision(op.results[0])
        if narrowed is not None:
            out = narrowed
        elif fast and name == "math.tanh":
            out = self.approximate_tanh(operands[0])
        elif fast:
            # 1 / (1 + e^-x) (the sigmoid normalizer's, torch.sigmoid's) as 0.5 + 0.5 tanh(x / 2):
            # one approximate tanh where the exponential and the division took two transcendental
            # instructions and their range checks (the exp and negation already emitted are dead).
            half = self.const(0.5, elt)
            x = self._elementwise_operand(logistic, op)
            out = self.op("arith.addf", half,
                          self.op("arith.mulf", half, self.approximate_tanh(self.op("arith.mulf", half, x))))
        elif expand is not None:
            out = expand(self, *operands)
        elif name in _CASTS:
            out = self.cast_int(operands[0], elt, signed=name == "arith.index_cast")
        elif name == "arith.divf" and elt == "f32" and _power_of_two(constant_value(op.operands[1])):
            # Exact: 1/c is representable, so x * (1/c) rounds the same quotient once.
            out = self.op("arith.mulf", operands[0], self.const(repr(1.0 / constant_value(op.operands[1])), elt))
        else:
            attrs = ", ".join(f"{k} = {op.attributes[k]}" for k in op.attributes)
            out = self.op(name, *operands, elt=elt, attrs=attrs)
        if wide and out.elt == "i64" and self.wide_bounds.within(op.results[0], *I32):
            out = self.cast_int(out, "i32")
        logical = logical_shape(rtype) if hasattr(rtype, "shape") else None
        self.values[op.results[0]] = replace(out, logical=logical)

    def _wide_index(self, op, operands: list[Value]) -> bool:
        """Whether an op on `index` values runs in 64 bits: an operand is 64-bit already, or its
        exact result can leave i32 (`index` is i32 here, which the reference's int64 never wraps).
        A result whose exact bounds are unknown stays 32-bit, as does every index the IR's bounds
        keep inside i32, so only the ops that need it pay for i64. Only the ops of a generic's body
        (the mods' arithmetic) widen: the kernel's own lengths and offsets feed slices, loops and
        loads, which take 32-bit indices, and a generic's index result is narrowed (LinalgOps)."""
        if self.generic_shape is None:
            return False
        if not any(is_index(v.type) for v in op.operands) and not is_index(op.results[0].type):
            return False
        if any(x.elt == "i64" and is_index(v.type) for x, v in zip(operands, op.operands)):
            return True
        if not is_index(op.results[0].type):
            return False
        if self.wide_bounds.within(op.results[0], *I32):
            return False
        if op.name in _CASTS and bit_width(element_type(op.operands[0].type)) > 32:
            # An i64 read into `index` (a closure tensor's int64 ids) keeps its 64 bits unless it
            # provably fits: truncated, ids 2^32 apart would compare equal. A float's round trip
            # through i64 (fptosi) stays the 32-bit conversion _narrowed takes.
            source = _defining(op.operands[0])
            return source is None or source.name != "arith.fptosi"
        return self.wide_bounds.leaves(op.results[0], *I32)

    def _elementwise_operand(self, v, op) -> Value:
        x = self.get(v, op)
        if not isinstance(x, Value):
            raise fail(op, "operates on a tensor the Triton lowering cannot express elementwise")
        return self.full(x) if x.logical is not None and self.generic_shape is None else x

    def _narrowed(self, op, elt: str) -> Value | None:
        """The 64-bit round trips the frontend writes between `index` and floats (index -> i64 ->
        f32, f32 -> i64 -> index) taken in 32 bits, where `index` is i32: the float of an i64
        widened from an i32 is the float of the i32, and a float outside i32 converts saturated
        rather than wrapped (the clamp into a closure tensor that follows keeps its meaning).
        Conversions from and to i64 run at a quarter of the i32 rate on NVIDIA GPUs."""
        source = _defining(op.operands[0]) if len(op.operands) else None
        if source is None or source.name not in ("arith.index_cast", "arith.extsi"):
            if op.name == "arith.index_cast" and elt == "i32" and source is not None \
                    and source.name == "arith.fptosi":
                return self.op("arith.fptosi", self._elementwise_operand(source.operands[0], op), elt="i32")
            return None
        if op.name != "arith.sitofp":
            return None
        narrow = self.get(source.operands[0], op)
        if not isinstance(narrow, Value) or narrow.elt != "i32":
            return None
        return self.op("arith.sitofp", self._elementwise_operand(source.operands[0], op), elt=elt)


def _defining(value):
    from mlir import ir

    return None if isinstance(value.owner, ir.Block) else value.owner


# Ops that turn a float into a decision or an integer: an approximation there could flip it.
DECISIONS = {"arith.cmpf", "arith.fptosi", "arith.fptoui", "math.floor", "math.ceil", "math.round",
              "math.roundeven", "math.trunc"}


def _reaches_decision(value) -> bool:
    """Whether `value` flows, through float ops, into a comparison or a float-to-integer op."""
    seen, todo = set(), [value]
    while todo:
        for use in todo.pop().uses:
            if use.owner.name in DECISIONS:
                return True
            for result in use.owner.results:
                if is_float(element_type(result.type)) and result not in seen:
                    seen.add(result)
                    todo.append(result)
    return False


def _logistic_argument(op):
    """x where `op` (an arith.divf) is 1 / (1 + exp(-x)), else None."""
    if constant_value(op.operands[0]) != 1.0:
        return None
    total = _defining(op.operands[1])
    if total is None or total.name != "arith.addf":
        return None
    for one, other in (tuple(total.operands), tuple(total.operands)[::-1]):
        exp = _defining(other)
        if constant_value(one) == 1.0 and exp is not None and exp.name == "math.exp":
            neg = _defining(exp.operands[0])
            if neg is not None and neg.name == "arith.negf":
                return neg.operands[0]
    return None


def _power_of_two(c) -> bool:
    """Whether c is a power of two whose reciprocal is a normal f32."""
    if not isinstance(c, float) or c == 0.0 or not math.isfinite(c):
        return False
    mantissa, exponent = math.frexp(abs(c))
    return mantissa == 0.5 and -125 < exponent < 126
