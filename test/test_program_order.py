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


# --- the runtime's order for tiles a call classifies (core.block_tables.program_order) ------------


def test_call_time_order_takes_sections_heaviest_first():
    from ae_mlir.core.block_tables import program_order

    counts = torch.tensor([1, 3, 2, 3], dtype=torch.int32)  # per block, every head alike
    # 2 x 3 heads of 4 blocks, a wave of 8: sections of 2 heads (8 programs); in each, the
    # programs by count descending, equal counts in grid order.
    order = program_order(counts, 2, 3, 1, 8, limit=4).tolist()
    assert sorted(order) == list(range(24))
    section = [p // 4 for p in order[:8]], [p % 4 for p in order[:8]]
    assert section == ([0, 0, 1, 1, 0, 1, 0, 1], [1, 3, 1, 3, 2, 2, 0, 0])
    assert [p // 4 for p in order[8:16]] == [2, 2, 3, 3, 2, 3, 2, 3]
    # Per query head counts under GQA (4 query heads on 2 KV heads): a program's work is its
    # group's sum; block 0 of KV head 1 (3 + 4) starts first.
    per_head = torch.tensor([[[1, 0], [1, 1], [3, 0], [4, 0]]], dtype=torch.int32)
    assert program_order(per_head, 1, 4, 2, 0, limit=4).tolist() == [2, 0, 1, 3]


def _degenerate_order(monkeypatch, entry: int, layout: str):
    """Every program of the kernel whose tables have `layout` told to compute program `entry`:
    blocks no other program computes stay NaN, which shows that the kernel reads the order."""
    from ae_mlir import block_mask

    real = block_mask.classify_program

    def classify(*args):
        tables = real(*args)
        return tables[:-1] + [torch.full_like(tables[-1], entry)] if args[-1] == layout else tables

    monkeypatch.setattr(block_mask, "classify_program", classify)
    block_mask._CACHE.clear()


@pytest.mark.parametrize("target", ["cuda:90", "hip:gfx942"])
def test_call_time_kernels_start_the_programs_the_order_names(monkeypatch, target):
    doc = torch.repeat_interleave(torch.arange(3), torch.tensor([70, 90, 40]))
    attn = ae.attention(mask_mod=lambda b, h, i, j: (doc[i] == doc[j]) & (i >= j))
    q, k, v = _inputs(3)
    bundle = tb.compile_bundle(attn, q.float(), k.float(), v.float(), target=target, config=SMALL)
    (out, _), _ = interpret(bundle, q.float(), k.float(), v.float(), doc)
    want = attn(q, k, v, backend="reference")
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=0)
    # Program (b 1, h 2, block 6) everywhere: only its rows 192..199 are written.
    _degenerate_order(monkeypatch, (1 * 3 + 2) * 7 + 6, "forward")
    (out, _), _ = interpret(bundle, q.float(), k.float(), v.float(), doc)
    written = torch.isfinite(out).all(dim=-1)
    assert written[1, 2, 192:].all() and int(written.sum()) == 8
    monkeypatch.undo()
    from ae_mlir import block_mask

    block_mask._CACHE.clear()


def test_call_time_backward_kernels_start_the_programs_the_order_names(monkeypatch):
    doc = torch.repeat_interleave(torch.arange(3), torch.tensor([70, 90, 40]))
    attn = ae.attention(mask_mod=lambda b, h, i, j: (doc[i] == doc[j]) & (i >= j))
    f32 = [t.float() for t in _inputs(4)]
    out, lse = attn(*f32, backend="reference", return_lse=True)
    config = dict(SMALL, dkdv_block_m=32, dkdv_block_n=32)
    bundle = tb.build_backward_bundle(attn.mlir(*f32), "cuda:90", config)
    tensors = dict(zip(("q", "k", "v"), f32), out=out, do=torch.ones_like(out), lse=lse,
                   dlse=torch.zeros_like(lse), c0=doc)
    # Program (b 0, h 0, block 0) of one kernel alone: the dQ kernel's first 32 query rows, the
    # dK/dV kernel's first 32 keys of head 0 of entry 0 (after a whole dQ kernel: its deltas).
    for layout, roles in (("dq", ("dq",)), ("dkdv", ("dk", "dv"))):
        _degenerate_order(monkeypatch, 0, layout)
        got = interpret_roles(bundle, tensors)
        for role in roles:
            written = torch.isfinite(got[role]).all(dim=-1)
            assert written[0, 0, :32].all() and int(written.sum()) == 32, role
        monkeypatch.undo()
    from ae_mlir import block_mask

    block_mask._CACHE.clear()
