"""Attention variants for the Triton benchmarks, in FlexAttention's mod signatures (torch only).

`make(name, b, h, l, device)` returns the mods, the closure tensors they read (in the order the
ae-mlir frontend captures them: score_mod's first, then mask_mod's) and whether torch SDPA
computes the same thing. bench/build_bundles.py traces these mods on the CPU; run_bundles.py
rebuilds them on the GPU with the same shapes, so the bundle's closure tensor arguments line up.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

NAMES = ("full", "causal", "alibi", "softcap_causal", "sliding_window", "document")
WINDOW = 1024
SOFTCAP = 30.0


@dataclass
class Variant:
    name: str
    score_mod: object
    mask_mod: object
    captures: list
    sdpa_causal: bool | None  # None: SDPA has no equivalent


def _causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def make(name: str, b: int, h: int, l: int, device="cpu") -> Variant:
    if name == "full":
        return Variant(name, None, None, [], False)
    if name == "causal":
        return Variant(name, None, _causal, [], True)
    if name == "alibi":
        slopes = torch.exp2(-8.0 * torch.arange(1, h + 1, dtype=torch.float32, device=device) / h)

        def alibi(score, b, h, q_idx, kv_idx):
            return score + slopes[h] * (kv_idx - q_idx)

        return Variant(name, alibi, _causal, [slopes], None)
    if name == "softcap_causal":
        def softcap(score, b, h, q_idx, kv_idx):
            return SOFTCAP * torch.tanh(score / SOFTCAP)

        return Variant(name, softcap, _causal, [], None)
    if name == "sliding_window":
        def window(b, h, q_idx, kv_idx):
            return (q_idx >= kv_idx) & (q_idx - kv_idx <= WINDOW)

        return Variant(name, None, window, [], None)
    if name == "document":
        # Documents of random lengths (a fixed seed, so every machine builds the same ones).
        g = torch.Generator().manual_seed(l)
        cuts = torch.sort(torch.randperm(l - 1, generator=g)[: max(1, l // 1024)] + 1).values
        doc = torch.zeros(l, dtype=torch.int32)
        doc[cuts] = 1
        doc = torch.cumsum(doc, 0).to(torch.int32).to(device)

        def same_document(b, h, q_idx, kv_idx):
            return doc[q_idx] == doc[kv_idx]

        return Variant(name, None, same_document, [doc], None)
    raise ValueError(f"unknown variant {name!r} (expected one of {', '.join(NAMES)})")
