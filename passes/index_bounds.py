"""Bounds of integer values in L1 kernels: the interval each index can take, from constants, the
grid (`attn.grid`), loop ranges, `linalg.index` over a generic's static domain and the arith ops
between them.

Upstream's integer range analysis knows neither `linalg.index` nor `attn.program_id`, and
`int-range-optimizations` keeps a min/max clamp whose operand it proves inside the clamp; both
matter here, where every closure-tensor read is clamped into its tensor (the frontend's rule) and
most such indices (`table[h, q_idx - kv_idx + Lk - 1]`) never leave it. `attn-fold-index-clamps`
drops the clamps this proves redundant and the Triton lowering drops a gather's bounds mask.

A bound is a closed interval (lo, hi) of Python ints, with -inf/inf for an open side. Triton's
lowering takes `index` as i32, so by default (`bits=32`) an interval that leaves the i32 range is
unknown: the arithmetic could wrap. With `bits=64` the bounds are those of the exact values up to
i64's range, which is what that lowering asks to find the ops it must compute in 64 bits (a
product of positions past L = 46341; a large constant factor): there an i64 read into `index`
keeps its value.
"""
from __future__ import annotations

import math

from ..core import abi

UNKNOWN = (-math.inf, math.inf)
I32 = (-(2 ** 31), 2 ** 31 - 1)


def signed_range(bits: int) -> tuple[int, int]:
    return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1


def _fit(ib, lo, hi) -> tuple:
    """An interval from min, max and select, which cannot wrap: an open side stays open."""
    if lo > hi:
        return UNKNOWN
    low, high = ib.range
    return lo if lo >= low else -math.inf, hi if hi <= high else math.inf


def _exact(ib, *points) -> tuple:
    """The hull of an arithmetic op's results at its operands' bounds, which holds only where no
    operand is open (a value near an open side could wrap) and the hull stays inside the range."""
    if any(isinstance(p, float) and not math.isfinite(p) for p in points):
        return UNKNOWN
    lo, hi = min(points), max(points)
    return (lo, hi) if ib.range[0] <= lo and hi <= ib.range[1] else UNKNOWN


class IndexBounds:
    """Memoized bounds of the values of one function (`bounds(value)`); values of other types or
    of ops it does not model are UNKNOWN. `bits`: the width indices are computed in (32, the
    Triton kernels'; 64 for the exact values); `arguments`: bounds of block arguments the IR does
    not tell (a mod region's positions). `lanes(n)` is how many lanes the backend computes a
    tile dimension of n on, padding included: Triton's lowering pads tiles to powers of two and
    its padding lanes compute (and load) too, so there `linalg.index` reaches lanes(n) - 1."""

    def __init__(self, lanes=None, bits: int = 32, arguments: dict | None = None):
        self._memo: dict = {}
        self.lanes = lanes or (lambda n: n)
        self.bits = bits
        self.range = signed_range(bits)
        self._arguments = arguments or {}  # bounds of block arguments the IR cannot tell (a region's positions)

    def bounds(self, value) -> tuple:
        """The interval of an integer value; of an integer tensor, the interval of its elements."""
        if value not in self._memo:
            self._memo[value] = UNKNOWN  # a value reached again through a loop is not bounded by itself
            self._memo[value] = self._compute(value)
        return self._memo[value]

    def within(self, value, lo: int, hi: int) -> bool:
        """Whether `value` provably lies in [lo, hi]."""
        b = self.bounds(value)
        return lo <= b[0] and b[1] <= hi

    def leaves(self, value, lo: int, hi: int) -> bool:
        """Whether `value` has known bounds and they leave [lo, hi] (an index past i32)."""
        b = self.bounds(value)
        return all(math.isfinite(x) for x in b) and not (lo <= b[0] and b[1] <= hi)

    def _compute(self, value) -> tuple:
        from mlir import ir

        if isinstance(value.owner, ir.Block):
            found = self._block_argument(ir.BlockArgument(value))
        else:
            handler = _OPS.get(value.owner.name)
            found = UNKNOWN if handler is None else handler(self, value.owner)
        width = _element_width(value)
        if width is not None and 1 < width < self.bits:
            # A value of a type narrower than the analysis (an i32 closure element in 64 bits, an
            # i8 in 32) lies in its type's range; an interval that leaves it (the exact rules on
            # an op that wrapped, or nothing known) is replaced by that range.
            low, high = signed_range(width)
            if not (low <= found[0] and found[1] <= high):
                return low, high
        return found

    def _block_argument(self, arg) -> tuple:
        if arg in self._arguments:
            return self._arguments[arg]
        parent = arg.owner.owner
        if parent is not None and parent.name == "scf.for" and arg.arg_number == 0:
            lb, ub, step = (self.bounds(v) for v in list(parent.operands)[:3])
            if step[0] < 1:
                return UNKNOWN
            return _fit(self, lb[0], ub[1] - 1)
        return UNKNOWN

    def operand(self, op, i: int) -> tuple:
        return self.bounds(op.operands[i])


