"""The Triton backend: L0 -> Triton IR numerics (NumPy TTIR interpreter vs the float64 reference),
triton.compile for cuda:90 and hip:gfx942 on this GPU-less machine, the runtime's import
discipline, the bundle cache, and (marked `gpu`) launches on a real GPU.

Kernels are built exactly as the backend builds them (`compile_bundle`), with block sizes small
enough that every case spans several query blocks and KV tiles, and run with the arguments the
runtime would pass (`runtime.bind` / `argument_values`), so the interpreter checks the whole
launch contract, not just the kernel body.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

import ae_mlir as ae
from ae_mlir import disk_cache, launch_defaults, runtime, triton_kernels
from ae_mlir.backends import triton as tb
from inputs import qkv, rand
from bundle_interp import interpret

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TOL = {
    torch.float32: dict(atol=2e-5, rtol=2e-5),
    # P is rounded to the input dtype before P @ V, as on the GPU.
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
    torch.float16: dict(atol=4e-3, rtol=4e-3),
}
SMALL = {"block_m": 32, "block_n": 16, "num_warps": 4, "num_stages": 2}


def check(attn, q, k, v, config=SMALL, variant=None, expect_variant=None):
    bundle = tb.compile_bundle(attn, q, k, v, config=config)
    (out, *rest), chosen = interpret(bundle, q, k, v, *captures_of(attn, q, k, v), variant=variant)
    if expect_variant is not None:
        assert chosen is bundle.variants[expect_variant]
    ref = attn(q, k, v, return_lse=bool(rest), backend="reference")
    ref_out, ref_lse = (ref if rest else (ref, None))
    assert not torch.isnan(out).any(), "the kernel left output elements unwritten"
    torch.testing.assert_close(out, ref_out.float(), **TOL[q.dtype])
    if rest:
        torch.testing.assert_close(rest[0], ref_lse.float(), atol=1e-4, rtol=1e-4)
    return out, (rest[0] if rest else None), bundle


def captures_of(attn, q, k, v):
    """The closure tensors a bundle takes after q, k, v (the runtime adds call-time tile tables
    itself, from the bundle's mask program)."""
    return attn._build(q, k, v)[1]


SLOPES = torch.tensor([0.5, 0.25, 0.125, 0.0625])
DOC = torch.tensor([0] * 40 + [1] * 50 + [2] * 38)


def alibi(s, b, h, qi, ki):
    return s + SLOPES[h] * (ki - qi)


def softcap(s, b, h, qi, ki):
    return 20.0 * torch.tanh(s / 20.0)


def causal(b, h, qi, ki):
    return qi >= ki


def document(b, h, qi, ki):
    return DOC[qi] == DOC[ki]


def sliding_window(b, h, qi, ki):
    return (qi - ki <= 40) & (ki - qi <= 40)


CASES = {
    # name: (attention kwargs, qkv kwargs, config)
    "plain-fp32": ({}, dict(h=2, lq=17, dtype=torch.float32), SMALL),
    "causal-bf16-B2": ({"mask_mod": causal}, dict(b=2, h=2, lq=128, dk=64, dtype=torch.bfloat16), SMALL),
    "causal-fp16-L1000": ({"mask_mod": causal}, dict(h=1, lq=1000, dk=64, dtype=torch.float16),
                          {"block_m": 128, "block_n": 64, "num_warps": 8, "num_stages": 3}),
    "plain-bf16-L1000-D128": ({}, dict(h=1, lq=1000, dk=128, dtype=torch.bfloat16), None),
    "alibi-causal-gqa-bf16": ({"score_mod": alibi, "mask_mod": causal},
                              dict(b=1, h=4, hkv=2, lq=100, dk=16, dtype=torch.bfloat16), SMALL),
    "softcap-fp32-D80-lq-ne-lk": ({"score_mod": softcap}, dict(h=2, lq=33, lk=70, dk=80, dtype=torch.float32),
                                  SMALL),
    "document-bf16": ({"mask_mod": document}, dict(h=2, lq=128, dk=16, dtype=torch.bfloat16), SMALL),
    "L1-fp16-D128": ({"mask_mod": causal}, dict(h=3, lq=1, dk=128, dtype=torch.float16), None),
    "dk64-dv16-fp32": ({"mask_mod": causal}, dict(h=2, lq=40, lk=57, dk=64, dv=16, dtype=torch.float32), SMALL),
    "dk16-dv80-bf16": ({}, dict(b=2, h=1, lq=23, lk=50, dk=16, dv=80, dtype=torch.bfloat16), SMALL),
    "sigmoid-fp16": ({"normalize": "sigmoid", "mask_mod": causal}, dict(h=2, lq=50, dtype=torch.float16), SMALL),
    # The default config's 128x64 tiles at head dims past 128 (launch_defaults), ragged.
    "causal-bf16-D256": ({"mask_mod": causal}, dict(h=1, lq=150, dk=256, dtype=torch.bfloat16), None),
    "causal-bf16-Dk192-Dv128": ({"mask_mod": causal}, dict(h=1, lq=150, dk=192, dv=128, dtype=torch.bfloat16),
                                None),
    "sliding-softcap-bf16-D256": ({"mask_mod": sliding_window, "score_mod": softcap},
                                  dict(h=1, lq=150, dk=256, dtype=torch.bfloat16), None),
    # Plain attention this long takes 128x128 tiles through TMA descriptors by default on sm90
    # (launch_defaults._PLAIN_LONG); ragged.
    "plain-bf16-L2100-D128": ({}, dict(h=1, lq=2100, dk=128, dtype=torch.bfloat16), None),
}
# At D = 64 only from L 8192 on: too long to run at every config above.
PLAIN_D64 = dict(h=1, lq=8200, dk=64, dtype=torch.bfloat16)


@pytest.mark.parametrize("name", list(CASES))
def test_numerics(name):
    """At the case's config, or (None) at the one a call on an H200 compiles."""
    attn_kwargs, shape, config = CASES[name]
    check(ae.attention(**attn_kwargs), *qkv(**shape), config=config)


@pytest.mark.parametrize("shape, warps", [(CASES["plain-bf16-L2100-D128"][1], 8), (PLAIN_D64, 4)],
                         ids=["D128", "D64"])
def test_plain_long_attention_loads_128x128_tiles_through_descriptors_by_default(shape, warps):
    _, _, bundle = check(ae.attention(), *qkv(**shape), config=None, expect_variant="aligned")
    assert {k: bundle.meta["config"][k] for k in ("block_m", "block_n", "num_warps")} == \
        {"block_m": 128, "block_n": 128, "num_warps": warps}
    assert '"tt.descriptor_load"' in bundle.variants["aligned"].ttir
    # With a mask the same shape keeps the 128x64 tiles, through descriptors too (made on the host).
    causal_bundle = tb.compile_bundle(ae.attention(mask_mod=causal), *qkv(**CASES["plain-bf16-L2100-D128"][1]))
    assert causal_bundle.meta["config"]["block_n"] == 64
    assert '"tt.descriptor_load"' in causal_bundle.variants["aligned"].ttir
    assert '"tt.make_tensor_descriptor"' not in causal_bundle.variants["aligned"].ttir


@pytest.mark.parametrize("name", list(CASES))
def test_numerics_with_tma_tile_loads(name):
    """TMA tile loads (tensor_descriptors, an autotuning choice on sm90): ragged tiles, head dims
    padded past the tensor (D = 80), Lq != Lk and GQA read zeros past the tensor's end as the
    masked loads do; a one-row sequence keeps its pointers."""
    attn_kwargs, shape, config = CASES[name]
    q, k, v = qkv(**shape)
    if config is None:
        dtype = str(q.dtype).removeprefix("torch.")
        config = launch_defaults.default_config(q.shape[2], k.shape[2], q.shape[3], v.shape[3], dtype, "cuda:90")
    _, _, bundle = check(ae.attention(**attn_kwargs), q, k, v, config=dict(config, tensor_descriptors=True),
                         expect_variant="aligned")
    assert ('"tt.descriptor_load"' in bundle.variants["aligned"].ttir) == (q.shape[2] > 1)


@pytest.mark.parametrize("name", ["alibi-causal-gqa-bf16", "softcap-fp32-D80-lq-ne-lk", "document-bf16",
                                  "dk64-dv16-fp32"])
def test_numerics_of_uncanonicalized_l1(name):
    """The lowering takes L1 as attn-tile writes it too (the preset's canonicalize=false):
    one-trip loops, constant block tables and in-body constants stay as they are."""
    attn_kwargs, shape, config = CASES[name]
    check(ae.attention(**attn_kwargs), *qkv(**shape), config=dict(config, canonicalize=False))


def test_fully_masked_row_gives_zero_and_minus_inf_lse():
    attn = ae.attention(mask_mod=lambda b, h, qi, ki: ki < qi)
    q, k, v = qkv(h=2, lq=37, dtype=torch.float32)
    out, lse, _ = check(attn, q, k, v)
    assert (out[:, :, 0] == 0).all()
    assert torch.isneginf(lse[:, :, 0]).all()
    assert torch.isfinite(lse[:, :, 1:]).all()


def test_index_arithmetic_and_expanded_math():
    """Integer // and %, |q - k|, x ** y, log1p, expm1 and unary minus: the ops the lowering
    rewrites because Triton cannot lower them on both targets."""
    def score(s, b, h, qi, ki):
        band = ((qi // 5) % 3).float()
        return -(torch.log1p(s.abs()) ** 1.5) + torch.expm1(s / 8.0) + 0.1 * band

    def window(b, h, qi, ki):
        return (qi - ki).abs() <= 9

    q, k, v = qkv(h=2, lq=45, dtype=torch.float32)
    check(ae.attention(score_mod=score, mask_mod=window), q, k, v)


def test_non_contiguous_inputs_pick_the_general_kernel():
    b, h, lq, d = 2, 2, 50, 16
    # q as a [B, L, H, D] tensor viewed as [B, H, L, D]; k with a non-unit last-dim stride; v a
    # slice of a larger buffer (storage offset, padded rows).
    q = rand(b, lq, h, d, seed=1).transpose(1, 2)
    k = rand(b, h, d, lq, seed=2).transpose(2, 3)
    v = rand(b, h, lq + 7, d + 3, seed=3)[:, :, 3 : 3 + lq, 1 : 1 + d]
    attn = ae.attention(mask_mod=causal)
    check(attn, q, k, v, expect_variant="generic")
    check(attn, q, k.contiguous(), v.contiguous(), expect_variant="aligned")


def test_both_variants_agree_on_a_transposed_layout():
    q = rand(1, 40, 2, 64, seed=4, dtype=torch.bfloat16).transpose(1, 2)
    k, v = (rand(1, 2, 40, 64, seed=s, dtype=torch.bfloat16) for s in (5, 6))
    attn = ae.attention(score_mod=softcap)
    bundle = tb.compile_bundle(attn, q, k, v, config=SMALL)
    tensors = runtime.bind(bundle, q, k, v)
    assert runtime.aligned_ok(bundle, tensors)
    (a, _), _ = interpret(bundle, q, k, v, variant="aligned")
    (g, _), _ = interpret(bundle, q, k, v, variant="generic")
    torch.testing.assert_close(a, g, atol=0, rtol=0)


def test_closure_layouts_and_the_aligned_variant():
    """A closure tensor of rows of 16 elements or more is specialized like q, k and v (its tile
    loads vectorize); any other keeps its strides and only needs a unit last one, so a bias
    table with rows of 50 (not a multiple of 16) leaves the call on the aligned variant. Each
    layout gives the reference's numbers."""
    from ae_mlir.core import abi

    q, k, v = qkv(h=2, lq=50, dtype=torch.float32)
    big = rand(2, 64, 64, seed=8)  # a dense closure: rows of 64
    table = rand(50, 53, seed=7)[:, :50]  # rows of 50 with a row stride of 53

    def scores(s, b, h, qi, ki):
        return s + table[qi, ki] + big[h, qi, ki]

    attn = ae.attention(score_mod=scores)
    bundle = tb.compile_bundle(attn, q, k, v, config=SMALL)
    closures = [spec for spec in bundle.inputs if abi.is_capture(spec.role)]
    assert sorted(len(spec.shape) for spec in closures) == [2, 3]
    for spec in closures:  # unit last strides in the aligned variant, runtime ones in the general
        last = f"{spec.role}.stride{len(spec.shape) - 1}"
        assert last not in bundle.variants["aligned"].args and last in bundle.variants["generic"].args
    check(attn, q, k, v, expect_variant="aligned")
    # The big table as a view with a non-unit last stride, then with odd row strides: general.
    big_t = big.transpose(1, 2).contiguous().transpose(1, 2)
    for swapped in (big_t, rand(2, 64, 67, seed=9)[:, :, :64].copy_(big)):
        big = swapped
        check(attn, q, k, v, expect_variant="generic")
    # The small table with a non-unit last stride: general.
    big, table = big.contiguous(), table.t().contiguous().t()
    check(attn, q, k, v, expect_variant="generic")


def test_launch_plan_is_kept_per_layout_and_takes_each_calls_tensors():
    from ae_mlir.kernel_args import ReversedRows

    attn = ae.attention(score_mod=softcap, mask_mod=causal)
    q, k, v = qkv(h=2, lq=40, dtype=torch.bfloat16)
    bundle = tb.compile_bundle(attn, q, k, v, config=SMALL)

    def plan_of(*inputs):
        tensors = runtime.bind(bundle, *inputs)
        plan = runtime.launch_plan(bundle, tensors, "cpu", lambda kernel: runtime.device_tables(bundle, "cpu", kernel))
        launch = plan[-1]
        want = runtime.argument_values(launch.variant, tensors, runtime.device_tables(bundle, "cpu", bundle))
        got = launch.arguments(tensors)
        assert len(got) == len(want) and all(a is b if isinstance(b, torch.Tensor) else a == b
                                             for a, b in zip(got, want))
        return plan, launch

    first, launch = plan_of(q, k, v)
    assert launch.variant.aligned
    q2, k2, v2 = qkv(h=2, lq=40, dtype=torch.bfloat16)
    again, _ = plan_of(q2, k2, v2)
    assert again is first  # same layout: the plan is reused with the new call's tensors
    strided, launch = plan_of(q.transpose(2, 3).contiguous().transpose(2, 3), k, v)
    assert strided is not first and not launch.variant.aligned
    reversed_plan, launch = plan_of(ReversedRows(q), k, v)
    assert reversed_plan is not first
    assert -q.stride(2) in launch.template


def test_block_tables_become_arithmetic_or_pointer_arguments():
    q, k, v = qkv(h=1, lq=128, dtype=torch.float16)
    causal_bundle = tb.compile_bundle(ae.attention(mask_mod=causal), q, k, v, config=SMALL)
    # Causal block lists are affine in the query block: no table reaches the kernel.
    assert causal_bundle.tables == []
    assert not any(a.startswith("table") for a in causal_bundle.variants["aligned"].args)
    # Every other query block sees everything, the rest only the first keys: not affine.
    band = ae.attention(mask_mod=lambda b, h, qi, ki: ((qi // 32) % 2 == 0) | (ki < 8))
    band_bundle = tb.compile_bundle(band, q, k, v, config=SMALL)
    assert band_bundle.tables and any(a.startswith("table") for a in band_bundle.variants["aligned"].args)
    check(band, q, k, v)


@pytest.mark.parametrize("decay", [None, "head", "token", "token_dim"])
def test_linear_attention_numerics(decay):
    """The chunked recurrence of ae.linear_attention lowers through the same pass (destinations
    stored inside the chunk loop, the state carried as a tile, contractions over the key dim)."""
    b, h, l, d = 1, 2, 40, 16
    q, k, v = (rand(b, h, l, d, seed=s) for s in (1, 2, 3))
    g = {None: None, "head": (h,), "token": (b, h, l), "token_dim": (b, h, l, d)}[decay]
    g = None if g is None else -0.3 * rand(*g, seed=4).abs()
    s0 = rand(b, h, d, d, seed=5)
    lin = ae.linear_attention(decay=decay, chunk_size=16, normalize=decay == "head")
    inputs = [t for t in (g, s0) if t is not None]
    bundle = tb.build_bundle(lin.mlir(q, k, v, g, s0), "cuda:90", SMALL)
    (out, state), _ = interpret(bundle, q, k, v, *inputs)
    ref_out, ref_state = lin(q, k, v, g, initial_state=s0, return_state=True, backend="reference")
    torch.testing.assert_close(out, ref_out, **TOL[torch.float32])
    torch.testing.assert_close(state, ref_state, **TOL[torch.float32])


@pytest.mark.parametrize("target", ["cuda:90", "hip:gfx942"])
@pytest.mark.parametrize("decay", [None, "head", "token"])
def test_linear_output_walks_value_blocks(decay, target):
    """At the default config, Dk = Dv = 128 (two V blocks of 64): with G one value per row, the
    output kernel is a program per chunk (the last of 70 tokens 6 rows) that builds the chunk's
    scores once and walks both V blocks in a loop, scaling q @ S by exp(G) row by row."""
    b, h, l, d = 1, 2, 70, 128
    q, k, v = (rand(b, h, l, d, seed=s) for s in (1, 2, 3))
    g = {None: None, "head": -0.2 * rand(h, seed=4).abs(), "token": -0.3 * rand(b, h, l, seed=4).abs()}[decay]
    s0 = rand(b, h, d, d, seed=5)
    lin = ae.linear_attention(decay=decay, chunk_size=64)
    inputs = [t for t in (g, s0) if t is not None]
    bundle = tb.build_bundle(lin.mlir(q, k, v, g, s0), target)
    assert bundle.grid == [2, 2, 1]  # (chunks, heads, batch): no V-block axis
    assert [s.name for s in bundle.stages][-1] == "linear_attention_states"
    (out, state), _ = interpret(bundle, q, k, v, *inputs)
    ref_out, ref_state = lin(q, k, v, g, initial_state=s0, return_state=True, backend="reference")
    torch.testing.assert_close(out, ref_out, **TOL[torch.float32])
    torch.testing.assert_close(state, ref_state, **TOL[torch.float32])


@pytest.mark.parametrize("target", ["cuda:90", "hip:gfx942"])
@pytest.mark.parametrize("decay, dk, dv, dtype", [
    ("head", 96, 80, torch.float32),      # Dk padded to 128 lanes; the second V block 16 of 64 wide
    ("token", 80, 200, torch.bfloat16),   # four V blocks, the last 8 wide
    (None, 128, 80, torch.bfloat16),
])
def test_linear_value_loop_ragged_blocks(target, decay, dk, dv, dtype):
    """The output kernel's loop over V blocks at the default config where neither head dim is a
    multiple of the blocks: the last V block's columns past Dv are neither read nor stored, and
    q's padded columns add nothing to q @ S."""
    b, h, l = 1, 2, 70
    q, k = (rand(b, h, l, dk, seed=s).to(dtype) / dk ** 0.5 for s in (1, 2))
    v = rand(b, h, l, dv, seed=3).to(dtype)
    g = {None: None, "head": -0.2 * rand(h, seed=4).abs(), "token": -0.3 * rand(b, h, l, seed=4).abs()}[decay]
    s0 = rand(b, h, dk, dv, seed=5)
    lin = ae.linear_attention(decay=decay, chunk_size=64)
    inputs = [t for t in (g, s0) if t is not None]
    bundle = tb.build_bundle(lin.mlir(q, k, v, g, s0), target)
    assert bundle.grid == [2, 2, 1]
    (out, state), _ = interpret(bundle, q, k, v, *inputs)
    wide = [t.double() for t in (q, k, v)] + [None if g is None else g.double()]
    ref_out, ref_state = lin(*wide, initial_state=s0.double(), return_state=True, backend="reference")
    for got, want in ((out, ref_out), (state, ref_state)):
        # bf16 inputs: products of rounded operands, f32 sums; 1% of the largest value.
        tol = dict(rtol=0, atol=1e-2 * want.abs().max().item()) if dtype == torch.bfloat16 else TOL[torch.float32]
        torch.testing.assert_close(got.double(), want, **tol)


@pytest.mark.parametrize("wide,dtype", [(False, torch.float32), (True, torch.float32), (True, torch.bfloat16)])
def test_linear_gla_scores_numerics(wide, dtype):
    """The split recurrence's "token_dim" scores kernel: a program per chunk (the last chunk of
    70 tokens is 6 rows), then the output kernel, all 128 V columns in one program a chunk. The
    cumulative decays take 24 of G's columns a program. A chunk whose decay stays under the span
    limit takes one product on tensor cores (chunk 1 always, chunk 0 without `wide`); with
    `wide`, rows 20-35 decay by 6 a token in five dimensions, so chunk 0 (96 nats) takes its
    blocks of 16 rows: block 1 (72 nats) computes its diagonal block in the exact 3-D form (over
    Dk = 48 in two slices of 24 key columns, each padded to 32 lanes in Triton IR) and block 2
    (24 nats) the factorized one across a strong decay."""
    b, h, l, d = 1, 2, 70, 48
    q, k = (rand(b, h, l, d, seed=s).to(dtype) for s in (1, 2))
    v = rand(b, h, l, 128, seed=3).to(dtype)
    g = -0.3 * rand(b, h, l, d, seed=4).abs()
    if wide:
        g[:, :, 20:36, :5] = -6.0
    s0 = rand(b, h, d, 128, seed=5)
    lin = ae.linear_attention(decay="token_dim", chunk_size=64)
    bundle = tb.build_bundle(lin.mlir(q, k, v, g, s0), "cuda:90")
    stages = [(s.name, s.grid) for s in bundle.stages]
    # The cumulative decays: a program per 24 columns of G, walking both chunks; the chunk
    # states in two blocks of 24 rows (2 programs of 64 rows would be too few, presets).
    assert stages == [("linear_attention_decays", [2, 2, 1]), ("linear_attention_states", [2, 2, 1]),
                      ("linear_attention_scores", [2, 2, 1])]  # (chunks, heads, batch)
    assert bundle.grid == [2, 2, 1]
    # Each kernel's own stage count (launch_defaults.linear_config).
    assert [s.num_stages for s in bundle.stages] + [bundle.num_stages] == [1, 2, 3, 3]
    (out, state), _ = interpret(bundle, q, k, v, g, s0)
    if dtype == torch.bfloat16:
        # bf16 operands, f32 accumulation: within a few roundings of the largest output.
        ref_out, ref_state = lin(q.float(), k.float(), v.float(), g, initial_state=s0, return_state=True,
                                 backend="reference")
        assert (out.float() - ref_out).abs().max() <= 2e-2 * ref_out.abs().max()
        assert (state - ref_state).abs().max() <= 2e-2 * ref_state.abs().max()
        return
    ref_out, ref_state = lin(q, k, v, g, initial_state=s0, return_state=True, backend="reference")
    # With `wide`, G reaches -96 nats, and its f32 sums carry about 5e-5 of absolute error into
    # the exponents (the exact path alone leaves 4e-5 here).
    tol = dict(atol=2e-4, rtol=1e-3) if wide else TOL[torch.float32]
    torch.testing.assert_close(out, ref_out, **tol)
    torch.testing.assert_close(state, ref_state, **tol)


def test_linear_gla_scores_in_column_passes():
    """At Dk = 96 the scores' products take Dk in two passes of 48 columns (padded to 64 lanes),
    the chunk's [64, 64] product and, past the span limit, a block's [16, 64] one; bf16 at the
    default chunk. Six loops: the chunk's passes, its store (under the limit), the loop past it
    and its blocks, a block's passes, and the loop of the block's exact diagonal."""
    b, h, l, d = 1, 2, 100, 96
    q, k, v = (rand(b, h, l, d, seed=s).bfloat16() for s in (1, 2, 3))
    g = -0.5 * rand(b, h, l, d, seed=4).abs()
    lin = ae.linear_attention(decay="token_dim")
    bundle = tb.build_bundle(lin.mlir(q, k, v, g), "cuda:90")
    scores = next(s for s in bundle.stages if s.name.endswith("_scores"))
    ttir = scores.variants["generic"].ttir
    assert ttir.count("scf.for") == 6
    assert "(tensor<64x64xbf16>, tensor<64x64xbf16>, tensor<64x64xf32>) -> tensor<64x64xf32>" in ttir
    assert "(tensor<16x64xbf16>, tensor<64x64xbf16>, tensor<16x64xf32>) -> tensor<16x64xf32>" in ttir
    (out, _), _ = interpret(bundle, q, k, v, g)
    ref = lin(q.float(), k.float(), v.float(), g, backend="reference")
    assert (out.float() - ref).abs().max() <= 1e-2 * ref.abs().max()


# --- Triton compiles the Triton IR for both GPU families on this GPU-less machine -----------------

COMPILE_CASES = {
    "causal-bf16-d64": ({"mask_mod": causal}, dict(h=2, lq=256, dk=64, dtype=torch.bfloat16)),
    "alibi-document-softcap-fp16-d80": (
        {"score_mod": lambda s, b, h, qi, ki: softcap(alibi(s, b, h, qi, ki), b, h, qi, ki), "mask_mod": document},
        dict(h=4, lq=128, dk=80, dtype=torch.float16)),
}


@pytest.mark.parametrize("name", list(COMPILE_CASES))
@pytest.mark.parametrize("target,kind,needle", [("cuda:90", "ptx", "wgmma"), ("hip:gfx942", "amdgcn", "mfma")])
def test_triton_compiles(name, target, kind, needle):
    attn_kwargs, shape = COMPILE_CASES[name]
    q, k, v = qkv(**shape)
    bundle = tb.compile_bundle(ae.attention(**attn_kwargs), q, k, v, target=target)
    for variant in bundle.variants.values():
        compiled = runtime.compile_ttir(variant.ttir, target, bundle.num_warps, bundle.num_stages)
        assert needle in compiled.asm[kind]


@pytest.mark.parametrize("decay", ["head", "token_dim"])
@pytest.mark.parametrize("target,kind,needle", [("cuda:90", "ptx", "mma"), ("hip:gfx942", "amdgcn", "mfma")])
def test_linear_kernels_compile(decay, target, kind, needle):
    """Every kernel of the split recurrence compiles for both GPU families, its products on
    matrix units (wgmma or mma.sync on Hopper, mfma on MI300), within MI300's 64 KiB of LDS."""
    q = torch.empty(1, 2, 256, 64, dtype=torch.bfloat16, device="meta")
    g = torch.empty(2) if decay == "head" else torch.empty(1, 2, 256, 64)
    bundle = tb.build_bundle(ae.linear_attention(decay=decay).mlir(q, q, q, g.to("meta")), target)
    assert [w.shape for w in bundle.workspace if w.role == "w0"] == [[1, 2, 4, 64, 64]]
    for kernel in bundle.stages + [bundle]:
        compiled = runtime.compile_ttir(kernel.variants["aligned"].ttir, target, kernel.num_warps, kernel.num_stages)
        if not kernel.name.endswith("_decays") or decay == "token_dim":  # a head decay sums nothing
            assert needle in compiled.asm[kind]
        if target.startswith("hip"):
            assert compiled.metadata.shared <= 65536


def test_ttir_structure_is_flash_attention():
    # 32 heads: 256 programs fill an H200, so the KV tiles are not split (test_decoding.py).
    q, k, v = qkv(h=32, lq=1024, dk=64, dtype=torch.bfloat16)
    # Pointer loads (the default on other targets and dtypes).
    bundle = tb.compile_bundle(ae.attention(), q, k, v, target="cuda:90", config={"tensor_descriptors": False})
    assert (bundle.block_m, bundle.block_n) == (128, 64) and not bundle.stages
    ttir = bundle.variants["aligned"].ttir
    loop = ttir.index('"scf.for"')
    q_loads = [m.start() for m in re.finditer(r'"tt.load".*-> tensor<128x64xbf16>', ttir)]
    kv_loads = [m.start() for m in re.finditer(r'"tt.load".*-> tensor<64x64xbf16>', ttir)]
    # The Q tile (128 x 64) is loaded once, before the KV loop; the K and V tiles (64 x 64) are
    # loaded in it, where each step does Q K^T and P V on tt.dot and exp2.
    assert len(q_loads) == 1 and q_loads[0] < loop
    assert len(kv_loads) == 2 and all(pos > loop for pos in kv_loads)
    assert "descriptor" not in ttir
    # By default on sm90 the same three tiles load through TMA descriptors the runtime makes on
    # the host (kernel parameters); with host_descriptors off, through descriptors each program
    # makes before the loop. No tile loads through pointers either way.
    for host in (True, False):
        config = {} if host else {"tensor_descriptors": True, "host_descriptors": False}
        tma = tb.compile_bundle(ae.attention(), q, k, v, target="cuda:90", config=config)
        assert tma.meta["config"].get("host_descriptors", False) is host
        ttir = tma.variants["aligned"].ttir
        loop = ttir.index('"scf.for"')
        loads = [m.start() for m in re.finditer(r'"tt.descriptor_load"', ttir)]
        descriptors = [m.start() for m in re.finditer(r'"tt.make_tensor_descriptor"', ttir)]
        assert len(loads) == 3 and sum(pos > loop for pos in loads) == 2
        assert len(descriptors) == (0 if host else 3) and all(pos < loop for pos in descriptors)
        assert ("!tt.tensordesc<tensor<1x1x" in ttir) is host  # a parameter over the whole [B, H, L, D]
        assert '"tt.load"' not in ttir and "descriptor" not in tma.variants["generic"].ttir
    assert ttir.count('"scf.for"') == 1
    body = ttir[loop:]
    assert body.count('"tt.dot"') >= 2 and '"math.exp2"' in body and '"tt.reduce"' in body
    assert ttir.count('"tt.store"') == 2
    assert "tt.divisibility = 16" in ttir


# --- the runtime loads without MLIR --------------------------------------------------------------


def _python(code: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def test_runtime_imports_no_mlir():
    result = _python("""
        import sys
        import ae_mlir.runtime
        heavy = sorted({m.split(".")[0] for m in sys.modules} & {"mlir", "torch", "triton"})
        print(heavy)
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_bundle_roundtrip_and_launch_contract_without_mlir(tmp_path):
    q, k, v = qkv(h=4, hkv=2, lq=70, dk=16, dtype=torch.bfloat16)
    attn = ae.attention(score_mod=alibi, mask_mod=causal)
    bundle = tb.compile_bundle(attn, q, k, v, config=SMALL)
    file_path = bundle.save(tmp_path / "b.json")
    dir_path = bundle.save(tmp_path / "b.bundle")
    assert (dir_path / "aligned.ttir").read_text() == bundle.variants["aligned"].ttir
    for path in (file_path, dir_path):
        loaded = runtime.Bundle.load(path)
        assert loaded.to_dict() == bundle.to_dict()
    # A process that cannot import mlir loads the bundle and binds arguments for a launch.
    result = _python(f"""
        import sys
        sys.modules["mlir"] = None
        import torch
        from ae_mlir import runtime
        b = runtime.Bundle.load({str(dir_path)!r})
        q = torch.zeros(1, 4, 70, 16, dtype=torch.bfloat16)
        kv = torch.zeros(1, 2, 70, 16, dtype=torch.bfloat16)
        t = runtime.bind(b, q, kv, kv, *[torch.zeros(s.shape, dtype=runtime.torch_dtype(s.dtype)) for s in b.inputs[3:]])
        v = runtime.choose_variant(b, t)
        print(len(runtime.argument_values(v, t, runtime.device_tables(b, "cpu"))) == len(v.args), sorted(t))
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[0] == "True"


# --- the bundle cache ----------------------------------------------------------------------------


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("AE_MLIR_CACHE_DIR", str(tmp_path))
    runtime.CACHE.clear_memory()
    yield tmp_path
    runtime.CACHE.clear_memory()


def _l0():
    q, k, v = qkv(h=2, lq=33, dk=16, dtype=torch.float16)
    return ae.attention(mask_mod=causal).mlir(q, k, v)


def test_cache_hit_in_memory_and_on_disk(cache_dir):
    text = _l0()
    first = tb.get_bundle(text, "cuda:90")
    files = list((cache_dir / "bundles").glob("*.json"))
    assert len(files) == 1 and files[0].stem == first.key
    assert tb.get_bundle(text, "cuda:90") is first
    runtime.CACHE.clear_memory()
    again = tb.get_bundle(text, "cuda:90")
    assert again is not first and again.to_dict() == first.to_dict()
    assert tb.get_bundle(text, "hip:gfx942").key != first.key


def test_second_process_needs_no_mlir(cache_dir):
    text = _l0()
    tb.get_bundle(text, "cuda:90")
    env = dict(os.environ, AE_MLIR_CACHE_DIR=str(cache_dir))
    result = _python(f"""
        import sys
        sys.modules["mlir"] = None
        from ae_mlir.backends import triton as tb
        b = tb.get_bundle({text!r}, "cuda:90")
        print(b.name, sorted(b.variants))
    """, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[0] == "attention"


def test_two_processes_compiling_the_same_kernel_both_succeed(cache_dir):
    # Both miss the cache, compile, and write the same entry at once; atomic renames mean each
    # ends with a whole bundle and the entry on disk is one of theirs, intact.
    text = _l0()
    env = dict(os.environ, AE_MLIR_CACHE_DIR=str(cache_dir))
    code = textwrap.dedent(f"""
        from ae_mlir.backends import triton as tb
        b = tb.get_bundle({text!r}, "cuda:90")
        print(b.name)
    """)
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _, err in outs]
    assert [out.split() for out, _ in outs] == [["attention"], ["attention"]]
    assert tb.get_bundle(text, "cuda:90").name == "attention"


@pytest.mark.parametrize("damage", ["truncate", "garbage", "edit"])
def test_corrupt_cache_entry_is_rebuilt(cache_dir, damage):
    text = _l0()
    bundle = tb.get_bundle(text, "cuda:90")
    path = runtime.CACHE.path(bundle.key)
    raw = path.read_text()
    if damage == "truncate":
        path.write_text(raw[: len(raw) // 2])
    elif damage == "garbage":
        path.write_bytes(b"\x00\xff not json")
    else:
        doc = json.loads(raw)
        doc["bundle"]["grid"][0] += 1
        path.write_text(json.dumps(doc))
    with pytest.raises(runtime.BundleError):
        runtime.Bundle.load(path)
    runtime.CACHE.clear_memory()
    rebuilt = tb.get_bundle(text, "cuda:90")
    assert rebuilt.to_dict() == bundle.to_dict()
    assert runtime.Bundle.load(path).to_dict() == bundle.to_dict()


def test_atomic_write_keeps_the_old_file_on_failure(tmp_path, monkeypatch):
    path = tmp_path / "entry.json"
    disk_cache.atomic_write(path, "old")

    def fail(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(disk_cache.os, "replace", fail)
    with pytest.raises(OSError):
        disk_cache.atomic_write(path, "new" * 1000)
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["entry.json"]


# --- on a GPU ------------------------------------------------------------------------------------
# These run through `ae.attention(...)(q, k, v)` and the runtime. Where the MLIR bindings are
# missing (a GPU machine with only torch and triton), warm the bundle cache elsewhere first:
#     AE_MLIR_CACHE_DIR=DIR python test/test_triton_backend.py --warm-cache
# and run with the same AE_MLIR_CACHE_DIR; the references here are plain float32 torch.

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm GPU")
GPU_TARGET = "cuda:90"


def _gpu_mods(device):
    slopes = SLOPES.to(device)
    doc = DOC.to(device)

    def score(s, b, h, qi, ki):
        return 20.0 * torch.tanh((s + slopes[h] * (ki - qi)) / 20.0)

    def mask(b, h, qi, ki):
        return (doc[qi] == doc[ki]) & (ki < qi)

    return score, mask


def _gpu_cases(device):
    """(name, attention, q, k, v) of every GPU test, on `device` (any device builds the same L0)."""
    cases = []
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for is_causal in (False, True):
            q, k, v = (t.to(device) for t in qkv(b=2, h=4, lq=1000, dk=128, dtype=dtype))
            cases.append((f"sdpa-{dtype}-{is_causal}", ae.attention(mask_mod=causal if is_causal else None), q, k, v))
    score, mask = _gpu_mods(device)
    q = rand(1, 128, 4, 80, seed=7, dtype=torch.bfloat16).to(device).transpose(1, 2)
    k = rand(1, 2, 80, 128, seed=8, dtype=torch.bfloat16).to(device).transpose(2, 3)
    v = rand(1, 2, 128, 80, seed=9, dtype=torch.bfloat16).to(device)
    cases.append(("mods", ae.attention(score_mod=score, mask_mod=mask), q, k, v))
    return cases


def float32_attention(q, k, v, score_mod=None, mask_mod=None):
    """Materialized float32 attention with the mods applied on broadcast index grids."""
    b, h, lq, dk = q.shape
    group = h // k.shape[1]
    k, v = (t.float().repeat_interleave(group, dim=1) for t in (k, v))
    s = q.float() @ k.transpose(-1, -2) / dk ** 0.5
    bi = torch.arange(b, device=q.device).view(b, 1, 1, 1)
    hi = torch.arange(h, device=q.device).view(1, h, 1, 1)
    qi = torch.arange(lq, device=q.device).view(1, 1, lq, 1)
    ki = torch.arange(k.shape[2], device=q.device).view(1, 1, 1, -1)
    if score_mod is not None:
        s = score_mod(s, bi, hi, qi, ki)
    if mask_mod is not None:
        s = s.masked_fill(~mask_mod(bi, hi, qi, ki).expand_as(s), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    return torch.softmax(s, dim=-1).nan_to_num(0.0) @ v, lse


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("index", range(6))
def test_gpu_matches_sdpa(index):
    name, attn, q, k, v = _gpu_cases("cuda")[index]
    out = attn(q, k, v)
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=name.endswith("True"))
    torch.testing.assert_close(out.float(), ref, **TOL[q.dtype])


@pytest.mark.gpu
@gpu
def test_gpu_mods_strides_and_lse():
    name, attn, q, k, v = _gpu_cases("cuda")[-1]
    out, lse = attn(q, k, v, return_lse=True)
    score, mask = _gpu_mods("cuda")
    ref_out, ref_lse = float32_attention(q, k, v, score, mask)
    torch.testing.assert_close(out.float(), ref_out, **TOL[torch.bfloat16])
    torch.testing.assert_close(lse, ref_lse, atol=1e-3, rtol=1e-3)
    assert torch.isneginf(lse[:, :, 0]).all() and (out[:, :, 0] == 0).all()


@pytest.mark.gpu
@gpu
def test_gpu_aot_bundle_launch(tmp_path):
    pytest.importorskip("mlir", reason="compile_bundle needs the MLIR bindings")
    q, k, v = (t.cuda() for t in qkv(h=2, lq=256, dk=64, dtype=torch.float16))
    attn = ae.attention(mask_mod=causal)
    bundle = tb.compile_bundle(attn, (q.shape, q.dtype), (k.shape, k.dtype), (v.shape, v.dtype),
                               target=runtime.current_target())
    loaded = runtime.Bundle.load(bundle.save(tmp_path / "b.json"))
    out, lse = runtime.launch(loaded, q, k, v)
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    torch.testing.assert_close(out.float(), ref, **TOL[torch.float16])


def warm_cache(target: str = GPU_TARGET) -> None:
    """Build the bundles of the GPU tests into the bundle cache ($AE_MLIR_CACHE_DIR)."""
    for name, attn, q, k, v in _gpu_cases("cpu"):
        bundle = tb.get_bundle(attn.mlir(q, k, v), target)
        print(f"{name}: {runtime.CACHE.path(bundle.key)}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--warm-cache"]:
        sys.exit("usage: AE_MLIR_CACHE_DIR=DIR python test/test_triton_backend.py --warm-cache")
    warm_cache()


def test_closure_reading_mask_is_classified_at_call_time():
    # Three documents of 40, 50 and 38 tokens: a query block visits only the KV tiles that share
    # a document with one of its rows; tiles where every pair shares one need no mask.
    q, k, v = qkv(lq=128, dk=16)
    attn = ae.attention(mask_mod=document)
    bundle = tb.compile_bundle(attn, q, k, v, config=SMALL)
    assert runtime.MASK_PROGRAM in bundle.meta
    tables = runtime.call_time_tables(bundle, q, k, v, *captures_of(attn, q, k, v))
    partial_count, partial_index, full_count, full_index = tables
    bm, bn = SMALL["block_m"], SMALL["block_n"]
    for m in range(128 // bm):
        rows = DOC[m * bm:(m + 1) * bm]
        want_full, want_partial = [], []
        for n in range(128 // bn):
            same = rows[:, None] == DOC[n * bn:(n + 1) * bn][None, :]
            if bool(same.all()):
                want_full.append(n)
            elif bool(same.any()):
                want_partial.append(n)
        assert full_index[m, : int(full_count[m])].tolist() == want_full
        assert partial_index[m, : int(partial_count[m])].tolist() == want_partial
    assert int((partial_count + full_count).sum()) < (128 // bm) * (128 // bn)
    check(attn, q, k, v)


def test_one_attention_called_from_two_lines_is_one_bundle():
    # The L0 text carries the caller's source line; the cache key must not, or every call site
    # of the same attention would compile its own bundle.
    attn = ae.attention(mask_mod=lambda b, h, i, j: i >= j)
    q = torch.empty(1, 2, 64, 32, device="meta")
    first, _ = attn._build(q, q, q)
    second, _ = attn._build(q, q, q)
    assert first != second
    assert tb._key(first, "cuda:90", None, "ieee") == tb._key(second, "cuda:90", None, "ieee")


def test_scratch_allocator_is_set_only_where_none_is():
    """Kernels that make TMA descriptors need Triton's global scratch allocator in the launching
    thread's context (autograd's backward runs on threads of its own); the runtime sets one
    backed by torch where none is set and leaves a caller's own alone."""
    import contextvars
    import threading

    from triton.runtime import _allocation

    def in_fresh_thread(before):
        seen = []

        def body():
            if before is not None:
                _allocation._allocator.set(before)
            triton_kernels._ensure_scratch_allocator()
            seen.append(_allocation._allocator.get())

        thread = threading.Thread(target=contextvars.Context().run, args=(body,))
        thread.start()
        thread.join()
        return seen[0]

    assert in_fresh_thread(None) is triton_kernels._scratch

    def own(size, alignment, stream):
        return torch.empty(size, dtype=torch.int8)

    assert in_fresh_thread(own) is own
