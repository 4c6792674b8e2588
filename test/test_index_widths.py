"""Index arithmetic past 32 bits in the Triton IR kernels: `index` is i32 there, while the
reference computes positions in int64, so an op whose exact values can leave i32 at the module's
shapes (a hash's large factor, a product of positions past L = 46341) runs in 64 bits, as does
an int64 closure element read into an index unless it provably fits, and only such ops
(passes/triton/elementwise.py, `_wide_index`). Each mod here gave wrong outputs with every index
op in 32 bits. The Gluon kernels' side is in test_gluon_score_mods.py."""
from __future__ import annotations

import re

import pytest
import torch

import ae_mlir as ae
from ae_mlir import runtime
from ae_mlir.backends import triton as tb
from bundle_interp import interpret
from inputs import qkv
from test_backward_triton import _check as check_backward


def hashed(b, h, q_idx, kv_idx):
    return (q_idx * 268435456 + kv_idx) % 3 != 1


def signed_product(score, b, h, q_idx, kv_idx):
    # (q - kv) * 1e9 + 7 leaves i32 on both sides; Python's % is floored, so the bias is 0..10.
    return score + 0.1 * (((q_idx - kv_idx) * 1000000007) % 11).float()


def past_i32_constant(score, b, h, q_idx, kv_idx):
    # 2^40 is no i32: the constant itself is 64-bit, and so are the ops on it.
    return score + 0.05 * (((q_idx * 2 ** 40 + kv_idx) // 2 ** 38) % 9).float()


def signed_remainder_hash(b, h, q_idx, kv_idx):
    # A remainder of a signed dividend, then a hash: bounded only since remsi's rule covers
    # dividends of either sign.
    return (((q_idx - kv_idx) % 7 + q_idx) * 268435459) % 5 != 2


def fitting_product(b, h, q_idx, kv_idx):
    return (q_idx * kv_idx) % 7 != 3


# Document ids 2^32 apart: truncated to 32 bits every query would see every key as its own.
WIDE_IDS = (torch.arange(90) // 20) << 32
BIAS = torch.linspace(-1.0, 1.0, 9)


def wide_ids(b, h, q_idx, kv_idx):
    return WIDE_IDS[q_idx] == WIDE_IDS[kv_idx]


def wide_id_bias(score, b, h, q_idx, kv_idx):
    # Ids read into positions: their difference, shifted back, indexes a table (clamped into it).
    return score + BIAS[(WIDE_IDS[kv_idx] - WIDE_IDS[q_idx]) // 2 ** 32 + 4]


CASES = {"hashed": dict(mask_mod=hashed), "signed_product": dict(score_mod=signed_product),
         "past_i32_constant": dict(score_mod=past_i32_constant, mask_mod=fitting_product),
         "wide_ids": dict(mask_mod=wide_ids, score_mod=wide_id_bias),
         "signed_remainder_hash": dict(mask_mod=signed_remainder_hash)}


@pytest.mark.parametrize("target", ["cuda:90", "hip:gfx942"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_forward_at_the_default_config(name, target):
    attn = ae.attention(**CASES[name])
    q, k, v = qkv(h=2, lq=77, lk=90, dk=32)
    bundle = tb.compile_bundle(attn, q, k, v, target=target)
    out = interpret(bundle, q, k, v, *attn._build(q, k, v)[1])[0][0]
    expected = attn(q.double(), k.double(), v.double(), backend="reference")
    assert (out.double() - expected).abs().max().item() < 1e-5


@pytest.mark.parametrize("name", sorted(CASES))
def test_backward_at_the_default_config(name):
    attn = ae.attention(**CASES[name])
    check_backward(attn, torch.float32, "cuda:90", 1e-5, lq=77, lk=90, closures=attn._build(*qkv(lq=77, lk=90))[1])


def test_packed_sequences_read_their_key_blocks_from_call_time_tables():
    """A packed batch's kernel lists its KV blocks in call-time tables; their reads carry the
    block numbers' range (abi.BOUNDS), so the positions are bounded and the hash is 64-bit there
    too (the fuzz campaign's failing program, before the reads carried it)."""
    from ae_mlir.frontend import varlen

    attn = ae.attention(mask_mod=lambda b, h, q_idx, kv_idx: h + kv_idx <= (kv_idx * 268435459) % 5 + 8)
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(heads, 40, 32, generator=gen) for heads in (2, 1, 1))
    cu = torch.tensor([0, 11, 40], dtype=torch.int32)
    call = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=29, max_seqlen_k=29)
    bundle = tb.compile_bundle(attn, q, k, v, **call)
    views = varlen.packed_views(q, k, v, attn.layout)
    sequences = varlen.prepare(*views[:2], cu, cu, 29, 29, False)
    out = interpret(bundle, *views, *attn._prepare(*views, sequences=sequences)[1])[0][0][0]
    expected = attn(q.double(), k.double(), v.double(), backend="reference", **call)
    assert (out.double() - expected).abs().max().item() < 1e-5


def _index_ops(bundle, width: int) -> set[str]:
    texts = [kernel.variants["aligned"].ttir for kernel in runtime.kernels(bundle, False)]
    return {m.group(1) for text in texts
            for m in re.finditer(rf"(arith\.\w+)\b[^\n]*-> tensor<[^\n]*xi{width}>", text)}


def test_only_the_ops_that_leave_i32_take_64_bits():
    """At L = 77 the product of positions fits (its mask's ops stay 32-bit); the hash's product and
    sum are 64-bit, and its remainder (0..2) comes back to 32 bits for the comparison. At L =
    50000 the same product of positions is 64-bit."""
    q, k, v = qkv(h=2, lq=77, dk=32)
    fits = _index_ops(tb.compile_bundle(ae.attention(mask_mod=fitting_product), q, k, v), 64)
    assert not {"arith.muli", "arith.remsi"} & fits
    hashed_ops = _index_ops(tb.compile_bundle(ae.attention(mask_mod=hashed), q, k, v), 64)
    assert {"arith.muli", "arith.addi", "arith.remsi", "arith.extsi"} <= hashed_ops
    assert "arith.trunci" in _index_ops(tb.compile_bundle(ae.attention(mask_mod=hashed), q, k, v), 32)
    meta = [torch.empty(1, 1, 50000, 64, dtype=torch.bfloat16, device="meta") for _ in range(3)]
    long = _index_ops(tb.compile_bundle(ae.attention(mask_mod=fitting_product), *meta), 64)
    assert "arith.muli" in long
