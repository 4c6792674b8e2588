"""The cumulative log-decay of a chunk: G_i = g_0 + ... + g_i inside the chunk (padded positions
have g = 0) and its total G_end = G_{C-1}, for each decay kind. G_end is always read off G's last
entry (or computed exactly as G's last entry is), so G_end - G is exactly 0 at the chunk's end."""
from __future__ import annotations

from dataclasses import dataclass

from ..l1_builders import convert, f32, index, tensor_type, transpose, zeros
from .kernel import COL, DIM_DECAYS, ROW, TILE, ChunkKernel, linalg_index, offset_of, or_zero


@dataclass(frozen=True)
class ChunkDecay:
    """A chunk's decay as generic operands (value, indexing-map dims) over a [C, width] tile of
    keys (of values for "token_value_dim"): `cum` is G (for the scalar decays a [C] vector read
    along rows), `end` is G_end; `end_rows` is G_end as a [width] vector, one value per state row
    (per state column for "token_value_dim", over the program's BV columns)."""

    cum: tuple
    end: tuple
    end_rows: object


class DecayedKernel(ChunkKernel):
    """A chunk kernel that computes G from g."""

    def program_ids(self, sums: bool = True):
        """The program ids (returning the third axis's) and, for the per-dimension decays of a
        kernel that `sums` g along chunks, the lower-triangular ones that do it, built once."""
        from mlir.dialects import arith

        third = super().program_ids()
        if self.decay in DIM_DECAYS and sums:
            self.tril = self.generic([], self.tile_type(self.c, self.c),
                                     lambda a: arith.select(self.pair_mask(), f32(1.0), f32(0.0)))
        return third

    def decays(self, t0, k_col, width: int) -> ChunkDecay | None:
        """The decay of the chunk at t0 for k columns [k_col, k_col + width) (for "token_value_dim",
        for the program's V columns whatever the k columns); None without one."""
        if self.decay in ("head", "token"):
            cum, end_c, end_k = self.head_decay(t0, width) if self.decay == "head" else self.token_decay(t0, width)
            return ChunkDecay((cum, ROW), (end_c, ROW), end_k)
        if self.decay in DIM_DECAYS:
            if self.decay == "token_value_dim":
                k_col, width = self.v0, self.bv
            cum, end_k = self.dim_decay(t0, k_col, width)
            return ChunkDecay((cum, TILE), (end_k, COL), end_k)
        return None

    def token_decay(self, t0, width: int) -> tuple:
        """(G [C], G_end [C], G_end [width]) for the "token" decay: G as row sums of the masked
        [C, C] tile [j <= i] * g_j."""
        from mlir import ir

        c = self.c
        steps = self.load_rows(self.g, "g", t0, c, None)
        tri = self.generic([(steps, COL)], self.tile_type(c, c),
                           lambda a: or_zero(self.pair_mask(), convert(a[0], ir.F32Type.get())))
        cum = self.row_sum(tri)
        return cum, self.last_of(cum, COL, c), self.last_of(cum, COL, width)

    def head_decay(self, t0, width: int) -> tuple:
        """The "head" decay in closed form: with n the chunk's valid rows, G_t = min(t + 1, n) * g_h
        and G_end = n * g_h, both exactly as the sums of g define them, so G_end - G_t is exactly 0
        at the last valid row. No cumulative sum: on a GPU its reductions and layout changes would
        lengthen each step of the chunk-state loop."""
        from mlir import ir
        from mlir.dialects import arith, tensor

        g = self.kernel_arg(self.g, "g")
        n = self.rows_left(t0, self.end, self.c, past_end=self.lengths is not None) if self.ragged else None

        def steps(upto_row: bool):
            count = index(self.c) if n is None else n
            if upto_row:
                i = linalg_index(0)
                count = arith.minsi(arith.addi(i, index(1)), count)
            as_int = arith.index_cast(ir.IntegerType.get_signless(32), count)
            rate = convert(tensor.extract(g, [self.ph]), ir.F32Type.get())
            return arith.mulf(arith.sitofp(ir.F32Type.get(), as_int), rate)

        cum = self.generic([], tensor_type([self.c]), lambda a: steps(True), rank=1)
        end_c = self.generic([], tensor_type([self.c]), lambda a: steps(False), rank=1)
        end_k = self.generic([], tensor_type([width]), lambda a: steps(False), rank=1)
        return cum, end_c, end_k

    def dim_decay(self, t0, col, width: int) -> tuple:
        """(G [C, width], G_end [width]) for the per-dimension decays: G = tril(ones) @ g over
        g's columns [col, col + width)."""
        c = self.c
        steps = self.load_rows(self.g, "g", t0, c, width, offset_of(col))
        steps = self.modded(steps, None, t0, None, False)
        cum = self.matmul(self.tril, steps, zeros([c, width]), "tf32x3")
        return cum, self.last_of(transpose(cum), TILE, width)

    def last_of(self, cum, dims: tuple, rows: int, cols: int | None = None):
        """[rows] values of the last column of cum viewed as a [rows, cols (C)] tile through the
        indexing-map `dims` (the chunk's total log-decay G_end): a row sum with every other
        column masked, so the value is bitwise cum's last entry and G_end - G is exactly 0 at
        the chunk's end."""
        from mlir.dialects import arith

        c = cols or self.c

        def pick(a):
            j = linalg_index(1)
            return or_zero(arith.cmpi(arith.CmpIPredicate.eq, j, index(c - 1)), a[0])

        return self.row_sum(self.generic([(cum, dims)], self.tile_type(rows, c), pick))
