"""Autograd for `ae_mlir.linear_attention`: the forward is the compiled kernel. The backward is
more runs of the compiled recurrence (`linear_kernel_backward`); on the reference backend (and
for float64 inputs, or scale = 0) it is torch differentiating a chunked recomputation of the
same recurrence, as follows.

The recomputation runs, under `torch.enable_grad()`, in float32 (float64 for float64 inputs):
the user's q/k/v mods applied with torch (the same Python functions the tracer captured, called
on real tensors and index grids), then the recurrence of DESIGN.md section 3 in chunks of the
call's chunk size, as `attn-chunk-recurrence` evaluates it. Per chunk of C tokens, G the
cumulative log-decay inside the chunk and S the state entering it:

    A      = [s <= t] * sum_d q[t,d] k[s,d] exp(G[t,d] - G[s,d])       [C, C]
    o      = scale * (A @ v + (q * exp(G)) @ S)
    S_next = exp(G_end) * S + (k * exp(G_end - G))^T @ v

(`normalize` divides A @ v + (q exp(G)) @ S by the same with v = 1, the key sum z starting at 0).
Every exponent is <= 0 for decays g <= 0, and the exponent of a pair s > t is replaced by 0 before
`exp`, so neither the values nor their gradients overflow. Only the chunk-to-chunk state update is
a Python loop; the [C, C] tiles of every chunk are batched. `torch.autograd.grad` then gives the
gradients of q, k, v, g, the initial state and the floating closure tensors the mods read.

Memory: the recorded graph holds O(B H L (D + C)) values (chunk tiles, decayed q and k) and the
ceil(L / C) states entering the chunks, O(B H (L / C) Dk Dv); no [L, L] tile exists. The
per-dimension decay ("token_dim") has a [C, C, Dk] product per chunk, which is recomputed in the
backward (`torch.utils.checkpoint`) rather than kept.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class LinearCall:
    """One call of a `linear_attention`: what the backward needs to recompute it."""

    mods: tuple  # (fn or None, arity) for q, k, v
    decay: str | None
    scale: float
    normalize: bool
    chunk_size: int
    run: Callable  # () -> (out, state): the compiled kernel on the call's (detached) tensors
    sources: tuple  # the closure tensors the mods read, as they read them
    current_sources: Callable  # () -> the closure tensors the mods read now (traced again)
    packing: tuple | None = None  # packed sequences: (offsets int32 [S + 1], the longest sequence)
    backend: str = "reference"  # where the forward ran; the kernel backward runs there too


def apply_mod(fn, arity: int, x, grid: list | None = None):
    """fn applied elementwise to x [B, H, L, D], with index grids (b, h, t, d) for five-argument
    mods (`grid`, broadcastable to x, or each axis's positions), as a tensor of x's shape and
    dtype."""
    if fn is None:
        return x
    if arity == 1:
        y = fn(x)
    else:
        if grid is None:
            grid = []
            for axis, n in enumerate(x.shape):
                shape = [1] * 4
                shape[axis] = n
                grid.append(torch.arange(n, device=x.device).view(shape))
        y = fn(x, *grid)
    if not isinstance(y, torch.Tensor):
        y = torch.as_tensor(y, device=x.device)
    return y.to(x.dtype).expand(x.shape)


def _pair_product(q, k, G):
    """[..., C, C]: [s <= t] * sum_d q[t,d] k[s,d] exp(G[t,d] - G[s,d]) (per-dimension decay)."""
    c = q.shape[-2]
    keep = torch.ones(c, c, dtype=torch.bool, device=q.device).tril().unsqueeze(-1)
    diff = torch.where(keep, G.unsqueeze(-2) - G.unsqueeze(-3), torch.zeros((), dtype=G.dtype, device=G.device))
    prod = q.unsqueeze(-2) * k.unsqueeze(-3) * torch.exp(diff)
    return torch.where(keep, prod, torch.zeros((), dtype=prod.dtype, device=prod.device)).sum(-1)


def chunked_recurrence(q, k, v, g, s0, decay, scale: float, normalize: bool, chunk_size: int, lengths=None):
    """(out [B, H, L, Dv], final state [B, H, Dk, Dv]) of the recurrence on mod-applied q, k, v
    (all one dtype; g and s0 converted to it), chunk by chunk, differentiably. With `lengths`
    ([B]), q, k, v and g must already be zero from each entry's length on."""
    b, h, l, dk = q.shape
    dv = v.shape[3]
    c = max(1, min(chunk_size, l))
    n = -(-l // c)
    pad = n * c - l
    dtype, device = q.dtype, q.device

    def chunks(t):  # [B, H, L, X] -> [B, H, n, C, X], zero past L
        return F.pad(t, (0, 0, 0, pad)).reshape(b, h, n, c, t.shape[3])

    qc, kc, vc = chunks(q), chunks(k), chunks(v)
    causal = torch.ones(c, c, dtype=torch.bool, device=device).tril()
    zero = torch.zeros((), dtype=dtype, device=device)
    if decay is None:
        G = None
        qd, kd = qc, kc
    else:
        g = g.to(dtype)
        gl = {"head": lambda: g.view(1, h, 1, 1).expand(b, h, l, 1), "token": lambda: g.unsqueeze(-1),
              "token_dim": lambda: g}[decay]()
        if lengths is not None:  # tokens past an entry's length do not decay its state
            live = torch.arange(l, device=device).view(1, 1, l, 1) < lengths.view(b, 1, 1, 1)
            gl = torch.where(live, gl, torch.zeros((), dtype=dtype, device=device))
        G = chunks(gl).cumsum(-2)  # [B, H, n, C, 1 or Dk]
        g_end = G[..., -1:, :]
        qd = qc * torch.exp(G)
        kd = kc * torch.exp(g_end - G)
    # The chunk states: one sequential update per chunk.
    updates = kd.transpose(-1, -2) @ vc  # [B, H, n, Dk, Dv]
    state = (s0.to(dtype) if s0 is not None else torch.zeros(b, h, dk, dv, dtype=dtype, device=device))
    z = torch.zeros(b, h, dk, dtype=dtype, device=device)
    key_sums = kd.sum(-2) if normalize else None  # [B, H, n, Dk]
    entering, z_entering = [], []
    for i in range(n):
        entering.append(state)
        z_entering.append(z)
        if G is None:
            state = state + updates[:, :, i]
            if normalize:
                z = z + key_sums[:, :, i]
            continue
        factor = torch.exp(g_end[:, :, i]).transpose(-1, -2)  # [B, H, 1 or Dk, 1]
        state = factor * state + updates[:, :, i]
        if normalize:
            z = factor.squeeze(-1) * z + key_sums[:, :, i]
    # Inside the chunks: every chunk at once.
    if decay == "token_dim":
        from torch.utils.checkpoint import checkpoint

        A = torch.stack([checkpoint(_pair_product, qc[:, :, i], kc[:, :, i], G[:, :, i], use_reentrant=False)
                         for i in range(n)], dim=2)
    else:
        A = qc @ kc.transpose(-1, -2)
        if G is not None:
            gs = G[..., 0]
            A = A * torch.exp(torch.where(causal, gs.unsqueeze(-1) - gs.unsqueeze(-2), zero))
        A = torch.where(causal, A, zero)
    out = A @ vc + qd @ torch.stack(entering, dim=2)
    if normalize:
        den = A.sum(-1) + (qd * torch.stack(z_entering, dim=2).unsqueeze(-2)).sum(-1)
        # Rows past L have q = 0 and a zero sum; divide them by 1 so no 0/0 reaches the gradients.
        bound = l if lengths is None else lengths.view(b, 1, 1, 1)
        valid = (torch.arange(n * c, device=device) < bound).view(*((n, c) if lengths is None else (b, 1, n, c)))
        out = out / torch.where(valid, den, torch.ones((), dtype=dtype, device=device)).unsqueeze(-1)
    else:
        out = out * scale
    return out.reshape(b, h, n * c, dv)[:, :, :l], state


class _LinearAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, call: LinearCall, q, k, v, g, s0, *sources):
        out, state = call.run()
        ctx.call = call
        # Saved for torch's in-place checks; the final state only where g's gradient reads it.
        ctx.save_for_backward(q, k, v, g, s0, state if ctx.needs_input_grad[4] else None, *sources)
        ctx.set_materialize_grads(False)
        return out, state

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, d_out, d_state):
        q, k, v, g, s0, state, *_ = ctx.saved_tensors
        call = ctx.call
        current = call.current_sources()
        if len(current) != len(call.sources) or any(a is not b for a, b in zip(current, call.sources)):
            raise RuntimeError("ae_mlir.linear_attention: a q/k/v mod reads other closure tensors than it did in the "
                               "forward (a closure variable was rebound before backward); its backward reapplies "
                               "the mods, so keep the tensors they read until backward has run")
        wanted = ctx.needs_input_grad[1:]
        if (d_out is None and d_state is None) or not any(wanted):
            return (None,) * (len(wanted) + 1)
        return (None, *gradients(call, (q, k, v, g, s0), (d_out, d_state), wanted, state))


