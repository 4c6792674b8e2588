"""The backward of linear attention as three more runs of the compiled forward recurrence: its
gradients are linear attention too.

With G_t = g_0 + ... + g_t and the state unscaled, the forward is

    o_t = scale * (sum_{s<=t} (q_t . k_s) e^{G_t - G_s} v_s + e^{G_t} q_t S0)
    S_L = sum_s e^{G_L - G_s} k_s v_s^T + e^{G_L} S0            (L the last token)

so, with dO and dS_L the incoming gradients,

    dq_t = scale * (sum_{s<=t} (dO_t . v_s) e^{G_t - G_s} k_s + e^{G_t} dO_t S0^T)
    dk_s = scale * (sum_{t>=s} (v_s . dO_t) e^{G_t - G_s} q_t + e^{G_L - G_s} v_s (dS_L / scale)^T)
    dv_s = scale * (sum_{t>=s} (k_s . q_t) e^{G_t - G_s} dO_t + e^{G_L - G_s} k_s (dS_L / scale))

dq is the forward on (q, k, v, S0) = (dO, v, k, S0^T) with the same decay. dk and dv are the
forward in reversed time: token w of the run is token L - w, and the decay of step w is
g'_w = g_{L-w+1} (g'_0 = 0), so the run's e^{G'} factors are the e^{G_t - G_s} above and its
initial state enters as e^{G_L - G_s}: dk on (v, dO, q, dS_L^T / scale), dv on (k, q, dO,
dS_L / scale), both flipped along L. The dv run's final state is sum_t e^{G_t - g_0} q_t dO_t^T
+ e^{G_L - g_0} dS_L / scale, so d(S0) = scale * e^{g_0} times it. Every exponent the runs take is
a sum of consecutive g <= 0, as in the forward, so nothing overflows. With RetNet's constant
decay ("head") and no dS_L, the reversed runs keep that decay as it is: the shift changes no
pair's factor, only the initial state's, and there is none.

The decay's gradient follows from G: the output at t grows with G_t through q_t, a key s shrinks
with G_s, and the final state grows with G_L, so dL/dG_t = q_t . dq_t - k_t . dk_t (+ dS_L . S_L at
t = L), and dg_u = sum_{t >= u} dL/dG_t (computed in float32 from the runs' outputs).

Packed sequences run packed: reversed, the sequences come in reverse order (offsets T - flip(cu)),
each one's g' shifted within it, the initial and final states per sequence reordered to match, and
g's sums end at each sequence's end.

The q/k/v mods are element-wise: they are applied with torch in float32 (rounded to the inputs'
dtype, as the kernel rounds them) and differentiated by autograd, which also gives the gradients
of the closure tensors they read. `normalize=True` runs once more to get the numerator and
denominator (`_normalized_gradients`). The reference backend keeps the torch recomputation of
`linear_backward`.

GLA's per-dimension decay ("token_dim", G_t a vector over Dk) gives the same formulas with the
factor e^{G_t[i] - G_s[i]} inside each product, and dq and dk indexed by i:

    dq_t[i] = scale * sum_{s<=t} (dO_t . v_s) e^{G_t[i] - G_s[i]} k_s[i]   (+ the S0 term)

the decay is on the output side of the run on (dO, v, k): the state's columns. The recurrence
op's "token_value_dim" decay is that recurrence, S_t = S_{t-1} diag(e^{g_t}) + k_t^T v_t, so dq
and dk run it (on g and the reversed g'), and dv runs "token_dim" reversed; d(S0)'s factor is
e^{g_0} per state row, and dg is q * dq - k * dk per dimension, summed over later tokens.
"""
from __future__ import annotations

import functools
import math

import torch

from .linear_backward import LinearCall, apply_mod


def applies(call: LinearCall, q) -> bool:
    """Whether `call`'s backward runs as forward kernels (module docstring)."""
    # scale = 0 would divide the state's gradient by 0 on its way through the runs.
    return call.backend != "reference" and q.dtype != torch.float64 and call.scale != 0


