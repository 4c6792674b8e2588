"""Mask programs: JSON round trips, the scalar evaluator against eager torch, and call-time tile
tables classified from the program a kernel carries (no user Python at call time)."""
from __future__ import annotations

import gc
import os
import sys
import weakref

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings

import ae_mlir as ae
from ae_mlir import block_mask, runtime
from ae_mlir.backends import triton as tb
from ae_mlir.core import scalar_eval
from ae_mlir.core.block_tables import classify
from ae_mlir.core.context import new_context, parse_module
from ae_mlir.core.regions import ScalarProgram, from_region
from ae_mlir.passes import build_pass_manager
from ae_mlir.core import abi
from ae_mlir.core.abi import MASK_PROGRAM
from bundle_interp import interpret
from inputs import qkv

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "fuzz"))
from programs import programs  # noqa: E402

BM, BN = 16, 16
SMALL = {"block_m": 32, "block_n": 16, "num_warps": 4, "num_stages": 2}


def _op_regions(text: str, name: str) -> list:
    """The ScalarPrograms of every `name` op's regions in an L0 module (non-empty ones)."""
    module = parse_module(text, new_context())
    func = next(op for op in module.body.operations if op.operation.name == "func.func")
    return [from_region(r) for op in func.regions[0].blocks[0].operations if op.operation.name == name
            for r in op.regions if list(r.blocks)]


def _kernel_program(attn, q, k, v) -> str:
    """The JSON mask program `attn-tile` writes on a call-time-classified kernel."""
    ctx = new_context()
    module = parse_module(attn.mlir(q, k, v), ctx)
    pipeline = (f"builtin.module(attn-fuse-online-softmax,attn-tile{{block-m={BM} block-n={BN} "
                "call-time-tables=true})")
    build_pass_manager(pipeline, ctx).run(module.operation)
    kernel = [op.operation for op in module.body.operations if op.operation.name == "func.func"][-1]
    return kernel.attributes[MASK_PROGRAM].value


def _grid(b, h, lq, lk):
    return (torch.arange(b).view(b, 1, 1, 1), torch.arange(h).view(1, h, 1, 1),
            torch.arange(lq).view(1, 1, lq, 1), torch.arange(lk).view(1, 1, 1, lk))


# --- JSON ---------------------------------------------------------------------------------------

DOC = torch.tensor([0] * 20 + [1] * 25 + [2] * 19)


def document(b, h, q_idx, kv_idx):
    return DOC[q_idx] == DOC[kv_idx]


def test_json_round_trip_keeps_ops_constants_and_capture_positions():
    bias = torch.randn(2)
    attn = ae.attention(score_mod=lambda s, b, h, qi, ki: torch.where(qi >= ki, s * 0.5 + bias[h], -float("inf")),
                        mask_mod=document)
    q, k, v = qkv(lq=64, dk=16)
    for program in _op_regions(attn.mlir(q, k, v), "attn.score_mod") + _op_regions(attn.mlir(q, k, v), "attn.mask"):
        back = ScalarProgram.from_json(program.to_json())
        assert back == program
        assert back.externals == ()
        assert all(s[0] == "operand" and s[1] >= 3 for s in back.sources)
    score, mask = _op_regions(attn.mlir(q, k, v), "attn.score_mod")[0], _op_regions(attn.mlir(q, k, v), "attn.mask")[0]
    assert score.sources != mask.sources  # bias is c0, DOC is c1: positions, not values
    assert any(op.attr("value") and "0xFF800000" in op.attr("value") for op in score.ops)


def test_kernel_attribute_holds_the_mask_program():
    q, k, v = qkv(lq=64, dk=16)
    attn = ae.attention(mask_mod=document)
    (mask,) = _op_regions(attn.mlir(q, k, v), "attn.mask")
    assert ScalarProgram.from_json(_kernel_program(attn, q, k, v)) == mask


def test_program_reading_a_computed_value_does_not_serialize():
    program = ScalarProgram(("index",), (), "ext0", "index", sources=(("other",),))
    with pytest.raises(ValueError, match="neither a function argument nor a constant"):
        program.to_json()


# --- the evaluator against eager torch ------------------------------------------------------------

