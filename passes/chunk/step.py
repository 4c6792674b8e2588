"""One chunk of the recurrence, with q, k [C, Dk] and v [C, BV] loaded and G its decay:

    A      = scale * [s <= t] * sum_d q[t,d] k[s,d] exp(G[t,d] - G[s,d])       [C, C]
    o      = A @ v + (scale * q * exp(G)) @ S                                  [C, BV]
    S_next = exp(G_end) * S + (k * exp(G_end - G))^T @ v
    z_next = exp(G_end) * z + sum_t k[t] * exp(G_end - G_t)                    (normalize)

and with `normalize`, o divided by rowsum(A) + (scale * q * exp(G)) . z."""
from __future__ import annotations

from ..l1_text import convert
from .decay import ChunkDecay, DecayedKernel
from .kernel import exp, exp_diff, or_zero

Loaded = tuple[str, str]  # a loaded tile: (f32 value, matmul operand)


class ChunkStep(DecayedKernel):
    """A chunk kernel that computes a chunk's outputs or its next state."""

    def scores(self, q: Loaded, k: Loaded, decay: ChunkDecay | None) -> str:
        """A [C, C]: the causal, decayed, scaled scores of the chunk."""
        c, dk = self.c, self.dk
        cc = self.tile_type(c, c)
        if self.decay == "token_dim":
            return self.decayed_scores(q[0], k[0], decay.cum[0], c, dk, self.zeros(cc))
        k_t = self.transpose(k[1], c, dk, self.dot_elt)
        qk = self.matmul(q[1], self.tile_type(c, dk, self.dot_elt), k_t, self.tile_type(dk, c, self.dot_elt),
                         self.zeros(cc), cc)
        ins = [(qk, cc, "(d0, d1)")]
        if decay is not None:
            value, vec, _ = decay.cum
            ins += [(value, vec, "(d0)"), (value, vec, "(d1)")]

        def causal(inner, a):
            keep = self.pair_mask(inner)
            x = self.scaled(inner, a[0])
            if decay is not None:
                x = inner(f"arith.mulf {x}, {self.safe_exp(inner, keep, a[1], a[2])} : f32")
            return or_zero(inner, keep, x)

        return self.generic(ins, cc, causal)

    def decayed_scores(self, q: str, k: str, cum: str, rows: int, width: int, acc: str,
                       clamp: bool = False) -> str:
        """acc + scale * [s <= t] * sum_d q[t,d] k[s,d] exp(cum[t,d] - cum[s,d]) over [rows, width]
        tiles: the 3-D form of the scores, where the pair factor depends on d ("token_dim")."""
        rd = self.tile_type(rows, width)

        def body(inner, a):
            keep = self.pair_mask(inner)
            factor = self.safe_exp(inner, keep, a[2], a[3], clamp)
            term = inner(f"arith.mulf {inner(f'arith.mulf {a[0]}, {a[1]} : f32')}, {factor} : f32")
            term = or_zero(inner, keep, self.scaled(inner, term))
            return inner(f"arith.addf {a[4]}, {term} : f32")

        return self.generic([(q, rd, "(d0, d2)"), (k, rd, "(d1, d2)"), (cum, rd, "(d0, d2)"), (cum, rd, "(d1, d2)")],
                            self.tile_type(rows, rows), body, rank=3,
                            iterators=["parallel", "parallel", "reduction"], init=acc, out_map="(d0, d1)")

    def store_output(self, t0: str, q: Loaded, k: Loaded, v: Loaded, decay: ChunkDecay | None, state: str,
                     z: str | None, out: str) -> str:
        """Insert the chunk's output rows o = A @ v + (scale * q * exp(G)) @ S (normalized with z)
        into `out`; `state` is S [Dk, BV] as a matmul operand."""
        c, dk, bv = self.c, self.dk, self.bv
        cd, cb = self.tile_type(c, dk), self.tile_type(c, bv)
        scores = self.scores(q, k, decay)
        o = self.matmul(self.operand(scores, c, c), self.tile_type(c, c, self.dot_elt), v[1],
                        self.tile_type(c, bv, self.dot_elt), self.zeros(cb), cb)
        if decay is None:
            q_dec = self.generic([(q[0], cd, "(d0, d1)")], cd, lambda inner, a: self.scaled(inner, a[0]))
        else:
            q_dec = self.generic([(q[0], cd, "(d0, d1)"), decay.cum], cd, lambda inner, a: self.scaled(
                inner, inner(f"arith.mulf {a[0]}, {exp(inner, a[1])} : f32")))
        o = self.matmul(self.operand(q_dec, c, dk), self.tile_type(c, dk, self.dot_elt), state,
                        self.tile_type(dk, bv, self.dot_elt), o, cb)
        if self.normalize:
            o = self.normalized(o, scores, q_dec, z)
        else:
            o = self.output_elements(o, c)
        return self.store_rows(o, t0, c, out)

    def normalized(self, o: str, scores: str, q_dec: str, z: str) -> str:
        """o / (rowsum(A) + (scale * q * exp(G)) . z), in the output's element type."""
        c, dk = self.c, self.dk
        cd, vec_c = self.tile_type(c, dk), f"tensor<{c}xf32>"
        den_intra = self.row_sum(scores, c, c)
        qz = self.generic([(q_dec, cd, "(d0, d1)"), (z, f"tensor<{dk}xf32>", "(d1)")], cd,
                          lambda inner, a: inner(f"arith.mulf {a[0]}, {a[1]} : f32"))
        den_inter = self.row_sum(qz, c, dk)

        def divide(inner, a):
            den = inner(f"arith.addf {a[1]}, {a[2]} : f32")
            return convert(inner, inner(f"arith.divf {a[0]}, {den} : f32"), "f32", self.out_elt)

        return self.generic([(o, self.tile_type(c, self.bv), "(d0, d1)"), (den_intra, vec_c, "(d0)"),
                             (den_inter, vec_c, "(d0)")], self.tile_type(c, self.bv, self.out_elt), divide)

    def store_rows(self, o: str, t0: str, rows: int, out: str) -> str:
        """Insert the rows of the [rows, BV] output tile o that lie before L into `out` at t0."""
        em, bv = self.em, self.bv
        valid = self.rows_left(t0, self.l, rows, past_end=rows != self.c)
        if rows != self.c:
            t0 = em(f"arith.minsi {t0}, {self.idx(self.l)} : index")
        o_rows = em(f"tensor.extract_slice {o}[0, 0] [{valid}, {bv}] [1, 1] : {self.tile_type(rows, bv, self.out_elt)} "
                    f"to tensor<?x{bv}x{self.out_elt}>")
        return em(f"tensor.insert_slice {o_rows} into {out}[{self.pb}, {self.ph}, {t0}, {self.v0 or 0}] "
                  f"[1, 1, {valid}, {bv}] [1, 1, 1, 1] : tensor<?x{bv}x{self.out_elt}> into {self.out_type}")

    def decayed_keys(self, k: str, decay: ChunkDecay, width: int) -> str:
        """k * exp(G_end - G) [C, width] (f32)."""
        cd = self.tile_type(self.c, width)
        return self.generic([(k, cd, "(d0, d1)"), decay.cum, decay.end], cd,
                            lambda inner, a: inner(f"arith.mulf {a[0]}, {exp_diff(inner, a[2], a[1])} : f32"))

    def next_state(self, state: str, k: Loaded, v: Loaded, decay: ChunkDecay | None, width: int) -> str:
        """S_next = exp(G_end) * S + (k * exp(G_end - G))^T @ v, for a [width, BV] state."""
        c, bv = self.c, self.bv
        db = self.tile_type(width, bv)
        if decay is None:
            k_dec = k[1]
        else:
            k_dec = self.operand(self.decayed_keys(k[0], decay, width), c, width)
            # In place: a fresh tile per chunk would make bufferization allocate one per iteration.
            state = self.generic([(decay.end_rows, f"tensor<{width}xf32>", "(d0)")], db,
                                 lambda inner, a: inner(f"arith.mulf {a[1]}, {exp(inner, a[0])} : f32"), init=state)
        k_dec_t = self.transpose(k_dec, c, width, self.dot_elt)
        return self.matmul(k_dec_t, self.tile_type(width, c, self.dot_elt), v[1],
                           self.tile_type(c, bv, self.dot_elt), state, db)

    def next_key_sum(self, z: str, k: Loaded, decay: ChunkDecay | None) -> str:
        """z_next = exp(G_end) * z + sum_t k[t] * exp(G_end - G_t) (the state update with v = 1)."""
        c, dk = self.c, self.dk
        vec_k = f"tensor<{dk}xf32>"
        k_dec = k[0] if decay is None else self.decayed_keys(k[0], decay, dk)
        k_sum = self.row_sum(self.transpose(k_dec, c, dk), dk, c)
        if decay is None:
            return self.generic([(k_sum, vec_k, "(d0)")], vec_k,
                                lambda inner, a: inner(f"arith.addf {a[1]}, {a[0]} : f32"), rank=1, init=z)

        def decay_and_add(inner, a):
            decayed = inner(f"arith.mulf {a[2]}, {exp(inner, a[0])} : f32")
            return inner(f"arith.addf {decayed}, {a[1]} : f32")

        return self.generic([(decay.end_rows, vec_k, "(d0)"), (k_sum, vec_k, "(d0)")], vec_k, decay_and_add,
                            rank=1, init=z)
