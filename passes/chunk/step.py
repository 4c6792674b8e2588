"""One chunk of the recurrence, with q, k [C, Dk] and v [C, BV] loaded and G its decay:

    A      = scale * [s <= t] * sum_d q[t,d] k[s,d] exp(G[t,d] - G[s,d])       [C, C]
    o      = A @ v + (scale * q * exp(G)) @ S                                  [C, BV]
             (= A @ v + scale * exp(G_t) * (q @ S) when G is one value per row: "head", "token")
    S_next = exp(G_end) * S + (k * exp(G_end - G))^T @ v
    z_next = exp(G_end) * z + sum_t k[t] * exp(G_end - G_t)                    (normalize)

and with `normalize`, o divided by rowsum(A) + (scale * q * exp(G)) . z.

With "token_value_dim" G decays the values' columns j (the state's columns) instead:

    A      = scale * [s <= t] * q @ k^T                                          [C, C]
    o[t,j] = sum_s A[t,s] v[s,j] exp(G[t,j] - G[s,j]) + scale * (q @ S)[t,j] exp(G[t,j])
    S_next = S * exp(G_end) + k^T @ (v * exp(G_end - G))          (exp(G_end) along columns)

o's first term is exp(G) * (A @ (v * exp(-G))) on tensor cores while |G| stays under
SPAN_LIMIT in the chunk, else a 3-D generic over (t, s, j) with a reduction on s; likewise
"token_dim"'s A (`dim_decayed_scores`)."""
from __future__ import annotations

from ..l1_builders import (convert, extract_slice, f32, for_loop, index, index_value, insert_slice, tensor_type,
                           transpose, zeros)
from .decay import ChunkDecay, DecayedKernel
from .kernel import COL, ROW, TILE, exp, exp_diff, linalg_index, offset_of, or_zero

Loaded = tuple  # a loaded tile: (f32 value, matmul operand)

# The largest decay (in nats, over the rows a factorization spans, in any column) whose factors
# the tensor-core forms take: a factor exp(R - G_s) grows to exp(SPAN_LIMIT), far inside the range
# of f32 and bf16 (exp(88)); the exponents of masked pairs are capped there too. Past it (or with
# f16 operands, whose range ends at exp(11)) the exact 3-D form runs instead.
SPAN_LIMIT = 40.0