@functools.lru_cache(maxsize=None)
def _plain(decay: str | None, scale: float, chunk_size: int):
    """The forward recurrence without mods that the gradients run on."""
    from .linear_api import linear_attention

    return linear_attention._recurrence(decay, scale, chunk_size)


def plain_module(decay, scale, chunk_size, q, k, v, g, s0, out_dtype, packing=None) -> str:
    """The L0 module of one run: the plain recurrence with its output in `out_dtype`, on packed
    sequences where `packing` (offsets int32 [S + 1], the longest sequence's bucket) is given."""
    signature = tuple(None if t is None else (tuple(t.shape), t.dtype) for t in (q, k, v, g, s0))
    packed = None if packing is None else (packing[0].shape[0], packing[1])
    return _module_text(decay, scale, chunk_size, signature, out_dtype, packed)


@functools.lru_cache(maxsize=256)
def _module_text(decay, scale, chunk_size, signature: tuple, out_dtype, packed) -> str:
    # Kept per signature: building and hashing the module took about 0.5 ms a run, more than a
    # run of B8 H16 L2048 D128 takes on an H200.
    from .varlen import Sequences

    tensors = [None if sig is None else torch.empty(sig[0], dtype=sig[1], device="meta") for sig in signature]
    sequences = None
    if packed is not None:
        cu = torch.empty(packed[0], dtype=torch.int32, device="meta")
        sequences = Sequences(cu, cu, cu[1:], packed[1], packed[1])
    return _plain(decay, scale, chunk_size)._build(*tensors, out_dtype=out_dtype, sequences=sequences)[0]


def run_operands(g, s0, packing) -> list:
    """The operands of a run after q, k, v, as the module takes them: g, the initial state, and
    for packed sequences their lengths and offsets."""
    rest = [t for t in (g, s0) if t is not None]
    if packing is not None:
        cu = packing[0]
        rest += [(cu[1:] - cu[:-1]).contiguous(), cu]
    return rest


def run_plain(backend: str, decay, scale, chunk_size, q, k, v, g, s0, out_dtype, reverse: bool = False,
              packing=None, like=None):
    """(out in `out_dtype`, final state) of the plain recurrence on `backend`; with `reverse`, of
    q, k, v read from their last token to their first, the output written in their order (g, the
    initial state and `packing`'s offsets as given, already in the run's order), the output on the GPU
    laid out like `like` where its shape is the output's. GPU kernels read
    and write the tensors backwards in place (`kernel_args.ReversedRows`); the CPU runs on flipped
    copies."""
    text = plain_module(decay, scale, chunk_size, q, k, v, g, s0, out_dtype, packing)
    rest = run_operands(g, s0, packing)
    if backend != "triton":
        from .api import _execute

        if reverse:
            q, k, v = (t.flip(2) for t in (q, k, v))
        out, state = _execute(text, [q, k, v] + rest, backend, out_dtype)
        return (out.flip(2) if reverse else out), state
    from .. import runtime
    from ..backends import triton as tb
    from ..kernel_args import ReversedRows

    def rows(t):
        return ReversedRows(t) if reverse else t

    out = run_output((*q.shape[:3], v.shape[3]), out_dtype, q.device, like)
    _, state = runtime.launch(tb.get_bundle(text, runtime.current_target()), rows(q), rows(k), rows(v), *rest,
                              out=rows(out))
    return out, state


def run_output(shape, dtype, device, like=None):
    """An empty output of a run, laid out like `like` where its shape is `shape`: the
    element-wise work on both that follows (dg's q * dq - k * dk) then walks operands of one
    layout; q as a [B, H, T, D] view of [B, T, H, D] against a contiguous dq took 0.46 ms of
    GLA's step on an H200, 0.29 after."""
    if like is None or tuple(like.shape) != tuple(shape):
        return torch.empty(shape, dtype=dtype, device=device)
    return torch.empty_like(like, dtype=dtype)


