"""Packed batches whose mask reads closure tensors (a prefix per sequence: prefix-LM; a window per
head): the forward kernels walk tile tables classified at call time per sequence (b is the
sequence) over the kernel's CALL_TIME_GRID, bounded by each sequence's keys, instead of visiting
every tile with the mask. Checked against a float64 oracle per sequence through the CPU backend
and each target's default-config bundle in the TTIR interpreter, at two totals; the tables list
no tile past a sequence's keys; sequences whose tables differ (a prefix of 0 beside one of 200)
make a kernel that read another sequence's row wrong."""
from __future__ import annotations

import math

import pytest
import torch

import ae_mlir as ae
from ae_mlir import runtime
from ae_mlir.core import abi
from ae_mlir.backends import triton as tb
from ae_mlir.frontend import varlen
from bundle_interp import interpret

PREFIX = torch.tensor([200, 0, 40, 7, 0])
WINDOW = torch.tensor([16, 300])
BATCHES = [[130, 300, 0, 257, 1], [300, 2, 90, 33, 256]]


def _prefix_lm(b, h, q_idx, kv_idx):
    return (kv_idx <= q_idx) | (kv_idx < PREFIX[b])


def _head_window(b, h, q_idx, kv_idx):
    return (kv_idx <= q_idx) & (q_idx - kv_idx < WINDOW[h])


def _oracle(q, k, v, lens, keep):
    """float64 attention of packed [T, H, D] q, k, v sequence by sequence; keep(b, h, i, j)."""
    outs, lo = [], 0
    heads = q.shape[1]
    for s, n in enumerate(lens):
        qs, ks, vs = (t[lo:lo + n].double().transpose(0, 1) for t in (q, k, v))
        scores = qs @ ks.transpose(-1, -2) / math.sqrt(q.shape[-1])
        i, j = torch.arange(n).view(1, -1, 1), torch.arange(n).view(1, 1, -1)
        kept = keep(s, torch.arange(heads).view(-1, 1, 1), i, j).expand(heads, n, n)
        outs.append((scores.masked_fill(~kept, -math.inf).softmax(-1).nan_to_num() @ vs).transpose(0, 1))
        lo += n
    return torch.cat(outs)


def _batch(lens, seed, dtype=torch.float32, d=32):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(sum(lens), 2, d, generator=gen).to(dtype) for _ in range(3))
    return q, k, v, torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)


def _keep(mask):
    if mask is _prefix_lm:
        return lambda s, h, i, j: (j <= i) | (j < PREFIX[s])
    return lambda s, h, i, j: (j <= i) & (i - j < WINDOW[h])


@pytest.mark.parametrize("mask", [_prefix_lm, _head_window], ids=["prefix", "window"])
def test_cpu_backend_at_two_totals(mask):
    attn = ae.attention(mask_mod=mask, layout="blhd")
    for seed, lens in enumerate(BATCHES):
        q, k, v, cu = _batch(lens, seed)
        out = attn(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, backend="cpu", max_seqlen_q=512, max_seqlen_k=512)
        torch.testing.assert_close(out.double(), _oracle(q, k, v, lens, _keep(mask)), rtol=0, atol=2e-6)


@pytest.mark.parametrize("target", ["cuda:90", "hip:gfx942"])
@pytest.mark.parametrize("mask", [_prefix_lm, _head_window], ids=["prefix", "window"])
def test_default_config_bundles_at_two_totals(target, mask):
    attn = ae.attention(mask_mod=mask, layout="blhd")
    bundle = None
    for seed, lens in enumerate(BATCHES):
        q, k, v, cu = _batch(lens, seed, torch.bfloat16, d=64)
        bundle = bundle or tb.compile_bundle(attn, q, k, v, target=target, cu_seqlens_q=cu, cu_seqlens_k=cu,
                                             max_seqlen_q=512, max_seqlen_k=512)
        assert runtime.MASK_PROGRAM in bundle.meta and bundle.meta[runtime.CALL_TIME_GRID] == [8, 512, 512]
        views = varlen.packed_views(q, k, v, "blhd")
        sequences = varlen.prepare(*views[:2], cu, cu, 512, 512, False)
        _, captures = attn._prepare(*views, sequences=sequences)
        (out, _), _ = interpret(bundle, *views, *captures)
        want = _oracle(q, k, v, lens, _keep(mask))
        assert (out[0].transpose(0, 1).double() - want).abs().max() < 2e-2 * want.abs().max()


