"""`attn-fold-index-clamps`: drop the min/max clamps of integer values that `index_bounds` proves
already inside them.

The frontend clamps every closure-tensor index into its tensor, so that no backend reads outside
it; attn-tile clamps query and key indices of ragged tail tiles. Where the index is in range by
construction (a relative-position table [H, Lq + Lk - 1] read at q_idx - kv_idx + Lk - 1) those
clamps are two integer ops per score for nothing.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from . import ModulePass, option
from .cpu_support import walk
from .index_bounds import IndexBounds
from .triton.values import padded_size

_CLAMPS = ("arith.maxsi", "arith.minsi")


@dataclass(frozen=True)
class FoldIndexClamps(ModulePass):
    name: ClassVar[str] = "attn-fold-index-clamps"
    summary: ClassVar[str] = ("drop arith.maxsi/minsi clamps against a constant whose other operand is "
                              "provably inside it (bounds from the grid, loops, linalg.index and constants)")

    padded_tiles: bool = option(True, "bound tile indices by the power-of-two lane counts of Triton's "
                                      "lowering (its padding lanes compute too), not by the tile sizes")

    def apply(self, module_op) -> None:
        for func in walk(module_op, "func.func"):
            fold_index_clamps(func, padded_size if self.padded_tiles else None)


def fold_index_clamps(func, lanes=None) -> None:
    """Fold the redundant clamps of one function, whose tiles are computed on `lanes(n)` lanes
    (IndexBounds)."""
    bounds = IndexBounds(lanes)
    for op in [op for name in _CLAMPS for op in walk(func, name)]:
        kept = _redundant(bounds, op)
        if kept is not None:
            op.results[0].replace_all_uses_with(kept)
            op.erase()


def _redundant(bounds: IndexBounds, op):
    """The operand `op` (a scalar clamp against a constant) returns unchanged, or None."""
    if hasattr(op.results[0].type, "shape"):
        return None
    for limit, other in ((op.operands[1], op.operands[0]), (op.operands[0], op.operands[1])):
        lo, hi = bounds.bounds(limit)
        if lo != hi:
            continue
        if op.name == "arith.maxsi" and bounds.within(other, lo, math.inf):
            return other
        if op.name == "arith.minsi" and bounds.within(other, -math.inf, hi):
            return other
    return None
