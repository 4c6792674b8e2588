"""Numerics of `attn-chunk-recurrence`: the L1 kernel it writes, run by the L1 interpreter
(test/l1_interp.py), against the float64 reference executor on the L0 module.

The same L1 also goes through `attn-lower-to-cpu` and runs natively (power-of-two tile widths).
The interpreter runs L1 in float64 by default, so the chunked algorithm itself (cumulative decays,
masks, padding, state carry, column split) is checked to near machine precision; a float32 run
checks that the f32 arithmetic of the kernel stays finite and accurate under strong decay. The same
file runs the softmax L1 of `attn-tile` through the interpreter, an independent check of that pass.
"""
from __future__ import annotations

import ctypes
import math
import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from l1_interp import kernels_of, run_kernel

import ae_mlir as ae
from ae_mlir.core import abi
from ae_mlir.core.context import CompileError, new_context, parse_module
from ae_mlir.passes import build_pass_manager, create_pass
from ae_mlir.passes.chunk.kernel import value_block
from ae_mlir.reference import evaluate
from ae_mlir.core.verifier import check_module

B, H = 2, 2


def rand(*shape, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


def log_decay(shape, seed, strength=1.0, dtype=torch.float32):
    """Log-decays in (-inf, 0): log(sigmoid(x)), the gate GLA and Mamba-2 use."""
    return (strength * torch.nn.functional.logsigmoid(rand(*shape, seed=seed) + 2.0)).to(dtype)


def elu1(x, b, h, t, d):
    return torch.where(x > 0, x + 1.0, torch.exp(x))


def lower(text: str, pipeline: str):
    ctx = new_context()
    module = parse_module(text, ctx)
    check_module(module)
    build_pass_manager(pipeline, ctx).run(module.operation)
    return module


def reference(text: str, inputs: list) -> list:
    ctx = new_context()
    module = parse_module(text, ctx)
    with ctx:
        return evaluate(module, inputs)


class Case:
    """A linear-attention problem: the L0 text, its inputs, and how to chunk it."""

    def __init__(self, decay=None, normalize=False, chunk=16, l=37, dk=16, dv=24, dtype=torch.float32,
                 mods=True, initial_state=True, strength=1.0, seed=0):
        q, k, v = (rand(B, H, l, d, seed=seed + i, dtype=dtype) for i, d in enumerate((dk, dk, dv)))
        g_shape = {None: None, "head": (H,), "token": (B, H, l), "token_dim": (B, H, l, dk)}[decay]
        g = None if g_shape is None else log_decay(g_shape, seed + 3, strength, dtype)
        s0 = rand(B, H, dk, dv, seed=seed + 4, dtype=dtype) if initial_state else None
        dt = torch.rand(B, H, l, generator=torch.Generator().manual_seed(seed + 5))
        w = rand(dv, seed=seed + 6)
        kw = {}
        if mods:
            # Positive features for normalize (q . z must not vanish), a captured per-token step
            # and a per-column weight in v_mod (its d index crosses the V column split).
            kw = dict(q_mod=elu1 if normalize else (lambda x, b, h, t, d: x * 0.5),
                      k_mod=elu1, v_mod=lambda x, b, h, t, d: x * dt[b, h, t] + w[d])
        elif normalize:
            q, k = q.abs(), k.abs()
        self.lin = ae.linear_attention(decay=decay, normalize=normalize, chunk_size=chunk, **kw)
        self.text, captures = self.lin._build(q, k, v, g, s0)
        self.inputs = [q, k, v] + [t for t in (g, s0) if t is not None] + captures
        self.dtype = dtype

    def l1(self, options: str = ""):
        return lower(self.text, f"builtin.module(attn-chunk-recurrence{{{options}}})")

    def run(self, options: str = "", float_dtype=torch.float64):
        return run_kernel(self.l1(options), self.inputs, float_dtype)

    def expected(self):
        return reference(self.text, self.inputs)


def close(got, want, tol):
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), want.double(), atol=tol, rtol=tol)