def _constant(ib, op) -> tuple:
    """A scalar constant, or the range of a constant table's elements (the tile lists attn-tile
    writes, which tensor.extract reads)."""
    import numpy as np
    from mlir import ir

    attr = op.attributes["value"]
    if isinstance(attr, ir.IntegerAttr):
        if isinstance(attr.type, ir.IntegerType) and attr.type.width == 1:
            return (0, 1) if attr.value else (0, 0)
        return _fit(ib, attr.value, attr.value)
    if isinstance(attr, ir.DenseIntElementsAttr):
        values = np.array(attr)
        if values.size:
            return _fit(ib, int(values.min()), int(values.max()))
    return UNKNOWN


def _extract(ib, op) -> tuple:
    """An element of a tensor: in the tensor's bounds, or those its read carries (abi.BOUNDS, a
    tile table's block numbers)."""
    from mlir import ir

    if abi.BOUNDS in op.attributes:
        lo, hi = ir.DenseI64ArrayAttr(op.attributes[abi.BOUNDS])
        return _fit(ib, lo, hi)
    return ib.operand(op, 0)


def _program_id(_, op) -> tuple:
    from mlir import ir

    axis = ir.IntegerAttr(op.attributes["axis"]).value
    func = op.parent
    while func is not None and func.name != "func.func":
        func = func.parent
    grid = abi.grid(func) if func is not None and abi.GRID in func.attributes else []
    return (0, grid[axis] - 1) if axis < len(grid) and grid[axis] > 0 else (0, I32[1])


def _linalg_index(ib: IndexBounds, op) -> tuple:
    """linalg.index d of the enclosing generic: [0, lanes(n) - 1] for the domain's static size n,
    read from an operand whose indexing map sends dimension d straight to one of its own."""
    from mlir import ir

    dim = ir.IntegerAttr(op.attributes["dim"]).value
    generic = op.parent
    if generic is None or generic.name != "linalg.generic":
        return UNKNOWN
    maps = [ir.AffineMapAttr(m).value for m in ir.ArrayAttr(generic.attributes["indexing_maps"])]
    for operand, amap in zip(generic.operands, maps):
        shape = getattr(operand.type, "shape", None)
        if shape is None:
            continue
        for position, expr in enumerate(amap.results):
            if isinstance(expr, ir.AffineDimExpr) and expr.position == dim \
                    and shape[position] != ir.ShapedType.get_dynamic_size():
                return _fit(ib, 0, ib.lanes(shape[position]) - 1)
    return UNKNOWN


def _cast(ib: IndexBounds, op) -> tuple:
    """A cast keeps the value; from a type wider than `bits` (i64 to index, an i32 in Triton's
    kernels) it truncates, which keeps only a bound known on both sides, and so does a cast to a
    narrower integer type (index to i32) of a value its range does not hold."""
    a = ib.operand(op, 0)
    wide = (_width(op.operands[0]) or 0) > ib.bits
    if wide and not all(math.isfinite(x) for x in a):
        return UNKNOWN
    if op.name == "arith.index_castui" and a[0] < 0:
        # Zero-extended: a negative value of a narrower type reads as its unsigned one.
        source = _width(op.operands[0])
        return (0, 2 ** source - 1) if source is not None and source < ib.bits else UNKNOWN
    width = _width(op.results[0])
    if width is not None and width < 64:
        low, high = signed_range(width)
        return a if low <= a[0] and a[1] <= high else UNKNOWN
    return a


def _add(ib, op):
    a, b = ib.operand(op, 0), ib.operand(op, 1)
    return _exact(ib, *(x + y for x in a for y in b))


def _sub(ib, op):
    a, b = ib.operand(op, 0), ib.operand(op, 1)
    return _exact(ib, *(x - y for x in a for y in b))


def _mul(ib, op):
    a, b = ib.operand(op, 0), ib.operand(op, 1)
    return _exact(ib, *(x * y for x in a for y in b))


