"""The order the Triton kernels' programs start in (passes/triton/program_order.py): each program
still computes a distinct (batch, head, block), whatever the wave and however the heads fall into
sections (a last section with fewer heads included). Run in the TTIR interpreter, whose outputs
start as NaN, so a block no program computed would show; against float64 on the reference backend."""
from __future__ import annotations

import pytest
import torch

import ae_mlir as ae
from ae_mlir.backends import triton as tb
from bundle_interp import interpret, interpret_roles

# B = 2, H = 3 (six heads), L = 200 in 32-row blocks (seven, the last ragged): a wave of 8 takes
# sections of 2 heads, 20 of 4 (then 2), 132 all six; 0 none.
WAVES = [0, 8, 20, 132]
SMALL = {"block_m": 32, "block_n": 32, "num_warps": 4, "num_stages": 2}


def _inputs(seed=0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 3, 200, 16, generator=gen, dtype=dtype) for _ in range(3)]


@pytest.mark.parametrize("wave", WAVES)
@pytest.mark.parametrize("mask", ["causal", "prefix"])
def test_forward_blocks_in_sections(wave, mask):
    mods = {"causal": lambda b, h, i, j: i >= j, "prefix": lambda b, h, i, j: (j < 70) | (i >= j)}
    attn = ae.attention(mask_mod=mods[mask])
    q, k, v = _inputs()
    bundle = tb.compile_bundle(attn, q.float(), k.float(), v.float(), target="cuda:90",
                               config=dict(SMALL, wave_programs=wave))
    (out, lse), _ = interpret(bundle, q.float(), k.float(), v.float())
    want, want_lse = attn(q, k, v, backend="reference", return_lse=True)
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=0)
    torch.testing.assert_close(lse.double(), want_lse, atol=1e-5, rtol=0)


@pytest.mark.parametrize("wave", WAVES)
def test_backward_blocks_in_sections(wave):
    """The dK/dV kernel's heavy blocks are its first (the causal mask's first keys), the dQ
    kernel's its last."""
    attn = ae.attention(mask_mod=lambda b, h, i, j: i >= j)
    q, k, v = (t.requires_grad_() for t in _inputs(1))
    out, lse = attn(q, k, v, backend="reference", return_lse=True)
    gen = torch.Generator().manual_seed(2)
    d_out = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    want = torch.autograd.grad(out, (q, k, v), d_out)
    f32 = [t.detach().float() for t in (q, k, v)]
    config = dict(SMALL, dkdv_block_m=32, dkdv_block_n=32, wave_programs=wave)
    bundle = tb.build_backward_bundle(attn.mlir(*f32), "cuda:90", config)
    tensors = dict(zip(("q", "k", "v"), f32), out=out.detach().float(), do=d_out.float(),
                   lse=lse.detach().float(), dlse=torch.zeros_like(lse, dtype=torch.float32))
    got = interpret_roles(bundle, tensors)
    for role, reference in zip(("dq", "dk", "dv"), want):
        torch.testing.assert_close(got[role].double(), reference, atol=1e-4, rtol=0, msg=role)


def test_the_preset_takes_the_targets_multiprocessors():
    from ae_mlir import presets
    from ae_mlir.core.context import new_context, parse_module

    text = ae.attention(mask_mod=lambda b, h, i, j: i >= j).mlir(*[t.float() for t in _inputs()])
    problem = presets.read_problem(parse_module(text, new_context()))
    for target, wave in (("cuda:90", 132), ("hip:gfx942", 304), ("cuda:80", 108), ("cuda:89", 0)):
        options = presets.options_for("triton", problem, target)
        assert options.wave_programs == wave
        assert f"wave-programs={wave}}}" in presets.pipeline_text("triton", options)


@pytest.mark.parametrize("partial, full, want", [
    ([[0], [1], [2]], [[], [0], [0, 1]], "last"),        # causal: 1, 2, 3 tiles
    ([[0, 1], [1, 2], [2]], [[2], [], []], "first"),     # anti-causal: 3, 2, 1
    ([[0], [0], [0]], [[1], [1], [1]], None),            # equal
    ([[0], [0, 1, 2], [2]], [[], [], []], None),         # up then down (a bidirectional window)
    ([[0]], [[]], None),                                 # one block
])
def test_heavy_blocks_from_the_tile_counts(partial, full, want):
    from ae_mlir.passes.tile_tables import heavy_blocks

    assert heavy_blocks(partial, full) == want
