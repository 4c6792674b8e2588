"""Autograd for `ae_mlir.attention`: a call whose forward is the compiled kernel and whose
backward is, for softmax, the element-wise normalizers (sigmoid, relu, none) and user normalizers
on the CPU and Triton backends, the two kernels `attn-tile-backward` builds from the same L0 module
(with the gradients of the closure tensors the score_mod reads), and on the reference backend
torch evaluating the derivative regions `attn-differentiate` compiles (`backward.py`).

The forward runs with its logsumexp result (softmax), which the backward uses to recompute the
probabilities a block of query rows at a time instead of saving them.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

import torch

from . import checks
from ..core import abi
from ..core.memo import kept
from .backward import Derivative, attention_backward


@dataclass(frozen=True)
class CompiledCall:
    """One compiled attention: its forward L0 module, where it runs, and its derivative."""

    text: str
    backend: str
    scale: float
    derivative: Derivative
    # The module the backward kernels compile from: `text`, or on the CPU for 16-bit inputs the
    # same attention in float32. The CPU has no 16-bit arithmetic (without AVX512-BF16 LLVM
    # converts every bf16 vector element by element, and a bf16 backward kernel took 25-30 s
    # to compile, against 2-4 s in float32); widening q, k, v and dO first is O(L D) copies
    # against O(L^2 D) work, and the gradients come out more exact.
    backward_text: str = ""
    # The position of the key lengths (kv_len) among the closure tensors, if the call has them.
    lengths: int | None = None
    autotune: bool = False  # the kernels' launch configurations are tuned (ae_mlir.autotune)

    @property
    def with_lse(self) -> bool:
        return self.derivative.kind == "softmax"

    def forward(self, q, k, v, captures: list):
        """(out, lse) of the compiled kernel; lse is None for normalizers other than softmax."""
        from .api import _execute

        tensors = [t.detach() for t in (q, k, v, *captures)]
        results = _execute(self.text, tensors, self.backend, out_dtype=q.dtype, autotune=self.autotune)
        return results[0], (results[1] if self.with_lse else None)

    @property
    def uses_kernels(self) -> bool:
        """Whether the backward runs as compiled kernels (attn-tile-backward): a built-in
        normalizer or a user's, on the CPU or Triton backend."""
        return self.backend in ("cpu", "triton") and self.derivative.kind in abi.BACKWARD_NORMALIZERS

    def backward(self, q, k, v, captures: list, lse, d_out, d_lse, closures_wanted=None, out=None):
        # Softmax's kernels read the forward's output, which is saved only when they run.
        if self.uses_kernels and (out is not None or not self.with_lse):
            return self.kernel_backward(q, k, v, captures, lse, out, d_out, d_lse, closures_wanted)
        if "attn.unpack_sequences" in self.text:
            # The torch evaluation of the derivative sees [B, H, L, D] tensors, not packed rows.
            raise ValueError("this gradient of a packed variable-length call (cu_seqlens) needs the backward "
                             "kernels: softmax, sigmoid, relu or none on the 'cpu' or 'triton' backend")
        if self.lengths is not None:
            # Keys past an entry's length are masked, but 0 * NaN is NaN: a cache's unfilled rows
            # must not reach dQ = dS K.
            k, v = (_zero_past(t, captures[self.lengths]) for t in (k, v))
        return attention_backward(self.derivative, self.scale, q, k, v, captures, lse, d_out, d_lse,
                                  closures_wanted)

    def kernel_backward(self, q, k, v, captures: list, lse, out, d_out, d_lse, closures_wanted=None):
        """dq, dk, dv and the closure tensors' gradients (those wanted; None: all) from the
        backward kernels."""
        from .. import backends

        from .api import _execute

        work = q.dtype if self.backward_text == self.text else torch.float32
        tensors = {"q": _as(q.detach(), work), "k": _as(k.detach(), work), "v": _as(v.detach(), work),
                   "do": _as(d_out, work).contiguous()}
        tensors.update({f"c{i}": t.detach() for i, t in enumerate(captures)})
        wanted = bool(self.derivative.closure_grads) and (
            closures_wanted is None or any(closures_wanted[p] for p, _ in self.derivative.closure_grads))
        if self.with_lse:
            if wanted and work != q.dtype:
                # A closure tensor's gradient sums dS over many scores; a row of dS sums to zero
                # only if delta = rowsum(dO O) uses the O its probabilities give. A 16-bit O's
                # rounding, times each score's weight (j - i for ALiBi's slopes), adds up to
                # percents: the float32 backward takes the float32 forward's O and lse.
                out, lse = _execute(self.backward_text, [tensors[r] for r in ("q", "k", "v")] + list(captures),
                                    self.backend, out_dtype=work)
            d_lse = _zeros(lse.shape, lse.device) if d_lse is None else d_lse.float()
            tensors.update(out=_as(out.detach(), work), lse=_as(lse.detach(), torch.float32).contiguous(),
                           dlse=d_lse.contiguous())
        grads = backends.run_backward(self.backward_text, tensors, self.backend, closure_grads=wanted,
                                      kind=self.derivative.kind, stat=self.derivative.stat, autotune=self.autotune)
        d_captures = [grads.get(abi.closure_grad(i)) if closures_wanted is None or closures_wanted[i] else None
                      for i in range(len(captures))]
        d_captures = [None if g is None else g.to(t.device, t.dtype) for g, t in zip(d_captures, captures)]
        return _as(grads["dq"], q.dtype), _as(grads["dk"], k.dtype), _as(grads["dv"], v.dtype), d_captures


