"""The softmax backward as kernels (the element-wise normalizers': test_backward_elementwise): `attn-tile-backward`'s dK/dV and dQ kernels, checked in the L1
interpreter (float64, against autograd on the reference backend), on the CPU backend end to end
through autograd (float32 and bfloat16), the path autograd takes (kernels or the torch fallback),
and the errors of the pass.

The CPU tests compile two kernels per module (a few seconds each), so their shapes are small and
several tests share a module (same attention, same shapes): the second use is a cache hit.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import replace

import pytest
import torch

import ae_mlir as ae
from ae_mlir import backends, variants
from ae_mlir.core import abi
from ae_mlir.core.context import CompileError, new_context, parse_module
from ae_mlir.frontend import autograd
from ae_mlir.passes import build_pass_manager, create_pass

from l1_interp import kernels_of, run_by_role

# Every softmax entry of the catalogue (test_softmax_entries_are_all_covered keeps this in step).
SOFTMAX = ["full", "causal", "sliding_window", "causal_sliding", "prefix_lm", "document", "document_rows",
           "alibi", "relative_bias", "softcap", "t5_bias", "gqa", "mla_dims", "dilated"]


def backward_module(text: str, block_m: int, block_n: int):
    ctx = new_context()
    module = parse_module(text, ctx)
    pipeline = f"builtin.module(attn-differentiate,attn-tile-backward{{block-m={block_m} block-n={block_n}}})"
    build_pass_manager(pipeline, ctx).run(module.operation)
    return ctx, module


def _leaves(*tensors, dtype=torch.float64):
    return [t.detach().to(dtype).requires_grad_() for t in tensors]


def reference_grads(attn, q, k, v, d_out, d_lse=None):
    """(out, lse, dq, dk, dv) by float64 autograd on the reference backend."""
    q, k, v = _leaves(q, k, v)
    out, lse = attn(q, k, v, backend="reference", return_lse=True)
    loss = (out * d_out.double()).sum()
    if d_lse is not None:
        loss = loss + (lse * d_lse.double()).sum()
    dq, dk, dv = torch.autograd.grad(loss, (q, k, v))
    return out.detach(), lse.detach(), dq, dk, dv


def _relative_error(got, want) -> float:
    """Max abs error over the reference's max abs (at least 0.01: a gradient that is 0, as dq with
    one key, is checked absolutely)."""
    return float((got.double() - want).abs().max() / want.abs().max().clamp(min=1e-2))


def check_l1(attn, q, k, v, block_m=16, block_n=16, seed=0, tol=1e-6, with_dlse=False):
    """The backward kernels in the L1 interpreter (float64, in module order, by argument role)
    against float64 autograd on the reference backend; with_dlse: the loss reads lse too. The
    kernels' exp2 takes its arguments times log2(e) (and the scale), constants the L1 module holds
    as f32: relative errors of about 1e-7 of the exponent, so the float64 run agrees to 1e-6, not
    to rounding; a wrong term costs far more."""
    gen = torch.Generator().manual_seed(seed)
    d_out = torch.randn(*q.shape[:3], v.shape[3], generator=gen, dtype=torch.float64)
    d_lse = torch.randn(*q.shape[:3], generator=gen, dtype=torch.float64) if with_dlse else None
    out, lse, *want = reference_grads(attn, q, k, v, d_out, d_lse)
    text, captures = attn._build(q.float(), k.float(), v.float())
    ctx, module = backward_module(text, block_m, block_n)
    d_lse = torch.zeros_like(lse) if d_lse is None else d_lse
    tensors = {"q": q, "k": k, "v": v, "out": out, "do": d_out, "lse": lse, "dlse": d_lse}
    tensors.update({abi.capture(i): c for i, c in enumerate(captures)})
    with ctx:
        assert sorted(abi.name(f).rsplit("_", 1)[1] for f in kernels_of(module)) == ["dkdv", "dq"]
        got = run_by_role(module, tensors)
    # The dQ kernel's delta, FlashAttention's preprocess, which the dK/dV kernel reads.
    delta = (d_out * out).sum(-1) - d_lse
    assert _relative_error(got["delta"], delta) < tol, "delta"
    for name, w in zip(("dq", "dk", "dv"), want):
        assert got[name].shape == w.shape, name
        assert torch.isfinite(got[name]).all(), name
        err = _relative_error(got[name], w)
        assert err < tol, f"{name}: relative error {err:.3g}"


# --- a. the kernels in the L1 interpreter, float64 ---------------------------------------------------


def test_softmax_entries_are_all_covered():
    shape = variants.Shape(1, 4, 8, 8, 4, 4)
    softmax = [name for name in variants.CATALOGUE if variants.build(name, shape)[0].normalize == "softmax"]
    assert sorted(softmax) == sorted(SOFTMAX)


def _f32_scale(dk: int) -> float:
    return torch.tensor(1 / math.sqrt(dk), dtype=torch.float32).item()


@pytest.mark.parametrize("name", SOFTMAX)
def test_catalogue_l1_backward_matches_autograd(name):
    # Lq != Lk, neither a multiple of the 16x16 tiles, batch 2: ragged edges on both sequences.
    attn, shape = variants.build(name, variants.Shape(2, 4, 45, 70, 16, 16))
    q, k, v = variants.inputs(shape, dtype=torch.float64, seed=1)
    # The kernels, the forward and the torch backward use the module's f32 scale (see
    # test_reference_backward_uses_the_modules_scale); the oracle's autograd gets the same value,
    # so that an inexact 1 / sqrt(Dk) (mla_dims' 192) does not cost 1e-8.
    attn = ae.attention(score_mod=attn.score_mod, mask_mod=attn.mask_mod, scale=_f32_scale(shape.dim_qk))
    check_l1(attn, q, k, v)


def test_reference_backward_uses_the_modules_scale():
    # Dk = 12: 1 / sqrt(12) is not an f32. The float64 reference forward computes with the f32
    # rounding of the scale (the attn.score attribute); its gradient should be that function's.
    gen = torch.Generator().manual_seed(11)
    q, k, v = _leaves(*(torch.randn(1, 2, 10, 12, generator=gen) for _ in range(3)))
    attn = ae.attention(mask_mod=lambda b, h, i, j: i >= j)
    out = attn(q, k, v, backend="reference")
    got = torch.autograd.grad(out.sum(), (q, k, v))
    scale = _f32_scale(12)
    oracle_leaves = _leaves(q, k, v)
    i, j = torch.arange(10).view(-1, 1), torch.arange(10).view(1, -1)
    s = (scale * oracle_leaves[0] @ oracle_leaves[1].transpose(-1, -2)).masked_fill(i < j, -math.inf)
    oracle = torch.softmax(s, -1) @ oracle_leaves[2]
    torch.testing.assert_close(out, oracle, rtol=1e-13, atol=1e-13)  # the forward agrees
    want = torch.autograd.grad(oracle.sum(), oracle_leaves)
    for name, g, w in zip("qkv", got, want):
        assert _relative_error(g, w) < 1e-12, name


def _bottom_right_window(lq, lk, window):
    def window_mask(b, h, q_idx, kv_idx):
        d = q_idx + (lk - lq) - kv_idx
        return (d >= 0) & (d <= window)

    return window_mask


@pytest.mark.parametrize("lq, lk", [(37, 53), (53, 37)])
def test_ragged_gqa_with_bias_table_and_window(lq, lk):
    # GQA (4 heads on 2 KV heads), Dk != Dv, both sequences ragged, a bias table read through a
    # closure tensor and a band mask: partial, full and skipped tiles in both kernels.
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(1, 4, lq, 16, generator=gen, dtype=torch.float64)
    k = torch.randn(1, 2, lk, 16, generator=gen, dtype=torch.float64)
    v = torch.randn(1, 2, lk, 8, generator=gen, dtype=torch.float64)
    table = torch.randn(4, lq + lk - 1, generator=gen)

    def bias(score, b, h, q_idx, kv_idx):
        return score + table[h, q_idx - kv_idx + lk - 1]

    attn = ae.attention(score_mod=bias, mask_mod=_bottom_right_window(lq, lk, 20))
    check_l1(attn, q, k, v, with_dlse=True)


def test_rows_without_keys_and_head_dependent_mask():
    # Row 0 sees no key (lse = -inf: P must come out 0, not inf * 0), and a mask that reads the
    # head visits every tile with the mask; GQA, so the dK/dV kernel's head loop reads it too.
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(2, 4, 40, 16, generator=gen, dtype=torch.float64)
    k = torch.randn(2, 2, 40, 16, generator=gen, dtype=torch.float64)
    v = torch.randn(2, 2, 40, 16, generator=gen, dtype=torch.float64)
    attn = ae.attention(mask_mod=lambda b, h, i, j: (i > j) | ((h == 1) & (i > 0)))
    check_l1(attn, q, k, v)


_CAUSAL = ae.attention(mask_mod=lambda b, h, i, j: i >= j)
_DOC = torch.tensor([[0] * 10 + [1] * 20 + [2] * 15, [0] * 30 + [1] * 15])
_BATCH_BIAS = torch.randn(2, 4, generator=torch.Generator().manual_seed(12))


@pytest.mark.parametrize("attn, dims, blocks", [
    (_CAUSAL, (1, 2, 2, 45, 45), (64, 16)),         # one query block, four KV blocks
    (_CAUSAL, (1, 2, 2, 45, 45), (16, 64)),
    (_CAUSAL, (1, 2, 2, 45, 70), (128, 128)),       # one tile, larger than both sequences
    (ae.attention(), (1, 4, 2, 1, 45), (16, 16)),   # decoding: one query row
    (ae.attention(), (1, 2, 2, 20, 1), (16, 16)),   # one key: dq = 0
    (_CAUSAL, (1, 2, 1, 1, 1), (16, 16)),
    (ae.attention(score_mod=lambda s, b, h, i, j: s + _BATCH_BIAS[b, h]), (2, 4, 2, 30, 30), (8, 8)),
    (ae.attention(mask_mod=lambda b, h, i, j: (_DOC[b, i] == _DOC[b, j]) & (i >= j)), (2, 4, 2, 45, 45), (16, 16)),
], ids=["block_m>block_n", "block_m<block_n", "huge_blocks", "decode", "one_key", "one_by_one", "batch_bias",
        "batched_documents_gqa"])
def test_tile_shapes_and_batch_dependent_mods(attn, dims, blocks):
    b, h, hkv, lq, lk = dims
    gen = torch.Generator().manual_seed(13)
    q = torch.randn(b, h, lq, 16, generator=gen, dtype=torch.float64)
    k = torch.randn(b, hkv, lk, 16, generator=gen, dtype=torch.float64)
    v = torch.randn(b, hkv, lk, 8, generator=gen, dtype=torch.float64)
    check_l1(attn, q, k, v, *blocks)


def test_softcap_with_explicit_scale_and_rectangular_tiles():
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, 50, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    attn = ae.attention(score_mod=lambda s, b, h, i, j: 5.0 * torch.tanh(s / 5.0),
                        mask_mod=lambda b, h, i, j: i >= j, scale=1.5)
    check_l1(attn, q, k, v, block_m=32, block_n=8)


# --- b. the CPU kernels end to end through autograd ---------------------------------------------------

CPU_SHAPE = variants.Shape(1, 4, 64, 64, 16, 16)


def _refuse(*args, **kwargs):
    raise AssertionError("this path must not run")


@contextlib.contextmanager
def kernels_only():
    """Autograd's torch backward refuses to run: a gradient can only come from the kernels."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(autograd, "attention_backward", _refuse)
        yield