def test_tables_are_per_sequence_and_stop_at_its_keys():
    attn = ae.attention(mask_mod=_prefix_lm, layout="blhd")
    lens = BATCHES[0]
    q, k, v, cu = _batch(lens, 0, torch.bfloat16, d=64)
    bundle = tb.compile_bundle(attn, q, k, v, target="cuda:90", cu_seqlens_q=cu, cu_seqlens_k=cu)
    views = varlen.packed_views(q, k, v, "blhd")
    sequences = varlen.prepare(*views[:2], cu, cu, None, None, False)
    _, captures = attn._prepare(*views, sequences=sequences)
    partial_count, partial_index, full_count, full_index = runtime.call_time_tables(bundle, *views, *captures)
    assert partial_count.shape[:2] == (8, 1)  # a row per (padded) sequence, shared by the heads
    bn = bundle.block_n
    for s in range(8):
        keys = lens[s] if s < len(lens) else 0
        for count, index in ((partial_count, partial_index), (full_count, full_index)):
            for m in range(count.shape[2]):
                listed = index[s, 0, m, :int(count[s, 0, m])]
                assert all(int(n) * bn < keys for n in listed), (s, m, listed)
    # The long prefix (200 keys) of sequence 0 lists KV tiles above its diagonal; sequence 1 (no
    # prefix) lists none: their rows differ.
    first_block = int(partial_count[0, 0, 0] + full_count[0, 0, 0]), int(partial_count[1, 0, 0] + full_count[1, 0, 0])
    assert first_block[0] > first_block[1] >= 1


def test_layers_on_the_same_offsets_check_and_classify_once(monkeypatch):
    """A model's layers call attention on the same offsets one after another: the offsets are read
    and checked once and the tables classified once, until the offsets change in place."""
    from ae_mlir import block_mask

    attn = ae.attention(mask_mod=_prefix_lm, layout="blhd")
    classified = []
    real = block_mask.mask_flags
    monkeypatch.setattr(block_mask, "mask_flags", lambda *a, **kw: classified.append(1) or real(*a, **kw))
    q, k, v, cu = _batch(BATCHES[0], 0)
    first = [attn(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, backend="cpu") for _ in range(3)]
    assert len(classified) == 1 and all(torch.equal(first[0], out) for out in first)
    cu[-1] += 5  # past the packed rows: the changed offsets are checked again
    with pytest.raises(ValueError, match="end at the"):
        attn(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, backend="cpu")
    cu[-1] -= 5
    attn(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, backend="cpu")
    assert len(classified) == 2


# --- the backward: tables per sequence, bounded by its keys and its queries -----------------------
def _backward_oracle(q, k, v, d_out, cu, score_mod=None, learnable=()):
    """float64 gradients of packed [T, H, D] q, k, v (and of the `learnable` closure tensors) of
    the packed prefix-LM attention (packed_oracle: b is the sequence there too)."""
    from packed_oracle import packed_gradients

    attn = ae.attention(score_mod=score_mod, mask_mod=_prefix_lm)
    offsets = cu.tolist()
    grads = packed_gradients(attn, *(t.transpose(0, 1) for t in (q, k, v, d_out)), offsets, offsets, 512, 512,
                             learnable)
    return [g.transpose(0, 1) for g in grads[:3]] + grads[3:]


def _relative_bias(table):
    return lambda s, b, h, q_idx, kv_idx: s + table[h, q_idx - kv_idx + 511]


def _relative(got, want):
    return ((got.double() - want).abs().max() / want.abs().max()).item()


def test_cpu_backward_takes_tables_per_sequence(monkeypatch):
    """The prefix per sequence beside a learnable relative-bias table: the backward kernels walk
    tables classified per sequence, and the gradients of q, k, v and the table match each
    sequence alone (a tile listed past a sequence's keys would add the scores of zero keys into
    the table's gradient)."""
    from ae_mlir import block_mask
    from test_backward_kernels import kernels_only

    grids, layouts = [], []
    real, tables = block_mask.mask_flags, block_mask._tables
    monkeypatch.setattr(block_mask, "mask_flags", lambda *a: grids.append(a[7:]) or real(*a))
    monkeypatch.setattr(block_mask, "_tables", lambda *a: layouts.append(a[-1]) or tables(*a))
    lens = BATCHES[0]
    q, k, v, cu = _batch(lens, 4)
    d_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(5))
    table = (torch.randn(2, 2 * 512 - 1, generator=torch.Generator().manual_seed(6)) * 0.5).requires_grad_()
    attn = ae.attention(score_mod=_relative_bias(table), mask_mod=_prefix_lm, layout="blhd")
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    with kernels_only():
        out = attn(*leaves, cu_seqlens_q=cu, cu_seqlens_k=cu, backend="cpu", max_seqlen_q=512, max_seqlen_k=512)
        got = torch.autograd.grad(out, leaves + [table], d_out)
    want = _backward_oracle(q, k, v, d_out, cu, _relative_bias(table), [table])
    for name, g, w in zip(("dq", "dk", "dv", "dtable"), got, want):
        assert _relative(g, w) < 1e-5, name
    # One evaluation of the mask: the forward's program and the backward's bound each sequence's
    # keys and queries alike, and name the same tensors at other argument positions.
    assert grids == [(8,)] and sorted(layouts) == ["dkdv", "dq", "forward"]


