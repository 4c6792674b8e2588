"""The Triton backward bundles (attn-tile-backward through attn-lower-to-triton), run in the TTIR
interpreter as `runtime.launch_roles` runs them on a GPU, at each target's default backward
config, against float64 autograd on the reference backend (with a gradient for the logsumexp too)."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import ae_mlir as ae
from ae_mlir import launch_defaults, runtime, variants
from ae_mlir.core import abi
from ae_mlir.backends import triton as tb
from bundle_interp import interpret, interpret_roles


def _problem(attn, b, h, hkv, lq, lk, dk, dv, closures=(), seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, lq, dk, generator=gen, dtype=torch.float64).requires_grad_()
    k = torch.randn(b, hkv, lk, dk, generator=gen, dtype=torch.float64).requires_grad_()
    v = torch.randn(b, hkv, lk, dv, generator=gen, dtype=torch.float64).requires_grad_()
    out, lse = attn(q, k, v, backend="reference", return_lse=True)
    d_out = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    d_lse = torch.randn(lse.shape, generator=gen, dtype=torch.float64)
    want = torch.autograd.grad((out, lse), (q, k, v), (d_out, d_lse))
    return (q, k, v), out, d_out, lse, d_lse, want


def _check(attn, dtype, target, tol, b=1, h=2, hkv=2, lq=77, lk=None, dk=32, dv=None, closures=(), config=None):
    """With `config`, over the default backward config; without, checking that it is the default."""
    lk, dv = lk or lq, dv or dk
    (q, k, v), out, d_out, lse, d_lse, want = _problem(attn, b, h, hkv, lq, lk, dk, dv)
    as_input = (lambda t: t.detach().to(dtype))
    text = attn.mlir(as_input(q), as_input(k), as_input(v))
    bundle = tb.build_backward_bundle(text, target, config)
    expected = launch_defaults.backward_config(lq, lk, dk, dv, str(dtype).removeprefix("torch."), target)
    if config is None:
        assert {key: bundle.meta["config"][key] for key in expected} == expected
    tensors = {"q": as_input(q), "k": as_input(k), "v": as_input(v), "out": as_input(out), "do": as_input(d_out),
               "lse": lse.detach().float(), "dlse": d_lse.float()}
    tensors.update({f"c{i}": t for i, t in enumerate(closures)})
    got = interpret_roles(bundle, tensors)
    for role, reference in zip(("dq", "dk", "dv"), want):
        scale = reference.abs().max()
        assert torch.isfinite(got[role]).all(), role
        torch.testing.assert_close(got[role].double() / scale, reference / scale, atol=tol, rtol=0, msg=role)
    return bundle


@pytest.mark.parametrize("target", ["cuda:90", "hip:gfx942"])
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
def test_causal_ragged_gqa_at_the_default_config(target, dtype, tol):
    attn = ae.attention(mask_mod=lambda b, h, i, j: i >= j)
    _check(attn, dtype, target, tol, h=4, hkv=2, lq=77, lk=77)


@pytest.mark.parametrize("name", ["softcap", "alibi", "sliding_window", "document", "mla_dims"])
def test_catalogue_entries(name):
    attn, shape = variants.build(name, variants.Shape(1, 2, 70, 70, 32, 32))
    closures = attn._build(*variants.inputs(shape))[1]
    _check(attn, torch.float32, "cuda:90", 1e-5, b=shape.batch, h=shape.heads, hkv=shape.kv_heads,
           lq=shape.seq_q, lk=shape.seq_k, dk=shape.dim_qk, dv=shape.dim_v, closures=closures)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
def test_tma_tile_loads_ragged_gqa(dtype, tol):
    """TMA tile loads (tensor_descriptors, an autotuning choice on sm90) in the backward kernels:
    ragged tiles (L = 77) read zeros past each head's rows, as the masked loads do; under GQA
    the dK/dV kernel's query heads vary in a loop, so its Q and dO tiles keep pointers. The dQ
    kernel takes 64-row tiles, within the 77 rows (the preset's 128 are not)."""
    attn = ae.attention(score_mod=lambda s, b, h, i, j: s - 0.01 * (i - j), mask_mod=lambda b, h, i, j: i >= j)
    bundle = _check(attn, dtype, "cuda:90", tol, h=4, hkv=2, lq=77, lk=77,
                    config={"tensor_descriptors": True, "block_m": 64, "num_warps": 4})
    kernels = [bundle] + list(bundle.stages)
    assert sum(k.variants["aligned"].ttir.count('"tt.descriptor_load"') for k in kernels) >= 4
    assert all("descriptor" not in k.variants["generic"].ttir for k in kernels)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
def test_document_mask_tables_classified_at_call_time(dtype, tol):
    """A mask that reads a closure tensor (document ids) is classified at each call for both
    backward kernels, as for the forward: the dQ kernel's tables per query block, the dK/dV
    kernel's per KV block, ragged edges partial (L = 201), under GQA; tiles of other documents
    are skipped."""
    doc = torch.repeat_interleave(torch.arange(4), torch.tensor([61, 50, 40, 50]))
    attn = ae.attention(mask_mod=lambda b, h, q, kv: (doc[q] == doc[kv]) & (q >= kv))
    bundle = _check(attn, dtype, "cuda:90", tol, h=4, hkv=2, lq=201, lk=201, closures=[doc])
    q = torch.empty(1, 4, 201, 32, dtype=dtype)
    tables = runtime.backward_call_time_tables(bundle, {"q": q, "k": q[:, :2], "v": q[:, :2], "c0": doc}, "cpu")
    for part in ("dq", "dkdv"):
        partial, index, full, _ = (tables[role] for role in abi.backward_table_roles(part))
        assert 0 < int(partial.sum() + full.sum()) < index.numel(), part


def test_lq_differs_from_lk_and_dk_from_dv():
    _check(ae.attention(), torch.float32, "cuda:90", 1e-5, h=4, hkv=1, lq=40, lk=90, dk=32, dv=16)


def test_cli_prints_the_backward_bundles_triton_ir(tmp_path):
    q = torch.empty(1, 2, 100, 32, dtype=torch.bfloat16, device="meta")
    text = ae.attention(mask_mod=lambda b, h, i, j: i >= j).mlir(q, q, q)
    bundle = tb.build_backward_bundle(text, "cuda:90")
    expected = "// -----\n".join(k.variants["aligned"].ttir for k in bundle.stages + [bundle])
    path = tmp_path / "l0.mlir"
    path.write_text(text)
    result = subprocess.run([sys.executable, "-m", "ae_mlir.cli", str(path), "--pipeline=triton{backward=true}",
                             "--emit=ttir", "--target=cuda:90"], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert result.stdout.rstrip("\n") == expected.rstrip("\n")


@pytest.mark.parametrize("target", ["cuda:90", "hip:gfx942"])
def test_whole_tiles_as_static_slices(target):
    """whole-tiles=true (the CPU preset's; the Triton preset keeps row masks, see launch_defaults.WHOLE_TILES):
    with L a multiple of the blocks, the forward and backward kernels load every tile with no mask
    and compute what the masked ones do."""
    attn = ae.attention(score_mod=lambda s, b, h, i, j: s - 0.01 * (i - j), mask_mod=lambda b, h, i, j: i >= j)
    (q, k, v), out, d_out, lse, d_lse, want = _problem(attn, 1, 4, 2, 128, 128, 32, 32)
    as_input = (lambda t: t.detach().float())
    text = attn.mlir(as_input(q), as_input(k), as_input(v))
    config = {"block_m": 32, "block_n": 32, "whole_tiles": True}
    forward = tb.compile_bundle(attn, as_input(q), as_input(k), as_input(v), target=target, config=config)
    backward = tb.build_backward_bundle(text, target, config)
    for bundle in (forward, backward):
        assert bundle.meta["config"]["whole_tiles"] is True
        for kernel in [bundle] + list(bundle.stages):
            loads = [line for line in kernel.variants["aligned"].ttir.splitlines() if '"tt.load"' in line]
            assert loads and all("array<i32: 1, 0, 0>" in line for line in loads)
    (got_out, got_lse), _ = interpret(forward, as_input(q), as_input(k), as_input(v))
    torch.testing.assert_close(got_out.double(), out.detach(), atol=1e-5, rtol=0)
    tensors = {"q": as_input(q), "k": as_input(k), "v": as_input(v), "out": as_input(out), "do": as_input(d_out),
               "lse": lse.detach().float(), "dlse": d_lse.float()}
    got = interpret_roles(backward, tensors)
    for role, reference in zip(("dq", "dk", "dv"), want):
        scale = reference.abs().max()
        torch.testing.assert_close(got[role].double() / scale, reference / scale, atol=1e-5, rtol=0, msg=role)


@pytest.mark.parametrize("dk, dv", [(192, 128), (256, 256)])
def test_wide_heads_at_the_default_config(dk, dv):
    """Head dims past 128 take their own backward tiles on CUDA (launch_defaults: dQ 128x64 and
    dK/dV 16x64 for Dk = 192, Dv = 128; 64x64 and 64x32 at 256); ragged (two query blocks of 128
    rows, the second cut short), causal, bf16."""
    bundle = _check(ae.attention(mask_mod=lambda b, h, i, j: i >= j), torch.bfloat16, "cuda:90", 3e-2, lq=150,
                    dk=dk, dv=dv)
    config = bundle.meta["config"]
    want = (128, 64, 16, 64) if dk + dv <= 320 else (64, 64, 64, 32)
    assert (config["block_m"], config["block_n"], config["dkdv_block_m"], config["dkdv_block_n"]) == want


def test_few_kv_programs_take_the_small_dkdv_tiles_at_the_default_config():
    """bf16 at D = 128 with GQA (4 query heads on 2 KV heads) and a ragged length: far fewer than
    1024 dK/dV programs, so the preset's dK/dV kernel takes 32x64 tiles on 4 warps; its gradients
    against float64 in the interpreter."""
    bundle = _check(ae.attention(mask_mod=lambda b, h, i, j: i >= j), torch.bfloat16, "cuda:90", 3e-2, h=4, hkv=2,
                    lq=77, dk=128, config={})
    config = bundle.meta["config"]
    assert (config["dkdv_block_m"], config["dkdv_block_n"], config["dkdv_num_warps"]) == (32, 64, 4)
