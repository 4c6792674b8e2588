"""The Triton backend: L0 -> Triton IR numerics (NumPy TTIR interpreter vs the float64 reference),
triton.compile for cuda:90 and hip:gfx942 on this GPU-less machine; launches on a real GPU are in
test_triton_gpu.py, linear attention's kernels in test_triton_linear.py, the runtime's import
discipline and the bundle cache in test_triton_bundles.py.

Kernels are built exactly as the backend builds them (`compile_bundle`), with block sizes small
enough that every case spans several query blocks and KV tiles, and run with the arguments the
runtime would pass (`runtime.bind` / `argument_values`), so the interpreter checks the whole
launch contract, not just the kernel body.
"""
from __future__ import annotations

import os
import re

import pytest
import torch

import ae_mlir as ae
from ae_mlir import launch_defaults, runtime, triton_kernels
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
    # The Triton IR kernels: attn-lower-to-gluon's (the cuda:90 default of plain and causal
    # attention at D = 128) runs on a GPU only (test_lower_to_gluon.py).
    config = dict(config or {})
    config.setdefault("warp_specialize", False)
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
    causal_bundle = tb.compile_bundle(ae.attention(mask_mod=causal), *qkv(**CASES["plain-bf16-L2100-D128"][1]),
                                      config={"warp_specialize": False})
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


def test_broadcast_keys_take_the_general_variant():
    """K and V expanded over the heads (stride 0) match the reference through the general
    variant: the aligned one's descriptors take no zero stride."""
    q = rand(1, 2, 40, 64, seed=7)
    k, v = (rand(1, 1, 40, 64, seed=s).expand(1, 2, 40, 64) for s in (8, 9))
    bundle = tb.compile_bundle(ae.attention(mask_mod=causal), q, k, v, config=SMALL)
    assert not runtime.aligned_ok(bundle, runtime.bind(bundle, q, k, v))
    check(ae.attention(mask_mod=causal), q, k, v, expect_variant="generic")


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


def test_ttir_structure_is_flash_attention():
    # 32 heads: 256 programs fill an H200, so the KV tiles are not split (test_decoding.py).
    q, k, v = qkv(h=32, lq=1024, dk=64, dtype=torch.bfloat16)
    # Pointer loads (the default on other targets and dtypes).
    # The Triton IR kernel (attn-lower-to-gluon's is the default here on sm90).
    bundle = tb.compile_bundle(ae.attention(), q, k, v, target="cuda:90",
                               config={"tensor_descriptors": False, "warp_specialize": False})
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
        config = {"warp_specialize": False} if host else {"tensor_descriptors": True, "host_descriptors": False,
                                                          "warp_specialize": False}
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