@settings(max_examples=25, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
@given(programs(max_seq=24, dtypes=(torch.float32,)))
def test_scalar_eval_matches_eager_torch(p):
    # Eager torch has no value for a closure read out of range, which the frontend clamps (the
    # fuzz programs leave some relative-position reads to that clamp): those programs are skipped.
    b, h, iq, ik = _grid(p.batch, p.heads, p.seq_q, p.seq_k)
    try:
        if p.mask_tree is not None:
            p.mask_mod()(b, h, iq, ik)
        if p.score_tree is not None:
            p.score_mod()(torch.zeros(()), b, h, iq, ik)
    except IndexError:
        assume(False)
    attn = ae.attention(score_mod=p.score_mod(), mask_mod=p.mask_mod())
    q, k, v = p.inputs()
    text, captures = attn._build(q, k, v)
    operands = [q, k, v] + [c.to(torch.float64) if c.dtype.is_floating_point else c for c in captures]
    if p.mask_tree is not None:
        (program,) = _op_regions(text, "attn.mask")
        program = ScalarProgram.from_json(program.to_json())
        got = scalar_eval.evaluate(program, [b, h, iq, ik], scalar_eval.bind_externals(program, operands))
        # A mod may return a Python constant; the grid's shape is what both broadcast to.
        want = torch.as_tensor(p.mask_mod()(b, h, iq, ik)).expand(p.batch, p.heads, p.seq_q, p.seq_k)
        assert torch.equal(got.expand(want.shape), want), str(p)
    if p.score_tree is not None:
        (program,) = _op_regions(text, "attn.score_mod")
        program = ScalarProgram.from_json(program.to_json())
        score = torch.randn(p.batch, p.heads, p.seq_q, p.seq_k, dtype=torch.float64)
        got = scalar_eval.evaluate(program, [score, b, h, iq, ik], scalar_eval.bind_externals(program, operands))
        want = torch.as_tensor(p.score_mod()(score.float(), b, h, iq, ik), dtype=torch.float64).expand(score.shape)
        torch.testing.assert_close(got.expand(want.shape), want, atol=1e-5, rtol=1e-5, msg=str(p))


def test_every_op_the_tracer_emits_is_evaluated():
    import re

    from ae_mlir.frontend import emit
    from ae_mlir import normalizers

    emitted = set()
    for module in (emit, normalizers):
        # Op names open string literals; a name completed by a format field ("arith.cmp{...}")
        # is left out, its completions appear literally too.
        emitted |= set(re.findall(r"[\"']((?:arith|math|tensor)\.\w+)(?![\w{])", open(module.__file__).read()))
    assert emitted and emitted <= scalar_eval.supported_ops(), emitted - scalar_eval.supported_ops()


def test_constant_literals():
    assert scalar_eval.constant_value("0x7F800000 : f32", "f32").item() == float("inf")
    assert scalar_eval.constant_value("0xFF800000 : f32", "f32").item() == -float("inf")
    assert scalar_eval.constant_value("0x3F80 : bf16", "bf16").item() == 1.0
    assert scalar_eval.constant_value("-3 : index", "index").item() == -3
    assert scalar_eval.constant_value("true", "i1").item() is True
    assert scalar_eval.constant_value("2.500000e-01 : f32", "f32").item() == 0.25


# --- call-time tables -----------------------------------------------------------------------------

WINDOW = torch.tensor(7)
PERM = torch.randperm(64, generator=torch.Generator().manual_seed(3))


def sliding_window(b, h, q_idx, kv_idx):
    return (q_idx - kv_idx <= WINDOW) & (kv_idx <= q_idx)


def _nested():
    """A mask built from closures over closures: the gather goes through a permutation."""
    def same_doc(q_idx, kv_idx):
        return DOC[PERM[q_idx]] == DOC[PERM[kv_idx]]

    def near(q_idx, kv_idx):
        return (q_idx - kv_idx).abs() <= WINDOW * 2

    def mask(b, h, q_idx, kv_idx):
        return same_doc(q_idx, kv_idx) | near(q_idx, kv_idx)

    return mask


@pytest.mark.parametrize("mask_mod", [document, sliding_window, _nested()], ids=["document", "window", "nested"])
@pytest.mark.parametrize("lk", [64, 57])
def test_call_time_tables_equal_the_mask_mod_ones(mask_mod, lk):
    q, k, v = qkv(lq=64, lk=lk, dk=16)
    attn = ae.attention(mask_mod=mask_mod)
    program = _kernel_program(attn, q, k, v)
    operands = [q, k, v] + attn._build(q, k, v)[1]
    got = block_mask.call_time_tables(program, operands, 64, lk, BM, BN, "cpu")
    want = classify(mask_mod, 1, 1, 64, lk, BM, BN, "cpu", full_width=True).tensors()
    for g, w in zip(got, want):
        assert torch.equal(g, w.reshape(w.shape[2:]))


@pytest.mark.parametrize("budget", [1, 2 * 16 * 60, 3 * 16 * 50, 1 << 24], ids=["block", "heads", "blocks", "whole"])
@pytest.mark.parametrize("lq,lk", [(100, 50), (96, 57), (7, 130)])
def test_classify_passes_over_several_query_blocks(monkeypatch, budget, lq, lk):
    # However many query blocks, batch entries and heads one evaluation covers (a block of one
    # head, two of the three heads then the third, a few blocks with a ragged block left over,
    # all), the tables are those of the dense mask tile by tile; the mask reads b and h too.
    from ae_mlir.core import block_tables

    monkeypatch.setattr(block_tables, "GRID_BUDGET", budget)
    doc = torch.randint(0, 3, (max(lq, lk),), generator=torch.Generator().manual_seed(5)).sort().values

    def mask(b, h, q_idx, kv_idx):
        return (doc[q_idx] == doc[kv_idx]) & (q_idx - kv_idx <= 20 + 7 * h) | ((kv_idx + b) % 11 == 0)

    batch, heads, bm, bn = 2, 3, 16, 16
    tables = classify(mask, batch, heads, lq, lk, bm, bn, "cpu", full_width=True)
    dense = mask(torch.arange(batch).view(-1, 1, 1, 1), torch.arange(heads).view(1, -1, 1, 1),
                 torch.arange(lq).view(1, 1, -1, 1), torch.arange(lk).view(1, 1, 1, -1)).expand(batch, heads, lq, lk)
    for b in range(batch):
        for h in range(heads):
            for m in range(-(-lq // bm)):
                partial, full = [], []
                for n in range(-(-lk // bn)):
                    tile = dense[b, h, m * bm:(m + 1) * bm, n * bn:(n + 1) * bn]
                    if tile.all() and tile.shape[1] == bn:
                        full.append(n)
                    elif tile.any():
                        partial.append(n)
                got = [t[b, h, m] for t in tables.tensors()]
                assert int(got[0]) == len(partial) and got[1][:len(partial)].tolist() == partial
                assert int(got[2]) == len(full) and got[3][:len(full)].tolist() == full


def test_call_time_tables_are_cached_until_a_closure_tensor_changes():
    doc = DOC.clone()

    def mask(b, h, q_idx, kv_idx):
        return doc[q_idx] == doc[kv_idx]

    q, k, v = qkv(lq=64, dk=16)
    attn = ae.attention(mask_mod=mask)
    program = _kernel_program(attn, q, k, v)
    operands = [q, k, v] + attn._build(q, k, v)[1]
    first = block_mask.call_time_tables(program, operands, 64, 64, BM, BN, "cpu")
    assert block_mask.call_time_tables(program, operands, 64, 64, BM, BN, "cpu") is first
    doc[:32] = 5  # in place: same tensor, new version
    changed = block_mask.call_time_tables(program, operands, 64, 64, BM, BN, "cpu")
    assert changed is not first
    want = classify(mask, 1, 1, 64, 64, BM, BN, "cpu", full_width=True).tensors()
    assert all(torch.equal(g, w.reshape(w.shape[2:])) for g, w in zip(changed, want))


def _doc_attention():
    doc = torch.tensor([0] * 40 + [1] * 50 + [2] * 38)

    def doc_mask(b, h, q_idx, kv_idx):
        return doc[q_idx] == doc[kv_idx]

    return ae.attention(mask_mod=doc_mask), weakref.ref(doc_mask)


def test_bundle_runs_without_the_users_function():
    q, k, v = qkv(lq=128, dk=16)
    attn, mask_ref = _doc_attention()
    want = attn(q, k, v, backend="reference")
    captures = attn._build(q, k, v)[1]
    text = tb.compile_bundle(attn, q, k, v, config=SMALL).to_json()
    del attn
    gc.collect()
    assert mask_ref() is None, "something still holds the user's mask function"
    bundle = runtime.Bundle.from_json(text)  # as a deployment loads it: tensors and JSON only
    (out, _), _ = interpret(bundle, q, k, v, *captures)
    torch.testing.assert_close(out, want, atol=2e-5, rtol=2e-5)


def test_cpu_kernel_runs_without_the_users_function():
    from ae_mlir import backends

    q, k, v = qkv(lq=128, dk=16)
    attn, mask_ref = _doc_attention()
    want = attn(q, k, v, backend="reference")
    text, captures = attn._build(q, k, v)
    del attn
    gc.collect()
    assert mask_ref() is None
    out, _ = backends.run(text, [q, k, v] + captures, "cpu", q.dtype)
    torch.testing.assert_close(out, want, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("lq, lk, bm, bn", [(77, 77, 16, 32), (64, 50, 16, 16), (40, 96, 32, 16)])
def test_backward_layouts_equal_the_compile_time_lists(lq, lk, bm, bn):
    """The call-time tables of the backward kernels: "dq" lists KV blocks per query block with the
    tiles of both ragged edges partial, "dkdv" the same tiles per KV block; the same lists
    attn-tile-backward builds at compile time for a mask of positions."""
    from ae_mlir.passes.tile_backward_lists import ragged_partial, transposed

    def keep(b, h, q, kv):
        return ((q // 20) == (kv // 20)) & (q >= kv)

    partial, full = ragged_partial(*classify(keep, 1, 1, lq, lk, bm, bn).as_lists(), lq, lk, bm, bn)
    nn = -(-lk // bn)
    for layout, want in (("dq", (partial, full)), ("dkdv", (transposed(partial, nn), transposed(full, nn)))):
        got = classify(keep, 1, 1, lq, lk, bm, bn, full_width=True, layout=layout).as_lists()
        assert got == want, layout


def _document_training(lq: int):
    """A causal document mask over ragged documents (tiles full, partial and empty at the
    CPU preset's 64 x 64 backward tiles, the last ones ragged) and inputs that take gradients."""
    gen = torch.Generator().manual_seed(3)
    doc = torch.sort(torch.randint(0, 4, (lq,), generator=gen)).values

    def doc_causal(b, h, q_idx, kv_idx):
        return (doc[q_idx] == doc[kv_idx]) & (q_idx >= kv_idx)

    q, k, v = (t.requires_grad_() for t in qkv(b=2, h=2, lq=lq, dk=16, seed=4))
    return ae.attention(mask_mod=doc_causal), doc, (q, k, v)


def _gradients(attn, q, k, v, d_out, backend: str):
    if backend == "reference":
        q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
        d_out = d_out.double()
    out = attn(q, k, v, backend=backend)
    return torch.autograd.grad(out, (q, k, v), d_out)


def test_cpu_backward_kernels_take_call_time_tables_and_match_float64():
    # The backward kernels walk the tiles a call's tables list (dQ per query block, dK/dV per KV
    # block), as the Triton ones do; a change of the document ids in place reclassifies.
    from ae_mlir.backends import cpu

    attn, doc, (q, k, v) = _document_training(lq=200)
    d_out = torch.randn(2, 2, 200, 16, generator=torch.Generator().manual_seed(5))
    for step in range(2):
        got = _gradients(attn, q, k, v, d_out, "cpu")
        want = _gradients(attn, q, k, v, d_out, "reference")
        for g, w in zip(got, want):
            torch.testing.assert_close(g.double(), w, atol=2e-5, rtol=2e-5)
        doc[100:] = 9  # one long last document: other tiles kept and cut
    text = attn.mlir(q.detach(), k.detach(), v.detach())
    for part in ("dq", "dkdv"):
        kernel = cpu.compile_module(text, backward=part)
        reads, _ = abi.backward_roles(part)
        assert kernel.mask_program is not None, part
        assert len(kernel.inputs) == 4 + len(reads) + 4, part  # q, k, v, doc, the reads, four tables
        assert [spec.elt for spec in kernel.inputs[-4:]] == ["i32"] * 4, part


def test_a_nearly_full_cache_keeps_a_steps_tables_together(monkeypatch):
    # At its bound the tables' cache drops its oldest entries: the backward's tables do not push
    # out the forward's that the same step made (emptying the cache did, so the next step's
    # forward classified again).
    attn, _, (q, k, v) = _document_training(lq=130)
    d_out = torch.randn(2, 2, 130, 16)
    block_mask._CACHE.clear()
    block_mask._CACHE.update({("earlier call", i): None for i in range(63)})
    _gradients(attn, q, k, v, d_out, "cpu")
    made = []
    tables = block_mask._tables
    monkeypatch.setattr(block_mask, "_tables", lambda *args: made.append(args[-1]) or tables(*args))
    _gradients(attn, q, k, v, d_out, "cpu")
    assert made == []
    assert ("earlier call", 0) not in block_mask._CACHE and len(block_mask._CACHE) == 64
    block_mask._CACHE.clear()


def test_a_training_step_evaluates_a_closure_mask_once(monkeypatch):
    # The forward and both backward kernels get their tables from the cache on later steps:
    # autograd hands the kernels new detached views of the document ids at every call. A step
    # with new ids evaluates the mask once: the three kernels' tables pool its flags.
    attn, _, (q, k, v) = _document_training(lq=130)
    d_out = torch.randn(2, 2, 130, 16)
    _gradients(attn, q, k, v, d_out, "cpu")
    layouts, evaluated = [], []
    tables, mask_flags = block_mask._tables, block_mask.mask_flags
    monkeypatch.setattr(block_mask, "_tables", lambda *args: layouts.append(args[-1]) or tables(*args))
    monkeypatch.setattr(block_mask, "mask_flags", lambda *args: evaluated.append(args[4:6]) or mask_flags(*args))
    _gradients(attn, q, k, v, d_out, "cpu")
    assert layouts == [] and evaluated == []
    block_mask._CACHE.clear()
    block_mask._FLAGS.clear()
    _gradients(attn, q, k, v, d_out, "cpu")
    assert sorted(layouts) == ["dkdv", "dq", "forward"]
    assert evaluated == [(block_mask.FLAG_TILE, block_mask.FLAG_TILE)]
