"""attn-lower-to-gluon: which L0 modules it lowers (and the located errors for the rest), where
the triton preset takes it, the bundle it makes (a Triton GPU IR aligned variant beside the
Triton IR general one), its Triton GPU IR compiled for sm90 here, and, on a GPU, its outputs and
logsumexp against float64."""
from __future__ import annotations

import re

import pytest
import torch

import ae_mlir as ae
from ae_mlir import launch_defaults, presets, runtime
from ae_mlir.backends import triton as tb
from ae_mlir.core.context import CompileError, new_context, parse_module
from ae_mlir.passes import create_pass
from ae_mlir.passes.lower_to_gluon import kernel_labels

from ptxas_report import ptxas_spill_bytes


def causal(b, h, i, j):
    return i >= j


def window(b, h, i, j):
    return (i >= j) & (i - j < 64)


def _meta(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device="meta")


def _l0(attn, b=2, h=4, hkv=None, lq=256, lk=None, dk=128, dv=None, dtype=torch.bfloat16) -> str:
    hkv, lk, dv = hkv or h, lk or lq, dv or dk
    return attn.mlir(_meta(b, h, lq, dk, dtype=dtype), _meta(b, hkv, lk, dk, dtype=dtype),
                     _meta(b, hkv, lk, dv, dtype=dtype))


def _lower(text: str, **options):
    module = parse_module(text, new_context(), "l0.mlir")
    create_pass("attn-lower-to-gluon", options).apply(module.operation)
    return module


@pytest.mark.parametrize("case, kwargs, message", [
    ("score_mod", dict(attn=ae.attention(score_mod=lambda s, b, h, i, j: s * 0.5)), "'attn.score_mod' op is not lowered"),
    ("window", dict(attn=ae.attention(mask_mod=window)), "'attn.mask' op is not the causal mask"),
    ("sigmoid", dict(attn=ae.attention(normalize="sigmoid")), "is a sigmoid normalizer"),
    ("f32", dict(attn=ae.attention(), dtype=torch.float32), "has f32 inputs"),
    ("d80", dict(attn=ae.attention(), dk=80), "has head dims 80 (q, k) and 80 (v)"),
    ("dv64", dict(attn=ae.attention(), dv=64), "has head dims 128 (q, k) and 64 (v)"),
    ("causal_lq_lk", dict(attn=ae.attention(mask_mod=causal), lq=128, lk=256), "is causal with 128 queries and 256"),
])
def test_rejects_what_it_does_not_lower_with_a_location(case, kwargs, message):
    text = _l0(**kwargs)
    with pytest.raises(CompileError) as err:
        _lower(text)
    assert message in str(err.value)
    assert re.search(r":\d+:\d+: error:", str(err.value)), str(err.value)


def test_grids_are_one_axis_so_batch_times_heads_has_no_axis_limit():
    """4097 x 16 batch entries x heads: more than a grid's y axis takes (65535), on one axis in
    each kernel."""
    text = _l0(ae.attention(mask_mod=causal), b=4097, h=16, hkv=8, lq=32)
    # The modules stay bound while their operations are read (a freed module's ops dangle).
    forward_module, backward_module = _lower(text), _lower(text, backward=True)
    forward = [op.operation for op in forward_module.body.operations]
    dq, dkdv = [op.operation for op in backward_module.body.operations]
    assert [[int(x) for x in op.attributes["attn.grid"]] for op in forward + [dq, dkdv]] == [
        [4097 * 16, 1, 1], [4097 * 16, 1, 1], [4097 * 8, 1, 1]]


@pytest.mark.parametrize("mask", [None, causal], ids=["full", "causal"])
def test_stub_records_the_kernel(mask):
    module = _lower(_l0(ae.attention(mask_mod=mask), b=2, h=8, hkv=2, lq=300))
    (stub,) = [op.operation for op in module.body.operations]
    assert stub.name == "tt.func"
    ttgir = stub.attributes["attn.ttgir"].value
    assert "ttg.warp_specialize" in ttgir and "ttng.warp_group_dot" in ttgir
    assert [int(x) for x in stub.attributes["attn.grid"]] == [3 * 16, 1, 1]
    # One label per parameter of the Triton GPU IR kernel, in its order.
    params = re.search(r"tt\.func public @\w+\((.*?)\) attributes", ttgir, re.S).group(1)
    assert len(re.findall(r"%\w+: ", params)) == len(kernel_labels())
    assert ttgir.count("!tt.tensordesc<tensor<1x1x") >= 3