class ChunkStep(DecayedKernel):
    """A chunk kernel that computes a chunk's outputs or its next state."""

    def scores(self, q: Loaded, k: Loaded, decay: ChunkDecay | None, rows: int | None = None):
        """A [rows (C), rows]: the causal, decayed (unless `decay` is None), scaled scores of the
        chunk's tokens (or of a block of `rows` of them)."""
        from mlir.dialects import arith

        c = rows or self.c
        if decay is not None and self.decay == "token_dim":
            return self.dim_decayed_scores(q, k, decay.cum[0], c)
        qk = self.matmul(q[1], transpose(k[1]), zeros([c, c]))
        ins = [(qk, TILE)]
        if decay is not None:
            ins += [(decay.cum[0], ROW), (decay.cum[0], COL)]

        def causal(a):
            keep = self.pair_mask()
            x = self.scaled(a[0])
            if decay is not None:
                x = arith.mulf(x, self.safe_exp(keep, a[1], a[2]))
            return or_zero(keep, x)

        return self.generic(ins, self.tile_type(c, c), causal)

    @property
    def factorizes(self) -> bool:
        """Whether the per-dimension decays may take the tensor-core forms (not with f16 operands)."""
        return str(self.dot_elt) != "f16"

    def past_span_limit(self, spans):
        """The trips (an index value, 1 or 0) of a loop that runs the exact 3-D form: whether an
        element of the f32 tile `spans` (decays in nats) exceeds SPAN_LIMIT."""
        return self.beyond_span_limit(self.tile_max(spans, 0.0))

    @staticmethod
    def beyond_span_limit(span):
        """The trips (an index value, 1 or 0) of a loop that runs the exact 3-D form: whether the
        f32 scalar `span` (a decay in nats) exceeds SPAN_LIMIT."""
        from mlir.dialects import arith

        wide = arith.cmpf(arith.CmpFPredicate.OGT, span, f32(SPAN_LIMIT))
        return arith.select(wide, index(1), index(0))

    def chunk_span(self, cum):
        """|G| [rows, width] of a chunk: how far its decay moved from the chunk's start, in nats
        (either sign: both of a pair's factors exp(G_t), exp(-G_s) stay within exp(SPAN_LIMIT))."""
        from mlir.dialects import math

        return self.generic([(cum, TILE)], cum.type, lambda a: math.absf(a[0]))

    def dim_decayed_scores(self, q: Loaded, k: Loaded, cum, rows: int):
        """A [rows, rows] for "token_dim": while |G| stays under SPAN_LIMIT (the chunk decays less
        than that in every dimension), one product, causal((scale * q exp(G)) @ (k exp(min(-G,
        SPAN_LIMIT)))^T); past it the 3-D form over (t, s, d), in a loop of one trip."""
        from mlir.dialects import arith

        def exact():
            return self.decayed_scores(q[0], k[0], cum, rows, zeros([rows, rows]))

        if not self.factorizes:
            return exact()
        tile = cum.type
        q_f = self.generic([(q[0], TILE), (cum, TILE)], tile, lambda a: self.scaled(arith.mulf(a[0], exp(a[1]))))
        k_f = self.undecayed(k[0], cum)
        products = self.matmul(self.operand(q_f), transpose(self.operand(k_f)), zeros([rows, rows]))
        fast = self.generic([(products, TILE)], products.type, lambda a: or_zero(self.pair_mask(), a[0]))
        return self.exact_past_span_limit(fast, cum, exact)

    def undecayed(self, x, cum):
        """x * exp(min(-G, SPAN_LIMIT)) over a [rows, width] tile: the later factor of a pair's
        decay exp(G_t - G_s) = exp(G_t) exp(-G_s), capped so that it stays finite."""
        from mlir.dialects import arith

        return self.generic([(x, TILE), (cum, TILE)], x.type, lambda a: arith.mulf(
            a[0], exp(arith.minimumf(arith.negf(a[1]), f32(SPAN_LIMIT)))))

    def exact_past_span_limit(self, fast, cum, exact):
        """`fast`, or `exact()` (built inside a loop of one trip) when the chunk's |G| passes
        SPAN_LIMIT."""
        return for_loop(self.past_span_limit(self.chunk_span(cum)), [fast], lambda _, values: [exact()])[0]

    def decayed_scores(self, q, k, cum, rows: int, acc, clamp: bool = False):
        """acc + scale * [s <= t] * sum_d q[t,d] k[s,d] exp(cum[t,d] - cum[s,d]) over [rows, width]
        tiles: the 3-D form of the scores, where the pair factor depends on d ("token_dim")."""
        from mlir.dialects import arith

        def body(a):
            keep = self.pair_mask()
            factor = self.safe_exp(keep, a[2], a[3], clamp)
            term = arith.mulf(arith.mulf(a[0], a[1]), factor)
            term = or_zero(keep, self.scaled(term))
            return arith.addf(a[4], term)

        return self.generic([(q, (0, 2)), (k, (1, 2)), (cum, (0, 2)), (cum, (1, 2))], self.tile_type(rows, rows),
                            body, rank=3, iterators=["parallel", "parallel", "reduction"], init=acc,
                            out_dims=(0, 1))

    def value_decayed_product(self, scores, v, cum, acc, clamp: bool = False):
        """acc + sum_{s <= t} scores[t,s] v[s,j] exp(cum[t,j] - cum[s,j]) over [rows, rows]
        scores and [rows, width] tiles: A @ v where the pair factor depends on the value column j
        ("token_value_dim"); `clamp` as for `safe_exp`."""
        from mlir.dialects import arith

        def body(a):
            keep = self.pair_mask()
            factor = self.safe_exp(keep, a[2], a[3], clamp)
            return arith.addf(a[4], or_zero(keep, arith.mulf(arith.mulf(a[0], a[1]), factor)))

        return self.generic([(scores, (0, 1)), (v, (1, 2)), (cum, (0, 2)), (cum, (1, 2))], acc.type, body, rank=3,
                            iterators=["parallel", "reduction", "parallel"], init=acc, out_dims=(0, 2))

    def value_decayed_values(self, scores, v, cum):
        """sum_{s <= t} scores[t,s] v[s,j] exp(G[t,j] - G[s,j]) ("token_value_dim"): while |G|
        stays under SPAN_LIMIT, exp(G) * (scores @ (v exp(min(-G, SPAN_LIMIT)))) on tensor cores;
        past it the 3-D form, in a loop of one trip."""
        from mlir.dialects import arith

        def exact():
            return self.value_decayed_product(scores, v, cum, zeros(list(v.type.shape)))

        if not self.factorizes:
            return exact()
        products = self.matmul(self.operand(scores), self.operand(self.undecayed(v, cum)), zeros(list(v.type.shape)))
        fast = self.generic([(products, TILE), (cum, TILE)], v.type, lambda a: arith.mulf(a[0], exp(a[1])))
        return self.exact_past_span_limit(fast, cum, exact)

    def plus_decayed_state(self, o, q_operand, state, cum, dims: tuple = TILE):
        """o + scale * (q @ S) * exp(cum): the state's part of the output with the decay applied
        to the product, along its columns ("token_value_dim", `dims` TILE) or its rows (`dims`
        ROW: G one value per token); no decay when `cum` is None."""
        from mlir.dialects import arith

        qs = self.matmul(q_operand, state, zeros(list(o.type.shape)))
        if cum is None:
            return self.generic([(o, TILE), (qs, TILE)], o.type, lambda a: arith.addf(a[0], self.scaled(a[1])))
        return self.generic([(o, TILE), (qs, TILE), (cum, dims)], o.type,
                            lambda a: arith.addf(a[0], self.scaled(arith.mulf(a[1], exp(a[2])))))

    def store_output(self, t0, q: Loaded, k: Loaded, v: Loaded, decay: ChunkDecay | None, state, z, out):
        """Insert the chunk's output rows o = A @ v + (scale * q * exp(G)) @ S (normalized with z)
        into `out`; `state` is S [Dk, BV] as a matmul operand."""
        from mlir.dialects import arith

        c, dk, bv = self.c, self.dk, self.bv
        if self.decay == "token_value_dim":
            o = self.value_decayed_values(self.scores(q, k, None), v[0], decay.cum[0])
            o = self.plus_decayed_state(o, q[1], state, decay.cum[0])
            return self.store_rows(self.output_elements(o), t0, c, out)
        cd = self.tile_type(c, dk)
        scores = self.scores(q, k, decay)
        if self.row_decayed_output:
            return self.store_row_decayed(t0, q, self.operand(scores), v, decay, state, out)
        o = self.matmul(self.operand(scores), v[1], zeros([c, bv]))
        if decay is None:
            q_dec = self.generic([(q[0], TILE)], cd, lambda a: self.scaled(a[0]))
        else:
            q_dec = self.generic([(q[0], TILE), decay.cum], cd, lambda a: self.scaled(arith.mulf(a[0], exp(a[1]))))
        o = self.matmul(self.operand(q_dec), state, o)
        if self.normalize:
            o = self.normalized(o, scores, q_dec, z)
        else:
            o = self.output_elements(o)
        return self.store_rows(o, t0, c, out)

    @property
    def row_decayed_output(self) -> bool:
        """Whether outputs take the state's part as scale * exp(G_t) * (q @ S)[t]: G one value per
        row (or no decay), no normalizer, and q wider than the program's V columns. The row
        factor then follows the product instead of decaying q before it: q enters both products
        as loaded, and the element-wise work is [C, BV] instead of [C, Dk] plus a conversion
        back to the operand type. On an H200 (bf16, simple GLA, BV 64) the output kernel took
        136 us against 152 at Dk 128, but 57 against 53 at Dk 64, where the sum of the two
        products costs a pass of its own."""
        return not self.normalize and self.decay in ("none", "head", "token") and self.dk > self.bv

    def store_row_decayed(self, t0, q: Loaded, scores, v: Loaded, decay: ChunkDecay | None, state, out):
        """Insert the chunk's output rows A @ v + scale * exp(G) * (q @ S) into `out`, `scores`
        being A as a matmul operand (`row_decayed_output`)."""
        o = self.matmul(scores, v[1], zeros([self.c, self.bv]))
        o = self.plus_decayed_state(o, q[1], state, None if decay is None else decay.cum[0], ROW)
        return self.store_rows(self.output_elements(o), t0, self.c, out)

    def normalized(self, o, scores, q_dec, z):
        """o / (rowsum(A) + (scale * q * exp(G)) . z), in the output's element type."""
        from mlir.dialects import arith

        c, dk = self.c, self.dk
        den_intra = self.row_sum(scores)
        qz = self.generic([(q_dec, TILE), (z, COL)], self.tile_type(c, dk), lambda a: arith.mulf(a[0], a[1]))
        den_inter = self.row_sum(qz)

        def divide(a):
            den = arith.addf(a[1], a[2])
            return convert(arith.divf(a[0], den), self.out_elt)

        return self.generic([(o, TILE), (den_intra, ROW), (den_inter, ROW)],
                            self.tile_type(c, self.bv, self.out_elt), divide)

    def store_rows(self, o, t0, rows: int, out):
        """Insert the rows of the [rows, BV] output tile o that lie before `end` into `out` at t0
        (the packed rows of the program's sequence for a packed output); with lengths and an
        unpacked output, the rows before L, those from `end` on as zeros."""
        from mlir.dialects import arith

        bv = self.bv
        if self.lengths is not None and self.packed_out is None:
            o = self.zero_past_end(o, t0)
            end = self.l
        else:
            end = self.end
        past_end = rows != self.c or self.lengths is not None
        valid = self.rows_left(t0, end, rows, past_end=past_end)
        if past_end:
            t0 = arith.minsi(t0, index_value(end))
        o_rows = extract_slice(o, [0, 0], [valid, bv], 2)
        if self.packed_out is not None:
            return insert_slice(o_rows, out, [index(0), self.ph, arith.addi(self.lo, t0), offset_of(self.v0)],
                                [1, 1, valid, bv])
        return insert_slice(o_rows, out, [self.pb, self.ph, t0, offset_of(self.v0)], [1, 1, valid, bv])

    def zero_past_end(self, o, t0):
        """The output tile o with its rows from the program's `end` on set to zero."""
        from mlir.dialects import arith

        def body(a):
            row = arith.addi(t0, linalg_index(0))
            keep = arith.cmpi(arith.CmpIPredicate.slt, row, index_value(self.end))
            return arith.select(keep, a[0], arith.constant(self.out_elt, 0.0))

        return self.generic([(o, TILE)], self.tile_type(*o.type.shape, self.out_elt), body)

    def decayed_keys(self, k, decay: ChunkDecay, width: int):
        """k * exp(G_end - G) [C, width] (f32); v's tile for "token_value_dim"."""
        from mlir.dialects import arith

        return self.generic([(k, TILE), decay.cum, decay.end], self.tile_type(self.c, width),
                            lambda a: arith.mulf(a[0], exp_diff(a[2], a[1])))

    def next_state(self, state, k: Loaded, v: Loaded, decay: ChunkDecay | None, width: int):
        """S_next = exp(G_end) * S + (k * exp(G_end - G))^T @ v, for a [width, BV] state (for
        "token_value_dim", S * exp(G_end) along columns + k^T @ (v * exp(G_end - G)))."""
        from mlir.dialects import arith

        if self.decay == "token_value_dim":
            v_dec = self.operand(self.decayed_keys(v[0], decay, self.bv))
            state = self.generic([(decay.end_rows, COL)], self.tile_type(width, self.bv),
                                 lambda a: arith.mulf(a[1], exp(a[0])), init=state)
            return self.matmul(transpose(k[1]), v_dec, state)
        if decay is None:
            k_dec = k[1]
        else:
            k_dec = self.operand(self.decayed_keys(k[0], decay, width))
            # In place: a fresh tile per chunk would make bufferization allocate one per iteration.
            state = self.generic([(decay.end_rows, ROW)], self.tile_type(width, self.bv),
                                 lambda a: arith.mulf(a[1], exp(a[0])), init=state)
        return self.matmul(transpose(k_dec), v[1], state)

    def next_key_sum(self, z, k: Loaded, decay: ChunkDecay | None):
        """z_next = exp(G_end) * z + sum_t k[t] * exp(G_end - G_t) (the state update with v = 1)."""
        from mlir.dialects import arith

        vec_k = tensor_type([self.dk])
        k_dec = k[0] if decay is None else self.decayed_keys(k[0], decay, self.dk)
        k_sum = self.row_sum(transpose(k_dec))
        if decay is None:
            return self.generic([(k_sum, ROW)], vec_k, lambda a: arith.addf(a[1], a[0]), rank=1, init=z)

        def decay_and_add(a):
            decayed = arith.mulf(a[2], exp(a[0]))
            return arith.addf(decayed, a[1])

        return self.generic([(decay.end_rows, ROW), (k_sum, ROW)], vec_k, decay_and_add, rank=1, init=z)
