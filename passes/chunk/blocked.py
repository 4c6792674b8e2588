"""The split form's "token_dim" output kernel (GLA), in blocks of SUB rows, as
flash-linear-attention's GLA kernels compute it: the 3-D scores of the one-kernel form cost
C * C * Dk exponentials and as many registers, more than a GPU program holds at C = 64, Dk = 128.

G comes from the cumulative-decay workspace. With the chunk cut into blocks I of SUB rows and R_I
the row of G just before block I, a pair of blocks J < I factorizes at that boundary safely:

    A_IJ = scale * (q_I exp(G_I - R_I)) @ (k_J exp(R_I - G_J))^T,

both exponents <= 0 (decays only shrink G), on tensor cores. Only the SUB x SUB diagonal blocks
need the exact pair factor, evaluated one key row at a time (`add_diagonal_block`). Then
o_I = sum_J A_IJ @ v_J + (scale q_I exp(G_I)) @ S. The exponents are also clamped at 0: rows past
L load G = 0, and a padded row (never stored) must not overflow either.

A program computes one block I of one chunk (grid [B, H, NC * C / SUB * Dv / BV]), walking the
earlier blocks J in an scf.for: each J's tiles are loaded, used once and dropped. One program per
chunk, with the blocks unrolled, kept every block's tiles live across the chunk (the loads of a
block J are the same ops for every later I) and spilled registers at Dk = 128."""
from __future__ import annotations

from ..l1_builders import convert, extract_slice, f32, for_loop, index, index_value, tensor_type, transpose, zeros
from ..tile_varlen import sequences_source
from .kernel import COL, ROW, TILE, exp, linalg_index, offset_of, or_zero
from .split import DECAYS, STATES, OutputKernel

# The row blocks: the smallest tile tt.dot takes.
SUB = 16