def gradients(call: LinearCall, tensors: tuple, grads: tuple, wanted, final_state, run=None) -> list:
    """As `linear_backward.gradients` (same arguments and result), from forward runs; `final_state`
    is the forward's (read only with a state gradient and a decay gradient wanted); `run` replaces
    `run_plain` without its first argument (tests interpret the Triton kernels with it)."""
    q, k, v, g, s0 = tensors
    d_out, d_state = grads
    run = run or functools.partial(run_plain, call.backend)
    order = _Order(call.packing, q)
    sources = list(call.sources)
    wanted = list(wanted)
    with torch.enable_grad():
        leaves, applied, modded = [], [], []
        for (fn, arity), x, w in zip(call.mods, (q, k, v), wanted[:3]):
            if fn is None:
                leaves.append(None)
                applied.append(None)
                modded.append(x.detach())
                continue
            leaf = x.detach().float().requires_grad_(w)
            y = apply_mod(fn, arity, leaf, order.grid(leaf))
            leaves.append(leaf)
            applied.append(y)
            modded.append(y.detach().to(x.dtype))
    qm, km, vm = modded
    if call.normalize:
        dqm, dkm, dvm, dg, ds0 = _normalized_gradients(call, order, qm, km, vm, g, s0, d_out, d_state, wanted, run)
    else:
        dqm, dkm, dvm, dg, ds0 = _recurrence_gradients(call, order, qm, km, vm, g, s0, d_out, d_state, final_state,
                                                       wanted, run)
    result = [None] * len(wanted)
    pairs = [(y, d) for y, d in zip(applied, (dqm, dkm, dvm)) if y is not None and y.requires_grad]
    targets = [(i, t) for i, t in enumerate(leaves + [None, None] + sources) if t is not None and wanted[i]]
    if pairs and targets:
        found = torch.autograd.grad([y for y, _ in pairs], [t for _, t in targets],
                                    [d.to(y.dtype) for y, d in pairs], allow_unused=True)
        for (i, _), grad in zip(targets, found):
            result[i] = grad
    for i, d in enumerate((dqm, dkm, dvm)):
        if leaves[i] is None and wanted[i]:
            result[i] = d
    result[3] = dg if wanted[3] else None
    result[4] = ds0 if wanted[4] else None
    originals = [q, k, v, g, s0] + sources
    return [None if r is None else r.to(t.dtype) for r, t in zip(result, originals)]