def test_divisibility_hints_are_what_the_aligned_variant_checks():
    """out's pointer and strides and lse's pointer are 16-element aligned on the aligned variant's
    layouts (kernel_args.aligned_ok), so O's stores are vectors; lse's row strides are not
    checked (L = 1000 gives 1000) and get no hint."""
    module = _lower(_l0(ae.attention(), lq=1000))
    ttgir = module.body.operations[0].operation.attributes["attn.ttgir"].value
    params = re.search(r"tt\.func public @\w+\((.*?)\) attributes", ttgir, re.S).group(1)
    hinted = {m.group(1) for m in re.finditer(r"%(\w+): [^ ]+ \{tt\.divisibility = 16", params)}
    assert hinted == {"o_ptr", "o_stride0", "o_stride1", "o_stride2", "lse_ptr"}


def _options(text: str, target: str = "cuda:90", **overrides):
    module = parse_module(text, new_context(), "l0.mlir")
    return presets.options_for("triton", presets.read_problem(module), target, **overrides)


@pytest.mark.parametrize("attn, kwargs, target, expected", [
    (ae.attention(), {}, "cuda:90", True),
    (ae.attention(mask_mod=causal), dict(h=8, hkv=2, dtype=torch.float16), "cuda:90", True),
    (ae.attention(), dict(dk=64), "cuda:90", True),
    (ae.attention(mask_mod=causal), dict(dk=64), "cuda:90", False),       # slower than Triton IR there
    (ae.attention(mask_mod=causal), {}, "cuda:100", False),              # no wgmma
    (ae.attention(mask_mod=causal), {}, "hip:gfx942", False),
    (ae.attention(mask_mod=window), {}, "cuda:90", False),
    (ae.attention(), dict(lq=8, lk=4096), "cuda:90", False),              # decoding splits KV
])
def test_the_triton_preset_takes_it_where_it_lowers_and_is_faster(attn, kwargs, target, expected):
    assert _options(_l0(attn, **kwargs), target).warp_specialize is expected


@pytest.mark.parametrize("mask, length", [(None, 8192), (None, 2048), (causal, 2048)])
def test_the_forward_kernel_takes_a_persistent_grid_by_default(mask, length):
    options = _options(_l0(ae.attention(mask_mod=mask), b=1, h=2, lq=length))
    assert options.warp_specialize and options.persistent and not options.pingpong
    assert "pingpong=false backward=false programs=132" in presets.pipeline_text("triton", options)


@pytest.mark.parametrize("b, h, length, programs", [(1, 16, 8192, 0), (2, 4, 4096, 0), (8, 16, 2048, 132)])
def test_the_causal_grid_is_persistent_where_its_programs_load_evenly(b, h, length, programs):
    """Over few heads the persistent programs' fixed causal items load them unequally
    (launch_defaults.gluon_schedule): a program per query block, longest first across sections
    of heads filling the 132 multiprocessors."""
    options = _options(_l0(ae.attention(mask_mod=causal), b=b, h=h, lq=length))
    assert options.warp_specialize and options.persistent is bool(programs)
    assert f"programs={programs} wave-programs=132" in presets.pipeline_text("triton", options)
    assert options.launch_config()["persistent"] is bool(programs)


@pytest.mark.parametrize("dk, options, message", [
    (64, dict(pingpong=True), "asks for ping-pong with 3 consumer warpgroups \\(head dim 64\\)"),
    (128, dict(backward=True, programs=132), "asks for the backward with ping-pong, persistent programs or "
                                             "consumer warpgroups"),
    (128, dict(backward=True, warpgroups=2), "asks for the backward with ping-pong, persistent programs or "
                                             "consumer warpgroups"),
    (128, dict(warpgroups=3), "asks for 3 consumer warpgroups at head dim 128; the kernel takes 2 there"),
    (64, dict(warpgroups=4), "asks for 4 consumer warpgroups at head dim 64; the kernel takes 2 or 3 there"),
])
def test_schedules_the_kernel_does_not_take_are_located_errors(dk, options, message):
    with pytest.raises(CompileError, match=message) as err:
        _lower(_l0(ae.attention(mask_mod=causal), dk=dk), **options)
    assert re.search(r":\d+:\d+: error:", str(err.value))


