"""The float64 oracle of a packed batch's gradients: the same sequences unpacked as batch entries of
their own key lengths (kv_len) on the reference backend, where b is the sequence and the positions
are the sequence's, as in the packed call; the gradients packed back. Packed tensors here are
heads-first, [H, T, ...]."""
from __future__ import annotations

import torch


def unpacked(t, offsets: list[int], length: int):
    """[H, T, ...] packed rows -> [S, H, length, ...] float64, each sequence zero-padded."""
    rows = [torch.nn.functional.pad(t[:, a:b], (0, 0) * (t.dim() - 2) + (0, length - (b - a)))
            for a, b in zip(offsets, offsets[1:])]
    return torch.stack(rows).double()


def repacked(t, offsets: list[int]):
    """[S, H, L, ...] -> [H, T, ...]: each sequence's rows, in order."""
    return torch.cat([t[s, :, :b - a] for s, (a, b) in enumerate(zip(offsets, offsets[1:]))], dim=1)


def packed_gradients(attn, q, k, v, d_out, cu_q: list[int], cu_k: list[int], len_q: int, len_k: int,
                     learnable=()):
    """float64 gradients of packed [H, T, D] q, k, v (packed like them) and of the `learnable`
    closure tensors (None where none reaches) of `attn` (layout "bhld"), sequences of at most
    len_q queries and len_k keys."""
    leaves = [unpacked(t, cu, n).requires_grad_() for t, cu, n in ((q, cu_q, len_q), (k, cu_k, len_k),
                                                                     (v, cu_k, len_k))]
    kv_len = torch.tensor([b - a for a, b in zip(cu_k, cu_k[1:])])
    out = attn(*leaves, kv_len=kv_len, backend="reference")
    grads = torch.autograd.grad(out, leaves + list(learnable), unpacked(d_out, cu_q, len_q), allow_unused=True)
    return [repacked(g, cu) for g, cu in zip(grads[:3], (cu_q, cu_k, cu_k))] + list(grads[3:])
