"""The split form's "token_dim" output kernel (GLA), in blocks of SUB rows, as
flash-linear-attention's GLA kernels compute it: the 3-D scores of the one-kernel form cost
C * C * Dk exponentials and as many registers, more than a GPU program holds at C = 64, Dk = 128.

G comes from the cumulative-decay workspace. With the chunk cut into blocks I of SUB rows and R_I
the row of G just before block I, a pair of blocks J < I factorizes at that boundary safely:

    A_IJ = scale * (q_I exp(G_I - R_I)) @ (k_J exp(R_I - G_J))^T,

both exponents <= 0 (decays only shrink G), on tensor cores. Only the SUB x SUB diagonal blocks
need the 3-D form, evaluated over Dk in slices of at most SLICE columns. Then
o_I = sum_J A_IJ @ v_J + (scale q_I exp(G_I)) @ S. The exponents are also clamped at 0: rows past
L load G = 0, and a padded row (never stored) must not overflow either. Tiles are loaded where
they are used, again for each block pair, rather than kept: a GPU program's registers hold one
block's tiles, not the chunk's (and cannot be sliced)."""
from __future__ import annotations

from ..l1_builders import f32, index, tensor_type, transpose, zeros
from .kernel import COL, TILE, exp, linalg_index, offset_of, value_block
from .split import OutputKernel

# The row blocks (the smallest tile tt.dot takes) and the widest Dk slice of the 3-D diagonal
# blocks: SUB * SUB * SLICE f32 values are 64 registers per thread of a 4-warp program.
SUB = 16
SLICE = 32


