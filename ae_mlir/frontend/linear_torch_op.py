"""`torch.compile` support for `ae_mlir.linear_attention`: the custom op `ae_mlir::linear_attention`.

As `torch_op` does for attention, a call under torch.compile records one op (dynamo never runs
the tracer or MLIR): the op names the layer by its registry key and takes q, k, v ([B, H, L, D]
views), g, the initial state, the closure tensors the mods read, and a packed batch's lengths and
offsets. Its fake implementation gives the shapes; its backward, the op
`ae_mlir::linear_attention_backward`, is the eager backward (`linear_backward.gradients`: forward
kernels on the gradients, a torch recomputation on the reference backend). That backward
reapplies the mods as Python functions, which read their closure tensors themselves, not the op's
inputs, so gradients of closure tensors are refused under torch.compile (eager calls compute them).
"""
from __future__ import annotations

import torch
from torch import Tensor

from . import closure_sources, variant_registry
from .torch_op import _kernel_captures


def _layer_and_text(key: str, q, k, v, g, s0, captures: list, lengths, cu, longest: int):
    layer = variant_registry.lookup(key)
    sequences = None
    if cu is not None:
        from .varlen import Sequences

        sequences = Sequences(cu, cu, lengths, longest, longest)
    text, caps = layer._build_with_captures(q, k, v, g, s0, sequences=sequences)
    given = _kernel_captures(captures)
    if [(tuple(t.shape), t.dtype) for t in caps.tensors] != [(tuple(t.shape), t.dtype) for t in given]:
        raise RuntimeError(f"the mods of ae_mlir linear attention {key!r} now read closure tensors "
                           f"{[tuple(t.shape) for t in caps.tensors]}, not the {[tuple(t.shape) for t in given]} "
                           "found where they read them when it was constructed; construct it again after "
                           "changing what its mods read")
    return layer, text, sequences, given


def _fixed(g, s0, lengths, cu) -> list:
    return [t for t in (g, s0, lengths, cu) if t is not None]


@torch.library.custom_op("ae_mlir::linear_attention", mutates_args=())
def linear_attention_op(key: str, backend: str, q: Tensor, k: Tensor, v: Tensor, g: Tensor | None,
                        s0: Tensor | None, captures: list[Tensor], lengths: Tensor | None, cu_seqlens: Tensor | None,
                        longest: int) -> tuple[Tensor, Tensor]:
    """(out, final state) of the compiled kernel; a packed batch's lengths and offsets are None
    where the call has none."""
    from .api import _execute

    layer, text, _, given = _layer_and_text(key, q, k, v, g, s0, captures, lengths, cu_seqlens, longest)
    out, state = _execute(text, [q, k, v] + _fixed(g, s0, lengths, cu_seqlens) + given, backend, out_dtype=q.dtype,
                          autotune=layer.autotune)
    return out, state


def _state_dtype(q) -> torch.dtype:
    return torch.float64 if q.dtype == torch.float64 else torch.float32


@linear_attention_op.register_fake
def _linear_fake(key, backend, q, k, v, g, s0, captures, lengths, cu_seqlens, longest):
    entries = q.shape[0] if lengths is None else lengths.shape[0]
    return (q.new_empty((*q.shape[:3], v.shape[3])),
            q.new_empty((entries, q.shape[1], q.shape[3], v.shape[3]), dtype=_state_dtype(q)))