def cpu_grads(attn, q, k, v, d_out, dtype=torch.float32, d_lse=None):
    """dq, dk, dv of `attn` on the CPU backend by autograd, from leaves of `dtype`, through the
    backward kernels only."""
    leaves = _leaves(q, k, v, dtype=dtype)
    with kernels_only():
        if d_lse is not None:
            out, lse = attn(*leaves, backend="cpu", return_lse=True)
            (out.float() * d_out.float()).sum().add((lse * d_lse.float()).sum()).backward()
        else:
            out = attn(*leaves, backend="cpu")
            out.backward(d_out.to(dtype))
    for t in leaves:
        assert t.grad is not None and t.grad.dtype == dtype and t.grad.shape == t.shape
    return [t.grad for t in leaves]


def check_cpu(attn, q, k, v, dtype=torch.float32, tol=1e-4, seed=0):
    gen = torch.Generator().manual_seed(seed)
    d_out = torch.randn(*q.shape[:3], v.shape[3], generator=gen)
    # The oracle sees the inputs the CPU sees (rounded to dtype).
    rounded = [t.to(dtype) for t in (q, k, v)]
    _, _, *want = reference_grads(attn, *rounded, d_out.to(dtype))
    got = cpu_grads(attn, *rounded, d_out, dtype=dtype)
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        assert torch.isfinite(g).all(), name
        err = _relative_error(g, w)
        assert err < tol, f"{name}: relative error {err:.3g}"


