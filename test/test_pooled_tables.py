"""One evaluation of a call-time mask serves every tile shape made of its tiles
(`core.block_tables.pool_flags`): tables pooled from small tiles' flags are the direct
classification's exactly, for random fuzz masks at ragged lengths, each layout and several tile
shapes, and a training step evaluates its mask once for its three kernels."""
from __future__ import annotations

import os
import sys

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ae_mlir as ae
from ae_mlir import block_mask
from ae_mlir.core.block_tables import classify, table_lead, tables_from_flags, tile_flags
from ae_mlir.core.scalar_eval import bind_externals, evaluate

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "fuzz"))
from programs import programs  # noqa: E402
from test_interval_classification import _mask_program  # noqa: E402

LAYOUTS = ("forward", "dq", "dkdv")


@settings(max_examples=200, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
@given(programs(max_seq=150).filter(lambda p: p.mask_tree is not None), st.sampled_from([(8, 8), (16, 8), (8, 32)]), st.sampled_from([(1, 1), (2, 4), (4, 2), (8, 1)]),
       st.sampled_from(LAYOUTS))
def test_pooled_tables_are_the_direct_ones(p, grain, factors, layout):
    attn = ae.attention(mask_mod=p.mask_mod())
    q, k, v = p.inputs()
    program = _mask_program(attn, q, k, v)
    _, captures = attn._build(q, k, v)
    externals = bind_externals(program, [q, k, v, *captures])
    lead = tuple(table_lead(program.uses_arg(0), program.uses_arg(1), p.batch, p.heads) or [1, 1])

    def keep(b, h, q_idx, kv_idx):
        return evaluate(program, [b, h, q_idx, kv_idx], externals)

    bm, bn = grain[0] * factors[0], grain[1] * factors[1]
    want = classify(keep, *lead, p.seq_q, p.seq_k, bm, bn, full_width=True, layout=layout)
    flags = tile_flags(keep, *lead, p.seq_q, p.seq_k, *grain)
    got = tables_from_flags(flags, grain, p.seq_q, p.seq_k, bm, bn, full_width=True, layout=layout)
    for a, b in zip(want.tensors(), got.tensors()):
        assert torch.equal(a, b), (p, grain, factors, layout)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("seq_q,seq_k", [(100, 100), (150, 64), (64, 150), (37, 200)])
def test_pooled_causal_and_window_at_ragged_lengths(seq_q, seq_k, layout):
    for keep in (lambda b, h, q, kv: q >= kv, lambda b, h, q, kv: (q - kv).abs() < 20):
        want = classify(keep, 1, 1, seq_q, seq_k, 32, 16, full_width=True, layout=layout)
        got = tables_from_flags(tile_flags(keep, 1, 1, seq_q, seq_k, 8, 8), (8, 8), seq_q, seq_k, 32, 16,
                                full_width=True, layout=layout)
        assert all(torch.equal(a, b) for a, b in zip(want.tensors(), got.tensors()))


def test_call_time_tables_pool_one_evaluation(monkeypatch):
    """Document ids at ragged lengths: the tables of the forward's, the dQ kernel's and the dK/dV
    kernel's tiles come from one evaluation at 32 x 32 and equal each one classified alone; new
    ids in place evaluate again."""
    seq_q, seq_k = 300, 270
    doc = torch.repeat_interleave(torch.arange(6), torch.tensor([40, 70, 1, 99, 60, 100]))
    attn = ae.attention(mask_mod=lambda b, h, q_idx, kv_idx: (doc[q_idx] == doc[kv_idx]) & (q_idx >= kv_idx))
    q, k = torch.randn(2, 3, seq_q, 16), torch.randn(2, 3, seq_k, 16)
    program = _mask_program(attn, q, k, k)
    text = program.to_json()
    operands = [q, k, k, *attn._build(q, k, k)[1]]
    evaluated = []
    real = block_mask.mask_flags
    monkeypatch.setattr(block_mask, "mask_flags", lambda *a, **kw: evaluated.append(a[4:6]) or real(*a, **kw))
    block_mask._CACHE.clear()
    block_mask._FLAGS.clear()
    shapes = [(64, 64, "forward"), (64, 64, "dq"), (32, 64, "dkdv"), (128, 64, "forward"), (64, 128, "dkdv")]
    for bm, bn, layout in shapes:
        got = block_mask.call_time_tables(text, operands, seq_q, seq_k, bm, bn, "cpu", layout)
        want = block_mask.classify_program(program, operands, seq_q, seq_k, bm, bn, "cpu", layout)
        assert all(torch.equal(a, b) for a, b in zip(got, want)), (bm, bn, layout)
    assert evaluated[0] == (32, 32) and evaluated.count((32, 32)) == 1
    doc[:40] = 7
    block_mask.call_time_tables(text, operands, seq_q, seq_k, 64, 64, "cpu", "forward")
    assert evaluated.count((32, 32)) == 2
    block_mask._CACHE.clear()
    block_mask._FLAGS.clear()


def test_tiles_not_made_of_the_flags_are_refused():
    flags = tile_flags(lambda b, h, q_idx, kv_idx: q_idx >= kv_idx, 1, 1, 64, 64, 32, 32)
    with pytest.raises(ValueError, match="not made of"):
        tables_from_flags(flags, (32, 32), 64, 64, 48, 32)


def test_a_gpu_evaluates_small_masks_element_by_element(monkeypatch):
    """On a GPU the intervals cost a launch per torch op: masks of up to GPU_ELEMENT_WISE_MAX
    entries skip them (no tensor is touched here: the choice is made from the sizes)."""
    calls = []
    monkeypatch.setattr(block_mask, "tile_bounds", lambda *args: calls.append(args[-1]) or None)
    assert block_mask._bounds(None, [], (8, 1), 2048, 2048, 64, 64, "cuda") is None and calls == []
    block_mask._bounds(None, [], (2, 1), 8192, 8192, 64, 64, "cuda:0")
    block_mask._bounds(None, [], (1, 1), 64, 64, 64, 64, "cpu")
    assert calls == ["cuda:0", "cpu"]
