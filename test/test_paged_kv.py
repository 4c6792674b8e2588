"""Paged KV caches: `attn(q, k_pages, v_pages, block_table=t, kv_len=n)` with K and V in page
pools (vLLM's and FlashAttention's [P, S, Hkv, D] under layout="blhd", [P, Hkv, S, D] under
"bhld") and a block table [B, max_pages]. Checked against the float64 oracle of test_kv_len on
the logical (gathered) cache, with shuffled pages, NaN in every page slot and pool page no entry
reads, garbage table entries past each entry's pages, page sizes 1 to 256 (a row gather below a
KV tile, one slice per tile from a tile up), through the reference, the CPU backend and the TTIR
interpreter at the default configs."""
from __future__ import annotations

import math

import pytest
import torch

import ae_mlir as ae
from ae_mlir.backends import triton as tb
from bundle_interp import interpret
from test_kv_len import _oracle


def _cache(b, hkv, d, page_size, max_pages, lengths, dtype, seed=0):
    """(k_pages, v_pages [P, Hkv, S, D], block_table [B, M], k, v as dense [B, Hkv, M * S, D])
    with the pages shuffled, unread slots NaN and table entries past each entry's pages bogus."""
    gen = torch.Generator().manual_seed(seed)
    n_pages = b * max_pages + 3
    pools = [torch.full((n_pages, hkv, page_size, d), float("nan"), dtype=torch.float64) for _ in range(2)]
    order = torch.randperm(n_pages, generator=gen)
    table = torch.full((b, max_pages), 10**6, dtype=torch.int32)
    dense = [torch.zeros(b, hkv, max_pages * page_size, d, dtype=torch.float64) for _ in range(2)]
    for i, n in enumerate(lengths.tolist()):
        for j in range(-(-n // page_size)):
            page = int(order[i * max_pages + j])
            table[i, j] = page
            rows = min(page_size, n - j * page_size)
            for pool, full in zip(pools, dense):
                values = torch.randn(hkv, rows, d, generator=gen, dtype=torch.float64)
                pool[page, :, :rows] = values
                full[i, :, j * page_size:j * page_size + rows] = values
    return (*(p.to(dtype) for p in pools), table, *(t.to(dtype) for t in dense))


def _mods(lk):
    attn = ae.attention(score_mod=lambda s, b, h, i, j: s - 0.02 * (j - i),
                        mask_mod=lambda b, h, i, j: j <= i + lk - 40)
    return attn, (lambda s, i, j: s - 0.02 * (j - i)), (lambda i, j: j <= i + lk - 40)


@pytest.mark.parametrize("page_size, max_pages", [(1, 90), (4, 25), (16, 6), (64, 2)])
@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_paged_cache_matches_the_oracle(page_size, max_pages, backend):
    lk = page_size * max_pages
    lengths = torch.tensor([lk, 0, 1, lk // 2 + 3], dtype=torch.int32)
    k_pages, v_pages, table, k, v = _cache(4, 2, 16, page_size, max_pages, lengths, torch.float32)
    q = torch.randn(4, 4, 5, 16, generator=torch.Generator().manual_seed(1))
    attn, score_mod, keep = _mods(lk)
    out, lse = attn(q, k_pages, v_pages, kv_len=lengths, block_table=table, backend=backend, return_lse=True)
    want, want_lse = _oracle(q, k, v, lengths, score_mod, keep)
    torch.testing.assert_close(out.double(), want, rtol=0, atol=2e-6)
    finite = torch.isfinite(want_lse)
    assert torch.equal(finite, torch.isfinite(lse))
    torch.testing.assert_close(lse.double()[finite], want_lse[finite], rtol=0, atol=2e-6)


def test_flash_attention_layout_and_a_full_table_without_lengths():
    # layout="blhd": q [B, L, H, D], pages [P, S, Hkv, D] as vLLM and FlashAttention keep them.
    lengths = torch.tensor([48, 48])
    k_pages, v_pages, table, k, v = _cache(2, 2, 8, 16, 3, lengths, torch.float32)
    q = torch.randn(2, 6, 4, 8, generator=torch.Generator().manual_seed(2))
    attn = ae.attention(layout="blhd")
    out = attn(q, k_pages.transpose(1, 2), v_pages.transpose(1, 2), block_table=table)
    want, _ = _oracle(q.transpose(1, 2), k, v, lengths)
    torch.testing.assert_close(out.double(), want.transpose(1, 2), rtol=0, atol=2e-6)


@pytest.mark.parametrize("target", ["cuda:90", "hip:gfx942"])
@pytest.mark.parametrize("lq, page_size, max_pages", [(1, 16, 40), (4, 256, 3), (1, 1, 150), (100, 64, 4)])
def test_default_config_bundles_in_the_ttir_interpreter(target, lq, page_size, max_pages):
    lk = page_size * max_pages
    lengths = torch.tensor([lk, 0, lk // 3 + 1], dtype=torch.int32)
    k_pages, v_pages, table, k, v = _cache(3, 2, 64, page_size, max_pages, lengths, torch.bfloat16)
    q = torch.randn(3, 8, lq, 64, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    attn, score_mod, keep = _mods(lk)
    bundle = tb.compile_bundle(attn, q, k_pages, v_pages, target=target, kv_len=lengths, block_table=table)
    (out, lse), _ = interpret(bundle, q, k_pages, v_pages, lengths, table)
    want, want_lse = _oracle(q, k, v, lengths, score_mod, keep)
    assert (out.double() - want).abs().max() < 2e-2 * want.abs().max()
    finite = torch.isfinite(want_lse)
    assert torch.equal(finite, torch.isfinite(lse))
    assert (lse.double()[finite] - want_lse[finite]).abs().max() < 1e-4 * math.log(lk)


def test_paged_cache_under_torch_compile():
    lengths = torch.tensor([30, 7])
    k_pages, v_pages, table, k, v = _cache(2, 2, 16, 8, 4, lengths, torch.float32)
    q = torch.randn(2, 4, 3, 16, generator=torch.Generator().manual_seed(4))
    attn = ae.attention()

    def step(q, k_pages, v_pages, table, lengths):
        return attn(q, k_pages, v_pages, kv_len=lengths, block_table=table)

    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)(q, k_pages, v_pages, table, lengths)
    torch.testing.assert_close(compiled, step(q, k_pages, v_pages, table, lengths))
    want, _ = _oracle(q, k, v, lengths)
    torch.testing.assert_close(compiled.double(), want, rtol=0, atol=2e-6)


def test_bad_paged_arguments():
    lengths = torch.tensor([8, 8])
    k_pages, v_pages, table, _, _ = _cache(2, 2, 8, 4, 2, lengths, torch.float32)
    q = torch.randn(2, 2, 3, 8)
    attn = ae.attention()
    with pytest.raises(ValueError, match="int32 or int64"):
        attn(q, k_pages, v_pages, block_table=table.float())
    with pytest.raises(ValueError, match=r"block_table must have shape \(2, max_pages\)"):
        attn(q, k_pages, v_pages, block_table=table[:1])
    with pytest.raises(ValueError, match="number of pages, heads and page size"):
        attn(q, k_pages, v_pages[:-1], block_table=table)
    with pytest.raises(ValueError, match="gradients through a paged KV cache"):
        attn(q.requires_grad_(), k_pages, v_pages, block_table=table)
    q = q.detach()
    bad = table.clone()
    bad[1, 1] = -3
    with pytest.raises(ValueError, match=r"block_table\[1, 1\] = -3 is not a page number in \[0, 7\)"):
        ae.attention(check_indices=True)(q, k_pages, v_pages, block_table=bad)
    # Entries past an entry's pages are not read, so they are not checked either.
    ae.attention(check_indices=True)(q, k_pages, v_pages, block_table=bad, kv_len=torch.tensor([8, 4]))


def test_checked_mode_sees_the_logical_keys():
    # The mods see M * S keys; a closure tensor sized for one page is out of range past it.
    lengths = torch.tensor([12, 12])
    k_pages, v_pages, table, _, _ = _cache(2, 2, 8, 4, 3, lengths, torch.float32)
    q = torch.randn(2, 2, 1, 8)
    page_sized = torch.randn(4)
    attn = ae.attention(score_mod=lambda s, b, h, i, j: s + page_sized[j], check_indices=True)
    with pytest.raises(IndexError, match="index 4 is out of range"):
        attn(q, k_pages, v_pages, block_table=table)
    attn(q, k_pages, v_pages, block_table=table, kv_len=torch.tensor([4, 3]))  # keys past kv_len unchecked


def test_t5_reads_a_table_composed_over_the_logical_cache():
    # Positions run over the logical cache (max_pages * page_size keys), so T5's bucket is composed
    # per distance as for a dense cache: one read of a [H, Lq + Lk - 1] table per score, no log.
    from ae_mlir import variants

    page_size, max_pages = 16, 6
    lk = page_size * max_pages
    lengths = torch.tensor([lk, 0, 1, lk // 2 + 3], dtype=torch.int32)
    k_pages, v_pages, table, k, v = _cache(4, 2, 16, page_size, max_pages, lengths, torch.float32)
    q = torch.randn(4, 4, 5, 16, generator=torch.Generator().manual_seed(2))
    attn, _ = variants.build("t5_bias", variants.Shape(4, 4, 5, lk, 16, 16))
    text = attn.mlir(q, k_pages, v_pages, kv_len=lengths, block_table=table)
    assert f"tensor<4x{5 + lk - 1}xf32>" in text and "math.log" not in text
    out = attn(q, k_pages, v_pages, kv_len=lengths, block_table=table)
    want = attn(q.double(), k.double(), v.double(), kv_len=lengths, backend="reference")
    torch.testing.assert_close(out.double(), want, rtol=0, atol=2e-6)