def test_persistent_grid_is_the_preset_wave_and_needs_warp_specialization():
    text = _l0(ae.attention(mask_mod=causal), b=8, h=16, lq=2048)
    options = _options(text, persistent=True)
    assert "programs=132" in presets.pipeline_text("triton", options)
    assert options.launch_config()["persistent"] is True
    assert "programs=0" in presets.pipeline_text("triton", _options(text, persistent=False))
    with pytest.raises(CompileError, match="'persistent' is an option of attn-lower-to-gluon's kernel"):
        _options(text, persistent=True, warp_specialize=False)
    # The default schedule goes with the kernel when an override turns it off.
    assert _options(text, warp_specialize=False).persistent is False


def test_two_consumer_warpgroups_at_head_dim_64_through_the_preset():
    """`warpgroups=2` (128-row programs at D = 64, which ping-pong then takes) reaches the pass, the
    bundle's config and the causal grid's schedule (blocks of 128 rows); it needs the Gluon kernel."""
    text = _l0(ae.attention(mask_mod=causal), b=8, h=16, lq=2048, dk=64)
    options = _options(text, warp_specialize=True, warpgroups=2, pingpong=True, persistent=False)
    assert "pingpong=true backward=false programs=0 wave-programs=132 warpgroups=2" in presets.pipeline_text(
        "triton", options)
    assert options.launch_config()["warpgroups"] == 2
    assert "warpgroups" not in _options(text, warp_specialize=True).launch_config()
    with pytest.raises(CompileError, match="'warpgroups' is an option of attn-lower-to-gluon's kernel"):
        _options(text, warp_specialize=False, warpgroups=2)
    # The causal grid's choice models the programs' rows: 128 with two warpgroups, as at D = 128;
    # three warpgroups take a program per block (gluon_schedule).
    for bh, length in [(16, 2048), (32, 2048), (64, 8192)]:
        two = launch_defaults.gluon_schedule(132, True, length, 64, bh, warpgroups=2)
        assert two == launch_defaults.gluon_schedule(132, True, length, 128, bh)
        assert not launch_defaults.gluon_schedule(132, True, length, 64, bh)["persistent"]
    assert launch_defaults.gluon_schedule(132, True, 2048, 64, 32, warpgroups=2)["persistent"]
    causal64 = _l0(ae.attention(mask_mod=causal), b=1, h=16, lq=2048, dk=64)
    assert not _options(causal64, warp_specialize=True).persistent
    assert not _options(causal64, warp_specialize=True, warpgroups=2).persistent
    q = _meta(1, 2, 1000, 64)
    bundle = tb.compile_bundle(ae.attention(mask_mod=causal), q, q, q,
                               config={"warp_specialize": True, "warpgroups": 2, "persistent": False})
    aligned = bundle.variants["aligned"]
    assert (aligned.grid, aligned.max_registers) == ([2 * 8, 1, 1], 168)


def test_forcing_it_off_a_sm90_target_is_an_error():
    with pytest.raises(CompileError, match="needs the NVIDIA sm90 target"):
        _options(_l0(ae.attention()), "hip:gfx942", warp_specialize=True)
    assert _options(_l0(ae.attention()), warp_specialize=False).warp_specialize is False


def test_bundle_has_a_gluon_aligned_variant_and_a_triton_ir_general_one():
    attn = ae.attention(mask_mod=causal)
    q, kv = _meta(2, 8, 1000, 128), _meta(2, 2, 1000, 128)
    bundle = tb.compile_bundle(attn, q, kv, kv)
    aligned, generic = bundle.variants["aligned"], bundle.variants["generic"]
    assert (aligned.ir, aligned.grid, aligned.max_registers) == ("ttgir", [8 * 16, 1, 1], 168)
    assert aligned.args == kernel_labels() and generic.ir == "ttir" and generic.grid is None
    assert bundle.meta["config"]["warp_specialize"] is True
    assert runtime.Bundle.from_json(bundle.to_json()).variants["aligned"] == aligned
    off = tb.compile_bundle(attn, q, kv, kv, config={"warp_specialize": False})
    assert off.variants["aligned"].ir == "ttir" and "warp_specialize" not in off.meta["config"]


# ptxas's spill bytes of the default build (a persistent grid): the full D = 128 kernel spills 92
# bytes, in the SASS a consumer's loop invariants (64-bit addresses and strides) stored before its
# first work item and reloaded once per item, not in the KV loop; it ran ahead of the spill-free
# grid of one program per query block on an H100 (553 / 605 TFLOP/s against 537 / 592,
# launch_defaults.warp_specialized). The bound keeps it from growing unseen.
@pytest.mark.parametrize("dim, warps, registers, mask, spill", [(128, 12, 168, None, 96), (128, 12, 168, causal, 0),
                                                                (64, 16, 128, None, 0), (64, 16, 128, causal, 0)])
