"""The split form's output kernels of the per-dimension decays ("token_dim", GLA, and
"token_value_dim", below), in blocks of SUB rows, as
flash-linear-attention's GLA kernels compute it: the 3-D scores of the one-kernel form cost
C * C * Dk exponentials and as many registers, more than a GPU program holds at C = 64, Dk = 128.

G comes from the cumulative-decay workspace. With the chunk cut into blocks I of SUB rows and R_I
the row of G just before block I, a pair of blocks J < I factorizes at that boundary safely:

    A_IJ = scale * (q_I exp(G_I - R_I)) @ (k_J exp(R_I - G_J))^T,

both exponents <= 0 (decays only shrink G), on tensor cores. Only the SUB x SUB diagonal blocks
need the 3-D form, evaluated over Dk in slices of at most SLICE columns. Then
o_I = sum_J A_IJ @ v_J + (scale q_I exp(G_I)) @ S. The exponents are also clamped at 0: rows past
L load G = 0, and a padded row (never stored) must not overflow either.

A program computes one block I of one chunk (grid [B, H, NC * C / SUB * Dv / BV]), walking the
earlier blocks J in an scf.for: each J's tiles are loaded, used once and dropped. One program per
chunk, with the blocks unrolled, kept every block's tiles live across the chunk (the loads of a
block J are the same ops for every later I) and spilled registers at Dk = 128."""
from __future__ import annotations

from ..l1_builders import f32, for_loop, index, tensor_type, transpose, zeros
from .kernel import COL, TILE, exp, linalg_index, offset_of, value_block
from .split import DECAYS, OutputKernel

# The row blocks (the smallest tile tt.dot takes) and the widest Dk slice of the 3-D diagonal
# blocks: SUB * SUB * SLICE f32 values are 64 registers per thread of a 4-warp program.
SUB = 16
SLICE = 32


class BlockedOutputKernel(OutputKernel):
    loads_decays = True  # G comes from the cumulative-decay workspace

    @staticmethod
    def applies(decay: str, chunk: int) -> bool:
        """Whether a chunk splits into several blocks of SUB rows."""
        return decay == "token_dim" and chunk % SUB == 0 and chunk > SUB

    def build(self) -> None:
        extra = self.arguments(self.loads_decays, ("out", self.out_type))
        grid = [self.b, self.h, self.chunks * (self.c // SUB) * self.nv]
        self.define(self.name, extra, [self.out_type], grid, self.body)

    def body(self) -> list:
        from mlir.dialects import arith

        blocks = index(self.c // SUB)
        rest, self.v0 = self.split_id(self.program_ids(sums=not self.loads_decays))
        it, block = arith.divsi(rest, blocks), arith.remsi(rest, blocks)
        t0 = arith.muli(it, index(self.c))
        start = self.block_start(t0, block)

        def store(values):
            return [self.block_output(t0, block, start, self.chunk_state(it), values[0], self.dests[DECAYS])]

        return self.if_holding_tokens(start, [self.dests["out"]], store)

    def block_output(self, t0, block, start, state, out, g_cum):
        """Store the output rows of the block `block` (an index value) at `start` of the chunk at
        t0, S being `state`."""
        q, _ = self.load("q", start, None, self.dk, SUB)
        g_i = self.cum(g_cum, start, None, self.dk)
        o = self.from_state(q, g_i, state)
        boundary = self.boundary(g_cum, start)
        q_local = self.operand(self.generic([(q, TILE), (g_i, TILE), (boundary, COL)], self.sd,
                                            lambda a: self.decayed(a[0], a[1], a[2], True)))
        o = for_loop(block, [o], lambda j, values: [
            self.add_earlier_block(values[0], q_local, boundary, self.block_start(t0, j), g_cum)])[0]
        o = self.add_diagonal_block(o, q, g_i, start, g_cum)
        return self.store_rows(self.output_elements(o), start, SUB, out)

    @staticmethod
    def block_start(t0, j):
        from mlir.dialects import arith

        return arith.addi(t0, arith.muli(j, index(SUB)))

    @property
    def sd(self):
        return self.tile_type(SUB, self.dk)

    def cum(self, g_cum, start, col, width: int):
        """G of the block at `start`, columns [col, col + width) (col an index value or None)."""
        return self.ws_load(g_cum, start, SUB, width, offset_of(col))

    def boundary(self, g_cum, start, col=None, width: int | None = None):
        """R_I [width (Dk)]: the row of G just before the block at `start`, columns from `col`."""
        from mlir.dialects import arith, tensor

        # Clamped into [0, L): the first block has none (and no earlier block reads it).
        before = self.ws_row(arith.maxsi(arith.minsi(arith.subi(start, index(1)), index(self.l - 1)), index(0)))

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

    def block_output(self, t0, block, start, state, out, g_cum):
        from mlir.dialects import arith

        sv = self.tile_type(SUB, self.bv)
        q = self.load("q", start, None, self.dk, SUB)
        g_i = self.cum(g_cum, start, self.v0, self.bv)
        o = self.plus_decayed_state(zeros([SUB, self.bv]), q[1], state, g_i)
        boundary = self.boundary(g_cum, start, self.v0, self.bv)
        earlier = for_loop(block, [zeros([SUB, self.bv])], lambda j, values: [
            self.add_earlier_values(values[0], q, boundary, self.block_start(t0, j), g_cum)])[0]
        o = self.generic([(o, TILE), (earlier, TILE), (g_i, TILE), (boundary, COL)], sv,
                         lambda a: arith.addf(a[0], self.decayed(a[1], a[2], a[3], True)))
        k = self.load("k", start, None, self.dk, SUB)
        v = self.load("v", start, self.v0, self.bv, SUB)[0]
        o = self.value_decayed_product(self.scores(q, k, None, SUB), v, g_i, o, clamp=True)
        return self.store_rows(self.output_elements(o), start, SUB, out)

    def add_earlier_values(self, acc, q, boundary, start, g_cum):
        """acc + (q_I k_J^T) @ (v_J exp(R_I - G_J)) for the earlier block J at `start`, unscaled."""
        k_j = self.load("k", start, None, self.dk, SUB)[1]
        v_j = self.load("v", start, self.v0, self.bv, SUB)[0]
        v_dec = self.generic([(v_j, TILE), (self.cum(g_cum, start, self.v0, self.bv), TILE), (boundary, COL)],
                             self.tile_type(SUB, self.bv), lambda a: self.decayed(a[0], a[2], a[1], False))
        scores = self.matmul(q[1], transpose(k_j), zeros([SUB, SUB]))
        return self.matmul(self.operand(scores), self.operand(v_dec), acc)
