"""The backward tiles and the dQ kernel's loop of a user's online normalizer without a running max
(RetNet's division by max(|l|, 1), or any prob/finalize pair), for `attn-tile-backward`.

With p = prob(x, 0) of the modified scores x, l = rowsum(p) and the output finalize(acc, l),
linear in acc (rscale = finalize(1, l) per row), the gradient of a score is
dS = c (rscale dP + delta), where c = dp/ds (prob's slope through the score_mod's) and
delta = d finalize(1, l) / dl * rowsum(p dP): prob_grad, score_mod_grad and finalize_grad are
linear in their incoming gradient. No forward statistic is saved: the dQ kernel sums l, rowsum(p dP),
A = (c dP) K and B = c K over the row's KV tiles, writes dQ = scale (rscale A + delta B), and hands
rscale and delta to the dK/dV kernel (abi.ONLINE_BACKWARD_KERNELS), which forms
P = rscale p for dV and dS for dK.
"""
from __future__ import annotations

from .l1_builders import convert, f32, index, matmul, tensor_type, zeros
from .tile_backward_tiles import ROW, TILE, TileGradients


class OnlineGradients(TileGradients):
    """Needs, besides TileGradients' fields, the normalizer's regions prob, finalize, prob_grad and
    finalize_grad (attn.normalize_grad's), and from the kernel builder bm, bn, dk, dv, elt,
    to_input_type and walk."""

    def online_modded(self, qk, pb, h, m0, n0, keys_first: bool = False):
        """The modified scores x = score_mod(scale qk) of a tile."""
        from mlir.dialects import arith

        def modded(a):
            s = arith.mulf(a[0], f32(self.scale))
            if self.score_mod is None:
                return s
            qi, kj, qc, kc = self.positions(m0, n0, keys_first)
            return self.inline(self.score_mod, [s, pb, h, qc, kc])

        return self.generic([(qk, TILE)], tensor_type(list(qk.type.shape)), modded)

    def online_masked(self, value, pb, h, m0, n0, masked: bool, keys_first: bool = False, fallback: float = 0.0):
        """`value` (built inside a tile's generic), `fallback` at the pairs the mask or the sequences drop."""
        from mlir.dialects import arith

        if not masked:
            return value
        qi, kj, qc, kc = self.positions(m0, n0, keys_first)
        # A masked pair's local derivative may be inf or NaN: select, do not multiply.
        return arith.select(self.keep(pb, h, qi, kj, qc, kc), value, f32(fallback))

    def online_tile(self, qk, pb, h, m0, n0, masked: bool, keys_first: bool = False):
        """(p, c) of a tile under a user's online normalizer without a running max: p = prob(x, 0)
        of the modified scores x, and c = dp/ds, prob's slope at x through the score_mod's at
        s, both 0 at masked pairs. prob_grad and score_mod_grad are linear in their incoming
        gradient, so dS = c (rscale dP + delta) for the per-row rscale and delta (abi's
        ONLINE_BACKWARD_KERNELS)."""
        from mlir.dialects import arith

        tile_t = tensor_type(list(qk.type.shape))
        where = (pb, h, m0, n0, masked, keys_first)
        x = self.online_modded(qk, pb, h, m0, n0, keys_first)
        p = self.generic([(x, TILE)], tile_t, lambda a: self.online_masked(self.inline(self.prob, [a[0], f32(0.0)]),
                                                                           *where))

        def slope(a):
            c = self.inline(self.prob_grad, [a[1], f32(0.0), f32(1.0)])
            if self.score_mod_grad is not None:
                qi, kj, qc, kc = self.positions(m0, n0, keys_first)
                c = self.inline(self.score_mod_grad, [arith.mulf(a[0], f32(self.scale)), c, pb, h, qc, kc])
            return self.online_masked(c, *where)

        return p, self.generic([(qk, TILE), (x, TILE)], tile_t, slope)

    def accumulate_rows(self, total, tile, reduce=None, combine=None):
        """`total` (a row vector) combined (added by default) with the rows of `tile` reduced by
        `reduce` (row sums by default)."""
        from mlir.dialects import arith

        reduced = (reduce or self.row_sum)(tile)
        return self.generic([(total, ROW), (reduced, ROW)], tensor_type(list(total.type.shape)),
                            lambda a: (combine or arith.addf)(a[0], a[1]), rank=1)

    def online_rows(self, total, products):
        """(rscale, delta) per query row from l = rowsum(p) and rowsum(p * dP): finalize(1, l) and
        finalize's derivative in l at acc = 1 times rowsum(p * dP) (finalize is linear in acc)."""
        rows_t = tensor_type(list(total.type.shape))
        rscale = self.generic([(total, ROW)], rows_t, lambda a: self.inline(self.finalize, [f32(1.0), a[0]]), rank=1)
        delta = self.generic([(total, ROW), (products, ROW)], rows_t,
                             lambda a: self.inline(self.finalize_grad, [f32(1.0), a[0], a[1]], result=1), rank=1)
        return rscale, delta

    def online_gradients(self, qk_t, dp_t, rows, pb, h, m0, n0, masked: bool):
        """(P^T, dS^T) of a transposed tile under a user's online normalizer, from `rows`, the
        rscale and delta the dQ kernel wrote by role: P = rscale p, dS = c (rscale dP + delta)."""
        from mlir.dialects import arith

        tile_t = tensor_type(list(qk_t.type.shape))
        p_t, c_t = self.online_tile(qk_t, pb, h, m0, n0, masked, keys_first=True)
        rscale, delta = ((rows[r], (1,)) for r in ("rscale", "delta"))
        probs = self.generic([(p_t, TILE), rscale], tile_t, lambda a: arith.mulf(a[0], a[1]))
        ds = self.generic([(c_t, TILE), (dp_t, TILE), rscale, delta], tile_t,
                          lambda a: arith.mulf(a[0], arith.addf(arith.mulf(a[2], a[1]), a[3])))
        return probs, ds

    def online_dq(self, q_tile, do_tile, sides, kv, program, lists, dests, closure_dests, reach) -> None:
        """The dQ kernel's loop and results under a user's online normalizer without a running
        max: over the row's KV tiles it sums l = rowsum(p), rowsum(p dP), A = (c dP) K and
        B = c K, and at the end writes dQ = scale (rscale A + delta B) with the rows' rscale and
        delta (`online_rows`), which the dK/dV kernel reads; with closure gradients, a second
        walk adds each score's share into `closure_dests`."""
        from mlir.dialects import arith, func

        q_rows, k_rows = sides
        k, v = kv
        pb, ph, hk, pm, m0 = program
        dq_dest, delta_dest, rscale_dest = dests
        bm, bn = self.bm, self.bn
        tile_t = tensor_type([bm, bn])
        add_rows = self.accumulate_rows

        def step(nb, acc, masked):
            n0 = arith.muli(nb, index(bn))
            k_tile, qk, dp = self.key_tile_products(q_tile, do_tile, k_rows, (k, v), hk, n0)
            p, c = self.online_tile(qk, pb, ph, m0, n0, masked)
            weighted = self.generic([(p, TILE), (dp, TILE)], tile_t, lambda a: arith.mulf(a[0], a[1]))
            sloped = self.generic([(c, TILE), (dp, TILE)], tile_t, lambda a: arith.mulf(a[0], a[1]))
            return [matmul(self.to_input_type(sloped), k_tile, acc[0]), matmul(self.to_input_type(c), k_tile, acc[1]),
                    add_rows(acc[2], p), add_rows(acc[3], weighted)]

        state = [zeros([bm, self.dk]), zeros([bm, self.dk]), zeros([bm]), zeros([bm])]
        a_acc, b_acc, total, products = self.walk(lists, (pb, ph, pm), state, step, reach)
        rscale, delta = self.online_rows(total, products)
        dq = self.generic([(a_acc, TILE), (b_acc, TILE), (rscale, ROW), (delta, ROW)],
                          tensor_type([bm, self.dk], self.elt),
                          lambda a: convert(arith.mulf(arith.addf(arith.mulf(a[2], a[0]), arith.mulf(a[3], a[1])),
                                                       f32(self.scale)), self.elt))
        closures = []
        if self.closure_grads:
            # The scores' gradients need the rows' rscale and delta, known only now: a second
            # walk over the row's tiles scatters the closure tensors' shares.
            def scatter(nb, acc, masked):
                n0 = arith.muli(nb, index(bn))
                _, qk, dp = self.key_tile_products(q_tile, do_tile, k_rows, (k, v), hk, n0)
                x = self.online_modded(qk, pb, ph, m0, n0)
                where = (pb, ph, m0, n0, masked)
                dm = self.generic([(x, TILE), (dp, TILE), (rscale, ROW), (delta, ROW)], tile_t, lambda a: self.online_masked(
                    arith.mulf(self.inline(self.prob_grad, [a[0], f32(0.0), f32(1.0)]),
                               arith.addf(arith.mulf(a[2], a[1]), a[3])), *where))
                return self.scatter_closure_grads(qk, dm, acc, pb, ph, m0, n0, masked)

            closures = self.walk(lists, (pb, ph, pm), list(closure_dests), scatter, reach)
        func.ReturnOp([q_rows.store(dq, dq_dest, ph, m0, bm), q_rows.store(delta, delta_dest, ph, m0, bm),
                       q_rows.store(rscale, rscale_dest, ph, m0, bm)] + closures)