def _recurrence_gradients(call, order, q, k, v, g, s0, d_out, d_state, final_state, wanted, run):
    """(dq, dk, dv, dg, d(initial state)) of the plain recurrence on mod-applied q, k, v, each None
    where nothing needs it."""
    b, h, length, _ = q.shape
    mods_wanted = any(wanted[5:])
    need_g = wanted[3] and g is not None
    # g's gradient reads dq and dk; a closure tensor's, the gradients of the inputs its mod maps.
    need = [wanted[i] or (need_g and i < 2) or (mods_wanted and call.mods[i][0] is not None) for i in range(3)]
    need_s0 = wanted[4] and s0 is not None
    scale, chunk = call.scale, call.chunk_size
    no_output_gradient = d_out is None
    d_out = torch.zeros((b, h, length, v.shape[3]), dtype=q.dtype, device=q.device) if d_out is None \
        else d_out.to(q.dtype)
    # g's gradient sums q . dq - k . dk over up to L tokens, where 16-bit dq and dk would cancel
    # to a few percent of it: those two are then kept in float32.
    wide = torch.float32 if need_g else q.dtype
    dq = dk = dv = ds0 = None
    per_dim = call.decay == "token_dim"
    # dq and dk decay the side of the state they read out: the values' for GLA's runs (module
    # docstring), whose kernels take that decay as "token_value_dim".
    out_side = "token_value_dim" if per_dim else call.decay
    if need[0] and no_output_gradient:
        dq = torch.zeros(q.shape, dtype=wide, device=q.device)
    elif need[0]:
        st = None if s0 is None else s0.transpose(-1, -2).contiguous()
        dq, _ = run(out_side, scale, chunk, d_out, v, k, g, st, wide, packing=order.packing, like=q)
    if need[1] or need[2] or need_s0:
        if call.decay == "head" and d_state is None:
            # A constant g makes the shift a no-op on every pair's e^{G'_t - G'_s}: it changes
            # only the initial state's factor e^{G'_t}, and without dS_L there is no initial state.
            # So the runs keep RetNet's decay and need no summed per-token g'.
            g_rev, decay_rev = g, "head"
        else:
            g_rev = None if call.decay is None else order.reversed_decay(call.decay, g)
            decay_rev = None if call.decay is None else "token_dim" if per_dim else "token"
        carried = None if d_state is None else order.reversed_states(d_state.float() / scale)
        packing = order.reversed_packing
        if need[1]:
            st = None if carried is None else carried.transpose(-1, -2).contiguous()
            dk_decay = out_side if per_dim else decay_rev  # reversed, dk reads the values' side too
            dk, _ = run(dk_decay, scale, chunk, v, d_out, q, g_rev, st, wide, reverse=True, packing=packing,
                        like=k)
        if need[2] or need_s0:
            dv, state = run(decay_rev, scale, chunk, k, q, d_out, g_rev, carried, q.dtype, reverse=True,
                            packing=packing, like=v)
            if need_s0:
                ds0 = scale * order.reversed_states(state.float())
                if call.decay is not None:
                    ds0 = ds0 * order.first_decay(call.decay, g)
    dg = None
    if need_g:
        # dq and dk are float32 here: each product promotes q or k inside its kernel, with no
        # float32 copy of them written first.
        if per_dim and order.packing is None:
            sums = ReverseSums(q, torch.float32)  # -dL/dG written straight into the sums' buffer
            torch.mul(k, dk, out=sums.negated).addcmul_(q, dq, value=-1)
            dg = sums.result()
        else:
            rate = torch.addcmul(q * dq, k, dk, value=-1)  # dL/dG, [B, H, L, Dk]
            dg = order.sum_after(rate if per_dim else rate.sum(-1))
        if d_state is not None:
            grows = (d_state.float() * final_state.float()).sum(-1)  # with G_L, [B, H, Dk]
            dg = dg + order.per_token(grows if per_dim else grows.sum(-1))
        if call.decay == "head":
            dg = dg.sum((0, 2))
    return dq, dk, dv, dg, ds0


def _normalized_gradients(call, order, q, k, v, g, s0, d_out, d_state, wanted, run):
    """`_recurrence_gradients` of the normalized form o = num / den. With a column of ones after
    v (and of zeros after the initial state: the key sum starts at 0), one unscaled run gives
    [num, den] and its state [S, z]; the gradients are those of that run with dnum = dO / den and
    dden = -(dO . o) / den, the ones' and zeros' own gradients dropped."""
    import dataclasses

    def widened(x, fill):
        return None if x is None else torch.cat([x, torch.full_like(x[..., :1], fill)], dim=-1)

    plain = dataclasses.replace(call, normalize=False, scale=1.0)
    # The runs take dnum and dden as operands, whose terms in dq cancel (dnum_t . v_s + dden_t):
    # 16-bit operands would leave errors of |dO . o| / den in them, so these runs are float32.
    q, k, v = (t.float() for t in (q, k, v))
    v1, s01 = widened(v, 1.0), widened(s0, 0.0)
    both, state = run(call.decay, 1.0, call.chunk_size, q, k, v1, g, s01, torch.float32, packing=order.packing)
    num, den = both[..., :-1], both[..., -1:]
    d_out = torch.zeros_like(num) if d_out is None else d_out.float()
    d_both = torch.cat([d_out / den, -(d_out * num).sum(-1, keepdim=True) / (den * den)], dim=-1)
    dq, dk, dv, dg, ds0 = _recurrence_gradients(plain, order, q, k, v1, g, s01, d_both, widened(d_state, 0.0),
                                                state, wanted, run)
    return dq, dk, None if dv is None else dv[..., :-1], dg, None if ds0 is None else ds0[..., :-1]


