"""`torch.compile` support: softmax-family attention as the custom op `ae_mlir::attention`.

Under `torch.compile` an `ae_mlir.attention` call records one op instead of being traced: dynamo
never runs the tracer or MLIR. The op names its variant by a key (`variant_registry`) and takes
q, k, v ([B, H, L, D] views) and the closure tensors as inputs; its fake implementation gives the
output shapes, and `register_autograd` connects its backward, itself the op
`ae_mlir::attention_backward`, so the compiled backward graph calls it as one op as well. Both
run what eager calls run: the compiled forward kernel, and the backward kernels or torch
evaluating the derivative regions `attn-differentiate` builds (`autograd.CompiledCall`).
"""
from __future__ import annotations

import torch
from torch import Tensor

from . import closure_sources, variant_registry
from .autograd import CompiledCall, compiled_call


def _kernel_captures(captures: list) -> list:
    """Closure tensors as the kernel takes them: a 0-d tensor as a 1-element vector."""
    return [t.reshape(1) if t.dim() == 0 else t for t in captures]


def _call(key: str, backend: str, q, k, v, captures: list, kv_len, block_table) -> CompiledCall:
    attn = variant_registry.lookup(key)
    text, traced = attn._prepare(q, k, v, kv_len, block_table)
    traced = traced[:len(traced) - len(_cache_operands(kv_len, block_table))]
    given = _kernel_captures(captures)
    if [(tuple(t.shape), t.dtype) for t in traced] != [(tuple(t.shape), t.dtype) for t in given]:
        raise RuntimeError(f"the mods of ae_mlir attention {key!r} now read closure tensors "
                           f"{[tuple(t.shape) for t in traced]}, not the {[tuple(t.shape) for t in given]} found "
                           "where they read them when it was constructed; under torch.compile a mod must keep "
                           "reading its closure tensors through the same names: construct the attention again "
                           "after changing what its mods read")
    return compiled_call(attn, text, q, k, v, backend, kv_len=kv_len, block_table=block_table)


def _cache_operands(kv_len, block_table) -> list:
    """The closure tensors a call adds after the mods': the key lengths, then the block table."""
    return [t for t in (kv_len, block_table) if t is not None]


def _with_cache(captures: list, kv_len, block_table) -> list:
    """The kernel's closure tensors."""
    return _kernel_captures(captures) + _cache_operands(kv_len, block_table)


def _lse_dtype(q) -> torch.dtype:
    return torch.float64 if q.dtype == torch.float64 else torch.float32


@torch.library.custom_op("ae_mlir::attention", mutates_args=())
def attention_op(key: str, backend: str, q: Tensor, k: Tensor, v: Tensor,
                 captures: list[Tensor], kv_len: Tensor | None,
                 block_table: Tensor | None) -> tuple[Tensor, Tensor]:
    """(out, lse); lse is zeros for normalizers other than softmax, which have none."""
    call = _call(key, backend, q, k, v, captures, kv_len, block_table)
    out, lse = call.forward(q, k, v, _with_cache(captures, kv_len, block_table))
    if lse is None:
        lse = torch.zeros(q.shape[:3], dtype=_lse_dtype(q), device=q.device)
    return out, lse


@attention_op.register_fake
def _attention_fake(key, backend, q, k, v, captures, kv_len, block_table):
    b, h, lq, _ = q.shape
    return q.new_empty((b, h, lq, v.shape[3])), q.new_empty((b, h, lq), dtype=_lse_dtype(q))


@torch.library.custom_op("ae_mlir::attention_backward", mutates_args=())
def attention_backward_op(key: str, backend: str, q: Tensor, k: Tensor, v: Tensor, captures: list[Tensor],
                          kv_len: Tensor | None, lse: Tensor, out: Tensor | None, d_out: Tensor,
                          d_lse: Tensor | None, closures_wanted: list[bool]) -> list[Tensor]:
    """[dq, dk, dv, one gradient per closure tensor]; zeros where none reaches a tensor."""
    call = _call(key, backend, q, k, v, captures, kv_len, None)
    softmax = call.with_lse
    wanted = list(closures_wanted) + ([] if kv_len is None else [False])
    dq, dk, dv, d_captures = call.backward(q, k, v, _with_cache(captures, kv_len, None), lse if softmax else None,
                                           d_out, d_lse if softmax else None, wanted, out=out)
    return [dq, dk, dv] + [t.new_zeros(t.shape, dtype=_grad_dtype(t)) if g is None else g.reshape(t.shape)
                           for g, t in zip(d_captures, captures)]


def _grad_dtype(t) -> torch.dtype:
    return t.dtype if t.dtype.is_floating_point else torch.float32


@attention_backward_op.register_fake
def _attention_backward_fake(key, backend, q, k, v, captures, kv_len, lse, out, d_out, d_lse, closures_wanted):
    # Contiguous, as the backward makes them (q, k and v may be strided views).
    return [t.new_empty(t.shape) for t in (q, k, v)] + [t.new_empty(t.shape, dtype=_grad_dtype(t)) for t in captures]


def _setup_context(ctx, inputs, output):
    key, backend, q, k, v, captures, kv_len, _ = inputs
    ctx.key, ctx.backend = key, backend
    # The graph holds the variant by key only, and the registry holds it weakly: without this the
    # backward would fail once the model that owns the attention is gone.
    ctx.attention = variant_registry.lookup(key)
    # The output only feeds the backward kernels (softmax on a compiled backend); saving it
    # otherwise would make an in-place change of the output an autograd error for nothing.
    kernels = backend in ("cpu", "triton") and ctx.attention.normalize == "softmax"
    ctx.save_for_backward(q, k, v, output[1], output[0] if kernels else None, kv_len, *captures)


def _backward(ctx, d_out, d_lse):
    q, k, v, lse, out, kv_len, *captures = ctx.saved_tensors
    # needs_input_grad: key, backend, q, k, v, then one flag per closure tensor.
    wanted = list(ctx.needs_input_grad[5])
    dq, dk, dv, *d_captures = attention_backward_op(ctx.key, ctx.backend, q, k, v, captures, kv_len, lse, out,
                                                    d_out, d_lse, wanted)
    d_captures = [g if t.dtype.is_floating_point else None for g, t in zip(d_captures, captures)]
    return None, None, dq, dk, dv, d_captures, None, None


attention_op.register_autograd(_backward, setup_context=_setup_context)


def compiled_attention(attn, q, k, v, backend: str, kv_len=None, block_table=None):
    """(out, lse) of `attn` as one `ae_mlir::attention` op (q, k, v as [B, H, L, D] views, or with
    a block table page pools; kv_len int32 [B] or None; block_table int32 [B, M] or None). The
    frontend refuses gradients through a paged cache, so the backward never sees a table."""
    if attn._sources is None:
        raise RuntimeError("ae_mlir.attention under torch.compile: its mods could not be traced when it was "
                           "constructed; call it once outside torch.compile to see the error")
    return attention_op(attn._key, backend, q, k, v, closure_sources.fetch(attn, attn._sources), kv_len,
                        block_table)
