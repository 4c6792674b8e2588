"""Score mods whose position sums the Triton preset converts to float term by term
(passes/split_position_casts.py): no int-to-float conversion is left on a whole score tile, and
the forward and backward kernels, run in the TTIR interpreter at the default configs, match
float64 (the conversion is exact, so any mistake in the rebuilt sum shows)."""
from __future__ import annotations

import re

import pytest
import torch

import ae_mlir as ae
from ae_mlir import presets
from ae_mlir.backends import triton as tb
from bundle_interp import interpret
from test_backward_triton import _check

# An int-to-float conversion of a tile with more than one row and column.
_WHOLE_TILE_CAST = re.compile(r'"arith\.sitofp"\(%\w+\) : \(tensor<([2-9]|\d\d+)x([2-9]|\d\d+)xi32>')
_ROW_OR_COLUMN_CAST = re.compile(r'"arith\.sitofp"\(%\w+\) : \(tensor<(1x\d+|\d+x1)xi32>')


def _alibi_like(heads: int):
    slopes = torch.tensor([2.0 ** (-(i + 1)) for i in range(heads)])
    # Three terms (kv - q + 5) and a sum (q + kv), both along rows and columns.
    return ae.attention(score_mod=lambda s, b, h, q_idx, kv_idx: s + slopes[h] * (kv_idx - q_idx + 5)
                        - 0.01 * (q_idx + kv_idx), mask_mod=lambda b, h, q_idx, kv_idx: q_idx >= kv_idx), slopes


def _whole_tile_casts(bundle) -> int:
    return sum(len(_WHOLE_TILE_CAST.findall(v.ttir)) for v in bundle.variants.values())


@pytest.mark.parametrize("target", ["cuda:90", "hip:gfx942"])
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_forward_converts_rows_and_columns_only(target, dtype, tol):
    attn, slopes = _alibi_like(4)
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 4, 150, 64, generator=gen).to(dtype) for _ in range(3))
    bundle = tb.compile_bundle(attn, q, k, v, target=target)
    assert _whole_tile_casts(bundle) == 0
    assert _ROW_OR_COLUMN_CAST.search(bundle.variants["aligned"].ttir)
    (out, lse), _ = interpret(bundle, q, k, v, slopes)
    want, want_lse = attn(q.double(), k.double(), v.double(), backend="reference", return_lse=True)
    assert (out.double() - want).abs().max() < tol * max(1.0, want.abs().max())
    assert (lse.double() - want_lse).abs().max() < 1e-3


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
def test_backward_at_the_default_config(dtype, tol):
    attn, slopes = _alibi_like(2)
    bundle = _check(attn, dtype, "cuda:90", tol, lq=77, closures=(slopes,))
    assert _whole_tile_casts(bundle) == 0
    assert all(_WHOLE_TILE_CAST.search(stage.variants["aligned"].ttir) is None for stage in bundle.stages)


def test_off_the_conversions_stay_and_only_triton_splits():
    attn, slopes = _alibi_like(2)
    q = torch.randn(1, 2, 64, 32)
    assert _whole_tile_casts(tb.compile_bundle(attn, q, q, q, target="cuda:90", config={"split_casts": False})) > 0
    for preset, target, present in (("triton", "cuda:90", True), ("cpu", "host", False)):
        options = presets.options_for(preset, None, target)
        assert ("attn-split-position-casts" in presets.pipeline_text(preset, options, "l1")) == present
