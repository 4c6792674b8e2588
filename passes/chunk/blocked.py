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

from .kernel import exp, value_block
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

    def chunk_output(self, t0: str, state: str, out: str, g_cum: str | None) -> str:
        starts = [self.em(f"arith.addi {t0}, {self.idx(j * SUB)} : index") for j in range(self.c // SUB)]
        for i, start in enumerate(starts):
            q, _ = self.load("q", start, None, self.dk, SUB)
            g_i = self.cum(g_cum, start, None, self.dk)
            o = self.from_state(q, g_i, state)
            if i:
                boundary = self.boundary(g_cum, start)
                q_local = self.operand(self.generic(
                    [(q, self.sd, "(d0, d1)"), (g_i, self.sd, "(d0, d1)"), (boundary, self.vec, "(d1)")], self.sd,
                    lambda inner, a: self.decayed(inner, a[0], a[1], a[2], True)), SUB, self.dk)
            for j in range(i):
                o = self.add_earlier_block(o, q_local, boundary, starts[j], g_cum)
            o = self.add_diagonal_block(o, q, g_i, start, g_cum)
            out = self.store_rows(self.output_elements(o, SUB), start, SUB, out)
        return out

    @property
    def sd(self) -> str:
        return self.tile_type(SUB, self.dk)

    @property
    def vec(self) -> str:
        return f"tensor<{self.dk}xf32>"

    def cum(self, g_cum: str, start: str, col: str | None, width: int) -> str:
        """G of the block at `start`, columns [col, col + width)."""
        return self.load_tile(g_cum, self.g_cum_type, "f32", [self.pb, self.ph], start, self.l, SUB, width,
                              col or "0", past_end=True)

    def boundary(self, g_cum: str, start: str) -> str:
        """R_I [Dk]: the row of G just before the block at `start`."""
        em = self.em
        before = em(f"arith.minsi {em(f'arith.subi {start}, {self.idx(1)} : index')}, {self.idx(self.l - 1)} : index")
        return self.generic([], self.vec, lambda inner, a: inner(
            f"tensor.extract {g_cum}[{self.pb}, {self.ph}, {before}, {inner('linalg.index 0 : index')}] "
            f": {self.g_cum_type}"), rank=1)

    def decayed(self, inner, x: str, hi: str, lo: str | None, scale: bool) -> str:
        """x * exp(min(hi - lo, 0)) (x * exp(hi) without `lo`), times the scale with `scale`."""
        exponent = hi if lo is None else inner(f"arith.subf {hi}, {lo} : f32")
        if lo is not None:
            exponent = inner(f"arith.minimumf {exponent}, {inner('arith.constant 0.0 : f32')} : f32")
        y = inner(f"arith.mulf {x}, {exp(inner, exponent)} : f32")
        return self.scaled(inner, y) if scale else y

    def from_state(self, q: str, g_i: str, state: str) -> str:
        """(scale * q_I * exp(G_I)) @ S, a fresh [SUB, BV] accumulator."""
        sub_bv = self.tile_type(SUB, self.bv)
        q_dec = self.generic([(q, self.sd, "(d0, d1)"), (g_i, self.sd, "(d0, d1)")], self.sd,
                             lambda inner, a: self.decayed(inner, a[0], a[1], None, True))
        return self.matmul(self.operand(q_dec, SUB, self.dk), self.tile_type(SUB, self.dk, self.dot_elt), state,
                           self.tile_type(self.dk, self.bv, self.dot_elt), self.zeros(sub_bv), sub_bv)

    def add_earlier_block(self, o: str, q_local: str, boundary: str, start: str, g_cum: str) -> str:
        """o + A_IJ @ v_J for the earlier block J at `start`, factorized at the boundary R_I."""
        dk, dot = self.dk, self.dot_elt
        sub_sub = self.tile_type(SUB, SUB)
        k_j, _ = self.load("k", start, None, dk, SUB)
        k_dec = self.generic([(k_j, self.sd, "(d0, d1)"), (self.cum(g_cum, start, None, dk), self.sd, "(d0, d1)"),
                              (boundary, self.vec, "(d1)")], self.sd,
                             lambda inner, a: self.decayed(inner, a[0], a[2], a[1], False))
        k_t = self.transpose(self.operand(k_dec, SUB, dk), SUB, dk, dot)
        scores = self.matmul(q_local, self.tile_type(SUB, dk, dot), k_t, self.tile_type(dk, SUB, dot),
                             self.zeros(sub_sub), sub_sub)
        return self.plus_scores_v(o, scores, start)

    def add_diagonal_block(self, o: str, q: str, g_i: str, start: str, g_cum: str) -> str:
        """o + A_II @ v_I, A_II in the 3-D form summed over slices of Dk."""
        dk = self.dk
        diagonal = self.zeros(self.tile_type(SUB, SUB))
        width = value_block(dk, SLICE)
        for col in range(0, dk, width):
            if width == dk:
                q_s, g_s = q, g_i
                k_s = self.load("k", start, None, dk, SUB)[0]
            else:
                c0 = self.idx(col)
                q_s = self.load("q", start, c0, width, SUB)[0]
                k_s = self.load("k", start, c0, width, SUB)[0]
                g_s = self.cum(g_cum, start, c0, width)
            diagonal = self.decayed_scores(q_s, k_s, g_s, SUB, width, diagonal, clamp=True)
        return self.plus_scores_v(o, diagonal, start)

    def plus_scores_v(self, o: str, scores: str, start: str) -> str:
        """o + scores @ v for the [SUB, SUB] scores against the block of v at `start`."""
        dot = self.dot_elt
        return self.matmul(self.operand(scores, SUB, SUB), self.tile_type(SUB, SUB, dot),
                           self.load("v", start, self.v0, self.bv, SUB)[1], self.tile_type(SUB, self.bv, dot),
                           o, self.tile_type(SUB, self.bv))
