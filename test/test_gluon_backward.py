"""The Gluon dK/dV kernel (passes/gluon/attention_backward.py), run by the emulator on CPU tensors
against float64 autograd: plain and causal, GQA (dK and dV summed over the group), ragged
lengths, Lq != Lk, D 64 and 128, transposed layouts; and its Triton GPU IR compiled for sm90."""
from __future__ import annotations

import pytest
import torch

from ae_mlir.kernel_args import host_descriptor
from ae_mlir.passes.gluon import attention_backward as ab

from gluon_emu import launch


def reference(q, k, v, do, causal, scale):
    """dK, dV in float64, and the forward's lse and delta = rowsum(dO * O) as the kernel reads them."""
    group = q.shape[1] // k.shape[1]
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    s = torch.einsum("bhqd,bhkd->bhqk", q64, k64.repeat_interleave(group, 1)) * scale
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).tril().logical_not(), float("-inf"))
    lse = torch.logsumexp(s, -1)
    out = torch.einsum("bhqk,bhkd->bhqd", torch.softmax(s, -1), v64.repeat_interleave(group, 1))
    out.backward(do.double())
    delta = (do.double() * out.detach()).sum(-1)
    return k64.grad, v64.grad, lse.detach().float(), delta.float()


def run_kernel(q, k, v, do, lse, delta, causal, scale):
    b, h, lq, d = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    dk = torch.full(k.shape, float("nan"), dtype=k.dtype)
    dv = torch.full(v.shape, float("nan"), dtype=v.dtype)
    args = [host_descriptor(t) for t in (q, k, v, do)]
    for t, n in ((lse, 2), (delta, 2), (dk, 3), (dv, 3)):
        args += [t] + [t.stride(i) for i in range(n)]
    grid = (-(-lk // ab.BLOCK_N), b * hkv, 1)
    launch(ab.attention_backward_dkdv, grid, args, ab.descriptor_blocks(d),
           ab.kernel_constants(hkv, h // hkv, lq, lk, scale, causal))
    return dk, dv


@pytest.mark.parametrize("b, h, hkv, lq, lk, d, causal, dtype, transposed", [
    (1, 2, 2, 256, 256, 128, True, torch.bfloat16, False),
    (1, 2, 2, 200, 200, 128, False, torch.bfloat16, False),
    (2, 4, 2, 190, 190, 64, True, torch.float16, True),
    (1, 2, 1, 100, 300, 128, False, torch.bfloat16, False),
    (1, 1, 1, 64, 64, 64, True, torch.bfloat16, False),
])
def test_emulated_dkdv_matches_float64(b, h, hkv, lq, lk, d, causal, dtype, transposed):
    torch.manual_seed(lq + lk + d)

    def make(heads, length):
        if transposed:
            return torch.randn(b, length, heads, d, dtype=dtype).transpose(1, 2)
        return torch.randn(b, heads, length, d, dtype=dtype)

    q, k, v, do = make(h, lq), make(hkv, lk), make(hkv, lk), make(h, lq)
    scale = d ** -0.5
    want_dk, want_dv, lse, delta = reference(q, k, v, do, causal, scale)
    dk, dv = run_kernel(q, k, v, do, lse, delta, causal, scale)
    # 16-bit P^T and dS^T enter the products, as in every flash backward: errors of a few 1e-3
    # relative to the gradients' size.
    for got, want in ((dk, want_dk), (dv, want_dv)):
        bound = 2e-2 * (1 + want.abs().max().item())
        assert (got.double() - want).abs().max().item() <= bound


def test_triton_gpu_ir_compiles_for_sm90_without_spills():
    import re
    import tempfile

    import triton
    from triton.backends.compiler import GPUTarget

    ttgir = ab.compile_ttgir("bf16", 128, ab.kernel_constants(2, 2, 1000, 1000, 0.088, True))
    with tempfile.NamedTemporaryFile("w", suffix=".ttgir") as f:
        f.write(ttgir)
        f.flush()
        compiled = triton.compile(f.name, target=GPUTarget("cuda", 90, 32), options={"maxnreg": ab.MAX_REGISTERS})
    ptx = compiled.asm["ptx"]
    # Four tensor-core products per step in each consumer warpgroup, K/V and Q/dO by TMA.
    assert ptx.count("wgmma.mma_async") >= 8 and "cp.async.bulk.tensor" in ptx
    assert re.search(r"\.maxnreg 168", ptx) and "ld.local" not in ptx
