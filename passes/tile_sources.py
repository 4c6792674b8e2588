"""Where an `attn-tile` program's rows come from and how many it stores: q, k and v as
[B, H, L, D] tensors, K and V through a paged cache's table (tile_paged), or a packed sequence's
rows (tile_varlen). A mixin of tile._Kernel, which sets the fields these read (op, pb, ph, m0,
lq, lk, bm, bn, rows, keys, packed, q_seq, packing, spans, whole_tiles)."""
from __future__ import annotations

from .l1_builders import index, index_value
from .tile_pack_gqa import load_head_rows
from .tile_paged import load_paged, paged_source
from .tile_varlen import sequences_source, span


class RowSources:
    def packing_results(self) -> list | None:
        return [p.results[0] for p in self.packing] if self.packing else None

    def rows_to_store(self):
        """The program's query rows that exist: up to block_m, fewer at the (sequence's) end."""
        from mlir.dialects import arith

        if self.q_seq is None:
            # With whole blocks a static row count makes the store a static slice, which the CPU
            # copies in vectors where a dynamic one took a scalar loop.
            return self.rows_left(self.m0, self.lq, self.rows, aligned=self.whole_tiles)
        lo, hi = self.span(self.q_seq, self.lq)
        return self.rows_left(self.m0, arith.subi(hi, lo), self.rows, past_end=True)

    def span(self, source, longest: int):
        """The packed rows [lo, hi) of this program's sequence in an unpack_sequences source
        (read once per kernel)."""
        key = (source[0], source[1])
        if key not in self.spans:
            self.spans[key] = span(self, source, self.pb, longest)
        return self.spans[key]

    def load_block(self, src, lead: list, width: int | None):
        """The program's query block of src[lead..., head, row(, :width)] (rows past Lq zero) as
        a [block_m(, width)] tile: the program's head, or packed, its group's heads one after the
        other; for a packed sequence, its rows of the packed q."""
        from mlir.dialects import arith

        if self.q_seq is not None:
            lo, hi = self.span(self.q_seq, self.lq)
            packed = self.kernel_arg(self.q_seq[0], "the packed q")
            return self.load_tile(packed, [index(0), self.ph], arith.addi(lo, self.m0), hi, self.bm, width,
                                  past_end=True)
        if not self.packed:
            return self.load_tile(src, lead + [self.ph], self.m0, self.lq, self.bm, width, aligned=self.whole_tiles)
        return load_head_rows(self, src, lead, width)

    def load_kv(self, which: int, hk, n0, width: int):
        """The KV tile from key n0 of operand `which` (1: k, 2: v) for KV head hk, zero past
        the entry's last key: a slice of the tensor, or read through a paged cache's table."""
        from mlir.dialects import arith

        value = self.op.operands[which]
        source = paged_source(value)
        if source is not None:
            return load_paged(self, source, hk, n0, self.bn, width)
        source = sequences_source(value)
        if source is not None:
            lo, hi = self.span(source, self.lk)
            packed = self.kernel_arg(source[0], "the packed k and v")
            # Keys past the sequence read as the view's zero rows (kv_len masks them as well).
            end = arith.minsi(hi, arith.addi(lo, index_value(self.keys)))
            return self.load_tile(packed, [index(0), hk], arith.addi(lo, n0), end, self.bn, width, past_end=True)
        return self.load_tile(self.kernel_arg(value, "k and v"), [self.pb, hk], n0, self.keys, self.bn, width,
                              aligned=self.whole_tiles)