def _catalogue(name, shape=CPU_SHAPE, **dims):
    attn, shape = variants.build(name, shape)
    shape = replace(shape, **dims)
    return attn, variants.inputs(shape, seed=5)


@pytest.mark.parametrize("name, dims", [
    ("causal", {}),
    ("document", {}),
    ("alibi", {}),              # slopes: a constant closure tensor the scores read
    ("softcap", {}),
    ("gqa", {}),                # 4 query heads on 1 KV head
    ("mla_dims", {"dim_qk": 32, "dim_v": 16}),  # the catalogue's Dk != Dv at a small size
])
def test_catalogue_cpu_backward_matches_autograd(name, dims):
    attn, (q, k, v) = _catalogue(name, **dims)
    check_cpu(attn, q, k, v)


def test_ragged_gqa_cpu_backward_matches_autograd():
    gen = torch.Generator().manual_seed(6)
    lq, lk = 37, 53
    q, k, v = torch.randn(2, 4, lq, 16, generator=gen), torch.randn(2, 2, lk, 16, generator=gen), \
        torch.randn(2, 2, lk, 8, generator=gen)
    table = torch.randn(4, lq + lk - 1, generator=gen)

    def bias(score, b, h, q_idx, kv_idx):
        return score + table[h, q_idx - kv_idx + lk - 1]

    check_cpu(ae.attention(score_mod=bias, mask_mod=_bottom_right_window(lq, lk, 20)), q, k, v)


