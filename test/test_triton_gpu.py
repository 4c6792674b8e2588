"""The Triton backend on a real GPU (marked `gpu`, skipped without one): launches through
`ae.attention(...)(q, k, v)` and the runtime against plain float32 torch references.

Where the MLIR bindings are missing (a GPU machine with only torch and triton), warm the bundle
cache elsewhere first:
    AE_MLIR_CACHE_DIR=DIR python test/test_triton_gpu.py --warm-cache
and run with the same AE_MLIR_CACHE_DIR.
"""
from __future__ import annotations

import sys

import pytest
import torch
import torch.nn.functional as F

import ae_mlir as ae
from ae_mlir import runtime
from ae_mlir.backends import triton as tb
from inputs import qkv, rand
from test_triton_backend import DOC, SLOPES, TOL, causal

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm GPU")
GPU_TARGET = "cuda:90"


def _gpu_mods(device):
    slopes = SLOPES.to(device)
    doc = DOC.to(device)

    def score(s, b, h, qi, ki):
        return 20.0 * torch.tanh((s + slopes[h] * (ki - qi)) / 20.0)

    def mask(b, h, qi, ki):
        return (doc[qi] == doc[ki]) & (ki < qi)

    return score, mask


def _gpu_cases(device):
    """(name, attention, q, k, v) of every GPU test, on `device` (any device builds the same L0)."""
    cases = []
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for is_causal in (False, True):
            q, k, v = (t.to(device) for t in qkv(b=2, h=4, lq=1000, dk=128, dtype=dtype))
            cases.append((f"sdpa-{dtype}-{is_causal}", ae.attention(mask_mod=causal if is_causal else None), q, k, v))
    score, mask = _gpu_mods(device)
    q = rand(1, 128, 4, 80, seed=7, dtype=torch.bfloat16).to(device).transpose(1, 2)
    k = rand(1, 2, 80, 128, seed=8, dtype=torch.bfloat16).to(device).transpose(2, 3)
    v = rand(1, 2, 128, 80, seed=9, dtype=torch.bfloat16).to(device)
    cases.append(("mods", ae.attention(score_mod=score, mask_mod=mask), q, k, v))
    return cases


def float32_attention(q, k, v, score_mod=None, mask_mod=None):
    """Materialized float32 attention with the mods applied on broadcast index grids."""
    b, h, lq, dk = q.shape
    group = h // k.shape[1]
    k, v = (t.float().repeat_interleave(group, dim=1) for t in (k, v))
    s = q.float() @ k.transpose(-1, -2) / dk ** 0.5
    bi = torch.arange(b, device=q.device).view(b, 1, 1, 1)
    hi = torch.arange(h, device=q.device).view(1, h, 1, 1)
    qi = torch.arange(lq, device=q.device).view(1, 1, lq, 1)
    ki = torch.arange(k.shape[2], device=q.device).view(1, 1, 1, -1)
    if score_mod is not None:
        s = score_mod(s, bi, hi, qi, ki)
    if mask_mod is not None:
        s = s.masked_fill(~mask_mod(bi, hi, qi, ki).expand_as(s), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    return torch.softmax(s, dim=-1).nan_to_num(0.0) @ v, lse


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("index", range(6))
def test_gpu_matches_sdpa(index):
    name, attn, q, k, v = _gpu_cases("cuda")[index]
    out = attn(q, k, v)
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=name.endswith("True"))
    torch.testing.assert_close(out.float(), ref, **TOL[q.dtype])


@pytest.mark.gpu
@gpu
def test_gpu_mods_strides_and_lse():
    name, attn, q, k, v = _gpu_cases("cuda")[-1]
    out, lse = attn(q, k, v, return_lse=True)
    score, mask = _gpu_mods("cuda")
    ref_out, ref_lse = float32_attention(q, k, v, score, mask)
    torch.testing.assert_close(out.float(), ref_out, **TOL[torch.bfloat16])
    torch.testing.assert_close(lse, ref_lse, atol=1e-3, rtol=1e-3)
    assert torch.isneginf(lse[:, :, 0]).all() and (out[:, :, 0] == 0).all()


@pytest.mark.gpu
@gpu
def test_gpu_aot_bundle_launch(tmp_path):
    pytest.importorskip("mlir", reason="compile_bundle needs the MLIR bindings")
    q, k, v = (t.cuda() for t in qkv(h=2, lq=256, dk=64, dtype=torch.float16))
    attn = ae.attention(mask_mod=causal)
    bundle = tb.compile_bundle(attn, (q.shape, q.dtype), (k.shape, k.dtype), (v.shape, v.dtype),
                               target=runtime.current_target())
    loaded = runtime.Bundle.load(bundle.save(tmp_path / "b.json"))
    out, lse = runtime.launch(loaded, q, k, v)
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    torch.testing.assert_close(out.float(), ref, **TOL[torch.float16])


def warm_cache(target: str = GPU_TARGET) -> None:
    """Build the bundles of the GPU tests into the bundle cache ($AE_MLIR_CACHE_DIR)."""
    for name, attn, q, k, v in _gpu_cases("cpu"):
        bundle = tb.get_bundle(attn.mlir(q, k, v), target)
        print(f"{name}: {runtime.CACHE.path(bundle.key)}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--warm-cache"]:
        sys.exit("usage: AE_MLIR_CACHE_DIR=DIR python test/test_triton_gpu.py --warm-cache")
    warm_cache()