class _Order:
    """The tokens' order as the runs see it: each batch entry one sequence ([B, H, L] tokens,
    states [B, ...]), or packed sequences ([1, H, T] tokens, states [S, ...], offsets `cu`).
    Reversed, packed sequences come in reverse order too (offsets T - flip(cu))."""

    def __init__(self, packing, q):
        self.batch, self.tokens = q.shape[0], q.shape[2]
        self.device = q.device
        self.packing = self.reversed_packing = None
        if packing is not None:
            from .linear_backward import packed_positions

            cu, longest = packing
            cu = cu.to(q.device)
            self.packing = (cu, longest)
            self.reversed_packing = ((self.tokens - cu.flip(0)).to(torch.int32).contiguous(), longest)
            self.cu = cu.long()
            self.seq, self.at = packed_positions(self.cu, longest, self.tokens)

    def grid(self, x):
        """The index grids a five-argument mod sees on x (None: each axis's positions)."""
        if self.packing is None:
            return None
        from .linear_backward import packed_grid

        return packed_grid(self.seq, self.at, x)

    def per_token(self, x):
        """x [B or S, H(, Dk)] per sequence, as [B, H, L(, Dk)] per token."""
        if self.packing is None:
            return x.unsqueeze(2)
        return x[self.seq].transpose(0, 1).unsqueeze(0)

    def reversed_states(self, states):
        return states if self.packing is None else states.flip(0)

    def reversed_decay(self, decay, g):
        """g' of the reversed runs, per token: the decay of the token after, in the original order,
        within its sequence, and 0 at each sequence's last token (its first in reverse)."""
        per_token = g.view(1, -1, 1).expand(self.batch, -1, self.tokens) if decay == "head" else g
        # One gather writes g' whole (a flip and a concatenation took two passes and 0.3 ms of
        # GLA's step on an H200): token w reads token L - w, token 0 a placeholder set to 0.
        # In g's memory order, so that the gather reads and writes one layout (g' then has g's).
        source = torch.arange(self.tokens, 0, -1, device=self.device).clamp_(max=self.tokens - 1)
        order = memory_order(per_token)
        shifted = per_token.permute(order).index_select(order.index(2), source).permute(_inverse(order))
        shifted.narrow(2, 0, 1).zero_()
        if self.packing is None:
            return shifted
        starts = torch.zeros(self.tokens + 1, dtype=torch.bool, device=self.device)
        starts[self.reversed_packing[0][:-1].long()] = True
        zero = torch.zeros((), dtype=shifted.dtype, device=self.device)
        starts = starts[:-1].view(-1, *[1] * (shifted.dim() - 3))  # along tokens, dim 2
        return torch.where(starts, zero, shifted).contiguous()

    def first_decay(self, decay, g):
        """e^{g} at each sequence's first token (1 for an empty one), as [B or S, H, 1, 1] ([B or S,
        H, Dk, 1] for "token_dim": one factor per state row)."""
        if self.packing is None:
            if decay == "token_dim":  # one factor per state row
                return torch.exp(g[:, :, 0].float()).unsqueeze(-1)
            first = g.float().view(1, -1) if decay == "head" else g[..., 0].float()
            return torch.exp(first).view(first.shape[0], -1, 1, 1)
        lengths = self.cu[1:] - self.cu[:-1]
        if decay == "head":
            first = g.float().view(1, -1).expand(lengths.shape[0], -1)
        else:
            first = g[0, :, self.cu[:-1].clamp(max=self.tokens - 1)].float().transpose(0, 1)
        live = (lengths > 0).view(-1, *[1] * (first.dim() - 1))
        factor = torch.where(live, torch.exp(first), torch.ones((), device=self.device))
        return factor.unsqueeze(-1) if decay == "token_dim" else factor.view(lengths.shape[0], -1, 1, 1)

    def sum_after(self, rate):
        """sum over t >= u of rate[..., t] within u's sequence, for every token u."""
        if self.packing is None:
            return reverse_cumsum(rate)
        # One sum over all the packed tokens, less the part past each sequence's end: in float64,
        # so that the rounding does not grow with the other sequences' lengths.
        after = reverse_cumsum(rate.double())
        ends = self.cu[self.seq + 1]  # where each token's sequence ends
        padded = torch.cat([after, torch.zeros_like(after.narrow(2, 0, 1))], dim=2)
        return (after - padded.index_select(2, ends)).to(rate.dtype)


