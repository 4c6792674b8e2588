"""The backward tiles and the dQ kernel's loops of a user's online normalizer with a running max
(a softmax written by hand, a tempered one, any prob/rescale/finalize triple), for
`attn-tile-backward`.

The forward's probabilities are p = prob(x, m) of the modified scores x, with m the row's largest
visible x (0 for a row that sees none), l = rowsum(p) and the output finalize(acc, l), linear in
acc (rscale = finalize(1, l) per row). m is a function of the scores too: the loss's derivative in
it, dmax = rowsum(dp/dm (rscale dP + delta)), goes to the first key that attains it, as torch.max's
gradient does. With G = rscale dP + delta (delta = d finalize(1, l) / dl * rowsum(p dP), as
without a running max) the gradient of a modified score is

    dx = dp/dx G + [key == maxkey] dmax

and dS = score_mod_grad(s, dx). The dQ kernel walks a row's KV tiles three times: for m; for l,
rowsum(p dP), rowsum(dp/dm dP), rowsum(dp/dm) and maxkey; and for dQ = scale sum dS K (and the
closure tensors' shares), from the rows it then writes for the dK/dV kernel
(abi.ONLINE_MAX_BACKWARD_KERNELS). Six tile products a tile, as many as one walk that also carried
the max's share in a third accumulator, but with one [block_m, dk] accumulator live, not three.
"""
from __future__ import annotations

from ..core import abi
from .l1_builders import empty, f32, fill, index, matmul, tensor_type, zeros
from .tile_backward_online import OnlineGradients
from .tile_backward_tiles import ROW, TILE

INF = float("inf")