class BlockedOutputKernel(OutputKernel):
    loads_decays = True

    @staticmethod
    def applies(decay: str, chunk: int) -> bool:
        """Whether a chunk splits into several blocks of SUB rows."""
        return decay == "token_dim" and chunk % SUB == 0 and chunk > SUB

    def chunk_output(self, t0, state, out, g_cum):
        from mlir.dialects import arith

        starts = [arith.addi(t0, index(j * SUB)) for j in range(self.c // SUB)]
        for i, start in enumerate(starts):
            q, _ = self.load("q", start, None, self.dk, SUB)
            g_i = self.cum(g_cum, start, None, self.dk)
            o = self.from_state(q, g_i, state)
            if i:
                boundary = self.boundary(g_cum, start)
                q_local = self.operand(self.generic([(q, TILE), (g_i, TILE), (boundary, COL)], self.sd,
                                                    lambda a: self.decayed(a[0], a[1], a[2], True)))
            for j in range(i):
                o = self.add_earlier_block(o, q_local, boundary, starts[j], g_cum)
            o = self.add_diagonal_block(o, q, g_i, start, g_cum)
            out = self.store_rows(self.output_elements(o), start, SUB, out)
        return out

    @property
    def sd(self):
        return self.tile_type(SUB, self.dk)

    def cum(self, g_cum, start, col, width: int):
        """G of the block at `start`, columns [col, col + width) (col an index value or None)."""
        return self.ws_load(g_cum, start, SUB, width, offset_of(col))

    def boundary(self, g_cum, start, col=None, width: int | None = None):
        """R_I [width (Dk)]: the row of G just before the block at `start`, columns from `col`."""
        from mlir.dialects import arith, tensor

        before = self.ws_row(arith.minsi(arith.subi(start, index(1)), index(self.l - 1)))

        def entry(a):
            d = linalg_index(0)
            return tensor.extract(g_cum, self.ws_lead() + [before, d if col is None else arith.addi(col, d)])

        return self.generic([], tensor_type([width or self.dk]), entry, rank=1)

    def decayed(self, x, hi, lo, scale: bool):
        """x * exp(min(hi - lo, 0)) (x * exp(hi) without `lo`), times the scale with `scale`."""
        from mlir.dialects import arith

        exponent = hi if lo is None else arith.subf(hi, lo)
        if lo is not None:
            exponent = arith.minimumf(exponent, f32(0.0))
        y = arith.mulf(x, exp(exponent))
        return self.scaled(y) if scale else y

    def from_state(self, q, g_i, state):
        """(scale * q_I * exp(G_I)) @ S, a fresh [SUB, BV] accumulator."""
        q_dec = self.generic([(q, TILE), (g_i, TILE)], self.sd, lambda a: self.decayed(a[0], a[1], None, True))
        return self.matmul(self.operand(q_dec), state, zeros([SUB, self.bv]))

    def add_earlier_block(self, o, q_local, boundary, start, g_cum):
        """o + A_IJ @ v_J for the earlier block J at `start`, factorized at the boundary R_I."""
        k_j, _ = self.load("k", start, None, self.dk, SUB)
        k_dec = self.generic([(k_j, TILE), (self.cum(g_cum, start, None, self.dk), TILE), (boundary, COL)], self.sd,
                             lambda a: self.decayed(a[0], a[2], a[1], False))
        scores = self.matmul(q_local, transpose(self.operand(k_dec)), zeros([SUB, SUB]))
        return self.plus_scores_v(o, scores, start)

    def add_diagonal_block(self, o, q, g_i, start, g_cum):
        """o + A_II @ v_I, A_II in the 3-D form summed over slices of Dk."""
        dk = self.dk
        diagonal = zeros([SUB, SUB])
        width = value_block(dk, SLICE)
        for col in range(0, dk, width):
            if width == dk:
                q_s, g_s = q, g_i
                k_s = self.load("k", start, None, dk, SUB)[0]
            else:
                c0 = index(col)
                q_s = self.load("q", start, c0, width, SUB)[0]
                k_s = self.load("k", start, c0, width, SUB)[0]
                g_s = self.cum(g_cum, start, c0, width)
            diagonal = self.decayed_scores(q_s, k_s, g_s, SUB, diagonal, clamp=True)
        return self.plus_scores_v(o, diagonal, start)

    def plus_scores_v(self, o, scores, start):
        """o + scores @ v for the [SUB, SUB] scores against the block of v at `start`."""
        return self.matmul(self.operand(scores), self.load("v", start, self.v0, self.bv, SUB)[1], o)


class BlockedValueOutputKernel(BlockedOutputKernel):
    """The same blocks for "token_value_dim", whose decay acts on the values' columns:

        o_I = sum_{J < I} exp(G_I - R_I) * (A_IJ @ (v_J exp(R_I - G_J))) + A_II (3-D over (t, s, j))
              + scale * (q_I @ S) * exp(G_I)

    with A = scale * q k^T undecayed and both exponents <= 0. A program takes SLICE V columns at
    most, so that the diagonal block's 3-D form, SUB * SUB * BV values, fits its registers whole:
    its output columns cannot be assembled from slices."""

    def __init__(self, op, func, chunk: int, block_v: int):
        super().__init__(op, func, chunk, min(block_v, SLICE))

    @staticmethod
    def applies(decay: str, chunk: int) -> bool:
        return decay == "token_value_dim" and chunk % SUB == 0 and chunk > SUB

    def chunk_output(self, t0, state, out, g_cum):
        from mlir.dialects import arith

        sv = self.tile_type(SUB, self.bv)
        starts = [arith.addi(t0, index(j * SUB)) for j in range(self.c // SUB)]
        for i, start in enumerate(starts):
            q = self.load("q", start, None, self.dk, SUB)
            g_i = self.cum(g_cum, start, self.v0, self.bv)
            o = self.plus_decayed_state(zeros([SUB, self.bv]), q[1], state, g_i)
            if i:
                boundary = self.boundary(g_cum, start, self.v0, self.bv)
                earlier = zeros([SUB, self.bv])
                for start_j in starts[:i]:
                    earlier = self.add_earlier_values(earlier, q, boundary, start_j, g_cum)
                o = self.generic([(o, TILE), (earlier, TILE), (g_i, TILE), (boundary, COL)], sv,
                                 lambda a: arith.addf(a[0], self.decayed(a[1], a[2], a[3], True)))
            k = self.load("k", start, None, self.dk, SUB)
            v = self.load("v", start, self.v0, self.bv, SUB)[0]
            o = self.value_decayed_product(self.scores(q, k, None, SUB), v, g_i, o, clamp=True)
            out = self.store_rows(self.output_elements(o), start, SUB, out)
        return out

    def add_earlier_values(self, acc, q, boundary, start, g_cum):
        """acc + (q_I k_J^T) @ (v_J exp(R_I - G_J)) for the earlier block J at `start`, unscaled."""
        k_j = self.load("k", start, None, self.dk, SUB)[1]
        v_j = self.load("v", start, self.v0, self.bv, SUB)[0]
        v_dec = self.generic([(v_j, TILE), (self.cum(g_cum, start, self.v0, self.bv), TILE), (boundary, COL)],
                             self.tile_type(SUB, self.bv), lambda a: self.decayed(a[0], a[2], a[1], False))
        scores = self.matmul(q[1], transpose(k_j), zeros([SUB, SUB]))
        return self.matmul(self.operand(scores), self.operand(v_dec), acc)