def memory_order(x) -> list:
    """x's dims from outermost to innermost in memory: the order in which x is contiguous when it
    is a permutation of a dense tensor, else x's own order."""
    order = sorted(range(x.dim()), key=lambda d: (-x.stride(d), d))
    return order if x.permute(order).is_contiguous() else list(range(x.dim()))


def _inverse(order: list) -> list:
    return sorted(range(len(order)), key=order.__getitem__)


class ReverseSums:
    """sum over t >= u of x[:, :, t] for every token u, x [B, H, L(, D)], in x's memory order
    (`like`'s), where every pass reads and writes contiguous memory: torch's scans copy other
    layouts to contiguous ones first, and element-wise ops over operands of two layouts (or one
    broadcast) leave the vectorized kernels. On an H200 those passes took 0.46 ms of GLA's step
    (B 8, H 16, L 2048, D 128, [B, T, H, D] storage); a scan over all of L takes one sequential
    thread per column (0.81 ms there), so the sums run in blocks of `block` tokens.

    In memory order x is [outer, L, inner]. A buffer of outer * N + 1 rows (N: L rounded up to
    blocks) holds -x one row late (`negated`, which the caller fills), so each block of the
    buffer starts with a row free of its own tokens: `result()` puts there the sum of x from the
    block on (its carry, summed in float64 from the blocks' totals), and a scan of each block
    gives the carry less the block's earlier tokens, the sum from each token on."""

    def __init__(self, like, dtype, block: int = 64):
        self.order = memory_order(like)
        sizes = [like.shape[d] for d in self.order]
        at = self.order.index(2)
        self.outer_sizes, self.inner_sizes = sizes[:at], sizes[at + 1:]
        self.length, self.block = like.shape[2], block
        self.blocks = -(-self.length // block)
        self.outer, self.inner = math.prod(self.outer_sizes), math.prod(self.inner_sizes)
        rows = self.blocks * block
        self.flat = torch.empty(self.outer * rows + 1, self.inner, dtype=dtype, device=like.device)
        self.late = self.flat[1:].view(self.outer, self.blocks, block, self.inner)
        late = self.late.view(self.outer, rows, self.inner)
        late.narrow(1, self.length, rows - self.length).zero_()
        self.negated = self._logical(late.narrow(1, 0, self.length))

    def _logical(self, rows):
        """[outer, L, inner] rows as x's [B, H, L(, D)] view."""
        return rows.view(*self.outer_sizes, self.length, *self.inner_sizes).permute(_inverse(self.order))

    def result(self):
        # Each block's total (negated) in its own dtype: a float64 sum of float32 rows first
        # copies them all to float64 (0.14 ms of GLA's step on an H200); the carries, sums over up
        # to L tokens, are summed in float64.
        blocks = self.late.sum(2).double()
        carries = blocks.flip(1).cumsum(1).flip(1).neg_()
        tiles = self.flat[:-1].view(self.outer, self.blocks, self.block, self.inner)
        tiles.select(2, 0).copy_(carries)
        sums = tiles.cumsum(2).view(self.outer, self.blocks * self.block, self.inner)
        return self._logical(sums.narrow(1, 0, self.length))


def reverse_cumsum(x, block: int = 64):
    """sum over t >= u of x[:, :, t] for every u, x [B, H, L(, D)] in any layout (ReverseSums)."""
    sums = ReverseSums(x, x.dtype, block)
    torch.neg(x, out=sums.negated)
    return sums.result()
