"""Where `attn-tile-backward`'s kernels find a program's rows: q-side tensors (q, out, dO, lse,
dlse, delta, dQ) and k-side ones (k, v, dK, dV) are [B, H, L, ...] slices, or for packed
variable-length batches (tile_varlen) the sequence's rows of [1, H, T, ...] packed tensors, whose
lengths are then known at run time only.
"""
from __future__ import annotations

from .l1_builders import index, index_value
from .tile_varlen import span


class Rows:
    """One side's rows for the program of batch entry (or sequence) `batch`: built once per
    kernel, before its loops, so every loop sees the same values."""

    def __init__(self, kernel, source, batch, longest: int):
        from mlir.dialects import arith

        self.kernel, self.longest = kernel, longest
        if source is None:
            self.batch, self.start, self.length = batch, None, longest
            return
        self.batch = index(0)
        self.start, end = span(kernel, source, batch, longest)
        self.length = arith.subi(end, self.start)

    @property
    def packed(self) -> bool:
        return self.start is not None

    def origin(self, r0):
        from mlir.dialects import arith

        return r0 if self.start is None else arith.addi(self.start, r0)

    def load(self, src, head, r0, rows: int, width: int | None):
        """Rows r0 .. r0 + rows - 1 of this side of `src` for `head`, zero past the length."""
        from mlir.dialects import arith

        if not self.packed:
            return self.kernel.load_tile(src, [self.batch, head], r0, self.longest, rows, width)
        return self.kernel.load_tile(src, [self.batch, head], self.origin(r0), arith.addi(self.start, self.length),
                                     rows, width, past_end=True)

    def valid(self, r0, rows: int):
        """How many of the rows from r0 exist (at least 0 for a packed sequence)."""
        return self.kernel.rows_left(r0, self.length, rows, past_end=self.packed)

    def reach(self, block: int):
        """The blocks of `block` rows that hold rows of this side."""
        from mlir.dialects import arith

        return arith.divui(arith.addi(index_value(self.length), index(block - 1)), index(block))
