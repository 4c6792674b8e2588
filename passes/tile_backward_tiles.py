"""The math of one backward tile, shared by `attn-tile-backward`'s two kernels: P and dS from the
tile's products QK^T and dO V^T, the mask and the mods inlined, for softmax (P from the saved
logsumexp, in the log2 domain as the forward computes it) and the element-wise normalizers
(a user's online normalizer: tile_backward_online)."""
from __future__ import annotations

from .l1_builders import KernelBuilder, f32, index, index_value, matmul, tensor_type, transpose, zeros

ROW, TILE = (0,), (0, 1)
LOG2E = 1.4426950408889634


def _elementwise_prob(kind: str, x):
    """P = f(x) of an element-wise normalizer, as the forward's kinds define it (ae_mlir.normalizers)."""
    from mlir.dialects import arith, math

    if kind == "sigmoid":
        return arith.divf(f32(1.0), arith.addf(f32(1.0), math.exp(arith.negf(x))))
    if kind == "relu":
        return arith.maximumf(x, f32(0.0))
    return x


def _d_prob(kind: str, p, dp, delta):
    """The gradient of the scores after the score_mod from P and dP = dO V^T: softmax's
    P (dP - delta); sigmoid's dP P (1 - P); relu's dP where P > 0 (0 at 0, as torch's); dP."""
    from mlir.dialects import arith

    if kind == "softmax":
        return arith.mulf(p, arith.subf(dp, delta))
    if kind == "sigmoid":
        return arith.mulf(dp, arith.mulf(p, arith.subf(f32(1.0), p)))
    if kind == "relu":
        return arith.select(arith.cmpf(arith.CmpFPredicate.OGT, p, f32(0.0)), dp, f32(0.0))
    return dp


