"""The online normalizer's row state in `attn-tile`'s kernels: its value before any KV tile, one
KV tile's step (the scores with the score_mod and mask, the normalizer's prob and rescale
regions, P V into the accumulator) and the output and logsumexp it finalizes to."""
from __future__ import annotations

import math

from .l1_builders import KernelBuilder, convert, f32, fill, index, index_value, matmul, tensor_type

LOG2E = 1.0 / math.log(2.0)
ROW, TILE = (0,), (0, 1)  # indexing-map dims of a row vector and of a whole tile


class OnlineRowState(KernelBuilder):
    """The row state's builders; `tile._Kernel` supplies the regions, tiles, positions and loads
    they read."""

    def initial_state(self) -> list:
        """The row state before any KV tile: (max, sum, accumulator), as the normalizer tracks them."""
        from mlir import ir
        from mlir.dialects import tensor

        f32_type = ir.F32Type.get()
        zero, ninf = f32(0.0), f32(-math.inf)
        row_empty = tensor.EmptyOp([self.bm], f32_type).result
        state = []
        if self.stat == "max":
            state.append(fill(ninf, row_empty))
        if self.tracks_sum:
            state.append(fill(zero, row_empty))
        state.append(fill(zero, tensor.EmptyOp([self.bm, self.dv], f32_type).result))
        return state

    def finalized(self, state: list):
        """The output tile (input element type) of a row state: the normalizer's finalize region."""
        acc = state[-1]
        out_tile_t = tensor_type([self.bm, self.dv], self.elt)

        def finalize(a):
            return convert(self.inline(self.regions["finalize"], a), self.elt)

        if self.tracks_sum:
            return self.generic([(acc, TILE), (state[-2], ROW)], out_tile_t, finalize)
        return self.generic([(acc, TILE)], out_tile_t, lambda a: finalize([a[0], f32(0.0)]))

    def lse_of(self, state: list):
        """The logsumexp rows of a softmax row state (the normalizer's lse region)."""
        m_safe = self.safe_max(state[0])
        return self.generic([(m_safe, ROW), (state[-2], ROW)], tensor_type([self.bm]),
                            lambda a: self.inline(self.regions["lse"], a), rank=1)

    def safe_max(self, m):
        """Row max with -inf (a row with nothing visible yet) replaced by 0."""
        from mlir.dialects import arith

        def body(a):
            ninf = f32(-math.inf)
            zero = f32(0.0)
            is_empty = arith.cmpf(arith.CmpFPredicate.OEQ, a[0], ninf)
            return arith.select(is_empty, zero, a[0])

        return self.generic([(m, ROW)], m.type, body, rank=1)

    def kv_step(self, q_tile, hk, nb, state: list, masked: bool) -> list:
        from mlir import ir
        from mlir.dialects import arith, linalg, tensor

        bm, bn = self.bm, self.bn
        f32_type = ir.F32Type.get()
        n0 = arith.muli(nb, index(bn))
        # Rows past the entry's length are loaded as zeros: a cache's unfilled rows may hold NaN,
        # which a zero probability would not cancel in P V.
        k_tile = self.load_kv(1, hk, n0, self.dk)
        v_tile = self.load_kv(2, hk, n0, self.dv)
        kt_empty = tensor.EmptyOp([self.dk, bn], self.elt).result
        k_trans = linalg.transpose(k_tile, outs=[kt_empty], permutation=[1, 0])
        tile_t = tensor_type([bm, bn], f32_type)
        row_t = tensor_type([bm], f32_type)
        s_empty = tensor.EmptyOp([bm, bn], f32_type).result
        s_zero = fill(f32(0.0), s_empty)
        qk = matmul(q_tile, k_trans, s_zero)
        score_mod = self.regions["score_mod"]
        mask = self.regions["mask"] if masked else None
        # With per-entry lengths every tile may reach past its entry's last key.
        bounded = masked or self.kv_len is not None

        def scores(a):
            fold = score_mod is not None and self.log2
            x = a[0] if self.prescale_q or fold else arith.mulf(a[0], f32(self.score_scale))
            if score_mod is not None or mask is not None or bounded:
                i = linalg.IndexOp(0).result
                j = linalg.IndexOp(1).result
                head, qi = self.row_position(i)
                kj = arith.addi(n0, j)
                # Padded rows and columns see the last valid index, so a mod never reads a
                # closure tensor out of bounds; their results are masked or never stored.
                qc = arith.minsi(qi, index(self.lq - 1))
                kc = arith.minsi(kj, index(self.lk - 1))
            if fold:
                # x log2(e), the factor on the score's scale (scaled_mods).
                scale = 1.0 if self.prescale_q else self.score_scale
                x = self.inline_on_score(score_mod, x, scale, [self.pb, head, qc, kc], LOG2E)
            elif score_mod is not None:
                x = self.inline(score_mod, [x, self.pb, head, qc, kc])
            if bounded:
                keep = arith.cmpi(arith.CmpIPredicate.slt, kj, index_value(self.keys))
                if mask is not None:
                    keep = arith.andi(keep, self.inline(mask, [self.pb, head, qc, kc]))
            if self.stat == "max":
                if bounded:
                    x = arith.select(keep, x, f32(-math.inf))
                return x
            zero = f32(0.0)
            p = self.inline(self.regions["prob"], [x, zero])
            if bounded:
                p = arith.select(keep, p, zero)
            return p

        plain = self.prescale_q and score_mod is None and not bounded and self.stat == "max"
        # max(c s) = c max(s) for c > 0, exactly (rounding is monotone): the row max of the raw
        # products, scaled once per row, spares Triton a multiply per score, since the scaled
        # scores then feed only the exponent, where the multiply fuses into its subtraction.
        # Tiles the mask or a length cuts keep the scaled max: taking it of the raw products
        # selected to -inf ran packed batches' forward 5-6% slower on an H200 (bench/RESULTS.md).
        raw_max = (self.raw_row_max and self.stat == "max" and score_mod is None and not self.prescale_q
                   and self.score_scale > 0 and not bounded)
        if raw_max:
            s = self.generic([(qk, TILE)], tile_t, lambda a: arith.mulf(a[0], f32(self.score_scale)))
        else:
            s = qk if plain else self.generic([(qk, TILE)], tile_t, scores)
        if self.stat == "max":
            m_old, l_old, acc = state
            if raw_max:
                m_raw = self.reduce_rows(qk, fill(f32(-math.inf), tensor.EmptyOp([bm], f32_type).result),
                                         arith.maximumf)
                m_new = self.generic([(m_old, ROW), (m_raw, ROW)], row_t,
                                     lambda a: arith.maximumf(a[0], arith.mulf(a[1], f32(self.score_scale))), rank=1)
            else:
                m_new = self.reduce_rows(s, m_old, arith.maximumf)
            m_safe = self.safe_max(m_new)
            p = self.generic([(s, TILE), (m_safe, ROW)], tile_t, lambda a: self.inline(self.regions["prob"], a))
            alpha = self.generic([(m_old, ROW), (m_safe, ROW)], row_t,
                                 lambda a: self.inline(self.regions["rescale"], a), rank=1)
            sum_empty = tensor.EmptyOp([bm], f32_type).result
            sum_init = fill(f32(0.0), sum_empty)
            p_sum = self.reduce_rows(p, sum_init, arith.addf)
            l_new = self.generic([(alpha, ROW), (l_old, ROW), (p_sum, ROW)], row_t,
                                 lambda a: arith.addf(arith.mulf(a[0], a[1]), a[2]), rank=1)
            acc_scaled = self.generic([(acc, TILE), (alpha, ROW)], acc.type, lambda a: arith.mulf(a[0], a[1]))
        else:
            acc = state[-1]
            p = s
            acc_scaled = acc
            if self.tracks_sum:
                l_old = state[0]
                sum_empty = tensor.EmptyOp([bm], f32_type).result
                sum_init = fill(f32(0.0), sum_empty)
                p_sum = self.reduce_rows(p, sum_init, arith.addf)
                l_new = self.generic([(l_old, ROW), (p_sum, ROW)], row_t, lambda a: arith.addf(a[0], a[1]), rank=1)
        p_in = p
        if self.elt != f32_type:
            p_in = self.generic([(p, TILE)], tensor_type([bm, bn], self.elt), lambda a: convert(a[0], self.elt))
        acc_new = matmul(p_in, v_tile, acc_scaled)
        if self.stat == "max":
            return [m_new, l_new, acc_new]
        return [l_new, acc_new] if self.tracks_sum else [acc_new]
