"""Tile classification through the mask's intervals (`core.interval_eval`): the tables it gives
are the element-by-element classification's exactly, for random fuzz masks (index expressions
over b, h, q_idx and kv_idx, closure reads of shared and per-row document ids, and/or/not), at
ragged lengths and several tile shapes; the intervals leave open only the tiles a document's edge
crosses; a program the intervals do not model falls back to evaluating every tile."""
from __future__ import annotations

import os
import sys

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ae_mlir as ae
from ae_mlir import block_mask
from ae_mlir.core import interval_eval
from ae_mlir.core.block_tables import classify, table_lead
from ae_mlir.core.context import new_context, parse_module
from ae_mlir.core.regions import from_region
from ae_mlir.core.scalar_eval import bind_externals, evaluate

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "fuzz"))
from programs import programs  # noqa: E402


def _mask_program(attn, q, k, v):
    module = parse_module(attn.mlir(q, k, v), new_context())
    func = next(op for op in module.body.operations if op.operation.name == "func.func")
    (mask,) = [op for op in func.regions[0].blocks[0].operations if op.operation.name == "attn.mask"]
    return from_region(mask.regions[0])


def _both(program, operands, batch, heads, seq_q, seq_k, bm, bn):
    """(element-by-element tables, tables through the intervals, the intervals' (always, never))."""
    externals = bind_externals(program, operands)
    lead = tuple(table_lead(program.uses_arg(0), program.uses_arg(1), batch, heads) or [1, 1])

    def keep(b, h, q, kv):
        return evaluate(program, [b, h, q, kv], externals)

    known = interval_eval.tile_bounds(program, externals, lead, seq_q, seq_k, bm, bn)
    exact = classify(keep, *lead, seq_q, seq_k, bm, bn, full_width=True)
    through = classify(keep, *lead, seq_q, seq_k, bm, bn, full_width=True, known=known)
    return exact, through, known