@torch.library.custom_op("ae_mlir::linear_attention_backward", mutates_args=())
def linear_attention_backward_op(key: str, backend: str, q: Tensor, k: Tensor, v: Tensor, g: Tensor | None,
                                 s0: Tensor | None, captures: list[Tensor], lengths: Tensor | None,
                                 cu_seqlens: Tensor | None, longest: int, state: Tensor | None, d_out: Tensor,
                                 d_state: Tensor | None, wanted: list[bool]) -> list[Tensor]:
    """[dq, dk, dv, dg, d(initial state)] (contiguous), zeros for those not wanted or absent (g,
    s0); `state` is the forward's final state (None where g takes no gradient), `d_state` its
    gradient: None where the loss does not read it, so RetNet's reversed runs keep their decay
    (linear_kernel_backward); under torch.compile the graph passes zeros there instead. `captures` are
    the closure tensors the forward read: the backward reapplies the mods, which must still read
    the same values."""
    from .linear_backward import gradients

    layer = variant_registry.lookup(key)
    current = layer._trace_mods()[1].sources
    if len(current) != len(captures) or not all(a.shape == b.shape and torch.equal(a, b.to(a.device))
                                                 for a, b in zip(current, captures)):
        raise RuntimeError(f"ae_mlir linear attention {key!r}: a q/k/v mod reads other closure tensors than it did "
                           "in the forward (a closure variable was rebound or changed before backward); its "
                           "backward reapplies the mods, so keep the tensors they read until backward has run")
    sequences = None if cu_seqlens is None else (cu_seqlens, longest)
    call = layer._linear_call(q.shape[3], (), sequences, backend)
    # A custom op runs below the autograd dispatch keys, and the mods' backward differentiates
    # with autograd: those keys come back for its duration.
    with torch._C._SetExcludeDispatchKeyGuard(torch._C.DispatchKey.AutogradFunctionality, False):
        grads = gradients(call, (q, k, v, g, s0), (d_out, d_state), list(wanted) + [False] * (5 - len(wanted)),
                          state)
    return [_zeros_like(t, q) if grad is None else grad.contiguous() for grad, t in zip(grads, (q, k, v, g, s0))]


def _zeros_like(t, q):
    return q.new_zeros(0) if t is None else q.new_zeros(t.shape, dtype=t.dtype)


@linear_attention_backward_op.register_fake
def _linear_backward_fake(key, backend, q, k, v, g, s0, captures, lengths, cu_seqlens, longest, state, d_out, d_state,
                          wanted):
    # Contiguous, as the real op returns them (q, k, v may be strided views).
    return [q.new_empty(0) if t is None else q.new_empty(t.shape, dtype=t.dtype) for t in (q, k, v, g, s0)]


def _setup_context(ctx, inputs, output):
    key, backend, q, k, v, g, s0, captures, lengths, cu, longest = inputs
    ctx.key, ctx.backend, ctx.longest, ctx.captures = key, backend, longest, len(captures)
    ctx.set_materialize_grads(False)  # an output the loss does not read: None, not zeros
    ctx.layer = variant_registry.lookup(key)  # the graph holds it by key, the registry weakly
    state = output[1] if ctx.needs_input_grad[5] else None  # g's gradient reads it
    ctx.save_for_backward(q, k, v, g, s0, lengths, cu, state, *captures)


def _backward(ctx, d_out, d_state):
    q, k, v, g, s0, lengths, cu, state, *captures = ctx.saved_tensors
    wanted = list(ctx.needs_input_grad[2:7])
    d_out = torch.zeros((*q.shape[:3], v.shape[3]), dtype=q.dtype, device=q.device) if d_out is None else d_out
    dq, dk, dv, dg, ds0 = linear_attention_backward_op(ctx.key, ctx.backend, q, k, v, g, s0, captures, lengths, cu,
                                                       ctx.longest, state, d_out, d_state, wanted)
    return (None, None, dq, dk, dv, dg if g is not None else None, ds0 if s0 is not None else None,
            [None] * ctx.captures, None, None, None)


linear_attention_op.register_autograd(_backward, setup_context=_setup_context)


def compiled_linear(layer, q, k, v, g, s0, backend: str, sequences=None):
    """(out, final state) of `layer` as one `ae_mlir::linear_attention` op."""
    if layer._sources is None:
        raise RuntimeError("ae_mlir.linear_attention under torch.compile: its mods could not be traced when it was "
                           "constructed; call it once outside torch.compile to see the error")
    captures = closure_sources.fetch(layer, layer._sources)
    if any(t.requires_grad for t in captures):
        raise ValueError("under torch.compile, gradients of the closure tensors a linear_attention mod reads are "
                         "not computed (its backward reapplies the mods as Python functions); detach them, or "
                         "call the layer outside torch.compile")
    lengths, cu, longest = (None, None, 0) if sequences is None else (sequences.kv_len, sequences.cu_q,
                                                                       sequences.longest_q)
    return linear_attention_op(layer._key, backend, q, k, v, g, s0, captures, lengths, cu, longest)