def test_triton_gpu_ir_compiles_for_sm90_with_descriptor_metadata(dim, warps, registers, mask, spill):
    """The runtime's compile of the aligned variant: wgmma in the PTX, no spills at the register
    cap with a program per query block and at most `spill` bytes on the default persistent grid,
    the whole register file at most (the loader warp is padded to a warpgroup: 3 warpgroups at
    D 128, 4 at D 64, where three consume), and the descriptors' swizzle read back for Triton's
    launcher (a Triton GPU IR source skips the stage that records it)."""
    q = _meta(1, 2, 512, dim)
    bundle = tb.compile_bundle(ae.attention(mask_mod=mask), q, q, q)
    variant = bundle.variants["aligned"]
    if dim == 64:  # causal, and full attention whose 192-row programs fill less of the wave (2 x 3 of 132)
        assert variant.ir == "ttir"
        bundle = tb.compile_bundle(ae.attention(mask_mod=mask), q, q, q, config={"warp_specialize": True})
        variant = bundle.variants["aligned"]
    compiled = runtime.compile_variant(variant, "cuda:90", bundle.num_warps, bundle.num_stages)
    assert "wgmma.mma_async" in compiled.asm["ptx"] and f".maxnreg {registers}" in compiled.asm["ptx"]
    assert compiled.metadata.num_warps == warps and registers * warps * 32 <= 65536
    assert ptxas_spill_bytes(compiled.asm["ptx"]) <= spill
    one_item = tb.compile_bundle(ae.attention(mask_mod=mask), q, q, q,
                                 config={"warp_specialize": True, "persistent": False}).variants["aligned"]
    assert ptxas_spill_bytes(runtime.compile_variant(one_item, "cuda:90", bundle.num_warps,
                                                     bundle.num_stages).asm["ptx"]) == 0
    # TMA boxes of 128-byte rows (64 bf16 columns, the swizzle's span): the copies of q's 64 rows
    # and of K's and V's 128.
    assert [m["block_size"] for m in compiled.metadata.tensordesc_meta] == [[1, 1, 64, 64], [1, 1, 128, 64],
                                                                            [1, 1, 128, 64]]
    assert all(m["swizzle"] == 3 for m in compiled.metadata.tensordesc_meta)
    # The launcher takes one descriptor object for each descriptor and its sizes and strides.
    assert list(compiled.src.signature.values())[:3] == [f"tensordesc<bf16[1, 1, 64, {dim}]>",
                                                          f"tensordesc<bf16[1, 1, 128, {dim}]>",
                                                          f"tensordesc<bf16[1, 1, 128, {dim}]>"]


@pytest.mark.gpu
@pytest.mark.parametrize("b, h, hkv, lq, lk, mask, dtype, layout", [
    (2, 4, 4, 1000, 1000, causal, torch.bfloat16, "bhld"),
    (2, 8, 2, 777, 777, None, torch.float16, "blhd"),
    (1, 2, 2, 300, 1000, None, torch.bfloat16, "bhld"),
    (1, 2, 2, 64, 64, causal, torch.bfloat16, "bhld"),
])
def test_on_the_gpu_matches_float64(b, h, hkv, lq, lk, mask, dtype, layout):
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm90 GPU")
    torch.manual_seed(lq)

    def make(heads, length):
        if layout == "blhd":
            return torch.randn(b, length, heads, 128, device="cuda", dtype=dtype).transpose(1, 2)
        return torch.randn(b, heads, length, 128, device="cuda", dtype=dtype)

    q, k, v = make(h, lq), make(hkv, lk), make(hkv, lk)
    attn = ae.attention(mask_mod=mask)
    bundle = tb.compile_bundle(attn, q, k, v)
    assert runtime.choose_variant(bundle, runtime.bind(bundle, q, k, v)).ir == "ttgir"
    out, lse = runtime.launch(bundle, q, k, v)
    want, want_lse = attn(q.double(), k.double(), v.double(), backend="reference", return_lse=True)
    torch.testing.assert_close(out.double(), want, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse.double(), want_lse, atol=1e-4, rtol=1e-4)