def test_rows_without_keys_on_cpu():
    # The forward's lse is -inf on row 0; the kernels must give its gradients 0, not NaN.
    q, k, v = variants.inputs(variants.Shape(1, 2, 40, 40, 16, 16), seed=10)
    check_cpu(ae.attention(mask_mod=lambda b, h, i, j: i > j), q, k, v)


def test_bfloat16_cpu_backward():
    # The kernels run in float32 on widened inputs; the module is the float32 causal one above.
    attn, (q, k, v) = _catalogue("causal")
    check_cpu(attn, q, k, v, dtype=torch.bfloat16, tol=2e-2)


def test_lse_gradient_and_blhd_layout_on_cpu():
    # d(lse) enters through delta = rowsum(dO O) - dlse; blhd hands the kernels strided views.
    attn, (q, k, v) = _catalogue("causal")
    gen = torch.Generator().manual_seed(7)
    d_out, d_lse = torch.randn(*q.shape[:3], v.shape[3], generator=gen), torch.randn(*q.shape[:3], generator=gen)
    _, _, *want = reference_grads(attn, q, k, v, d_out, d_lse)
    got = cpu_grads(attn, q, k, v, d_out, d_lse=d_lse)
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        assert _relative_error(g, w) < 1e-4, name

    blhd = ae.attention(mask_mod=attn.mask_mod, layout="blhd")
    _, _, *want = reference_grads(attn, q, k, v, d_out)
    leaves = _leaves(*(t.transpose(1, 2) for t in (q, k, v)), dtype=torch.float32)
    with kernels_only():
        blhd(*leaves, backend="cpu").backward(d_out.transpose(1, 2))
    for name, t, w in zip(("dq", "dk", "dv"), leaves, want):
        assert _relative_error(t.grad.transpose(1, 2), w) < 1e-4, name


# --- c. which path autograd takes ---------------------------------------------------------------------
# (The tests above run the CPU backward under kernels_only(): the torch backward refuses to run.)


def test_cpu_softmax_backward_runs_the_kernels(monkeypatch):
    calls = []
    run_backward = backends.run_backward

    def counting(text, tensors, backend, closure_grads=True, kind=None, stat="none", autotune=False):
        calls.append((backend, sorted(tensors), closure_grads))
        return run_backward(text, tensors, backend, closure_grads, kind, stat)

    monkeypatch.setattr(backends, "run_backward", counting)
    attn, (q, k, v) = _catalogue("alibi")  # a closure tensor that wants no gradient
    check_cpu(attn, q, k, v)
    assert calls == [("cpu", sorted(abi.input_roles(4) + list(abi.BACKWARD_INPUTS)), False)]
    # kernels_only() does refuse the torch backward (the reference backend has no kernels).
    leaves = _leaves(q, k, v)
    with kernels_only(), pytest.raises(AssertionError, match="this path must not run"):
        attn(*leaves, backend="reference").sum().backward()


def test_learnable_closure_tensor_takes_the_kernels():
    _, (q, k, v) = _catalogue("alibi")
    slopes = torch.tensor([2.0 ** (-8.0 * (i + 1) / 4) for i in range(4)])

    def grads(slopes, leaves, backend):
        attn = ae.attention(score_mod=lambda s, b, h, i, j: s + slopes[h] * (j - i),
                            mask_mod=lambda b, h, i, j: i >= j)
        out = attn(*leaves, backend=backend)
        return torch.autograd.grad(out, leaves + [slopes], d_out.to(out.dtype))

    d_out = torch.randn(*q.shape[:3], v.shape[3], generator=torch.Generator().manual_seed(8))
    with kernels_only():
        got = grads(slopes.clone().requires_grad_(), _leaves(q, k, v, dtype=torch.float32), "cpu")
    want = grads(slopes.double().requires_grad_(), _leaves(q, k, v), "reference")
    for name, g, w in zip(("dq", "dk", "dv", "dslopes"), got, want):
        assert _relative_error(g, w) < 1e-4, name


