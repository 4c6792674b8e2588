"""FlexAttention users' mods, as its documentation writes them, run unchanged.

This file imports nothing but torch and ae_mlir: each mod below is plain FlexAttention code, and
ae-mlir's CPU backend must give what FlexAttention itself gives on the same tensors.
"""
from __future__ import annotations

import pytest
import torch
from torch.nn.attention.flex_attention import and_masks, create_block_mask, flex_attention, or_masks

import ae_mlir as ae

B, H, L, D = 2, 4, 80, 32
SLIDING_WINDOW = 16
PREFIX_LENGTH = 20
SOFTCAP = 20.0

document_id = torch.zeros(L, dtype=torch.int64)
document_id[30:55] = 1
document_id[55:] = 2
alibi_slopes = torch.tensor([2.0 ** (-8.0 * (i + 1) / H) for i in range(H)])
rel_bias = torch.randn(H, 2 * L - 1, generator=torch.Generator().manual_seed(5))


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def sliding_window(b, h, q_idx, kv_idx):
    return q_idx - kv_idx <= SLIDING_WINDOW


def prefix_mask(b, h, q_idx, kv_idx):
    return kv_idx < PREFIX_LENGTH


def document_masking(b, h, q_idx, kv_idx):
    return document_id[q_idx] == document_id[kv_idx]


def alibi(score, b, h, q_idx, kv_idx):
    bias = alibi_slopes[h] * (kv_idx - q_idx)
    return score + bias


def soft_cap(score, b, h, q_idx, kv_idx):
    score = score / SOFTCAP
    score = torch.tanh(score)
    score = score * SOFTCAP
    return score


def relative_positional(score, b, h, q_idx, kv_idx):
    return score + rel_bias[h, q_idx - kv_idx + L - 1]


CASES = {
    "causal": (None, causal),
    "sliding_window": (None, and_masks(causal, sliding_window)),
    "prefix_lm": (None, or_masks(prefix_mask, causal)),
    "document": (None, and_masks(document_masking, causal)),
    "alibi": (alibi, causal),
    "softcap": (soft_cap, causal),
    "relative_positional": (relative_positional, None),
}


@pytest.mark.parametrize("name", list(CASES))
def test_flex_attention_mods_run_unchanged(name):
    score_mod, mask_mod = CASES[name]
    gen = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(B, H, L, D, generator=gen) for _ in range(3))
    block_mask = create_block_mask(mask_mod, None, None, L, L, device="cpu") if mask_mod else None
    want = flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask)
    got = ae.attention(score_mod=score_mod, mask_mod=mask_mod)(q, k, v)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
