"""Where `attn-tile-backward`'s kernels find a program's rows: q-side tensors (q, out, dO, lse,
dlse, delta, dQ) and k-side ones (k, v, dK, dV) are [B, H, L, ...] slices, or for packed
variable-length batches (tile_varlen) the sequence's rows of [1, H, T, ...] packed tensors, whose
lengths are then known at run time only.
"""
from __future__ import annotations

from .l1_builders import index, index_value, tensor_type
from .tile_varlen import span


class Rows:
    """One side's rows for the program of batch entry (or sequence) `batch`, at most `keys` of
    them (the entry's kv_len) when given: built once per kernel, before its loops, so every loop
    sees the same values."""

    def __init__(self, kernel, source, batch, longest: int, keys=None):
        from mlir.dialects import arith

        self.kernel, self.longest = kernel, longest
        if source is None:
            self.batch, self.start, self.length = batch, None, longest
        else:
            self.batch = index(0)
            self.start, end = span(kernel, source, batch, longest)
            self.length = arith.subi(end, self.start)
        # The rows a store writes: all of them (gradients of keys past kv_len are zeros, written
        # as such), but for a packed sequence only its own.
        self.extent = self.length
        if keys is not None:
            self.length = arith.minsi(index_value(self.length), keys)

    @property
    def packed(self) -> bool:
        return self.start is not None

    @property
    def dynamic(self) -> bool:
        """Whether the length is known at run time only (then any block may be cut short)."""
        return not isinstance(self.length, int)

    def origin(self, r0):
        from mlir.dialects import arith

        return r0 if self.start is None else arith.addi(self.start, r0)

    def load(self, src, head, r0, rows: int, width: int | None):
        """Rows r0 .. r0 + rows - 1 of this side of `src` for `head`, zero past the length."""
        from mlir.dialects import arith

        if not self.packed:
            return self.kernel.load_tile(src, [self.batch, head], r0, self.length, rows, width, past_end=self.dynamic,
                                         aligned=self.kernel.whole_tiles)
        return self.kernel.load_tile(src, [self.batch, head], self.origin(r0), arith.addi(self.start, self.length),
                                     rows, width, past_end=True)

    def valid(self, r0, rows: int):
        """How many of the rows from r0 a store writes (at least 0 for a packed sequence)."""
        return self.kernel.rows_left(r0, self.extent, rows, past_end=self.packed)

    def reach(self, block: int):
        """The blocks of `block` rows that hold rows of this side."""
        from mlir.dialects import arith

        return arith.divui(arith.addi(index_value(self.length), index(block - 1)), index(block))

    def store(self, tile, dest, head, r0, rows: int):
        """The rows of a [rows(, width)] tile a store writes (`valid`), into dest at this side's
        rows from r0 for `head`."""
        from mlir import ir
        from mlir.dialects import tensor

        valid = self.valid(r0, rows)
        dynamic = ir.ShapedType.get_dynamic_size()
        width = list(tile.type.shape[1:])
        rank = 1 + len(width)
        piece = tensor.ExtractSliceOp(tensor_type([dynamic] + width, tile.type.element_type), tile, [], [valid], [],
                                      [0] * rank, [dynamic] + width, [1] * rank).result
        return tensor.InsertSliceOp(piece, dest, [self.batch, head, self.origin(r0)], [valid], [],
                                    [dynamic] * 3 + [0] * len(width), [1, 1, dynamic] + width,
                                    [1] * (2 + rank)).result
