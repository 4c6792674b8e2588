"""The CPU kernels at every vector width the host can run (`AE_MLIR_CPU_VECTOR_BITS`): the register
tiles and element-wise blocks of AVX2 (256 bits) and of SSE / NEON (128) are compiled, on an
AVX-512 host, without the wider x86 extensions (`attn-cpu-narrow-isa`), so these tests run the
code those hosts get, against the float64 reference."""
from __future__ import annotations

import pytest
import torch

import ae_mlir as ae
from ae_mlir import presets, variants
from ae_mlir.backends import cpu, cpu_cache

VECTOR_BITS = cpu_cache.VECTOR_BITS_ENV
NARROWER = [bits for bits in (128, 256) if bits < cpu_cache.host_vector_bits()]

# The catalogue at a ragged shape (Lq 70, Lk 90: partial tiles, query blocks past one), fp32, and
# a bf16 case; the mods cover masks, closure reads, soft-capping and the element-wise normalizers.
CASES = ["full", "causal", "alibi", "softcap", "document", "relative_bias", "sigmoid", "gqa"]


@pytest.fixture(params=NARROWER or [None], ids=lambda bits: f"{bits}-bits")
def narrow(request, monkeypatch):
    if request.param is None:
        pytest.skip("the host's vector registers are 128 bits: there is no narrower width")
    monkeypatch.setenv(VECTOR_BITS, str(request.param))
    cpu.clear_memory_cache()
    yield request.param
    cpu.clear_memory_cache()


def _check(attn, q, k, v, atol=2e-5):
    got = attn(q, k, v, backend="cpu")
    want = attn(q.double(), k.double(), v.double(), backend="reference")
    torch.testing.assert_close(got.double(), want, atol=atol, rtol=atol)


@pytest.mark.parametrize("name", CASES)
def test_catalogue_at_a_narrower_width(narrow, name):
    attn, shape = variants.build(name, variants.Shape(1, 4, 70, 90, 32, 32, heads_kv=2 if name == "gqa" else None))
    _check(attn, *variants.inputs(shape))


def test_bf16_and_the_backward_at_a_narrower_width(narrow):
    attn = ae.attention(mask_mod=lambda b, h, i, j: i >= j)
    q, k, v = (t.to(torch.bfloat16) for t in variants.inputs(variants.Shape(1, 2, 65, 65, 64, 64)))
    got = attn(q, k, v, backend="cpu").float()
    want = attn(q.double(), k.double(), v.double(), backend="reference")
    torch.testing.assert_close(got.double(), want, atol=2e-2, rtol=2e-2)
    leaves = [t.float().requires_grad_() for t in (q, k, v)]
    attn(*leaves, backend="cpu").square().sum().backward()
    doubles = [t.detach().double().requires_grad_() for t in leaves]
    attn(*doubles, backend="reference").square().sum().backward()
    for a, b in zip(leaves, doubles):
        torch.testing.assert_close(a.grad.double(), b.grad, atol=1e-4, rtol=1e-4)


def test_the_preset_compiles_narrower_code_and_keys_it_apart(narrow, monkeypatch):
    q, k, v = variants.inputs(variants.Shape(1, 2, 40, 40, 16, 16))
    text = ae.attention().mlir(q, k, v)
    narrowed = cpu.lowered_text(text)
    features = {128: '"-avx"', 256: '"-avx512f"'}[narrow]
    assert f"vector-bits={narrow}" in presets.pipeline_text("cpu", presets.options_for("cpu", None, "host"), "llvm")
    assert features in narrowed
    key = cpu_cache.key(text, {})
    monkeypatch.delenv(VECTOR_BITS)
    assert features not in cpu.lowered_text(text)
    assert cpu_cache.key(text, {}) != key


@pytest.mark.parametrize("raw", ["1024", "64", "wide", "0"])
def test_a_width_the_host_cannot_run_is_named(raw, monkeypatch):
    monkeypatch.setenv(VECTOR_BITS, raw)
    q = torch.randn(1, 1, 8, 8)
    with pytest.raises(ValueError, match=f"{VECTOR_BITS} must be one of .*got '{raw}'"):
        ae.attention()(q, q, q, backend="cpu")
