"""Triton compiles every kernel for both GPU families on this GPU-less machine: the products on
matrix units (wgmma or mma.sync on Hopper, mfma on MI300), for softmax attention with mods and
for the split linear recurrence's kernels, within MI300's 64 KiB of LDS."""
from __future__ import annotations

import pytest
import torch

import ae_mlir as ae
from ae_mlir import runtime
from ae_mlir.backends import triton as tb
from inputs import qkv
from test_triton_backend import alibi, causal, document, softcap

COMPILE_CASES = {
    "causal-bf16-d64": ({"mask_mod": causal}, dict(h=2, lq=256, dk=64, dtype=torch.bfloat16)),
    "alibi-document-softcap-fp16-d80": (
        {"score_mod": lambda s, b, h, qi, ki: softcap(alibi(s, b, h, qi, ki), b, h, qi, ki), "mask_mod": document},
        dict(h=4, lq=128, dk=80, dtype=torch.float16)),
}


@pytest.mark.parametrize("name", list(COMPILE_CASES))
@pytest.mark.parametrize("target,kind,needle", [("cuda:90", "ptx", "wgmma"), ("hip:gfx942", "amdgcn", "mfma")])
def test_triton_compiles(name, target, kind, needle):
    attn_kwargs, shape = COMPILE_CASES[name]
    q, k, v = qkv(**shape)
    bundle = tb.compile_bundle(ae.attention(**attn_kwargs), q, k, v, target=target)
    for variant in bundle.variants.values():
        compiled = runtime.compile_variant(variant, target, bundle.num_warps, bundle.num_stages)
        assert needle in compiled.asm[kind]


@pytest.mark.parametrize("decay", ["head", "token_dim"])
@pytest.mark.parametrize("target,kind,needle", [("cuda:90", "ptx", "mma"), ("hip:gfx942", "amdgcn", "mfma")])
def test_linear_kernels_compile(decay, target, kind, needle):
    """Every kernel of the split recurrence compiles for both GPU families, its products on
    matrix units (wgmma or mma.sync on Hopper, mfma on MI300), within MI300's 64 KiB of LDS."""
    q = torch.empty(1, 2, 256, 64, dtype=torch.bfloat16, device="meta")
    g = torch.empty(2) if decay == "head" else torch.empty(1, 2, 256, 64)
    bundle = tb.build_bundle(ae.linear_attention(decay=decay).mlir(q, q, q, g.to("meta")), target)
    assert [w.shape for w in bundle.workspace if w.role == "w0"] == [[1, 2, 4, 64, 64]]
    for kernel in bundle.stages + [bundle]:
        compiled = runtime.compile_variant(kernel.variants["aligned"], target, kernel.num_warps, kernel.num_stages)
        if not kernel.name.endswith("_decays") or decay == "token_dim":  # a head decay sums nothing
            assert needle in compiled.asm[kind]
        if target.startswith("hip"):
            assert compiled.metadata.shared <= 65536
