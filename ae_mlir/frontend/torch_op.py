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

from . import checks, closure_sources, relative_reads, variant_registry
from .autograd import CompiledCall, compiled_call


def _kernel_captures(captures: list) -> list:
    """Closure tensors as the kernel takes them: a 0-d tensor as a 1-element vector."""
    return [t.reshape(1) if t.dim() == 0 else t for t in captures]


def _call(key: str, backend: str, q, k, v, captures: list, cache: list, longest: tuple) -> tuple[CompiledCall, list]:
    """The call's `CompiledCall` and the plan that makes its module's closure tensors from the op's
    (relative_reads.kernel_closures: the op takes the tensors the mods read, as found at
    construction; the module may read tables composed from them)."""
    attn = variant_registry.lookup(key)
    kv_len, block_table, cu_q, cu_k = cache
    sequences = None
    if cu_q is not None:
        from .varlen import Sequences

        sequences, kv_len = Sequences(cu_q, cu_k, kv_len, *longest), None
    written_text, written = attn._prepare_captures(q, k, v, kv_len, block_table, sequences, compose=False)
    traced = written.tensors[:len(written.tensors) - len(_present(cache))]
    given = _kernel_captures(captures)
    if [(tuple(t.shape), t.dtype) for t in traced] != [(tuple(t.shape), t.dtype) for t in given]:
        raise RuntimeError(f"the mods of ae_mlir attention {key!r} now read closure tensors "
                           f"{[tuple(t.shape) for t in traced]}, not the {[tuple(t.shape) for t in given]} found "
                           "where they read them when it was constructed; under torch.compile a mod must keep "
                           "reading its closure tensors through the same names: construct the attention again "
                           "after changing what its mods read")
    # As eager calls: the reference backend evaluates the mods as written.
    where = {"kv_len": kv_len, "block_table": block_table, "sequences": sequences,
             "compose": backend != "reference"}
    text, composed = attn._build_captures(q, k, v, **where) if where["compose"] else (written_text, written)
    return compiled_call(attn, text, q, k, v, backend, **where), composed.plan(written)


def _present(cache: list) -> list:
    """The closure tensors a call adds after the mods', in the module's order: the key lengths,
    the block table, a packed batch's offsets of q and of k (those the call has)."""
    return [t for t in cache if t is not None]


def _with_cache(plan: list, captures: list, cache: list, q, k, v) -> list:
    """The kernel's closure tensors, with a unit last stride as eager calls pass them
    (`checks.with_unit_last_stride`)."""
    closures = relative_reads.kernel_closures(plan, _kernel_captures(captures))
    return checks.with_unit_last_strides(closures, q, k, v) + _present(cache)


def _lse_dtype(q) -> torch.dtype:
    return torch.float64 if q.dtype == torch.float64 else torch.float32


@torch.library.custom_op("ae_mlir::attention", mutates_args=())
def attention_op(key: str, backend: str, q: Tensor, k: Tensor, v: Tensor,
                 captures: list[Tensor], kv_len: Tensor | None, block_table: Tensor | None,
                 cu_seqlens_q: Tensor | None, cu_seqlens_k: Tensor | None, longest_q: int,
                 longest_k: int) -> tuple[Tensor, Tensor]:
    """(out, lse); lse is zeros for normalizers other than softmax, which have none. The call's
    key lengths, block table and a packed batch's offsets are None where it has none (a packed
    batch's as varlen.Sequences holds them, with its longest sequences' bounds)."""
    cache = [kv_len, block_table, cu_seqlens_q, cu_seqlens_k]
    call, plan = _call(key, backend, q, k, v, captures, cache, (longest_q, longest_k))
    out, lse = call.forward(q, k, v, _with_cache(plan, captures, cache, q, k, v))
    if lse is None:
        lse = torch.zeros(q.shape[:3], dtype=_lse_dtype(q), device=q.device)
    return out, lse


@attention_op.register_fake
def _attention_fake(key, backend, q, k, v, captures, kv_len, block_table, cu_seqlens_q, cu_seqlens_k, longest_q,
                    longest_k):
    b, h, lq, _ = q.shape
    return q.new_empty((b, h, lq, v.shape[3])), q.new_empty((b, h, lq), dtype=_lse_dtype(q))