def gradients(call: LinearCall, tensors: tuple, grads: tuple, wanted, final_state=None) -> list:
    """The gradients of q, k, v, g, the initial state (`tensors`, g and s0 None where absent)
    and the call's closure tensors from those of (out, final state) (`grads`, None where none),
    where `wanted`; None elsewhere. The forward kernels run on the gradients
    (`linear_kernel_backward`, which reads the forward's `final_state`), except on the reference
    backend, for float64 inputs or scale = 0, which recompute the recurrence under autograd
    (module docstring)."""
    from . import linear_kernel_backward

    if linear_kernel_backward.applies(call, tensors[0]):
        return linear_kernel_backward.gradients(call, tensors, grads, wanted, final_state)
    d_out, d_state = grads
    work = torch.float64 if tensors[0].dtype == torch.float64 else torch.float32
    with torch.enable_grad():
        leaves = [None if t is None else t.detach().to(work).requires_grad_(w) for t, w in zip(tensors, wanted[:5])]
        if call.packing is None:
            xs = [apply_mod(fn, arity, x) for (fn, arity), x in zip(call.mods, leaves[:3])]
            out, state = chunked_recurrence(*xs, leaves[3], leaves[4], call.decay, call.scale, call.normalize,
                                            call.chunk_size)
        else:
            out, state = _packed_recurrence(call, *leaves)
        # An output none of the wanted inputs reaches (the state when only q requires grad) has
        # no graph to differentiate.
        pairs = [(o, d) for o, d in ((out, d_out), (state, d_state)) if d is not None and o.requires_grad]
        targets = [t for t, w in zip(leaves + list(call.sources), wanted) if w and t is not None]
        if not pairs or not targets:
            return [None] * len(wanted)
        found = iter(torch.autograd.grad([o for o, _ in pairs], targets, [d.to(o.dtype) for o, d in pairs],
                                         allow_unused=True))
    result = []
    for t, original, w in zip(leaves + list(call.sources), (*tensors, *call.sources), wanted):
        grad = next(found) if w and t is not None else None
        result.append(None if grad is None else grad.to(original.dtype))
    return result


