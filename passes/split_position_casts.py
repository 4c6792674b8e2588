"""`attn-split-position-casts`: convert a sum of positions term by term, not the sum.

A score_mod such as ALiBi's `slope[h] * (kv_idx - q_idx)` converts an integer that varies along
both axes of a tile to float: one int-to-float conversion per score. On NVIDIA GPUs that
conversion issues at a quarter of the FP32 rate (16 per clock per SM from sm80 to sm90), the
rate of the exp2 every score already pays. Where the integer is a tree of `addi`/`subi` whose
leaves each vary along fewer of the generic's dimensions than the tree (q_idx along the rows,
kv_idx along the columns, a constant along none), this pass converts the leaves and rebuilds the
tree with `addf`/`subf`. Triton's lowering computes a value of the rows alone once per row ([M,
1]) and of the columns alone once per column ([1, N]), so the tile pays one float add per score.

The rewrite is exact, not approximate: it applies only where `index_bounds` proves every leaf and
every partial sum of the tree within the float type's exact integers (|x| <= 2^24 for f32), so
each conversion and each float add or subtract is exact and the result equals the conversion of
the integer. Nothing upstream does it: LLVM and Triton cannot assume those bounds.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from . import ModulePass, option
from .cpu_support import walk
from .index_bounds import IndexBounds
from .triton.values import padded_size

# Integer-to-integer casts that keep the value (the frontend converts index -> i64 -> float).
_KEEPING = ("arith.index_cast", "arith.extsi")
_SUMS = {"arith.addi": "arith.addf", "arith.subi": "arith.subf"}
_MANTISSA = {"f16": 11, "bf16": 8, "f32": 24, "f64": 53}


@dataclass(frozen=True)
class SplitPositionCasts(ModulePass):
    name: ClassVar[str] = "attn-split-position-casts"
    summary: ClassVar[str] = ("in linalg.generic bodies, arith.sitofp of an addi/subi tree whose leaves each vary "
                              "along fewer tile dimensions becomes the tree over the converted leaves "
                              "(addf/subf), where index bounds prove it exact")

    padded_tiles: bool = option(True, "bound tile indices by the power-of-two lane counts of Triton's "
                                      "lowering (its padding lanes compute too), not by the tile sizes")

    def apply(self, module_op) -> None:
        for func in walk(module_op, "func.func"):
            split_position_casts(func, padded_size if self.padded_tiles else None)


def split_position_casts(func, lanes=None) -> None:
    bounds = IndexBounds(lanes)
    for generic in walk(func, "linalg.generic"):
        dims = _Dims(generic)
        for cast in [op for op in walk(generic, "arith.sitofp") if op.parent.operation == generic.operation]:
            _split(cast, dims, bounds)


class _Dims:
    """The iteration dimensions of a generic each value of its body varies along."""

    def __init__(self, generic):
        from mlir import ir

        self._memo: dict = {}
        block = generic.regions[0].blocks[0]
        maps = [ir.AffineMapAttr(m).value for m in ir.ArrayAttr(generic.attributes["indexing_maps"])]
        for arg, amap in zip(block.arguments, maps):
            self._memo[arg] = frozenset(e.position for e in amap.results if isinstance(e, ir.AffineDimExpr))
        self._generic = generic.operation

    def of(self, value) -> frozenset:
        from mlir import ir

        if value in self._memo:
            return self._memo[value]
        owner = value.owner
        if isinstance(owner, ir.Block) or owner.parent.operation != self._generic:
            found = frozenset()  # defined outside the body: the same at every point of the domain
        elif owner.name == "linalg.index":
            found = frozenset([ir.IntegerAttr(owner.attributes["dim"]).value])
        else:
            found = frozenset().union(*(self.of(v) for v in owner.operands))
        self._memo[value] = found
        return found


def _through_casts(value):
    while _name(value) in _KEEPING:
        value = value.owner.operands[0]
    return value


def _name(value) -> str | None:
    """The name of the op defining `value`; None for a block argument."""
    return getattr(value.owner, "name", None)


def _split(cast, dims: _Dims, bounds: IndexBounds) -> None:
    root = _through_casts(cast.operands[0])
    whole = dims.of(root)
    if len(whole) < 2 or _name(root) not in _SUMS or str(cast.results[0].type) not in _MANTISSA:
        return
    exact = 2 ** _MANTISSA[str(cast.results[0].type)]

    def plan(value):
        """The tree to convert: a leaf value varying along fewer dimensions than `whole`, or
        (float op, left plan, right plan); None where some node is not provably exact."""
        if not bounds.within(value, -exact, exact):
            return None
        inner = _through_casts(value)
        if _name(inner) in _SUMS and dims.of(inner) == whole:
            left, right = (plan(v) for v in inner.owner.operands)
            return None if left is None or right is None else (_SUMS[_name(inner)], left, right)
        return inner if dims.of(inner) < whole else None

    tree = plan(cast.operands[0])
    if tree is not None:
        _rebuild(cast, tree)


def _rebuild(cast, tree) -> None:
    from mlir import ir
    from mlir.dialects import arith

    float_type = cast.results[0].type

    def emit(node):
        if isinstance(node, tuple):
            op, left, right = node
            return (arith.addf if op == "arith.addf" else arith.subf)(emit(left), emit(right))
        wide = node if isinstance(node.type, ir.IntegerType) else arith.index_cast(ir.IntegerType.get_signless(64), node)
        return arith.sitofp(float_type, wide)

    with ir.InsertionPoint(cast), cast.location:
        converted = emit(tree)
    cast.results[0].replace_all_uses_with(converted)
    integer = cast.operands[0]
    cast.erase()
    _erase_unused(integer)


def _erase_unused(value) -> None:
    """Erase the integer ops the conversion no longer reads, up to those something else uses."""
    op = value.owner
    if _name(value) not in (*_KEEPING, *_SUMS) or any(True for _ in value.uses):
        return
    operands = list(op.operands)
    op.erase()
    for operand in operands:
        _erase_unused(operand)