def test_uses_kernels_decision():
    def call(attn, backend):
        q, k, v = variants.inputs(variants.Shape(1, 2, 8, 8, 4, 4))
        text, captures = attn._build(q, k, v)
        c = autograd.compiled_call(attn, text, q, k, v, backend)
        return c, captures

    causal, _ = variants.build("causal", CPU_SHAPE)
    alibi, _ = variants.build("alibi", variants.Shape(1, 2, 8, 8, 4, 4))
    sigmoid, _ = variants.build("sigmoid", CPU_SHAPE)
    retnet, _ = variants.build("retnet", CPU_SHAPE)
    for backend, expected in (("cpu", True), ("triton", True), ("reference", False)):
        c, _ = call(causal, backend)
        assert c.uses_kernels is expected
    # The kernels also give the gradients of closure tensors the scores read.
    c, captures = call(alibi, "cpu")
    assert len(captures) == 1 and c.uses_kernels
    c, _ = call(sigmoid, "cpu")
    assert c.uses_kernels
    c, _ = call(retnet, "cpu")  # a user normalizer without a running max
    assert c.uses_kernels
    by_hand = ae.attention(normalize=ae.OnlineNormalizer(
        prob=lambda s, m: torch.exp(s - m), finalize=lambda acc, l: acc / l,
        rescale=lambda m_old, m_new: torch.exp(m_old - m_new)))
    c, _ = call(by_hand, "cpu")  # one with a running max
    assert c.uses_kernels


# --- d. errors ------------------------------------------------------------------------------------------


def _module_text(attn, shape=variants.Shape(1, 2, 40, 40, 16, 16)):
    q, k, v = variants.inputs(shape)
    return attn.mlir(q, k, v)


def test_tile_backward_without_differentiate_is_a_located_error():
    text = _module_text(variants.build("causal", CPU_SHAPE)[0])
    ctx = new_context()
    module = parse_module(text, ctx)
    with ctx, pytest.raises(CompileError, match="has no derivative @attention_grad: run attn-differentiate first") \
            as info:
        create_pass("attn-tile-backward").apply(module.operation)
    assert info.value.diagnostics and info.value.diagnostics[0].line is not None
    module = parse_module(text, ctx)
    from mlir import ir

    with pytest.raises(ir.MLIRError, match="run attn-differentiate first"):
        build_pass_manager("builtin.module(attn-tile-backward)", ctx).run(module.operation)


@pytest.mark.parametrize("option", ["block-m=24", "block-n=0"])
def test_block_sizes_must_be_powers_of_two(option):
    with pytest.raises(CompileError, match="power of two"):
        build_pass_manager(f"builtin.module(attn-tile-backward{{{option}}})", new_context())


@pytest.mark.parametrize("form", ["where", "additive"])
def test_rows_a_score_mod_hides_entirely_get_zero_not_nan(form):
    # Rows 0..4 have every score -inf through the score_mod, so the forward's lse there is -inf;
    # the kernels must give those rows probability 0, not exp(-inf - -inf) = NaN.
    minus_inf = float("-inf")
    if form == "where":
        attn = ae.attention(score_mod=lambda s, b, h, i, j: torch.where(i >= 5, s, minus_inf))
    else:
        attn = ae.attention(score_mod=lambda s, b, h, i, j: s + torch.where(i >= 5, 0.0, minus_inf))
    gen = torch.Generator().manual_seed(12)
    q, k, v = (torch.randn(1, 2, 20, 16, generator=gen, dtype=torch.float64) for _ in range(3))
    d_out = torch.randn(1, 2, 20, 16, generator=gen, dtype=torch.float64)
    check_l1(attn, q, k, v)
    _, _, *want = reference_grads(attn, q, k, v, d_out)
    got = cpu_grads(attn, q, k, v, d_out)
    for g, w in zip(got, want):
        assert torch.isfinite(g).all()
        assert _relative_error(g, w) < 1e-4


def test_outputs_the_kernels_do_not_read_may_be_changed_in_place():
    # The output is saved for backward only where the kernels read it (softmax on a compiled
    # backend); elsewhere an in-place change of it must not be an autograd error.
    q, k, v = _leaves(*(torch.randn(1, 2, 8, 4) for _ in range(3)))
    out = ae.attention(normalize="sigmoid")(q, k, v, backend="reference")
    out.mul_(2)
    out.sum().backward()
    assert torch.isfinite(q.grad).all()