@settings(max_examples=150, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
@given(programs(max_seq=150), st.sampled_from([(16, 16), (32, 8), (64, 32), (128, 64)]))
def test_random_masks_classify_as_element_by_element(p, blocks):
    if p.mask_tree is None:
        return
    attn = ae.attention(mask_mod=p.mask_mod())
    q, k, v = p.inputs()
    program = _mask_program(attn, q, k, v)
    _, captures = attn._build(q, k, v)
    exact, through, known = _both(program, [q, k, v, *captures], p.batch, p.heads, p.seq_q, p.seq_k, *blocks)
    for a, b in zip(exact.tensors(), through.tensors()):
        assert torch.equal(a, b), p


@pytest.mark.parametrize("per_row", [False, True])
def test_document_masks_leave_open_only_the_tiles_an_edge_crosses(per_row):
    length, bm, bn = 1000, 64, 32
    gen = torch.Generator().manual_seed(0)
    doc = torch.sort(torch.randint(0, 6, (2, length), generator=gen), dim=-1).values
    if per_row:
        def mask(b, h, q_idx, kv_idx):
            return (doc[b, q_idx] == doc[b, kv_idx]) & (q_idx >= kv_idx)
    else:
        shared = doc[0]

        def mask(b, h, q_idx, kv_idx):
            return (shared[q_idx] == shared[kv_idx]) & (q_idx >= kv_idx)
    q = torch.randn(2, 2, length, 16)
    attn = ae.attention(mask_mod=mask)
    program = _mask_program(attn, q, q, q)
    _, captures = attn._build(q, q, q)
    exact, through, (always, never) = _both(program, [q, q, q, *captures], 2, 2, length, length, bm, bn)
    assert all(torch.equal(a, b) for a, b in zip(exact.tensors(), through.tensors()))
    # An open tile holds a document's edge or the causal diagonal in its query or key range.
    rows = doc if per_row else doc[:1]
    for b in range(rows.shape[0]):
        for m, n in (~(always[b, 0] | never[b, 0])).nonzero().tolist():
            q_ids, kv_ids = rows[b, m * bm:(m + 1) * bm], rows[b, n * bn:(n + 1) * bn]
            diagonal = n * bn < (m + 1) * bm and m * bm < (n + 1) * bn
            assert diagonal or q_ids.unique().numel() > 1 or kv_ids.unique().numel() > 1
    assert (~(always | never)).float().mean() < 0.2


def test_unmodelled_ops_fall_back_to_every_tile():
    # sin has no interval here: the classification evaluates every tile, with the same result.
    attn = ae.attention(mask_mod=lambda b, h, q_idx, kv_idx: torch.sin(q_idx * 0.1) > torch.cos(kv_idx * 0.1))
    q = torch.randn(1, 1, 70, 16)
    program = _mask_program(attn, q, q, q)
    assert interval_eval.tile_bounds(program, bind_externals(program, [q, q, q]), (1, 1), 70, 70, 16, 16) is None
    tables = block_mask.classify_program(program, [q, q, q], 70, 70, 16, 16, "cpu")
    exact, _, _ = _both(program, [q, q, q], 1, 1, 70, 70, 16, 16)
    assert all(torch.equal(a, b.reshape(a.shape)) for a, b in zip(tables, exact.tensors()))


def test_reads_past_a_closure_tensor_fall_back_and_report_the_read():
    # The intervals leave an out-of-range read to the element-by-element evaluation, which
    # names it (the frontend clamps reads; a program written by hand may not).
    from ae_mlir.core.regions import ScalarOp, ScalarProgram
    from ae_mlir.core.scalar_eval import ScalarEvalError

    read = ScalarOp("tensor.extract", ("ext0", "arg2"), (), ("i64",), ("tensor<4xi64>", "index"))
    zero = ScalarOp("arith.constant", (), (("value", "0 : i64"),), ("i64",), ())
    cmp = ScalarOp("arith.cmpi", ("v0_0", "v1_0"), (("predicate", "0 : i64"),), ("i1",), ("i64", "i64"))
    program = ScalarProgram(("index",) * 4, (read, zero, cmp), "v2_0", "i1", sources=(("operand", 3),))
    q = torch.zeros(1, 1, 8, 4)
    ids = torch.zeros(4, dtype=torch.int64)
    assert interval_eval.tile_bounds(program, [ids], (1, 1), 8, 8, 4, 4) is None
    with pytest.raises(ScalarEvalError, match="out of bounds"):
        block_mask.classify_program(program, [q, q, q, ids], 8, 8, 4, 4, "cpu")


def test_products_that_may_wrap_fall_back():
    # int64 bounds of a product past 2^30 could wrap where the elements do not: no intervals.
    attn = ae.attention(mask_mod=lambda b, h, q_idx, kv_idx: (q_idx * 3037000500) * (kv_idx + 1) > 0)
    q = torch.randn(1, 1, 64, 16)
    program = _mask_program(attn, q, q, q)
    assert interval_eval.tile_bounds(program, bind_externals(program, [q, q, q]), (1, 1), 64, 64, 16, 16) is None
    exact, through, _ = _both(program, [q, q, q], 1, 1, 64, 64, 16, 16)
    assert all(torch.equal(a, b) for a, b in zip(exact.tensors(), through.tensors()))


def test_outer_constants_are_values():
    # A program whose constant is an outer value (a source "constant"), as a region reading a
    # function-level arith.constant has it: q_idx >= kv_idx + 3 at 16 x 16 tiles.
    from ae_mlir.core.regions import ScalarOp, ScalarProgram

    add = ScalarOp("arith.addi", ("arg3", "ext0"), (), ("index",), ("index", "index"))
    cmp = ScalarOp("arith.cmpi", ("arg2", "v0_0"), (("predicate", "5 : i64"),), ("i1",), ("index", "index"))
    program = ScalarProgram(("index",) * 4, (add, cmp), "v1_0", "i1", sources=(("constant", "3 : index", "index"),))
    exact, through, (always, never) = _both(program, [], 1, 1, 64, 64, 16, 16)
    assert all(torch.equal(a, b) for a, b in zip(exact.tensors(), through.tensors()))
    assert always[0, 0].tolist()[2] == [True, False, False, False]
    assert never[0, 0].tolist()[0] == [False, True, True, True]


def test_reads_proven_inside_their_tensor_skip_the_bounds_check():
    # The frontend clamps a closure read's indices into the tensor: the intervals over the whole
    # grid prove both of a document mask's reads in bounds (no check, so no GPU synchronization),
    # but not a read by a hand-written program whose index reaches past the tensor.
    from ae_mlir.core.regions import ScalarOp, ScalarProgram

    doc = torch.tensor([0, 0, 1, 1, 1, 2, 2, 2])
    attn = ae.attention(mask_mod=lambda b, h, q_idx, kv_idx: (doc[q_idx] == doc[kv_idx]) & (q_idx >= kv_idx))
    q = torch.randn(1, 1, 8, 16)
    program = _mask_program(attn, q, q, q)
    reads = {i for i, op in enumerate(program.ops) if op.name == "tensor.extract"}
    shapes = [tuple(doc.shape) if s[0] == "operand" else None for s in program.sources]
    assert len(reads) == 2 and interval_eval.gathers_in_bounds(program, shapes, (1, 1), 8, 8) == reads

    read = ScalarOp("tensor.extract", ("ext0", "arg2"), (), ("i64",), ("tensor<4xi64>", "index"))
    zero = ScalarOp("arith.constant", (), (("value", "0 : i64"),), ("i64",), ())
    cmp = ScalarOp("arith.cmpi", ("v0_0", "v1_0"), (("predicate", "0 : i64"),), ("i1",), ("i64", "i64"))
    raw = ScalarProgram(("index",) * 4, (read, zero, cmp), "v2_0", "i1", sources=(("operand", 3),))
    assert interval_eval.gathers_in_bounds(raw, [(4,)], (1, 1), 4, 8) == {0}
    assert interval_eval.gathers_in_bounds(raw, [(4,)], (1, 1), 5, 8) == frozenset()
    # A read whose index is itself read from a tensor is unbounded here: checked.
    nested = ScalarOp("tensor.extract", ("ext0", "v0_0"), (), ("i64",), ("tensor<4xi64>", "i64"))
    program = ScalarProgram(("index",) * 4, (read, nested, zero, cmp), "v3_0", "i1", sources=(("operand", 3),))
    assert interval_eval.gathers_in_bounds(program, [(4,)], (1, 1), 4, 8) == {0}


def test_bool_indices_and_overflowing_conversions():
    # A bool widened into an index reads 0 / 1 (as the exact evaluation does): the read is proven
    # in bounds and the tables equal element by element's. A float converted to an integer that
    # may overflow (exp of a position) has no interval: its read stays checked, and reports.
    from ae_mlir.core.regions import ScalarOp, ScalarProgram
    from ae_mlir.core.scalar_eval import ScalarEvalError

    doc = torch.tensor([0, 0, 1, 1, 1, 2, 2, 2, 3, 3])
    attn = ae.attention(mask_mod=lambda b, h, q_idx, kv_idx: doc[(q_idx >= kv_idx).long() + q_idx // 2] == doc[kv_idx])
    q = torch.randn(1, 1, 10, 16)
    program = _mask_program(attn, q, q, q)
    operands = [q, q, q, *attn._build(q, q, q)[1]]
    shapes = [tuple(operands[s[1]].shape) if s[0] == "operand" else None for s in program.sources]
    reads = {i for i, op in enumerate(program.ops) if op.name == "tensor.extract"}
    assert interval_eval.gathers_in_bounds(program, shapes, (1, 1), 10, 10) == reads
    exact, through, _ = _both(program, operands, 1, 1, 10, 10, 4, 4)
    assert all(torch.equal(a, b) for a, b in zip(exact.tensors(), through.tensors()))

    def op(name, operands, result, types, attributes=()):
        return ScalarOp(name, operands, attributes, (result,), types)

    ops = (op("arith.index_cast", ("arg2",), "i64", ("index",)), op("arith.sitofp", ("v0_0",), "f64", ("i64",)),
           op("math.exp", ("v1_0",), "f64", ("f64",)), op("arith.fptosi", ("v2_0",), "i64", ("f64",)),
           op("arith.constant", (), "i64", (), (("value", "3 : i64"),)),
           op("arith.remsi", ("v3_0", "v4_0"), "i64", ("i64", "i64")),
           op("arith.index_cast", ("v5_0",), "index", ("i64",)),
           op("tensor.extract", ("ext0", "v6_0"), "i64", ("tensor<3xi64>", "index")),
           op("arith.constant", (), "i64", (), (("value", "1 : i64"),)),
           op("arith.cmpi", ("v7_0", "v8_0"), "i1", ("i64", "i64"), (("predicate", "0 : i64"),)))
    overflowing = ScalarProgram(("index",) * 4, ops, "v9_0", "i1", sources=(("operand", 3),))
    assert interval_eval.gathers_in_bounds(overflowing, [(3,)], (1, 1), 64, 1) == frozenset()
    assert interval_eval.tile_bounds(overflowing, [torch.tensor([0, 1, 2])], (1, 1), 64, 1, 16, 1) is None
    q = torch.zeros(1, 1, 64, 4)
    with pytest.raises(ScalarEvalError, match="out of bounds"):
        block_mask.classify_program(overflowing, [q, q, q, torch.tensor([0, 1, 2])], 64, 1, 16, 1, "cpu")
