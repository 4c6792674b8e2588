"""Decoding: a few query tokens against a long KV cache. On GPUs the (batch, head, query block)
programs are then too few to fill the device, and `attn-tile{kv-splits=S}` deals each query
block's KV tiles out to S programs plus a combine kernel (flash-decoding); with GQA,
`pack-gqa` puts a KV head's query heads in one tile so K and V are read once per KV head. Checked in the L1
interpreter (float64) and in the TTIR interpreter at the default configs, against the float64
reference."""
from __future__ import annotations

import math

import pytest
import torch

import ae_mlir as ae
from ae_mlir import launch_defaults, presets
from ae_mlir.backends import triton as tb
from ae_mlir.core.context import new_context, parse_module
from ae_mlir.passes import build_pass_manager
from bundle_interp import interpret
from l1_interp import run_by_role, run_kernel


def _inputs(b, h, hkv, lq, lk, d, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(b, h, lq, d, generator=gen, dtype=dtype), torch.randn(b, hkv, lk, d, generator=gen, dtype=dtype),
            torch.randn(b, hkv, lk, d, generator=gen, dtype=dtype))


def _alibi_window(lk):
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625])

    def score_mod(s, b, h, i, j):
        return s - slopes[h] * (lk - 1 - j)

    def mask_mod(b, h, i, j):
        return j >= 37

    return ae.attention(score_mod=score_mod, mask_mod=mask_mod), [slopes]


def _tiled(attn, q, k, v, pipeline: str):
    ctx = new_context()
    module = parse_module(attn.mlir(q.float(), k.float(), v.float()), ctx)
    build_pass_manager(f"builtin.module(attn-fuse-online-softmax,{pipeline})", ctx).run(module.operation)
    return module


@pytest.mark.parametrize("lq, lk, splits", [(1, 300, 4), (4, 1000, 7), (3, 250, 64), (17, 530, 3)])
def test_split_kernels_match_the_reference_in_the_l1_interpreter(lq, lk, splits):
    attn, closures = _alibi_window(lk)
    q, k, v = _inputs(1, 4, 2, lq, lk, 16)
    module = _tiled(attn, q, k, v, f"attn-tile{{block-m=16 block-n=32 kv-splits={splits}}}")
    names = [op.operation.attributes["sym_name"].value for op in module.body.operations]
    assert names == ["attention_partial", "attention_combine"]
    got = run_by_role(module, {"q": q, "k": k, "v": v, "c0": closures[0].double()})
    want, lse = attn(q, k, v, *[], backend="reference", return_lse=True)
    # The module's constants (the scale, log2 e) are f32: 1e-7 relative is their rounding.
    torch.testing.assert_close(got["out"], want, rtol=0, atol=1e-7)
    torch.testing.assert_close(got["lse"], lse, rtol=0, atol=1e-6)


