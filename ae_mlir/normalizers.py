"""Online normalizers: how a row of scores is normalized while KV tiles stream by.

A normalizer is written in Python, like a mod, and traced into the regions of the fused
`attn.online_attention` op. Per query row the lowering keeps an optional running statistic `m`
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
    name: str
    stat: str | None  # "max" or None
    log2_domain: bool
    prob: Callable  # (s, m) -> p
    finalize: Callable  # (acc, l) -> out
    rescale: Callable | None = None  # (m_old, m_new) -> alpha; required with a statistic
    lse: Callable | None = None  # (m, l) -> natural-log logsumexp


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


SOFTMAX = OnlineNormalizer(
    name="softmax",
    stat="max",
    log2_domain=True,
    prob=_exp2_of_difference,
    rescale=_exp2_of_difference,
    finalize=_softmax_finalize,
    lse=_softmax_lse,
)

SIGMOID = OnlineNormalizer("sigmoid", None, False, prob=_sigmoid, finalize=_accumulator)
RELU = OnlineNormalizer("relu", None, False, prob=_relu, finalize=_accumulator)
NONE = OnlineNormalizer("none", None, False, prob=_identity_prob, finalize=_accumulator)

BUILTIN = {n.name: n for n in (SOFTMAX, SIGMOID, RELU, NONE)}


def region_texts(normalizer: OnlineNormalizer, with_lse: bool) -> dict[str, str]:
    """Trace the normalizer's functions into region texts keyed prob/rescale/finalize/lse."""
    from .frontend.emit import emit_region
    from .frontend.trace import F32, TraceError, trace

    pieces = {"prob": (normalizer.prob, ("%s", "%m")), "finalize": (normalizer.finalize, ("%acc", "%l"))}
    if normalizer.stat is not None:
        pieces["rescale"] = (normalizer.rescale, ("%m_old", "%m_new"))
    if with_lse and normalizer.lse is not None:
        pieces["lse"] = (normalizer.lse, ("%m", "%l"))
    out = {}
    for key, (fn, names) in pieces.items():
        expr, state = trace(fn, f"normalizer '{normalizer.name}' {key}", [F32, F32])
        if state.captures:
            raise TraceError(f"normalizer '{normalizer.name}' {key} must not read closure tensors")
        if expr.type != F32:
            raise TraceError(f"normalizer '{normalizer.name}' {key} must return a float")
        out[key] = emit_region(expr, [(names[0], "f32"), (names[1], "f32")], [], [], key[0], indent="      ")
    return out