def _packed_recurrence(call: LinearCall, q, k, v, g, s0):
    """`chunked_recurrence` of packed sequences ([1, H, T, D] rows, the call's offsets): the
    mods applied to the packed rows (each row's sequence as b, its position in it as t, so they
    are evaluated only where tokens exist), every sequence unpacked to [S, H, L, D] with zeros from
    its length on, and the output packed back."""
    cu, longest = call.packing
    cu = cu.to(q.device).long()
    lengths = cu[1:] - cu[:-1]
    pos = torch.arange(longest, device=q.device)
    valid = pos < lengths.unsqueeze(1)  # [S, L]
    rows = (cu[:-1].unsqueeze(1) + pos).clamp(max=max(q.shape[2] - 1, 0))
    seq, at = packed_positions(cu, longest, q.shape[2])

    def unpack(t):  # [1, H, T(, D)] -> [S, H, L(, D)], zero past each sequence
        view = t[0][:, rows].transpose(0, 1)
        mask = valid.view(valid.shape[0], 1, longest, *([1] * (t.dim() - 3)))
        return torch.where(mask, view, torch.zeros((), dtype=t.dtype, device=t.device))

    xs = [unpack(apply_mod(fn, arity, x, packed_grid(seq, at, x))) for (fn, arity), x in zip(call.mods, (q, k, v))]
    g_view = unpack(g) if g is not None and g.dim() > 1 else g
    out, state = chunked_recurrence(*xs, g_view, s0, call.decay, call.scale, call.normalize, call.chunk_size,
                                    lengths)
    return out[seq, :, at].transpose(0, 1).unsqueeze(0), state


def packed_positions(cu, longest: int, rows: int):
    """(sequence, position in it) of each of `rows` packed rows (int64 [rows] each), from offsets
    `cu` (int64 [S + 1], possibly padded with empty sequences at the end)."""
    r = torch.arange(rows, device=cu.device)
    # Packed row r belongs to the sequence whose offsets bracket it.
    seq = torch.searchsorted(cu[1:], r, right=True).clamp(max=cu.shape[0] - 2)
    return seq, (r - cu[seq]).clamp(0, max(longest - 1, 0))


def packed_grid(seq, at, x) -> list:
    """The (b, h, t, d) index grids a five-argument mod sees on packed rows x [1, H, T, D]: the
    sequence as b, the position in it as t."""
    return [seq.view(1, 1, -1, 1), torch.arange(x.shape[1], device=x.device).view(1, -1, 1, 1),
            at.view(1, 1, -1, 1), torch.arange(x.shape[3], device=x.device).view(1, 1, 1, -1)]


def differentiable_call(call: LinearCall, q, k, v, g, s0):
    """(out, final state) of the compiled kernel, connected to the autograd graph of q, k, v, g,
    the initial state and the closure tensors the mods read."""
    return _LinearAttention.apply(call, q, k, v, g, s0, *call.sources)