def _div(ib, op):
    """By a constant divisor c >= 1: monotone in the dividend, so its ends' quotients (divsi
    truncates toward zero, floordivsi floors; divui only of a non-negative dividend)."""
    a, b = ib.operand(op, 0), ib.operand(op, 1)
    if b[0] != b[1] or b[0] < 1:
        return UNKNOWN
    c = b[0]
    if a[0] >= 0:
        return _fit(ib, a[0] // c, a[1] // c if math.isfinite(a[1]) else math.inf)
    if op.name == "arith.divui" or not all(math.isfinite(x) for x in a):
        return UNKNOWN
    if op.name == "arith.floordivsi":
        return _fit(ib, a[0] // c, a[1] // c)
    return _fit(ib, *(-(-x // c) if x < 0 else x // c for x in a))


def _rem(ib, op):
    """By a constant divisor c >= 1: remsi takes the dividend's sign and |r| < c, whatever the
    dividend (one that wrapped included); remui only of a non-negative dividend."""
    a, b = ib.operand(op, 0), ib.operand(op, 1)
    if b[0] != b[1] or b[0] < 1:
        return UNKNOWN
    c = b[0]
    if a[0] >= 0:
        return (a[0], a[1]) if a[1] < c else (0, c - 1)
    if op.name == "arith.remui":
        return UNKNOWN
    return (-(c - 1), 0) if a[1] <= 0 else (-(c - 1), c - 1)


def _bitwise(ib, op):
    """and, or, xor of non-negative bounded operands (a hash's mixing): and is at most the
    smaller, or and xor below the larger's next power of two."""
    a, b = ib.operand(op, 0), ib.operand(op, 1)
    if a[0] < 0 or b[0] < 0 or not math.isfinite(a[1]) or not math.isfinite(b[1]):
        return UNKNOWN
    if op.name == "arith.andi":
        return 0, min(a[1], b[1])
    return _fit(ib, 0, (1 << int(max(a[1], b[1])).bit_length()) - 1)


def _max(ib, op):
    a, b = ib.operand(op, 0), ib.operand(op, 1)
    return _fit(ib, max(a[0], b[0]), max(a[1], b[1]))


def _min(ib, op):
    a, b = ib.operand(op, 0), ib.operand(op, 1)
    return _fit(ib, min(a[0], b[0]), min(a[1], b[1]))


def _abs(ib, op):
    a = ib.operand(op, 0)
    if a[0] >= 0:
        return a
    lo = 0 if a[1] >= 0 else -a[1]
    return _exact(ib, lo, max(-a[0], a[1]))


def _select(ib, op):
    a, b = ib.operand(op, 1), ib.operand(op, 2)
    return _fit(ib, min(a[0], b[0]), max(a[1], b[1]))


def _boolean(*_):
    return 0, 1


def _width(value) -> int | None:
    from mlir import ir

    return value.type.width if isinstance(value.type, ir.IntegerType) else None


def _element_width(value) -> int | None:
    """The width of an integer value or of an integer tensor's elements."""
    from mlir import ir

    element = getattr(value.type, "element_type", value.type)
    return element.width if isinstance(element, ir.IntegerType) else None


def _extsi(ib, op):
    # An i1 sign-extends to -1 or 0; the bounds model it unsigned (0 or 1).
    return (-1, 0) if _width(op.operands[0]) == 1 else _cast(ib, op)


def _extui(ib, op):
    a = ib.operand(op, 0)
    return (0, 1) if _width(op.operands[0]) == 1 else (a if a[0] >= 0 else UNKNOWN)


_OPS = {
    "arith.constant": _constant,
    "tensor.extract": _extract,
    "attn.program_id": _program_id,
    "linalg.index": _linalg_index,
    "arith.index_cast": _cast,
    "arith.index_castui": _cast,
    "arith.extsi": _extsi,
    "arith.addi": _add,
    "arith.subi": _sub,
    "arith.muli": _mul,
    "arith.divsi": _div,
    "arith.divui": _div,
    "arith.floordivsi": _div,
    "arith.remsi": _rem,
    "arith.remui": _rem,
    "arith.maxsi": _max,
    "arith.minsi": _min,
    "math.absi": _abs,
    "arith.select": _select,
    "arith.cmpi": _boolean,
    "arith.andi": _bitwise,
    "arith.ori": _bitwise,
    "arith.xori": _bitwise,
    "arith.extui": _extui,
}