@torch.library.custom_op("ae_mlir::attention_backward", mutates_args=())
def attention_backward_op(key: str, backend: str, q: Tensor, k: Tensor, v: Tensor, captures: list[Tensor],
                          kv_len: Tensor | None, cu_seqlens_q: Tensor | None, cu_seqlens_k: Tensor | None,
                          longest_q: int, longest_k: int, lse: Tensor, out: Tensor | None, d_out: Tensor,
                          d_lse: Tensor | None, closures_wanted: list[bool]) -> list[Tensor]:
    """[dq, dk, dv, one gradient per closure tensor]; zeros where none reaches a tensor. No block
    table: the frontend refuses gradients through a paged cache."""
    cache = [kv_len, None, cu_seqlens_q, cu_seqlens_k]
    call, plan = _call(key, backend, q, k, v, captures, cache, (longest_q, longest_k))
    softmax = call.with_lse
    wanted = [closures_wanted[j] for j, _, _ in plan] + [False] * len(_present(cache))
    closures = _with_cache(plan, captures, cache, q, k, v)
    dq, dk, dv, d_kernel = call.backward(q, k, v, closures, lse if softmax else None, d_out,
                                         d_lse if softmax else None, wanted, out=out)
    given = _kernel_captures(captures)
    d_captures = relative_reads.written_gradients(plan, given, d_kernel[:len(plan)])
    return [dq, dk, dv] + [t.new_zeros(t.shape, dtype=_grad_dtype(t)) if g is None else g.reshape(t.shape)
                           for g, t in zip(d_captures, captures)]


def _grad_dtype(t) -> torch.dtype:
    return t.dtype if t.dtype.is_floating_point else torch.float32


@attention_backward_op.register_fake
def _attention_backward_fake(key, backend, q, k, v, captures, kv_len, cu_seqlens_q, cu_seqlens_k, longest_q,
                             longest_k, lse, out, d_out, d_lse, closures_wanted):
    # Contiguous, as the backward makes them (q, k and v may be strided views).
    return [t.new_empty(t.shape) for t in (q, k, v)] + [t.new_empty(t.shape, dtype=_grad_dtype(t)) for t in captures]


def _setup_context(ctx, inputs, output):
    key, backend, q, k, v, captures, kv_len, _, cu_q, cu_k, longest_q, longest_k = inputs
    ctx.key, ctx.backend, ctx.longest = key, backend, (longest_q, longest_k)
    # The graph holds the variant by key only, and the registry holds it weakly: without this the
    # backward would fail once the model that owns the attention is gone.
    ctx.attention = variant_registry.lookup(key)
    # The output only feeds softmax's backward kernels (on a compiled backend); saving it
    # otherwise would make an in-place change of the output an autograd error for nothing.
    kernels = backend in ("cpu", "triton") and ctx.attention.normalize == "softmax"
    ctx.save_for_backward(q, k, v, output[1], output[0] if kernels else None, kv_len, cu_q, cu_k, *captures)


def _backward(ctx, d_out, d_lse):
    q, k, v, lse, out, kv_len, cu_q, cu_k, *captures = ctx.saved_tensors
    # needs_input_grad: key, backend, q, k, v, then one flag per closure tensor.
    wanted = list(ctx.needs_input_grad[5])
    dq, dk, dv, *d_captures = attention_backward_op(ctx.key, ctx.backend, q, k, v, captures, kv_len, cu_q, cu_k,
                                                    *ctx.longest, lse, out, d_out, d_lse, wanted)
    d_captures = [g if t.dtype.is_floating_point else None for g, t in zip(d_captures, captures)]
    return None, None, dq, dk, dv, d_captures, None, None, None, None, None, None


attention_op.register_autograd(_backward, setup_context=_setup_context)


def compiled_attention(attn, q, k, v, backend: str, kv_len=None, block_table=None, sequences=None):
    """(out, lse) of `attn` as one `ae_mlir::attention` op (q, k, v as [B, H, L, D] views, with a
    block table page pools, with `sequences` (varlen.Sequences) packed [1, H, T, D]; kv_len int32
    [B] or None; block_table int32 [B, M] or None). The frontend refuses gradients through a paged
    cache, so the backward never sees a table."""
    if attn._sources is None:
        raise RuntimeError("ae_mlir.attention under torch.compile: its mods could not be traced when it was "
                           "constructed; call it once outside torch.compile to see the error")
    cache, longest = [kv_len, block_table, None, None], (0, 0)
    if sequences is not None:
        cache = [sequences.kv_len, None, sequences.cu_q, sequences.cu_k]
        longest = (sequences.longest_q, sequences.longest_k)
    return attention_op(attn._key, backend, q, k, v, closure_sources.fetch(attn, attn._sources), *cache, *longest)