class BlockedOutputKernel(OutputKernel):
    loads_decays = True

    @staticmethod
    def applies(decay: str, chunk: int) -> bool:
        """Whether a chunk splits into several blocks of SUB rows."""
        return decay == "token_dim" and chunk % SUB == 0 and chunk > SUB

    def build(self) -> None:
        extra = self.arguments(True, ("out", self.out_type))
        grid = [self.b, self.h, self.chunks * (self.c // SUB) * self.nv]
        self.define(self.name, extra, [self.out_type], grid, self.body)

    def body(self) -> list:
        from mlir.dialects import arith

        blocks = index(self.c // SUB)
        rest, self.v0 = self.split_id(self.program_ids(sums=False))
        it, block = arith.divsi(rest, blocks), arith.remsi(rest, blocks)
        t0 = arith.muli(it, index(self.c))
        start = arith.addi(t0, arith.muli(block, index(SUB)))

        def store(values):
            state = extract_slice(self.dests[STATES], self.ws_lead() + [self.ws_chunk(it), 0, offset_of(self.v0)],
                                  [1, 1, 1, self.dk, self.bv], 2)
            return [self.block_output(t0, block, start, state, values[0], self.dests[DECAYS])]

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
        """R_I [width (Dk)]: the row of G just before the block at `start`, columns from `col` (the
        first block has none, and no earlier block reads it)."""
        from mlir.dialects import arith

        return self.g_row(g_cum, arith.subi(start, index(1)), col, width or self.dk)

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
        """o + A_II @ v_I, one key row s of the block at a time: the column A_II[:, s], a row sum of
        q * k_s * exp(G - G_s) over Dk (rows t >= s), times the row v_s. Elementwise, as no
        factorization of exp(G_t - G_s) is safe inside the block; a 3-D (t, s, d) form would hold
        SUB * SUB * Dk values at once."""
        from mlir.dialects import arith

        def step(s, values):
            t = arith.addi(start, s)
            k_s, g_s = self.row_vector("k", t, None, self.dk), self.g_row(g_cum, t, None, self.dk)

            def term(a):
                keep = self.rows_from(s)
                return arith.mulf(arith.mulf(a[0], a[2]), self.safe_exp(keep, a[1], a[3], clamp=True))

            column = self.row_sum(self.generic([(q, TILE), (g_i, TILE), (k_s, COL), (g_s, COL)], self.sd, term))
            v_s = self.row_vector("v", t, self.v0, self.bv)
            return [self.generic([(column, ROW), (v_s, COL)], self.tile_type(SUB, self.bv), lambda a: arith.addf(
                a[2], or_zero(self.rows_from(s), self.scaled(arith.mulf(a[0], a[1])))), init=values[0])]

        return for_loop(SUB, [o], step)[0]

    @staticmethod
    def rows_from(s):
        """In a body over [SUB, width]: the row is s or later (t >= s)."""
        from mlir.dialects import arith

        return arith.cmpi(arith.CmpIPredicate.sge, linalg_index(0), s)

    def row_vector(self, role: str, t, col, width: int):
        """Row t of k or v, columns [col, col + width), as a [width] f32 vector, modded, zero from
        `end` on: gathered element by element, because a GPU program cannot take a row out of a
        tile it holds."""
        from mlir import ir
        from mlir.dialects import arith, tensor

        value = {"k": self.k, "v": self.v}[role]
        mod = self.mods["qkv".index(role)]
        source = sequences_source(value)
        inside = arith.cmpi(arith.CmpIPredicate.slt, t, index_value(self.end))
        last = arith.maxsi(arith.subi(index_value(self.end), index(1)), index(0))
        clamped = arith.minsi(t, last)
        if source is None:
            arg, lead, row = self.kernel_arg(value, role), [self.pb, self.ph], clamped
        else:
            arg, lead, row = self.kernel_arg(source[0], role), [index(0), self.ph], arith.addi(self.lo, clamped)

        def body(a):
            d = linalg_index(0)
            if col is not None:
                d = arith.addi(col, d)
            x = convert(tensor.extract(arg, lead + [row, d]), ir.F32Type.get())
            if mod is not None:
                x = self.inline(mod, [x, self.pb, self.ph, clamped, d], constants_first=True)
            return or_zero(inside, x)

        return self.generic([], tensor_type([width]), body, rank=1)

    def g_row(self, g_cum, t, col, width: int):
        """Row t of G (the workspace's), columns [col, col + width), as a [width] vector; rows are
        clamped into [0, L) (a row past the end is never used unmasked)."""
        from mlir.dialects import arith, tensor

        row = self.ws_row(arith.maxsi(arith.minsi(t, index(self.l - 1)), index(0)))

        def entry(a):
            d = linalg_index(0)
            return tensor.extract(g_cum, self.ws_lead() + [row, d if col is None else arith.addi(col, d)])

        return self.generic([], tensor_type([width]), entry, rank=1)

    def plus_scores_v(self, o, scores, start):
        """o + scores @ v for the [SUB, SUB] scores against the block of v at `start`."""
        return self.matmul(self.operand(scores), self.load("v", start, self.v0, self.bv, SUB)[1], o)


class BlockedValueOutputKernel(BlockedOutputKernel):
    """The same blocks for "token_value_dim", whose decay acts on the values' columns:

        o_I = sum_{J < I} exp(G_I - R_I) * (A_IJ @ (v_J exp(R_I - G_J)))
              + sum_{s in I, s <= t} A_II[t, s] v_s exp(G_t - G_s) + scale * (q_I @ S) * exp(G_I)

    with A = scale * q k^T undecayed and both exponents <= 0; the diagonal block one row s at a
    time, as for "token_dim"."""

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
        o = self.add_diagonal_values(o, q[0], g_i, start, g_cum)
        return self.store_rows(self.output_elements(o), start, SUB, out)

    def add_diagonal_values(self, o, q, g_i, start, g_cum):
        """o + sum_{s <= t} A[t, s] v_s exp(G_t - G_s) over the block's rows s, one at a time."""
        from mlir.dialects import arith

        def step(s, values):
            t = arith.addi(start, s)
            k_s = self.row_vector("k", t, None, self.dk)
            column = self.row_sum(self.generic([(q, TILE), (k_s, COL)], self.sd, lambda a: arith.mulf(a[0], a[1])))
            v_s, g_s = self.row_vector("v", t, self.v0, self.bv), self.g_row(g_cum, t, self.v0, self.bv)

            def term(a):
                keep = self.rows_from(s)
                pair = self.scaled(arith.mulf(a[0], a[2]))
                return arith.addf(a[4], or_zero(keep, arith.mulf(pair, self.safe_exp(keep, a[1], a[3], clamp=True))))

            return [self.generic([(column, ROW), (g_i, TILE), (v_s, COL), (g_s, COL)], self.tile_type(SUB, self.bv),
                                 term, init=values[0])]

        return for_loop(SUB, [o], step)[0]

    def add_earlier_values(self, acc, q, boundary, start, g_cum):
        """acc + (q_I k_J^T) @ (v_J exp(R_I - G_J)) for the earlier block J at `start`, unscaled."""
        k_j = self.load("k", start, None, self.dk, SUB)[1]
        v_j = self.load("v", start, self.v0, self.bv, SUB)[0]
        v_dec = self.generic([(v_j, TILE), (self.cum(g_cum, start, self.v0, self.bv), TILE), (boundary, COL)],
                             self.tile_type(SUB, self.bv), lambda a: self.decayed(a[0], a[2], a[1], False))
        scores = self.matmul(q[1], transpose(k_j), zeros([SUB, SUB]))
        return self.matmul(self.operand(scores), self.operand(v_dec), acc)