def test_split_and_unsplit_kernels_agree():
    attn = ae.attention(mask_mod=lambda b, h, i, j: j <= i + 290)
    q, k, v = _inputs(2, 2, 2, 5, 300, 8)
    split = run_by_role(_tiled(attn, q, k, v, "attn-tile{block-m=16 block-n=16 kv-splits=5}"), {"q": q, "k": k, "v": v})
    one = run_kernel(_tiled(attn, q, k, v, "attn-tile{block-m=16 block-n=16}"), [q, k, v])
    torch.testing.assert_close(split["out"], one[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(split["lse"], one[1], rtol=1e-12, atol=1e-12)


def test_normalizers_without_a_row_max_are_not_split():
    attn = ae.attention(normalize="sigmoid")
    q, k, v = _inputs(1, 2, 2, 1, 500, 16)
    module = _tiled(attn, q, k, v, "attn-tile{block-m=16 block-n=32 kv-splits=8}")
    assert len([op for op in module.body.operations]) == 1


def test_the_preset_splits_only_grids_that_leave_the_gpu_idle():
    # One wave of split programs (the most that fit on the 132 SMs, at least two splits), and no
    # more than 128 tiles a split.
    assert launch_defaults.kv_splits(programs=4, kv_tiles=2048, target="cuda:90") == 33
    assert launch_defaults.kv_splits(programs=32, kv_tiles=2048, target="cuda:90") == 16
    assert launch_defaults.kv_splits(programs=32, kv_tiles=256, target="cuda:90") == 4
    assert launch_defaults.kv_splits(programs=100, kv_tiles=200, target="cuda:90") == 2
    assert launch_defaults.kv_splits(programs=32, kv_tiles=16, target="cuda:90") == 2
    assert launch_defaults.kv_splits(programs=32, kv_tiles=8, target="cuda:90") == 1
    assert launch_defaults.kv_splits(programs=132, kv_tiles=2048, target="cuda:90") == 1
    assert launch_defaults.kv_splits(programs=1, kv_tiles=100000, target="hip:gfx942") == 128
    q = torch.empty(1, 32, 1, 128, dtype=torch.bfloat16, device="meta")
    kv = torch.empty(1, 8, 131072, 128, dtype=torch.bfloat16, device="meta")
    options = presets.options_for("triton", presets.read_problem(parse_module(ae.attention().mlir(q, kv, kv),
                                                                               new_context())), "cuda:90")
    # Packed: 8 programs (one per KV head), each 4 query heads x 1 row, so 16 splits fill a wave.
    assert (options.pack_gqa, options.kv_splits, options.block_m) == (True, 16, 16)
    # Four query tokens of 8 heads a KV head: 32 rows a tile.
    config = launch_defaults.default_config(4, 8192, 128, 128, "bf16", "cuda:90", 8 * 32, 8)
    assert (config["pack_gqa"], config["block_m"], config["kv_splits"]) == (True, 32, 4)
    # Per-entry lengths over several entries, or a paged cache: two waves of split programs.
    assert launch_defaults.kv_splits(programs=8, kv_tiles=2048, target="cuda:90", uneven_keys=True) == 33
    attn = ae.attention()
    for batch, paged, splits in ((8, False, 5), (1, False, 16), (1, True, 33)):
        qb = torch.empty(batch, 32, 1, 128, dtype=torch.bfloat16, device="meta")
        lengths = torch.empty(batch, dtype=torch.int32, device="meta")
        if paged:
            pages = torch.empty(512, 8, 256, 128, dtype=torch.bfloat16, device="meta")
            table = torch.empty(batch, 512, dtype=torch.int32, device="meta")
            text = attn.mlir(qb, pages, pages, kv_len=lengths, block_table=table)
        else:
            cache = torch.empty(batch, 8, 131072 if batch == 1 else 32768, 128, dtype=torch.bfloat16, device="meta")
            text = attn.mlir(qb, cache, cache, kv_len=lengths)
        options = presets.options_for("triton", presets.read_problem(parse_module(text, new_context())), "cuda:90")
        assert options.kv_splits == splits, (batch, paged)
    # Prefill fills the GPU unsplit and unpacked.
    config = launch_defaults.default_config(2048, 2048, 128, 128, "bf16", "cuda:90", 8 * 16, 4)
    assert "kv_splits" not in config and "pack_gqa" not in config


@pytest.mark.parametrize("target", ["cuda:90", "hip:gfx942"])
@pytest.mark.parametrize("lq, lk", [(1, 65536), (4, 3000)])
def test_default_config_bundles_decode_in_the_ttir_interpreter(target, lq, lk):
    attn, closures = _alibi_window(lk)
    q, k, v = _inputs(1, 4, 2, lq, lk, 64, dtype=torch.float32)
    q, k, v = (t.to(torch.bfloat16) for t in (q, k, v))
    bundle = tb.compile_bundle(attn, q, k, v, target=target)
    assert bundle.meta["config"]["kv_splits"] > 1 and [s.name for s in bundle.stages] == ["attention_partial"]
    (out, lse), _ = interpret(bundle, q, k, v, *closures)
    want, want_lse = attn(q.double(), k.double(), v.double(), backend="reference", return_lse=True)
    assert (out.double() - want).abs().max() < 2e-2 * want.abs().max()
    assert (lse.double() - want_lse).abs().max() < 1e-4 * math.log(lk)


def _head_dependent(heads):
    slopes = torch.linspace(0.1, 0.8, heads)
    attn = ae.attention(score_mod=lambda s, b, h, i, j: s - slopes[h] * (j - i),
                        mask_mod=lambda b, h, i, j: (h % 2 == 0) | (j <= i + 290))
    return attn, [slopes]


@pytest.mark.parametrize("lq, splits, block_m", [(1, 4, 16), (5, 3, 16), (20, 2, 32), (3, 1, 16)])
def test_packed_gqa_matches_the_reference_in_the_l1_interpreter(lq, splits, block_m):
    # 8 query heads on 2 KV heads: a program's tile holds block_m / 4 rows of each of 4 heads, and
    # the mods see each row's own head (an ALiBi slope and a mask that depend on it).
    attn, closures = _head_dependent(8)
    q, k, v = _inputs(2, 8, 2, lq, 300, 16)
    module = _tiled(attn, q, k, v, f"attn-tile{{block-m={block_m} block-n=32 kv-splits={splits} pack-gqa=true}}")
    grids = [list(op.operation.attributes["attn.grid"]) for op in module.body.operations]
    assert all(grid[1] == 2 for grid in grids)
    tensors = {"q": q, "k": k, "v": v, "c0": closures[0].double()}
    if splits > 1:
        got = run_by_role(module, tensors)
        out, lse = got["out"], got["lse"]
    else:
        out, lse = run_kernel(module, [q, k, v, closures[0].double()])
    want, want_lse = attn(q, k, v, backend="reference", return_lse=True)
    torch.testing.assert_close(out, want, rtol=0, atol=1e-7)
    torch.testing.assert_close(lse, want_lse, rtol=0, atol=1e-6)


@pytest.mark.parametrize("target", ["cuda:90", "hip:gfx942"])
def test_packed_default_config_bundle_in_the_ttir_interpreter(target):
    attn, closures = _head_dependent(8)
    q, k, v = _inputs(1, 8, 2, 2, 3000, 64, dtype=torch.float32)
    q, k, v = (t.to(torch.bfloat16) for t in (q, k, v))
    bundle = tb.compile_bundle(attn, q, k, v, target=target)
    assert bundle.meta["config"]["pack_gqa"] and bundle.grid[1] == 2
    (out, lse), _ = interpret(bundle, q, k, v, *closures)
    want, want_lse = attn(q.double(), k.double(), v.double(), backend="reference", return_lse=True)
    assert (out.double() - want).abs().max() < 2e-2 * want.abs().max()
    assert (lse.double() - want_lse).abs().max() < 1e-4 * math.log(3000)


def test_packing_needs_two_rows_a_head_and_head_dims_of_16():
    # 16 query heads a KV head at Lq = 1: a 32-row tile (two rows a head), not 16 one-row heads.
    config = launch_defaults.default_config(1, 4096, 128, 128, "bf16", "cuda:90", 64, 16)
    assert (config["pack_gqa"], config["block_m"]) == (True, 32)
    # A group too big for the target's tiles is not packed (and no division by zero).
    config = launch_defaults.default_config(1, 512, 128, 128, "f32", "cuda:90", 64, 64)
    assert "pack_gqa" not in config and config["kv_splits"] >= 1
    attn = ae.attention()
    q, k, v = _inputs(1, 8, 1, 1, 100, 8)
    module = _tiled(attn, q, k, v, "attn-tile{block-m=16 block-n=32 pack-gqa=true}")
    grid = list(next(iter(module.body.operations)).operation.attributes["attn.grid"])
    assert grid[1] == 8  # head dim 8: one program a query head, unpacked
