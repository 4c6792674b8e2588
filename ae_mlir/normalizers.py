"""Online normalizers: how a row of scores is normalized while KV tiles stream by.

A normalizer is written in Python, like a mod; a user's is traced into the regions of its
`attn.normalize` op (kind "online") at L0, which `attn-fuse-online-softmax` moves into the fused
`attn.online_attention` op. The built-in ones below (SOFTMAX, SIGMOID, RELU, NONE) state the math
that pass builds for the kinds "softmax", "sigmoid", "relu" and "none" with
`ae_mlir.core.normalizer_regions` (test_normalizers checks that both agree), so that no pass runs
the tracer. Per query row the lowering keeps an optional running statistic `m`
(a max over the scores seen so far; masked scores count as -inf) and a running sum `l` of the
probabilities, and for every KV tile computes

    m_new = max(m, rowmax(s))              (when stat == "max")
    p     = prob(s, m_new)                 (masked entries are forced to 0)
    alpha = rescale(m, m_new)              (1 when there is no statistic)
    l     = alpha * l + rowsum(p);  acc = alpha * acc + p @ V
    out   = finalize(acc, l),  lse = lse(m, l)

A row whose scores are all masked keeps m = -inf; the lowering passes 0 in its place so that no
`-inf - -inf` ever reaches `prob` or `rescale`. With `log2_domain`, scores are multiplied by
log2(e) before the statistic (folded into the q.k scale when there is no score_mod), so softmax
uses exp2, which GPUs evaluate natively.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class OnlineNormalizer:
    """A row normalizer in online form (see the module docstring).

    `prob(s, m)` and `finalize(acc, l)` are required; give `rescale(m_old, m_new)` to keep the
    running row max `m` (without it, m is 0 and no rescaling happens). `finalize` must be linear
    in `acc` (finalize(c * acc, l) = c * finalize(acc, l)), which is what lets the division move
    to the end of the row; at L0 it is applied to each probability, at L1 once to the accumulator.
    """

    prob: Callable
    finalize: Callable
    rescale: Callable | None = None
    name: str = "custom"
    log2_domain: bool = False
    lse: Callable | None = None

    def __post_init__(self):
        for role in ("prob", "finalize"):
            if not callable(getattr(self, role)):
                raise TypeError(f"OnlineNormalizer {role} must be callable, got {type(getattr(self, role)).__name__}")
        if self.rescale is not None and not callable(self.rescale):
            raise TypeError(f"OnlineNormalizer rescale must be callable or None, got {type(self.rescale).__name__}")

    @property
    def stat(self) -> str | None:
        return "max" if self.rescale is not None else None


def _exp2_of_difference(a, b):
    import torch

    return torch.exp2(a - b)


def _sigmoid(s, m):
    import torch

    return torch.sigmoid(s)


def _relu(s, m):
    import torch

    return torch.relu(s)


def _identity_prob(s, m):
    return s


def _accumulator(acc, l):
    return acc


def _softmax_finalize(acc, l):
    import torch

    return torch.where(l == 0.0, 0.0, acc / l)


def _softmax_lse(m, l):
    import torch

    return torch.where(l == 0.0, -math.inf, (m + torch.log2(l)) * math.log(2.0))


SOFTMAX = OnlineNormalizer(prob=_exp2_of_difference, finalize=_softmax_finalize, rescale=_exp2_of_difference,
                           name="softmax", log2_domain=True, lse=_softmax_lse)
SIGMOID = OnlineNormalizer(prob=_sigmoid, finalize=_accumulator, name="sigmoid")
RELU = OnlineNormalizer(prob=_relu, finalize=_accumulator, name="relu")
NONE = OnlineNormalizer(prob=_identity_prob, finalize=_accumulator, name="none")

BUILTIN = {n.name: n for n in (SOFTMAX, SIGMOID, RELU, NONE)}


def region_texts(normalizer: OnlineNormalizer, indent: str = "    ") -> dict[str, str]:
    """Trace a user normalizer's functions into region texts keyed prob/rescale/finalize. The
    functions are traced on every call (what they read may have changed); their texts are
    written once per traced form (`frontend.module_text.signature`) and kept on the normalizer."""
    from .core.memo import kept
    from .frontend.emit import emit_region
    from .frontend.module_text import signature
    from .frontend.trace import F32, TraceError, trace

    pieces = {"prob": (normalizer.prob, ("%s", "%m")), "finalize": (normalizer.finalize, ("%acc", "%l"))}
    if normalizer.stat is not None:
        pieces["rescale"] = (normalizer.rescale, ("%m_old", "%m_new"))
    traced = {}
    for key, (fn, names) in pieces.items():
        expr, state = trace(fn, f"normalizer '{normalizer.name}' {key}", [F32, F32])
        if state.captures:
            raise TraceError(f"normalizer '{normalizer.name}' {key} must not read closure tensors")
        if expr.type != F32:
            raise TraceError(f"normalizer '{normalizer.name}' {key} must return a float")
        traced[key] = (expr, names)
    form = (indent,) + tuple((key, signature(expr, [])) for key, (expr, _) in traced.items())
    return kept(normalizer.__dict__.setdefault("_region_texts", {}), form, lambda: {
        key: emit_region(expr, [(names[0], "f32"), (names[1], "f32")], [], [], key[0], indent=indent)
        for key, (expr, names) in traced.items()}, 16)