def close_16bit(got, want):
    """Within a few bf16 roundings (2^-8 relative each) of the largest value: the kernels round
    matmul operands to the inputs' 16-bit type, so an element's error scales with the terms
    summed into it, not with its own size."""
    assert torch.isfinite(got).all()
    scale = max(want.abs().max().item(), 1.0)
    torch.testing.assert_close(got.double(), want.double(), atol=2**-6 * scale, rtol=2**-6)


DECAYS = [None, "head", "token", "token_dim"]


@pytest.mark.parametrize("decay", DECAYS)
@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("chunk", [16, 32, 64])
def test_matches_reference(decay, normalize, chunk):
    # L = 77 is ragged for every chunk size; Dv = 24 with block-v = 16 gives two programs of 12
    # columns per head.
    case = Case(decay, normalize, chunk, l=77, dk=16, dv=24)
    out, state = case.run("block-v=16")
    want_out, want_state = case.expected()
    close(out, want_out, 1e-9)
    close(state, want_state, 1e-9)


@pytest.mark.parametrize("decay", DECAYS)
@pytest.mark.parametrize("chunk", [16, 32])
def test_split_matches_reference(decay, chunk):
    # Two kernels: the chunk states (Dk = 16 in two row blocks of 8, Dv = 24 in two column blocks
    # of 12) written to the workspace, then every chunk's output from it; L = 77 is ragged.
    case = Case(decay, normalize=False, chunk=chunk, l=77, dk=16, dv=24)
    module = case.l1("split=true block-v=16 block-k=8")
    kernels = kernels_of(module)
    chunks = -(-77 // chunk)
    summed = decay in ("token", "token_dim")
    scored = decay == "token_dim" and chunk > 16
    assert len(kernels) == 2 + summed + scored
    states, outputs = kernels[summed], kernels[-1]
    if summed:
        # The cumulative log-decays of every chunk come first, in parallel, into workspace w1:
        # a program walks four chunks (at chunk 16 the second program walks the fifth alone).
        assert [int(x) for x in kernels[0].attributes["attn.grid"]] == [B, H, -(-chunks // 4)]
        assert '"w1", "w0", "state"]' in str(states.attributes["attn.arg_roles"])
    assert [int(x) for x in states.attributes["attn.grid"]] == [B, H, 4]
    if scored:
        # GLA's scores (chunk 32): a program per chunk, into workspace w2, which the output
        # kernel reads.
        assert [int(x) for x in kernels[2].attributes["attn.grid"]] == [B, H, chunks]
        assert str(kernels[2].attributes["attn.arg_roles"]).endswith('"w1", "w2"]')
        assert '"w1", "w2", "w0", "out"]' in str(outputs.attributes["attn.arg_roles"])
    # The decays of one value per row (and none) take a program per chunk, walking its two V
    # blocks from the chunk's scores (Dk 16 is wider than a block's 12 columns); "token_dim" a
    # program per (chunk, V block).
    per_chunk = 2 if decay == "token_dim" else 1
    assert [int(x) for x in outputs.attributes["attn.grid"]] == [B, H, per_chunk * chunks]
    out, state = run_kernel(module, case.inputs)
    want_out, want_state = case.expected()
    close(out, want_out, 1e-9)
    close(state, want_state, 1e-9)


@pytest.mark.parametrize("wide", [False, True])
def test_one_kernel_gla_scores_by_span(wide):
    # The one-kernel form's "token_dim" scores are one product while |G| stays under 40 nats in
    # the chunk, else the 3-D form (a loop of one trip). With `wide`, rows 20-35 decay by 6 in
    # five dimensions: chunk 0 (rows 0-31) moves 72 nats and takes the 3-D form, chunk 1 (24 nats
    # more) the product across a strong decay. The L1 kernels in float64, and the CPU backend.
    case = Case("token_dim", normalize=False, chunk=32, l=77, dk=16, dv=24)
    if wide:
        case.inputs[3][:, :, 20:36, :5] = -6.0
    module = case.l1()
    assert str(module.operation).count('iterator_types = ["parallel", "parallel", "reduction"]') == 1
    want_out, want_state = case.expected()
    out, state = run_kernel(module, case.inputs)
    close(out, want_out, 1e-9)
    close(state, want_state, 1e-9)
    out, state = case.lin(*case.inputs[:4], initial_state=case.inputs[4], return_state=True, backend="cpu")
    torch.testing.assert_close(out.double(), want_out.double(), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(state.double(), want_state.double(), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dk,slices,wide", [(16, 1, False), (80, 4, False), (16, 1, True), (80, 4, True)])
def test_split_gla_scores_by_chunk_or_row_blocks(dk, slices, wide):
    # GLA's scores a program per chunk of 64; L = 77 leaves the last chunk 13 rows. The output
    # kernel takes a program per chunk and V block. A chunk that decays less than 40 nats (the
    # log-sigmoid decays at strength 3: about 9 nats a chunk) takes one product of its decayed
    # queries and keys, in passes of 64 Dk columns (two at Dk = 80). With `wide`, rows 20-35
    # decay by 6 in five dimensions, so chunk 0 (96 nats) takes its four blocks of 16 rows:
    # block 1 (72 nats) computes its diagonal block in the exact 3-D form, over Dk = 80 in four
    # slices of 20 key columns, and block 2 (24 nats) the product across a strong decay.
    case = Case("token_dim", normalize=False, chunk=64, l=77, dk=dk, dv=24, strength=3.0)
    if wide:
        case.inputs[3][:, :, 20:36, :5] = -6.0
    module = case.l1("split=true block-v=16")
    assert str(module.operation).count('iterator_types = ["parallel", "parallel", "reduction"]') == slices
    *_, scores, outputs = kernels_of(module)
    assert [int(x) for x in scores.attributes["attn.grid"]] == [B, H, 2]
    assert [int(x) for x in outputs.attributes["attn.grid"]] == [B, H, 2 * 2]
    out, state = run_kernel(module, case.inputs)
    want_out, want_state = case.expected()
    close(out, want_out, 1e-9)
    close(state, want_state, 1e-9)


@pytest.mark.parametrize("decay", ["head", "token_dim"])
def test_split_bf16(decay):
    case = Case(decay, normalize=False, chunk=32, l=37, dtype=torch.bfloat16)
    module = case.l1("split=true")
    workspaces = '"w0"' if decay == "head" else '"w1", "w0"'
    assert f'attn.arg_roles = ["q", "k", "v", "c0", "c1", "c2", "c3", {workspaces}, "state"]' in str(module.operation)
    assert "x2x16x24xbf16>" in str(module.operation)  # the workspace holds 16-bit states
    out, state = run_kernel(module, case.inputs)
    want_out, want_state = case.expected()
    close_16bit(out, want_out)
    close_16bit(state, want_state)


def test_split_keeps_one_kernel_to_normalize():
    case = Case("token", normalize=True, chunk=16, l=37)
    module = case.l1("split=true")
    assert len(kernels_of(module)) == 1
    out, state = run_kernel(module, case.inputs)
    want_out, want_state = case.expected()
    close(out, want_out, 1e-9)
    close(state, want_state, 1e-9)


@settings(max_examples=int(os.environ.get("AE_LINEAR_EXAMPLES", "40")), deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(decay=st.sampled_from(DECAYS), normalize=st.booleans(), split=st.booleans(),
       chunk=st.sampled_from([16, 32, 64, 128]), l=st.integers(1, 150), dk=st.sampled_from([8, 16, 24, 40]),
       dv=st.integers(1, 40), strength=st.floats(0.01, 30.0), mods=st.booleans(), seed=st.integers(0, 2**16))
def test_property_matches_reference(decay, normalize, split, chunk, l, dk, dv, strength, mods, seed):
    # Shapes (L below, at and past chunk multiples; any Dv), chunk sizes, gate strengths (log
    # decays down to about -30 per token) and both forms, in float64 against the reference.
    case = Case(decay, normalize, chunk, l=l, dk=dk, dv=dv, mods=mods, strength=strength, seed=seed)
    options = "split=true block-v=16 block-k=8" if split else "block-v=16"
    out, state = case.run(options)
    want_out, want_state = case.expected()
    close(out, want_out, 1e-8)
    close(state, want_state, 1e-8)


@pytest.mark.parametrize("decay", DECAYS)
def test_bf16(decay):
    case = Case(decay, normalize=False, chunk=16, l=37, dtype=torch.bfloat16)
    assert "bf16" in str(case.l1().operation)
    out, state = case.run()
    want_out, want_state = case.expected()
    # bf16 q, k, v, g and initial state; the products take bf16 operands (A, the decayed q and
    # k, the state) with f32 accumulation, as on tensor cores, and the output is rounded to bf16.
    close_16bit(out, want_out)
    close_16bit(state, want_state)


@pytest.mark.parametrize("decay", ["token", "token_dim"])
def test_chunk_size_option_and_exact_multiple(decay):
    # The option overrides the op's chunk_size; L = 64 is a multiple of 32, so no row is padding.
    case = Case(decay, normalize=True, chunk=64, l=64, dk=8, dv=8)
    module = case.l1("chunk-size=32")
    assert "attn.chunk_size = 32" in str(module.operation)
    out, state = run_kernel(module, case.inputs)
    want_out, want_state = case.expected()
    close(out, want_out, 1e-9)
    close(state, want_state, 1e-9)


@pytest.mark.parametrize("l", [20, 5])
def test_no_mods_no_initial_state(l):
    # L = 5 is shorter than one chunk.
    case = Case("token", mods=False, initial_state=False, l=l, dk=16, dv=16)
    out, state = case.run()
    want_out, want_state = case.expected()
    close(out, want_out, 1e-9)
    close(state, want_state, 1e-9)


@pytest.mark.parametrize("dv,block_v,width", [(80, 64, 40), (128, 64, 64), (24, 64, 24), (67, 64, 67),
                                              (96, 32, 32), (130, 64, 130)])
def test_value_block(dv, block_v, width):
    assert value_block(dv, block_v) == width


def test_uneven_value_split():
    # Dv = 80 with block-v = 64: two programs of 40 columns.
    case = Case("token_dim", normalize=True, chunk=16, l=21, dk=32, dv=80)
    module = case.l1()
    assert "attn.grid = array<i64: 2, 2, 2>" in str(module.operation)
    out, state = run_kernel(module, case.inputs)
    want_out, want_state = case.expected()
    close(out, want_out, 1e-9)
    close(state, want_state, 1e-9)


@pytest.mark.parametrize("decay", ["head", "token", "token_dim"])
@pytest.mark.parametrize("split", [False, True])
def test_strong_decay_stays_finite_in_f32(decay, split):
    # Log-decays around -20 per token make cumulative sums reach about -1300 within a chunk of 64:
    # exp(-G) overflows f32 (and f64); the kernels only take exponentials of differences (the
    # split GLA outputs in blocks of 16 rows included, whose padded rows load G = 0).
    case = Case(decay, normalize=False, chunk=64, l=70, dk=16, dv=16, strength=20.0)
    out, state = case.run("split=true" if split else "", float_dtype=torch.float32)
    want_out, want_state = case.expected()
    close(out, want_out, 1e-4)
    close(state, want_state, 1e-4)


@pytest.mark.parametrize("decay", DECAYS)
def test_f32_arithmetic(decay):
    case = Case(decay, normalize=True, chunk=32, l=45)
    out, state = case.run(float_dtype=torch.float32)
    want_out, want_state = case.expected()
    close(out, want_out, 1e-4)
    close(state, want_state, 1e-4)


def test_matmuls_are_marked_ieee():
    text = str(Case("token").l1().operation)
    matmuls = [line for line in text.splitlines() if "linalg.matmul" in line]
    assert matmuls and all('attn.precision = "ieee"' in line for line in matmuls)


# --- the same L1 compiled by attn-lower-to-cpu and run natively ------------------------------------


def _memref(tensor):
    """A ranked memref descriptor (the C interface of the kernel's arguments) viewing `tensor`."""
    rank = tensor.dim()
    fields = [("allocated", ctypes.c_void_p), ("aligned", ctypes.c_void_p), ("offset", ctypes.c_int64),
              ("sizes", ctypes.c_int64 * rank), ("strides", ctypes.c_int64 * rank)]
    desc = type(f"MemRef{rank}D", (ctypes.Structure,), {"_fields_": fields})()
    desc.allocated = desc.aligned = tensor.data_ptr()
    desc.offset = 0
    for i, (size, stride) in enumerate(zip(tensor.shape, tensor.stride())):
        desc.sizes[i], desc.strides[i] = size, stride
    return desc


def run_on_cpu(case: Case, options: str = "") -> list:
    from mlir.execution_engine import ExecutionEngine

    module = lower(case.text, f"builtin.module(attn-chunk-recurrence{{{options}}})")
    programs = math.prod(abi.grid(abi.kernels(module)[0]))
    build_pass_manager("builtin.module(attn-lower-to-cpu)", module.context).run(module.operation)
    engine = ExecutionEngine(module, opt_level=2)
    entry = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(engine.raw_lookup("_mlir_ciface_linear_attention"))
    q, _, v = case.inputs[:3]
    b, h, l, dk = q.shape
    outputs = [torch.empty(b, h, l, v.shape[3], dtype=q.dtype), torch.empty(b, h, dk, v.shape[3])]
    descriptors = [_memref(t) for t in case.inputs + outputs]
    pointers = [ctypes.pointer(d) for d in descriptors]
    bounds = [ctypes.c_int64(0), ctypes.c_int64(programs)]  # the kernel's range of programs: all of them
    entry((ctypes.c_void_p * (len(pointers) + 2))(*[ctypes.addressof(p) for p in pointers + bounds]))
    return outputs


# Dv = 32 in two programs of 16 columns: the CPU lowering handles power-of-two tile widths only.
@pytest.mark.parametrize("decay", DECAYS)
@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("chunk", [16, 32])
def test_cpu_backend(decay, normalize, chunk):
    case = Case(decay, normalize, chunk, l=45, dk=16, dv=32)
    out, state = run_on_cpu(case, "block-v=16")
    want_out, want_state = case.expected()
    close(out, want_out, 1e-5)
    close(state, want_state, 1e-5)


@pytest.mark.parametrize("decay", [None, "token_dim"])
def test_cpu_backend_bf16(decay):
    case = Case(decay, normalize=False, chunk=16, l=45, dk=16, dv=32, dtype=torch.bfloat16)
    out, state = run_on_cpu(case, "block-v=16")
    want_out, want_state = case.expected()
    close_16bit(out, want_out)
    close_16bit(state, want_state)


# --- errors and pass boundaries ----------------------------------------------------------------


def test_rejects_non_positive_chunk_size():
    text = Case("token").text.replace("chunk_size = 16 : i64", "chunk_size = 0 : i64")
    module = parse_module(text, new_context())
    with pytest.raises(CompileError, match="chunk_size must be positive, got 0"):
        create_pass("attn-chunk-recurrence").apply(module.operation)
    with pytest.raises(CompileError, match="chunk-size must be 0"):
        create_pass("attn-chunk-recurrence", {"chunk-size": "-4"})
    with pytest.raises(CompileError, match="block-v must be positive"):
        create_pass("attn-chunk-recurrence", {"block-v": "0"})


def test_rejects_function_with_other_ops():
    text = Case("token", mods=False, initial_state=False).text
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if "attn.linear_recurrence" in line)
    lines.insert(at, '    %extra = "tensor.empty"() : () -> tensor<2xf32>')
    module = parse_module("\n".join(lines), new_context())
    with pytest.raises(CompileError, match="must hold only 'attn.linear_recurrence', constants and the views"):
        create_pass("attn-chunk-recurrence").apply(module.operation)


def test_leaves_softmax_functions_to_attn_tile():
    q, k, v = rand(1, 2, 20, 16, seed=1), rand(1, 2, 20, 16, seed=2), rand(1, 2, 20, 16, seed=3)
    soft = ae.attention(mask_mod=lambda b, h, i, j: i >= j).mlir(q, k, v)
    lin = ae.linear_attention(decay="token").mlir(q, k, v, log_decay((1, 2, 20), seed=4))
    body = lambda text: text[text.index("module {") + len("module {"):text.rindex("}")]
    merged = "module {" + body(soft).replace("@attention", "@soft") + body(lin) + "}"
    module = lower(merged, "builtin.module(attn-fuse-online-softmax,attn-chunk-recurrence)")
    text = str(module.operation)
    assert "attn.online_attention" in text and "attn.linear_recurrence" not in text
    module = lower(merged, "builtin.module(attn-fuse-online-softmax,attn-chunk-recurrence,attn-tile)")
    text = str(module.operation)
    assert text.count("attn.grid") == 2 and '"attn.online_attention"' not in text


# --- the softmax L1 of attn-tile through the same interpreter ------------------------------------


def softmax_expected(q, k, v, keep, bias=None):
    s = (q.double() @ k.double().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if bias is not None:
        s = s + bias
    s = s.masked_fill(~keep, -math.inf)
    return torch.softmax(s, dim=-1).nan_to_num(0.0) @ v.double(), torch.logsumexp(s, dim=-1)


@pytest.mark.parametrize("block", [(16, 16), (32, 16)])
def test_attn_tile_causal_softmax(block):
    q, k, v = rand(1, 2, 45, 16, seed=1), rand(1, 2, 45, 16, seed=2), rand(1, 2, 45, 24, seed=3)
    attn = ae.attention(mask_mod=lambda b, h, i, j: i >= j)
    module = lower(attn.mlir(q, k, v),
                   f"builtin.module(attn-fuse-online-softmax,attn-tile{{block-m={block[0]} block-n={block[1]}}})")
    out, lse = run_kernel(module, [q, k, v])
    keep = torch.ones(45, 45, dtype=torch.bool).tril()
    want_out, want_lse = softmax_expected(q, k, v, keep)
    # The kernel's constants (scale * log2(e)) are f32 literals: about 1e-7 relative.
    close(out, want_out, 1e-6)
    close(lse, want_lse, 1e-6)


def test_attn_tile_score_mod_with_capture_bf16():
    q, k, v = (rand(2, 2, 30, 16, seed=s, dtype=torch.bfloat16) for s in (1, 2, 3))
    slopes = torch.tensor([0.5, -0.25])
    attn = ae.attention(score_mod=lambda s, b, h, i, j: s + slopes[h] * (j - i))
    text, captures = attn._build(q, k, v)
    module = lower(text, "builtin.module(attn-fuse-online-softmax,attn-tile{block-m=16 block-n=16})")
    out, lse = run_kernel(module, [q, k, v] + captures)
    i = torch.arange(30)
    bias = slopes.double().view(1, 2, 1, 1) * (i.view(1, -1) - i.view(-1, 1)).double()
    want_out, want_lse = softmax_expected(q, k, v, torch.ones(30, 30, dtype=torch.bool), bias)
    close(out, want_out, 1e-2)
    close(lse, want_lse, 1e-6)