def compiled_call(attn, text: str, q, k, v, backend: str, **call_args) -> CompiledCall:
    """The `CompiledCall` of `attn` for the module `text` (built from q, k, v and `call_args`:
    kv_len, sequences, compose, as `attn._build` takes them); NotImplementedError naming the mods and the
    normalizer when the derivative cannot be built. Kept per module text: everything it holds
    follows from the text (shapes, dtypes, scale, the closure tensors' places), the backend and
    whether the attention autotunes."""
    return kept(attn.__dict__.setdefault("_calls", {}), (text, backend, attn.autotune),
                lambda: _compiled_call(attn, text, q, k, v, backend, **call_args), 64)


def _compiled_call(attn, text: str, q, k, v, backend: str, **call_args) -> CompiledCall:
    from ..core.context import CompileError

    try:
        derivative = Derivative.of(text)
    except CompileError as err:
        raise NotImplementedError(f"the backward of ae_mlir.attention({describe(attn)}) cannot be built: {err}; "
                                  "call it under torch.no_grad() or on tensors that do not require grad") from None
    backward_text = text
    if backend == "cpu" and q.dtype in (torch.bfloat16, torch.float16):
        widened = [torch.empty(t.shape, dtype=torch.float32, device="meta") for t in (q, k, v)]
        backward_text, _ = attn._build(*widened, **call_args)
    # The forward computes with the module's scale, an f32 attribute: the backward recomputes the
    # probabilities from its logsumexp, so it must use that same f32 value (1 / sqrt(12) is not one).
    scale = struct.unpack("f", struct.pack("f", checks.default_scale(attn.scale, q.shape[3])))[0]
    lengths = None
    if call_args.get("kv_len") is not None:
        # The mods' closure tensors come first, then kv_len (paged calls take no gradients); the
        # mods' are the composed ones unless the call reads them as written (the reference backend).
        lengths = len(attn._build(q, k, v, kv_len=call_args["kv_len"], compose=call_args.get("compose", True))[1]) - 1
    return CompiledCall(text, backend, scale, derivative, backward_text, lengths, attn.autotune)


def _as(t, dtype):
    """`t` in `dtype`: itself when it already is (Tensor.to's own check costs more, per tensor
    of every backward call)."""
    return t if t.dtype == dtype else t.to(dtype)


# Zeros the backward kernels read as dlse when the caller used the output alone (the usual
# training step): one per shape and device, read-only, instead of an allocation and a fill
# launched every step.
_ZEROS: dict = {}


def _zeros(shape, device):
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        # A fill recorded into a CUDA graph does not run while capturing: kept for eager calls,
        # the tensor would hold whatever its memory held.
        return torch.zeros(shape, dtype=torch.float32, device=device)
    return kept(_ZEROS, (tuple(shape), device), lambda: torch.zeros(shape, dtype=torch.float32, device=device), 64)


def _zero_past(t, lengths):
    """t [B, H, L, D] with the rows at or past lengths[b] set to zero."""
    keep = torch.arange(t.shape[2], device=t.device).view(1, -1) < lengths.to(t.device).view(-1, 1).long()
    return t.masked_fill(~keep.view(t.shape[0], 1, t.shape[2], 1), 0.0)


def describe(attn) -> str:
    """The variant's pieces by name: score_mod 'alibi', mask_mod 'causal', normalizer 'retnet'."""
    parts = [f"{role}={getattr(fn, '__name__', type(fn).__name__)!r}" for role, fn in
             (("score_mod", attn.score_mod), ("mask_mod", attn.mask_mod)) if fn is not None]
    normalize = attn.normalize if isinstance(attn.normalize, str) else attn.normalize.name
    return ", ".join(parts + [f"normalize={normalize!r}"])


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, call: CompiledCall, q, k, v, *captures):
        out, lse = call.forward(q, k, v, list(captures))
        ctx.call = call
        # The output only feeds softmax's backward kernels; saving it otherwise would make an
        # in-place change of the output an autograd error for nothing.
        kernels = call.with_lse and call.uses_kernels
        ctx.save_for_backward(q, k, v, lse, out if kernels else None, *captures)
        return (out, lse) if call.with_lse else out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, d_out, d_lse=None):
        q, k, v, lse, out, *captures = ctx.saved_tensors
        # needs_input_grad follows forward's inputs: call, q, k, v, then the closure tensors.
        dq, dk, dv, d_captures = ctx.call.backward(q, k, v, captures, lse, d_out, d_lse, ctx.needs_input_grad[4:],
                                                   out)
        return (None, dq, dk, dv, *d_captures)


def differentiable_call(call: CompiledCall, q, k, v, captures: list):
    """(out, lse) connected to the autograd graph of q, k, v and the closure tensors."""
    results = _Attention.apply(call, q, k, v, *captures)
    return results if call.with_lse else (results, None)
