"""Blocks of SUB rows of a chunk in the split form's kernels of the per-dimension decays, as
flash-linear-attention's GLA kernels compute them: the 3-D pair factors of a whole chunk cost
C * C * Dk exponentials and as many registers, more than a GPU program holds at C = 64,
Dk = 128. The values'-decay output kernel here takes a program per block (f16 operands, which
never factorize); the scores kernel and the output kernels of `chunk/scores.py` a program per
chunk, walking its blocks only past SPAN_LIMIT.

G comes from the cumulative-decay workspace. With the chunk cut into blocks I of SUB rows and R_I
the row of G just before block I, a pair of blocks J < I factorizes at that boundary safely,

    exp(G_t - G_s) = exp(G_t - R_I) * exp(R_I - G_s)    (t in I, s in J),

both exponents <= 0 (decays only shrink G), so their products run on tensor cores. A diagonal
block (J = I) factorizes the same way while the block's own decay, max(R_I - G_I), stays under
SPAN_LIMIT (then exp(R_I - G_s) <= exp(SPAN_LIMIT) stays finite and exact); past it, it takes
the exact 3-D form. The exponents are also clamped at 0 (at SPAN_LIMIT for a diagonal block's
keys): rows past L load G = 0, and a padded row (never stored) must not overflow either.

GLA's ("token_dim") scores use this in `chunk/scores.py`. Here, the output kernel of
"token_value_dim", whose decay acts on the values' columns:

    o_I = sum_{J <= I} exp(G_I - R_I) * (A_IJ @ (v_J exp(R_I - G_J))) + scale * (q_I @ S) * exp(G_I)

with A = scale * q k^T undecayed (and causal in A_II), the diagonal term in the 3-D form over
(t, s, j) for a block past SPAN_LIMIT; a block walks the earlier blocks J in an scf.for, each J's
tiles loaded, used once and dropped (the blocks unrolled kept every block's tiles live across the
chunk and spilled registers at Dk = 128). `ScoredValueOutputKernel` (`chunk/scores.py`) runs the
blocks one after the other for a chunk past SPAN_LIMIT; with f16 operands this kernel takes a
program per block (grid [B, H, NC * C / SUB * Dv / BV])."""
from __future__ import annotations

from ..l1_builders import f32, for_loop, index, tensor_type, transpose, zeros
from .kernel import COL, TILE, exp, linalg_index, offset_of
from .split import DECAYS, OutputKernel
from .step import SPAN_LIMIT

# The row blocks (the smallest tile tt.dot takes) and the widest Dk slice of the 3-D diagonal
# blocks: SUB * SUB * SLICE f32 values are 64 registers per thread of a 4-warp program.
SUB = 16
SLICE = 32


class BlockedKernel(OutputKernel):
    """A kernel that computes blocks of SUB rows of a chunk: the blocks' coordinates and the
    factorization at a block's boundary; its own `build` and `body` take a program per block."""

    def build(self) -> None:
        extra = self.arguments(("out", self.out_type))
        grid = [self.b, self.h, self.chunks * (self.c // SUB) * self.nv]
        self.define(extra, [self.out_type], grid, self.body)

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

    @staticmethod
    def block_start(t0, j):
        from mlir.dialects import arith

        return arith.addi(t0, arith.muli(j, index(SUB)))

    def cum(self, g_cum, start, col, width: int):
        """G of the block at `start`, columns [col, col + width) (col an index value or None)."""
        return self.ws_load(g_cum, start, SUB, width, offset_of(col))

    def boundary(self, g_cum, start, col=None, width: int | None = None):
        """R_I [width (Dk)]: the row of G just before the block at `start`, columns from `col`;
        0 before a chunk's first block (G counts from the chunk's start)."""
        from mlir.dialects import arith, tensor

        # Clamped into [0, L): the row is read even where it is not used (a chunk's first block,
        # a block past L).
        before = self.ws_row(arith.maxsi(arith.minsi(arith.subi(start, index(1)), index(self.l - 1)), index(0)))
        chunk_start = arith.cmpi(arith.CmpIPredicate.eq, arith.remsi(start, index(self.c)), index(0))

        def entry(a):
            d = linalg_index(0)
            row = tensor.extract(g_cum, self.ws_lead() + [before, d if col is None else arith.addi(col, d)])
            return arith.select(chunk_start, f32(0.0), row)

        return self.generic([], tensor_type([width or self.dk]), entry, rank=1)

    def wide(self, g_i, boundary):
        """The trips (1 or 0) of the loop that computes the block's diagonal block in the exact
        3-D form: whether its decay over its rows, max(R_I - G_I), exceeds SPAN_LIMIT."""
        from mlir.dialects import arith

        return self.past_span_limit(self.generic([(g_i, TILE), (boundary, COL)], g_i.type,
                                                 lambda a: arith.subf(a[1], a[0])))

    def decayed(self, x, hi, lo, scale: bool, cap: float = 0.0):
        """x * exp(min(hi - lo, cap)) (x * exp(hi) without `lo`), times the scale with `scale`."""
        from mlir.dialects import arith

        exponent = hi if lo is None else arith.subf(hi, lo)
        if lo is not None:
            exponent = arith.minimumf(exponent, f32(cap))
        y = arith.mulf(x, exp(exponent))
        return self.scaled(y) if scale else y


class BlockedValueOutputKernel(BlockedKernel):
    """The output kernel of "token_value_dim" (module docstring). A program takes SLICE V columns
    at most, so that the diagonal block's 3-D form, SUB * SUB * BV values, fits its registers whole:
    its output columns cannot be assembled from slices."""

    def __init__(self, op, func, chunk: int, block_v: int):
        super().__init__(op, func, chunk, min(block_v, SLICE))

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
        scores = self.scores(q, k, None, SUB)
        if not self.factorizes:
            o = self.value_decayed_product(scores, v, g_i, o, clamp=True)
        else:
            v_dec = self.generic([(v, TILE), (g_i, TILE), (boundary, COL)], sv,
                                 lambda a: self.decayed(a[0], a[2], a[1], False, SPAN_LIMIT))
            diagonal = self.matmul(self.operand(scores), self.operand(v_dec), zeros([SUB, self.bv]))
            fast = self.generic([(o, TILE), (diagonal, TILE), (g_i, TILE), (boundary, COL)], sv,
                                lambda a: arith.addf(a[0], self.decayed(a[1], a[2], a[3], False)))
            o = for_loop(self.wide(g_i, boundary), [fast], lambda _, values: [
                self.value_decayed_product(scores, v, g_i, o, clamp=True)])[0]
        return self.store_rows(self.output_elements(o), start, SUB, out)

    def add_earlier_values(self, acc, q, boundary, start, g_cum):
        """acc + (q_I k_J^T) @ (v_J exp(R_I - G_J)) for the earlier block J at `start`, unscaled."""
        k_j = self.load("k", start, None, self.dk, SUB)[1]
        v_j = self.load("v", start, self.v0, self.bv, SUB)[0]
        v_dec = self.generic([(v_j, TILE), (self.cum(g_cum, start, self.v0, self.bv), TILE), (boundary, COL)],
                             self.tile_type(SUB, self.bv), lambda a: self.decayed(a[0], a[2], a[1], False))
        scores = self.matmul(q[1], transpose(k_j), zeros([SUB, SUB]))
        return self.matmul(self.operand(scores), self.operand(v_dec), acc)