class RunningMaxGradients(OnlineGradients):
    """Adds to OnlineGradients the tiles and the dQ kernel of a running max."""

    def key_position(self, m0, n0, keys_first: bool):
        """The key index of a tile element as an f32 (exact below 2^24 keys)."""
        from mlir import ir
        from mlir.dialects import arith

        _, kj, _, _ = self.positions(m0, n0, keys_first)
        return arith.sitofp(ir.F32Type.get(), arith.index_cast(ir.IntegerType.get_signless(64), kj))

    def max_tile_gradients(self, qk, dp, rows, pb, h, m0, n0, masked: bool, keys_first: bool = False,
                           with_probs: bool = True):
        """(P, dS, dx) of a tile (transposed with `keys_first`) from `rows`, the dQ kernel's rows by
        role (rowmax m, rscale, delta, maxkey, dmax): P = rscale prob(x, m), dx = dp/dx (rscale dP + delta)
        plus dmax at the row's max key, dS = score_mod_grad(s, dx); all 0 at masked pairs.
        Without `with_probs`, P is None."""
        from mlir.dialects import arith

        dims = (1,) if keys_first else (0,)
        m, rscale, delta, key, dmax = ((rows[r], dims) for r in ("rowmax", "rscale", "delta", "maxkey", "dmax"))
        tile_t = tensor_type(list(qk.type.shape))
        where = (pb, h, m0, n0, masked, keys_first)
        x = self.online_modded(qk, pb, h, m0, n0, keys_first)
        probs = None
        if with_probs:
            probs = self.generic([(x, TILE), m, rscale], tile_t, lambda a: self.online_masked(
                arith.mulf(a[2], self.inline(self.prob, [a[0], a[1]])), *where))

        def d_modded(a):
            slope = self.inline(self.prob_grad, [a[0], a[2], f32(1.0)])
            dx = arith.mulf(slope, arith.addf(arith.mulf(a[3], a[1]), a[4]))
            at_max = arith.cmpf(arith.CmpFPredicate.OEQ, self.key_position(m0, n0, keys_first), a[5])
            return self.online_masked(arith.addf(dx, arith.select(at_max, a[6], f32(0.0))), *where)

        dx = self.generic([(x, TILE), (dp, TILE), m, rscale, delta, key, dmax], tile_t, d_modded)
        if self.score_mod_grad is None:
            return probs, dx, dx

        def through_score_mod(a):
            qi, kj, qc, kc = self.positions(m0, n0, keys_first)
            ds = self.inline(self.score_mod_grad, [arith.mulf(a[0], f32(self.scale)), a[1], pb, h, qc, kc])
            return self.online_masked(ds, *where)

        return probs, self.generic([(qk, TILE), (dx, TILE)], tile_t, through_score_mod), dx

    def max_dq(self, q_tile, do_tile, sides, kv, program, lists, dests, closure_dests, reach) -> None:
        """The dQ kernel's three walks and results under a user's online normalizer with a running
        max (the module docstring); `dests` are dq's and the rows' destinations in
        abi.ONLINE_MAX_BACKWARD_KERNELS' order."""
        from mlir.dialects import arith, func

        q_rows, k_rows = sides
        k, v = kv
        pb, ph, hk, pm, m0 = program
        bm, bn = self.bm, self.bn
        tile_t, rows_t = tensor_type([bm, bn]), tensor_type([bm])

        def products(nb, with_products: bool = True):
            """(n0, the K tile, QK^T, dO V^T or None) of KV block `nb`."""
            n0 = arith.muli(nb, index(bn))
            return (n0,) + self.key_tile_products(q_tile, do_tile, k_rows, (k, v), hk, n0, with_products)

        combine = self.accumulate_rows

        def largest(nb, acc, masked):
            n0, _, qk, _ = products(nb, with_products=False)
            x = self.online_modded(qk, pb, ph, m0, n0)
            visible = self.generic([(x, TILE)], tile_t,
                                   lambda a: self.online_masked(a[0], pb, ph, m0, n0, masked, fallback=-INF))
            return [combine(acc[0], visible, self.row_max, arith.maximumf)]

        (top,) = self.walk(lists, (pb, ph, pm), [fill(f32(-INF), empty(rows_t))], largest, reach)
        # A row that sees no key keeps m = 0, as the forward does.
        m = self.generic([(top, ROW)], rows_t, lambda a: arith.select(
            arith.cmpf(arith.CmpFPredicate.OEQ, a[0], f32(-INF)), f32(0.0), a[0]), rank=1)

        def sums(nb, acc, masked):
            n0, _, qk, dp = products(nb)
            x = self.online_modded(qk, pb, ph, m0, n0)
            where = (pb, ph, m0, n0, masked)
            p = self.generic([(x, TILE), (m, ROW)], tile_t,
                             lambda a: self.online_masked(self.inline(self.prob, [a[0], a[1]]), *where))
            dm = self.generic([(x, TILE), (m, ROW)], tile_t, lambda a: self.online_masked(
                self.inline(self.prob_grad, [a[0], a[1], f32(1.0)], result=1), *where))

            def first_max(a):
                at_max = arith.cmpf(arith.CmpFPredicate.OEQ, a[0], a[1])
                return self.online_masked(arith.select(at_max, self.key_position(m0, n0, False), f32(INF)), *where,
                                          fallback=INF)

            keys = self.generic([(x, TILE), (m, ROW)], tile_t, first_max)
            times = [self.generic([(t, TILE), (dp, TILE)], tile_t, lambda a: arith.mulf(a[0], a[1])) for t in (p, dm)]
            return [combine(acc[0], p), combine(acc[1], times[0]), combine(acc[2], times[1]), combine(acc[3], dm),
                    combine(acc[4], keys, self.row_min, arith.minimumf)]

        state = [zeros([bm]) for _ in range(4)] + [fill(f32(INF), empty(rows_t))]
        total, weighted, slope_weighted, slopes, key = self.walk(lists, (pb, ph, pm), state, sums, reach)
        rscale, delta = self.online_rows(total, weighted)
        dmax = self.generic([(rscale, ROW), (slope_weighted, ROW), (delta, ROW), (slopes, ROW)], rows_t,
                            lambda a: arith.addf(arith.mulf(a[0], a[1]), arith.mulf(a[2], a[3])), rank=1)
        rows = {"rowmax": m, "rscale": rscale, "delta": delta, "maxkey": key, "dmax": dmax}

        def gradients(nb, acc, masked):
            n0, k_tile, qk, dp = products(nb)
            _, ds, dx = self.max_tile_gradients(qk, dp, rows, pb, ph, m0, n0, masked, with_probs=False)
            closures = self.scatter_closure_grads(qk, dx, acc[1:], pb, ph, m0, n0, masked) if acc[1:] else []
            return [matmul(self.to_input_type(ds), k_tile, acc[0])] + closures

        dq, *closures = self.walk(lists, (pb, ph, pm), [zeros([bm, self.dk])] + list(closure_dests), gradients, reach)
        results = [q_rows.store(self.scaled(dq, self.scale), dests[0], ph, m0, bm)]
        roles = abi.backward_roles("dq", "online", "max")[1][1:]
        results += [q_rows.store(rows[r], dest, ph, m0, bm) for r, dest in zip(roles, dests[1:])]
        func.ReturnOp(results + closures)

    def row_max(self, value):
        from mlir.dialects import arith

        return self.reduce_rows(value, fill(f32(-INF), empty(tensor_type([value.type.shape[0]]))), arith.maximumf)

    def row_min(self, value):
        from mlir.dialects import arith

        return self.reduce_rows(value, fill(f32(INF), empty(tensor_type([value.type.shape[0]]))), arith.minimumf)
