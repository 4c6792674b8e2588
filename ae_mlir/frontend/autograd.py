"""Autograd for `ae_mlir.attention`: a call whose forward is the compiled kernel and whose
backward is torch evaluating the derivative regions `attn-differentiate` compiles from the same
L0 module (`backward.py`); generated backward kernels do not exist yet.

The forward runs with its logsumexp result (softmax), which the backward uses to recompute the
probabilities a block of query rows at a time instead of saving them.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from . import checks
from .backward import Derivative, attention_backward


@dataclass(frozen=True)
class CompiledCall:
    """One compiled attention: its forward L0 module, where it runs, and its derivative."""

    text: str
    backend: str
    scale: float
    derivative: Derivative

    @property
    def with_lse(self) -> bool:
        return self.derivative.kind == "softmax"

    def forward(self, q, k, v, captures: list):
        """(out, lse) of the compiled kernel; lse is None for normalizers other than softmax."""
        from .api import _execute

        tensors = [t.detach() for t in (q, k, v, *captures)]
        results = _execute(self.text, tensors, self.backend, out_dtype=q.dtype)
        return results[0], (results[1] if self.with_lse else None)

    def backward(self, q, k, v, captures: list, lse, d_out, d_lse, closures_wanted=None):
        return attention_backward(self.derivative, self.scale, q, k, v, captures, lse, d_out, d_lse,
                                  closures_wanted)


def compiled_call(attn, text: str, q, backend: str) -> CompiledCall:
    """The `CompiledCall` of `attn` for the module `text`; NotImplementedError naming the mods and
    the normalizer when the derivative cannot be built."""
    from ..core.context import CompileError

    try:
        derivative = Derivative.of(text)
    except CompileError as err:
        raise NotImplementedError(f"the backward of ae_mlir.attention({describe(attn)}) cannot be built: {err}; "
                                  "call it under torch.no_grad() or on tensors that do not require grad") from None
    return CompiledCall(text, backend, checks.default_scale(attn.scale, q.shape[3]), derivative)


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
        ctx.save_for_backward(q, k, v, lse, *captures)
        return (out, lse) if call.with_lse else out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, d_out, d_lse=None):
        q, k, v, lse, *captures = ctx.saved_tensors
        # needs_input_grad follows forward's inputs: call, q, k, v, then the closure tensors.
        dq, dk, dv, d_captures = ctx.call.backward(q, k, v, captures, lse, d_out, d_lse, ctx.needs_input_grad[4:])
        return (None, dq, dk, dv, *d_captures)


def differentiable_call(call: CompiledCall, q, k, v, captures: list):
    """(out, lse) connected to the autograd graph of q, k, v and the closure tensors."""
    results = _Attention.apply(call, q, k, v, *captures)
    return results if call.with_lse else (results, None)