class TileGradients(KernelBuilder):
    """Needs from the kernel builder: kind (the normalize kind), scale, score_mod,
    score_mod_grad and mask (regions or None), bm, bn, dk, dv, lq, lk and len_q, len_k (static or per program),
    and closure_grads ((region, closure rank, groups) per closure gradient the dQ kernel writes)."""

    @property
    def row_statistic(self) -> bool:
        """Whether the kernels read the forward's logsumexp and delta (softmax)."""
        return self.kind == "softmax"

    def log2_offsets(self, lse_row):
        """-lse log2(e) per query row, what the tiles' exp2 adds. A row whose every score is -inf
        (a score_mod that hides it) has lse = -inf, and exp(-inf - -inf) is NaN: with lse taken
        as 0 there its probabilities are exp(-inf) = 0."""
        from mlir.dialects import arith

        return self.generic(
            [(lse_row, ROW)], tensor_type(list(lse_row.type.shape)),
            lambda a: arith.select(arith.cmpf(arith.CmpFPredicate.OEQ, a[0], f32(-float("inf"))), f32(0.0),
                                   arith.mulf(a[0], f32(-LOG2E))), rank=1)

    def positions(self, m0, n0, keys_first: bool = False):
        """(q_idx, kv_idx, and the two clamped into the sequences) of the element a
        linalg.generic over a tile is at; padded rows and columns read the last valid index, as
        in the forward."""
        from mlir.dialects import arith, linalg

        q_axis, k_axis = (1, 0) if keys_first else (0, 1)
        i, j = linalg.IndexOp(q_axis).result, linalg.IndexOp(k_axis).result
        qi, kj = arith.addi(m0, i), arith.addi(n0, j)
        return qi, kj, arith.minsi(qi, index(self.lq - 1)), arith.minsi(kj, index(self.lk - 1))

    def keep(self, pb, h, qi, kj, qc, kc):
        """Whether the pair is inside both sequences and the mask shows it."""
        from mlir.dialects import arith

        inside = arith.andi(arith.cmpi(arith.CmpIPredicate.slt, qi, index_value(self.len_q)),
                            arith.cmpi(arith.CmpIPredicate.slt, kj, index_value(self.len_k)))
        if self.mask is not None:
            inside = arith.andi(inside, self.inline(self.mask, [pb, h, qc, kc]))
        return inside

    def key_tile_products(self, q_tile, do_tile, k_rows, kv, hk, n0, with_products: bool = True):
        """(the K tile at key n0, QK^T, dO V^T) for a dQ program's query rows; dO V^T is None
        without `with_products`. `k_rows` loads the key side (tile_backward_rows.Rows)."""
        k, v = kv
        k_tile = k_rows.load(k, hk, n0, self.bn, self.dk)
        v_tile = k_rows.load(v, hk, n0, self.bn, self.dv) if with_products else None
        qk = matmul(q_tile, transpose(k_tile), zeros([self.bm, self.bn]))
        if not with_products:
            return k_tile, qk, None
        return k_tile, qk, matmul(do_tile, transpose(v_tile), zeros([self.bm, self.bn]))

    def tile_gradients(self, qk, dp, neg_lse2, delta_row, pb, h, m0, n0, masked: bool, keys_first: bool = False,
                       with_modded: bool = False):
        """(P, dS) of one tile from its products qk = QK^T and dp = dO V^T and its rows'
        `log2_offsets` and delta (softmax; None otherwise), f32; dS is with respect to the scaled
        scores. The tile is [block_m, block_n], or with `keys_first` the transposed
        [block_n, block_m] (qk = K Q^T, dp = V dO^T), whose P^T and dS^T are the left operands of
        dV += P^T dO and dK += dS^T Q as they are: on GPUs the products' accumulator then feeds the
        next product from registers, where a transposed P would go through shared memory.
        `with_modded` adds a third result, the gradient with respect to the score_mod's output
        (0 at masked pairs), which the closure tensors' gradients start from."""
        from mlir.dialects import arith, math

        stats = ((1,) if keys_first else (0,))
        tile_t = tensor_type(list(qk.type.shape))

        def positions():
            return self.positions(m0, n0, keys_first)

        def keep(qi, kj, qc, kc):
            return self.keep(pb, h, qi, kj, qc, kc)

        def probs(a):
            qi, kj, qc, kc = positions()
            if self.kind == "softmax":
                # exp2 in the log2 domain, as the forward computes it: exp(x - lse) is
                # exp2(x log2(e) - lse log2(e)), with the softmax scale folded into log2(e) when
                # no score_mod comes between (one multiply-add and the GPUs' native exp2).
                if self.score_mod is None:
                    x2 = arith.mulf(a[0], f32(self.scale * LOG2E))
                else:
                    x2 = self.inline_on_score(self.score_mod, a[0], self.scale, [pb, h, qc, kc], LOG2E)
                p = math.exp2(arith.addf(x2, a[1]))
            else:
                x = arith.mulf(a[0], f32(self.scale))
                if self.score_mod is not None:
                    x = self.inline(self.score_mod, [x, pb, h, qc, kc])
                p = _elementwise_prob(self.kind, x)
            return arith.select(keep(qi, kj, qc, kc), p, f32(0.0)) if masked else p

        rows = [(neg_lse2, stats)] if self.kind == "softmax" else []
        p = self.generic([(qk, TILE)] + rows, tile_t, probs)
        rows = [(delta_row, stats)] if self.kind == "softmax" else []

        if with_modded:
            def d_modded(a):
                dm = _d_prob(self.kind, a[0], a[1], a[2] if self.kind == "softmax" else None)
                return arith.select(keep(*positions()), dm, f32(0.0)) if masked else dm

            dm = self.generic([(p, TILE), (dp, TILE)] + rows, tile_t, d_modded)

            def through_score_mod(a):
                qi, kj, qc, kc = positions()
                ds = self.inline_on_score(self.score_mod_grad, a[0], self.scale, [a[1], pb, h, qc, kc])
                return arith.select(keep(qi, kj, qc, kc), ds, f32(0.0)) if masked else ds

            return p, self.generic([(qk, TILE), (dm, TILE)], tile_t, through_score_mod), dm

        def d_scores(a):
            ds = _d_prob(self.kind, a[1], a[2], a[3] if self.kind == "softmax" else None)
            # P = 0 at a masked pair zeroes the normalizers' derivatives, but not the identity's.
            select = masked and (self.score_mod_grad is not None or self.kind == "none")
            if self.score_mod_grad is None and not select:
                return ds
            qi, kj, qc, kc = positions()
            if self.score_mod_grad is not None:
                ds = self.inline_on_score(self.score_mod_grad, a[0], self.scale, [ds, pb, h, qc, kc])
            # A masked pair's local derivative may be inf or NaN: select, do not multiply.
            return arith.select(keep(qi, kj, qc, kc), ds, f32(0.0)) if select else ds

        ds = self.generic([(qk, TILE), (p, TILE), (dp, TILE)] + rows, tile_t, d_scores)
        return p, ds

    def scatter_closure_grads(self, qk, dm, dests: list, pb, h, m0, n0, masked: bool) -> list:
        """The closure gradients `dests` (one per `self.closure_grads` entry: its region, the
        closure's rank) with this [block_m, block_n] tile's contributions added: each read of
        the closure tensor in the score_mod yields (value, index_0, .., index_{r-1}) per pair,
        from the scaled score and `dm`, the gradient with respect to the score_mod's output; a
        masked pair adds 0 (its local derivative may be inf or NaN)."""
        from mlir import ir
        from mlir.dialects import arith

        from .l1_builders import scatter_add

        tile = list(qk.type.shape)
        i32 = ir.IntegerType.get_signless(32)
        out = []
        for (region, rank, groups), dest in zip(self.closure_grads, dests):
            for g in range(groups):
                def component(k, a):
                    qi, kj, qc, kc = self.positions(m0, n0)
                    args = [arith.mulf(a[0], f32(self.scale)), a[1], pb, h, qc, kc]
                    value = self.inline(region, args, result=g * (rank + 1) + k)
                    if k:
                        return arith.index_cast(i32, value)
                    return arith.select(self.keep(pb, h, qi, kj, qc, kc), value, f32(0.0)) if masked else value

                ins = [(qk, TILE), (dm, TILE)]
                values = self.generic(ins, tensor_type(tile), lambda a: component(0, a))
                indices = [self.generic(ins, tensor_type(tile, i32), lambda a, k=k: component(k, a))
                           for k in range(1, rank + 1)]
                dest = scatter_add(dest, values, indices)
            out.append(dest)
        return out