def test_backward_tables_stop_at_each_sequences_keys_and_queries():
    """Each backward kernel's tables list, per sequence, no KV block past its keys and no query
    block past its queries (the dK/dV kernel walks query blocks: rows past a sequence's end are
    the next sequence's), and blocks past the end list nothing."""
    attn = ae.attention(mask_mod=_prefix_lm, layout="blhd")
    lens = BATCHES[1]
    q, k, v, cu = _batch(lens, 0, torch.bfloat16, d=64)
    text = attn.mlir(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=512, max_seqlen_k=512)
    bundle = tb.build_backward_bundle(text, "cuda:90")
    assert bundle.meta[runtime.CALL_TIME_GRID] == [8, 512, 512]
    views = varlen.packed_views(q, k, v, "blhd")
    sequences = varlen.prepare(*views[:2], cu, cu, 512, 512, False)
    _, captures = attn._prepare(*views, sequences=sequences)
    given = {"q": views[0], "k": views[1], "v": views[2], **{f"c{i}": c for i, c in enumerate(captures)}}
    tables = runtime.backward_call_time_tables(bundle, given, "cpu")
    config = bundle.meta["config"]
    for part in ("dq", "dkdv"):
        bm, bn = abi.backward_blocks(part, config)
        # dq: a row per query block listing KV blocks; dkdv: a row per KV block listing query blocks.
        own, other = (bm, bn) if part == "dq" else (bn, bm)
        counts = [tables[f"{part}_{kind}_count"] for kind in ("partial", "full")]
        indices = [tables[f"{part}_{kind}_index"] for kind in ("partial", "full")]
        for s in range(8):
            n = lens[s] if s < len(lens) else 0
            for block in range(counts[0].shape[2]):
                listed = [int(i) for c, ix in zip(counts, indices) for i in ix[s, 0, block, :int(c[s, 0, block])]]
                if block * own >= n:
                    assert listed == [], (part, s, block)
                assert all(i * other < n for i in listed), (part, s, block, listed)


@pytest.mark.parametrize("target", ["cuda:90", "hip:gfx942"])
def test_backward_bundles_in_the_interpreter(target):
    """Each target's default-config backward bundle of the packed prefix-LM in the TTIR
    interpreter, its forward's out and lse from the CPU backend, against each sequence alone."""
    from bundle_interp import interpret_roles

    lens = [70, 0, 129, 33]
    q, k, v, cu = _batch(lens, 7, d=32)
    d_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(8))
    attn = ae.attention(mask_mod=_prefix_lm, layout="blhd")
    out, lse = attn(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, backend="cpu", return_lse=True)
    bundle = tb.build_backward_bundle(attn.mlir(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu), target)
    assert runtime.MASK_PROGRAM in bundle.meta
    views = varlen.packed_views(q, k, v, "blhd")
    sequences = varlen.prepare(*views[:2], cu, cu, None, None, False)
    _, captures = attn._prepare(*views, sequences=sequences)
    given = {"q": views[0], "k": views[1], "v": views[2], "do": varlen.packed_views(d_out, d_out, d_out, "blhd")[0],
             "out": varlen.packed_views(out, out, out, "blhd")[0], "lse": lse.unsqueeze(0),
             **{f"c{i}": c for i, c in enumerate(captures)}}
    given["dlse"] = torch.zeros_like(given["lse"])
    got = interpret_roles(bundle, given)
    want = _backward_oracle(q, k, v, d_out, cu)
    for name, w in zip(("dq", "dk", "dv"), want):
        assert _relative(got[name][0].transpose(0, 1), w) < 1e-4, name
