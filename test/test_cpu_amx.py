"""bf16 tile products on AMX units (passes/cpu_amx_tile_products.py): which kernels take them, and
their numerics against float64 where the host has AMX-BF16 (the kernels' IR is checked anywhere by
test/lit/passes/cpu-amx-tile-products.mlir)."""
from __future__ import annotations

import pytest
import torch

import ae_mlir as ae
from ae_mlir import presets
from ae_mlir.backends import cpu, cpu_cache
from ae_mlir.core.context import new_context, parse_module

AMX = cpu_cache.host_has_amx_bf16()
needs_amx = pytest.mark.skipif(not AMX, reason="the host has no AMX-BF16 (or the OS refuses its tiles)")


def _problem(dtype, linear=False):
    q = k = v = torch.zeros(1, 2, 64, 64, dtype=dtype)
    attn = ae.linear_attention() if linear else ae.attention(mask_mod=lambda b, h, i, j: i >= j)
    return presets.read_problem(parse_module(attn.mlir(q, k, v), new_context()))


@pytest.fixture
def amx_host(monkeypatch):
    monkeypatch.setattr(cpu_cache, "host_has_amx_bf16", lambda: True)
    monkeypatch.delenv(cpu_cache.AMX_ENV, raising=False)


def test_bf16_forwards_take_amx_where_the_host_has_it(amx_host, monkeypatch):
    options = presets.options_for("cpu", _problem(torch.bfloat16))
    # Q enters the product unscaled (AMX multiplies bf16 tiles); the scores take the scale.
    assert options.amx and not options.prescale_q
    assert "amx=true" in presets.pipeline_text("cpu", options, "llvm")
    assert not presets.options_for("cpu", _problem(torch.float32)).amx
    assert not presets.options_for("cpu", _problem(torch.float16)).amx
    assert not presets.options_for("cpu", _problem(torch.bfloat16), backward=True).amx
    assert not presets.options_for("cpu", _problem(torch.bfloat16), unit_inner_stride=False).amx
    assert not presets.options_for("cpu", _problem(torch.bfloat16, linear=True)).amx
    monkeypatch.setenv(cpu_cache.AMX_ENV, "0")
    options = presets.options_for("cpu", _problem(torch.bfloat16))
    assert not options.amx and options.prescale_q
    monkeypatch.setenv(cpu_cache.AMX_ENV, "yes")
    with pytest.raises(ValueError, match="AE_MLIR_CPU_AMX must be 0 or 1"):
        presets.options_for("cpu", _problem(torch.bfloat16))


def test_no_amx_without_the_host_feature(monkeypatch):
    monkeypatch.setattr(cpu_cache, "host_has_amx_bf16", lambda: False)
    assert not presets.options_for("cpu", _problem(torch.bfloat16)).amx


def _inputs(b, h, hk, lq, lk, dk, dv, seed):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, lq, dk, generator=gen).bfloat16()
    k = torch.randn(b, hk, lk, dk, generator=gen).bfloat16()
    v = torch.randn(b, hk, lk, dv, generator=gen).bfloat16()
    return q, k, v


slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625])


def alibi(score, b, h, q_idx, kv_idx):
    return score + slopes[h] * (kv_idx - q_idx)


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


@needs_amx
@pytest.mark.parametrize("shape", [
    (1, 4, 4, 512, 512, 64, 64),     # the preset's tiles, whole
    (2, 4, 2, 77, 130, 64, 32),      # GQA, ragged lengths (padded tiles), Dk != Dv
    (1, 4, 4, 200, 200, 128, 128),
    (1, 4, 4, 40, 40, 48, 48),       # Dk not a multiple of 32: the scores' product stays in f32
], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("mods", ["full", "causal", "alibi-causal"])
def test_amx_forward_matches_float64(shape, mods):
    b, h, hk, lq, lk, dk, dv = shape
    q, k, v = _inputs(b, h, hk, lq, lk, dk, dv, seed=lq + dk)
    score_mod = alibi if mods == "alibi-causal" else None
    mask_mod = None if mods == "full" else causal
    attn = ae.attention(score_mod=score_mod, mask_mod=mask_mod)
    out, lse = attn(q, k, v, return_lse=True, backend="cpu")
    want, want_lse = attn(q.double(), k.double(), v.double(), return_lse=True, backend="reference")
    # The output is rounded to bf16 once; P is rounded to bf16 before P V, as on GPUs.
    torch.testing.assert_close(out.double(), want, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse.double(), want_lse, atol=1e-4, rtol=1e-4)


@needs_amx
def test_amx_kernel_runs_on_tiles_and_agrees_with_the_f32_path(monkeypatch):
    q, k, v = _inputs(1, 4, 4, 256, 256, 64, 64, seed=3)
    text = ae.attention(mask_mod=causal).mlir(q, k, v)
    kernel = cpu.compile_module(text)
    assert kernel.amx
    monkeypatch.setenv(cpu_cache.AMX_ENV, "0")
    plain = cpu.compile_module(text)
    assert not plain.amx
    got, want = kernel([q, k, v]), plain([q, k, v])
    # Both round P to bf16 and sum exact products in f32; they differ in the order of the sums
    # and in where the scale is taken.
    torch.testing.assert_close(got[0].float(), want[0].float(), atol=1.6e-2, rtol=1.6e-2)
    torch.testing.assert_close(got[1], want[1], atol=1e-5, rtol=1e-5)


@needs_amx
def test_amx_forward_propagates_nan():
    q, k, v = _inputs(1, 2, 2, 64, 64, 64, 64, seed=5)
    v[0, 1, 7, 3] = float("nan")
    out = ae.attention()(q, k, v, backend="cpu")
    assert out[0, 1, :, 3].isnan().all() and not out[0, 0].isnan().any()


@needs_amx
def test_arrays_of_any_inner_stride():
    """Such arrays compile without AMX (the preset test above); their results hold either way."""
    q, k, v = _inputs(1, 2, 2, 64, 64, 64, 64, seed=7)
    # k's elements along the head dimension 64 apart: the kernel is compiled for any strides.
    k_strided = k.transpose(2, 3).contiguous().transpose(2, 3)
    assert k_strided.stride(-1) != 1
    attn = ae.attention(mask_mod=causal)
    out = attn(q, k_strided, v, backend="cpu")
    want = attn(q.double(), k.double(), v.double(), backend="reference")
    torch.testing.assert_close(out.double(), want, atol=2e-2, rtol=2e-2)


@needs_amx
def test_padded_tiles_keep_f32_products():
    """A tile past a sequence's end, or cut by per-entry lengths, is a padded load: its products
    stay in f32 (made a bf16 buffer, such a tile took LLVM minutes to compile)."""
    short = _inputs(1, 2, 1, 40, 40, 64, 64, seed=11)
    attn = ae.attention()
    assert not cpu.compile_module(attn.mlir(*short)).amx
    q, k, v = _inputs(3, 2, 1, 90, 130, 64, 64, seed=11)
    lengths = torch.tensor([130, 77, 5])
    out = attn(q, k, v, backend="cpu", kv_len=lengths)
    want = attn(q.double(), k.double(), v.double(), backend="reference", kv_len=lengths)
    torch.testing.assert_close(out.double(), want, atol=2e-2, rtol=2e-2)
