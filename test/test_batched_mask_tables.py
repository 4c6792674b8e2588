"""Masks read at call time that also read the batch entry or the head (document ids per batch
row, a window per head): their tile tables have a batch and a head axis, and every program walks
its own entry's and head's lists, forward and backward, on the CPU and in the Triton bundles (run
in the TTIR interpreter), against float64 references.

The masks make one entry's (or head's) tiles full where another's are cut or skipped, so a
program that read another slice's lists would either run a full tile without the mask or skip a
tile it needs: either changes the result."""
from __future__ import annotations

import pytest
import torch

import ae_mlir as ae
from ae_mlir import block_mask, runtime
from ae_mlir.backends import triton as tb
from ae_mlir.core.block_tables import classify, table_lead
from bundle_interp import interpret, interpret_roles

L = 150  # ragged at every tile size the presets and the tests take


def _doc_per_row(b: int):
    """Entry 0 one document (every tile full without a causal cut), entry 1 ragged documents."""
    doc = torch.zeros(b, L, dtype=torch.int64)
    doc[1] = torch.repeat_interleave(torch.arange(3), torch.tensor([47, 70, 33]))
    return doc


def _masks():
    doc = _doc_per_row(2)
    window = torch.tensor([L, 5, 30, L])

    def per_row_documents(b, h, q, kv):
        return doc[b, q] == doc[b, kv]

    def window_per_head(b, h, q, kv):
        return (q - kv).abs() <= window[h]

    def shifted_causal_per_head(b, h, q, kv):  # positions and the head, no closure tensor
        return kv <= q + 40 * h

    return {"per_row_documents": (per_row_documents, (True, False)),
            "window_per_head": (window_per_head, (False, True)),
            "shifted_causal_per_head": (shifted_causal_per_head, (False, True))}


MASKS = _masks()


def _inputs(h=4, hkv=2, dk=16, seed=0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, h, L, dk, generator=gen, dtype=dtype)
    k = torch.randn(2, hkv, L, dk, generator=gen, dtype=dtype)
    v = torch.randn(2, hkv, L, dk, generator=gen, dtype=dtype)
    return q, k, v


def _reference_gradients(attn, q, k, v, d_out):
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    out = attn(*leaves, backend="reference")
    return out.detach(), torch.autograd.grad(out, leaves, d_out.double())


@pytest.mark.parametrize("name", list(MASKS))
def test_tables_have_the_axes_the_mask_reads_and_differ_per_slice(name):
    mask, (reads_b, reads_h) = MASKS[name]
    attn = ae.attention(mask_mod=mask)
    q, k, v = _inputs(dtype=torch.float32)
    text, captures = attn._build(q, k, v)
    bundle = tb.compile_bundle(attn, q, k, v, config={"block_m": 32, "block_n": 32, "num_warps": 4})
    program = bundle.meta[runtime.MASK_PROGRAM]
    counts, index, full_counts, _ = block_mask.call_time_tables(program, [q, k, v, *captures], L, L, 32, 32, "cpu")
    lead = table_lead(reads_b, reads_h, 2, 4)
    assert list(counts.shape) == lead + [5] and list(index.shape) == lead + [5, 5]
    slices = (counts + full_counts).reshape(-1, 5)
    assert any(not torch.equal(slices[0], s) for s in slices[1:]), "every slice visits the same tiles"
    want = classify(lambda b, h, i, j: mask(b, h, i, j), *lead, L, L, 32, 32, full_width=True)
    assert torch.equal(counts, want.partial_count) and torch.equal(full_counts, want.full_count)


@pytest.mark.parametrize("name", list(MASKS))
def test_cpu_forward_and_backward_match_float64(name):
    _check_cpu(ae.attention(mask_mod=MASKS[name][0]), seed=1)


def _check_cpu(attn, seed: int, tol=1e-5):
    """The CPU backend's output and gradients (float32) against float64 autograd on the reference
    backend, relative to each one's largest magnitude (RetNet's unnormalized outputs and
    gradients reach hundreds)."""
    q, k, v = (t.float().requires_grad_() for t in _inputs(seed=seed))
    d_out = torch.randn(2, 4, L, 16, generator=torch.Generator().manual_seed(seed + 1))
    want_out, want = _reference_gradients(attn, q, k, v, d_out)
    out = attn(q, k, v, backend="cpu")
    got = [out] + list(torch.autograd.grad(out, (q, k, v), d_out))
    for g, w in zip(got, [want_out, *want]):
        scale = w.abs().max()
        torch.testing.assert_close(g.double() / scale, w / scale, atol=tol, rtol=0)


@pytest.mark.parametrize("name", list(MASKS))
@pytest.mark.parametrize("target", ["cuda:90", "hip:gfx942"])
def test_triton_forward_at_the_default_config_matches_float64(name, target):
    attn = ae.attention(mask_mod=MASKS[name][0])
    q, k, v = _inputs(seed=3, dtype=torch.float32)
    captures = attn._build(q, k, v)[1]
    bundle = tb.compile_bundle(attn, q, k, v, target=target)
    assert bundle.meta[runtime.MASK_PROGRAM]
    (out, _), _ = interpret(bundle, q, k, v, *captures)
    want = attn(q.double(), k.double(), v.double(), backend="reference")
    torch.testing.assert_close(out.double(), want, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("name", list(MASKS))
def test_triton_backward_at_the_default_config_matches_float64(name):
    # GQA (4 query heads on 2 KV heads): the dK/dV program walks each of its query heads' lists.
    attn = ae.attention(mask_mod=MASKS[name][0])
    q, k, v = _inputs(seed=4)
    gen = torch.Generator().manual_seed(5)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, lse = attn(*leaves, backend="reference", return_lse=True)
    d_out = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    d_lse = torch.randn(lse.shape, generator=gen, dtype=torch.float64)
    want = torch.autograd.grad((out, lse), leaves, (d_out, d_lse))
    text = attn.mlir(q.float(), k.float(), v.float())
    bundle = tb.build_backward_bundle(text, "cuda:90")
    tensors = {"q": q.float(), "k": k.float(), "v": v.float(), "out": out.detach().float(), "do": d_out.float(),
               "lse": lse.detach().float(), "dlse": d_lse.float()}
    tensors.update({f"c{i}": t for i, t in enumerate(attn._build(q, k, v)[1])})
    assert runtime.backward_call_time_tables(bundle, tensors, "cpu"), "the backward takes no call-time tables"
    got = interpret_roles(bundle, tensors)
    for role, reference in zip(("dq", "dk", "dv"), want):
        scale = reference.abs().max()
        torch.testing.assert_close(got[role].double() / scale, reference / scale, atol=1e-5, rtol=0, msg=role)


@pytest.mark.parametrize("normalizer", ["retnet", "tempered"])
def test_user_normalizers_walk_their_slices_lists(normalizer):
    # A user normalizer's dQ kernel walks its lists once (RetNet's) or three times (a running max).
    from ae_mlir import variants

    make = variants.retnet_normalizer if normalizer == "retnet" else variants.tempered_normalizer
    _check_cpu(ae.attention(mask_mod=MASKS["per_row_documents"][0], normalize=make()), seed=6)
