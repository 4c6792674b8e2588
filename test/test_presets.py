"""The named pipelines have one owner (ae_mlir.presets): `ae-opt --pipeline=NAME` prints exactly
what the backends compile. For each L0 module, the Triton IR of `ae-opt --pipeline=triton
--emit=ttir` is the bundle's (aligned variant, every kernel in launch order), and the llvm dialect
of `ae-opt --pipeline=cpu` is what the CPU backend hands to the JIT."""
from __future__ import annotations

import dataclasses
import re
import subprocess
import sys

import pytest
import torch

import ae_mlir as ae
from ae_mlir import launch_defaults, linear_defaults, presets, runtime
from ae_mlir.backends import cpu
from ae_mlir.backends import triton as tb
from ae_mlir.core.context import CompileError, new_context, parse_module

DOC = torch.tensor([0] * 40 + [1] * 50 + [2] * 38)


def _meta(*shape, dtype=torch.float32):
    return torch.empty(*shape, dtype=dtype, device="meta")


def _softmax(attn, b=1, h=2, hkv=None, lq=128, lk=None, dk=16, dv=None, dtype=torch.float32):
    hkv, lk, dv = hkv or h, lk or lq, dv or dk
    return attn.mlir(_meta(b, h, lq, dk, dtype=dtype), _meta(b, hkv, lk, dk, dtype=dtype),
                     _meta(b, hkv, lk, dv, dtype=dtype))


def _linear(decay, l=96, d=16, dtype=torch.float32):
    q = _meta(1, 2, l, d, dtype=dtype)
    g = {"head": (2,), "token_dim": (1, 2, l, d)}[decay]
    return ae.linear_attention(decay=decay, chunk_size=32).mlir(q, q, q, _meta(*g))


def _modules() -> dict:
    return {
        "plain-f32": _softmax(ae.attention(), lq=37),
        "causal-bf16": _softmax(ae.attention(mask_mod=lambda b, h, q, k: q >= k), dk=64, dtype=torch.bfloat16),
        # attn-lower-to-gluon's Triton GPU IR (the aligned variant on cuda:90).
        "causal-bf16-d128": _softmax(ae.attention(mask_mod=lambda b, h, q, k: q >= k), dk=128, dtype=torch.bfloat16),
        "document-bf16": _softmax(ae.attention(mask_mod=lambda b, h, q, k: DOC[q] == DOC[k]),
                                  dtype=torch.bfloat16),
        "gqa-f32": _softmax(ae.attention(), h=4, hkv=2, lq=50, lk=70),
        "dk64-dv16-f32": _softmax(ae.attention(mask_mod=lambda b, h, q, k: q >= k), lq=40, dk=64, dv=16),
        "linear-head-f32": _linear("head"),
        "linear-token-dim-bf16": _linear("token_dim", dtype=torch.bfloat16),
    }


MODULES = _modules()
DOC_LONG = torch.arange(1000) // 300


def ae_opt(path, *args: str) -> str:
    result = subprocess.run([sys.executable, "-m", "ae_mlir.cli", str(path), *args],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    return result.stdout


def _write(tmp_path, text: str):
    path = tmp_path / "l0.mlir"
    path.write_text(text)
    return path


@pytest.mark.parametrize("name", list(MODULES))
def test_triton_cli_prints_the_bundles_triton_ir(name, tmp_path):
    bundle = tb.build_bundle(MODULES[name], "cuda:90")
    expected = "// -----\n".join(k.variants["aligned"].ttir for k in bundle.stages + [bundle])
    got = ae_opt(_write(tmp_path, MODULES[name]), "--pipeline=triton", "--emit=ttir", "--target=cuda:90")
    assert got.rstrip("\n") == expected.rstrip("\n")


@pytest.mark.parametrize("reduce_dq", [False, True])
def test_triton_cli_prints_the_gluon_backward_the_bundle_runs(tmp_path, reduce_dq):
    """With warp-specialize on, the backward's aligned variants are attn-lower-to-gluon's Triton
    GPU IR kernels, and `ae-opt` prints them: with reduce-dq the three the aligned variants
    launch (the conversion after the bundle's own kernel)."""
    text = MODULES["causal-bf16-d128"]
    bundle = tb.build_backward_bundle(text, "cuda:90", {"warp_specialize": True, "reduce_dq": reduce_dq})
    expected = "// -----\n".join(k.variants["aligned"].ttir for k in runtime.kernels(bundle, True))
    got = ae_opt(_write(tmp_path, text), f"--pipeline=triton{{backward=true warp-specialize=true "
                                         f"reduce-dq={str(reduce_dq).lower()}}}", "--emit=ttir")
    assert got.rstrip("\n") == expected.rstrip("\n")
    assert expected.count("ttg.warp_specialize") == (1 if reduce_dq else 2)
    assert ("ttng.async_tma_reduce add" in expected) == reduce_dq


@pytest.mark.parametrize("config, message", [
    ({"reduce_dq": True}, "preset option 'reduce-dq' is a form of attn-lower-to-gluon's backward; it needs 'backward' "
                          "and 'warp-specialize'"),
    ({"reduce_dq": True, "backward": True, "warp_specialize": False}, "it needs 'backward' and 'warp-specialize'"),
])
def test_reduce_dq_needs_the_gluon_backward(config, message):
    problem = presets.read_problem(parse_module(MODULES["causal-bf16-d128"], new_context(), "l0.mlir"))
    with pytest.raises(CompileError, match=re.escape(message)):
        presets.options_for("triton", problem, "cuda:90", **config)


@pytest.mark.parametrize("name", list(MODULES))
def test_cpu_cli_prints_what_the_cpu_backend_compiles(name, tmp_path):
    got = ae_opt(_write(tmp_path, MODULES[name]), "--pipeline=cpu")
    assert got.rstrip("\n") == cpu.lowered_text(MODULES[name]).rstrip("\n")


def test_ptx_uses_the_launch_options_of_the_bundle(tmp_path):
    """bf16 at D = 128: 128x64 tiles on 8 warps (256 threads) on cuda:90, 4 warps on gfx942."""
    text = _softmax(ae.attention(), lq=256, dk=128, dtype=torch.bfloat16)
    path = _write(tmp_path, text)
    assert tb.build_bundle(text, "cuda:90", {"warp_specialize": False}).num_warps == 8
    assert ".reqntid 256" in ae_opt(path, "--pipeline=triton{warp-specialize=false}", "--emit=ptx")
    # attn-lower-to-gluon's kernel states its own: two consumer warpgroups and a loader warp (9
    # warps, rounded up to whole warpgroups).
    assert ".reqntid 384" in ae_opt(path, "--pipeline=triton", "--emit=ptx")


def test_backward_kernels_launch_with_their_own_options(tmp_path):
    """bf16 at D = 128: the dQ kernel on 8 warps over 128x64 tiles, the dK/dV kernel on 8 warps
    over 64 query rows and 128 keys; given its own warps, the dK/dV kernel launches with them
    while the dQ kernel keeps the preset's; the bundle, the PTX and the dump agree. (The Triton
    IR kernels: at D = 128 on sm90 the Gluon backward is the default, test_gluon_backward.py.)"""
    text = _softmax(ae.attention(mask_mod=lambda b, h, i, j: i >= j), b=8, h=16, lq=2048, dk=128, dtype=torch.bfloat16)
    path = _write(tmp_path, text)
    bundle = tb.build_backward_bundle(text, "cuda:90", {"warp_specialize": False})
    assert (bundle.stages[0].num_warps, bundle.stages[0].num_stages) == (8, 3)
    assert (bundle.num_warps, bundle.num_stages) == (8, 3)
    config = bundle.meta["config"]
    assert (config["block_m"], config["block_n"], config["dkdv_block_m"], config["dkdv_block_n"]) == (128, 64, 64, 128)
    bundle = tb.build_backward_bundle(text, "cuda:90", {"dkdv_num_warps": 4, "warp_specialize": False})
    assert (bundle.stages[0].num_warps, bundle.num_warps) == (8, 4)
    pipeline = "--pipeline=triton{backward=true warp-specialize=false dkdv-num-warps=4}"
    ptx = ae_opt(path, pipeline, "--emit=ptx").split(".entry")
    assert [".reqntid 256" in p for p in ptx[1:]] == [True, False]
    assert [".reqntid 128" in p for p in ptx[1:]] == [False, True]
    result = subprocess.run([sys.executable, "-m", "ae_mlir.cli", str(path), pipeline, "--dump-pass-pipeline"],
                            capture_output=True, text=True, timeout=600)
    assert result.stderr.splitlines()[1] == "// launch: num-warps=8 num-stages=3 dkdv-num-warps=4 dkdv-num-stages=3"
    # A short sequence's smaller dK/dV tiles take 4 warps.
    short = launch_defaults.backward_config(32, 32, 128, 128, "bf16", "cuda:90")
    assert (short["dkdv_block_m"], short["dkdv_block_n"], short["dkdv_num_warps"]) == (32, 32, 4)
    # Fewer dK/dV programs than 1024 at 64x128 (GQA 16:4 at B 8, L 2048: 512) take 32x64 tiles.
    gqa = _softmax(ae.attention(mask_mod=lambda b, h, i, j: i >= j), b=8, h=16, hkv=4, lq=2048, dk=128,
                   dtype=torch.bfloat16)
    config = tb.build_backward_bundle(gqa, "cuda:90").meta["config"]
    assert (config["dkdv_block_m"], config["dkdv_block_n"], config["dkdv_num_warps"]) == (32, 64, 4)
    assert (config["block_m"], config["block_n"], config["num_warps"]) == (128, 64, 8)
    # An override of a shared option sets both kernels' unless the dK/dV kernel's own is given.
    problem = presets.read_problem(parse_module(text, new_context()))

    def dkdv(**overrides):
        o = presets.options_for("triton", problem, "cuda:90", backward="true", **overrides)
        return (o.dkdv_block_m or o.block_m, o.dkdv_block_n or o.block_n, *o.kernel_launch("f_bwd_dkdv"))

    assert dkdv() == (64, 128, 8, 3)
    assert dkdv(block_m="32", block_n="32", num_warps="8") == (32, 32, 8, 3)
    assert dkdv(dkdv_block_n="64") == (64, 64, 4, 3)
    assert dkdv(block_m="32", dkdv_block_m="16") == (16, 128, 4, 3)


def test_dump_pass_pipeline_prints_the_presets_text(tmp_path):
    text = MODULES["causal-bf16"]
    options = presets.options_for("triton", presets.read_problem(parse_module(text, new_context())), "cuda:90")
    result = subprocess.run([sys.executable, "-m", "ae_mlir.cli", str(_write(tmp_path, text)), "--pipeline=triton",
                             "--dump-pass-pipeline"], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [presets.pipeline_text("triton", options),
                                          f"// launch: num-warps={options.num_warps} num-stages={options.num_stages}"]


# --- the options object -----------------------------------------------------------------------------


def _problem(name: str):
    return presets.read_problem(parse_module(MODULES[name], new_context()))


def test_problem_is_read_from_the_parsed_module():
    # Causal at L = 40: its one (ragged) 128 x 64 tile is cut.
    assert _problem("dk64-dv16-f32") == presets.Problem(40, 40, 64, 16, "f32", batch_heads=2, cut_tiles=1.0, masked=True)
    # No mask or score_mod: plain softmax attention.
    assert _problem("gqa-f32") == presets.Problem(50, 70, 16, 16, "f32", batch_heads=4, group=2, plain=True)
    assert _problem("linear-token-dim-bf16") == presets.Problem(96, 96, 16, 16, "bf16", "token_dim", 32, 2)


@pytest.mark.parametrize("mask, cut, tiles", [
    (lambda b, h, q, k: q >= k, 2.0, (128, 64, 8, 3)),
    (lambda b, h, q, k: (q - k).abs() <= 256, 3.25, (64, 64, 4, 3)),
    (lambda b, h, q, k: (q >= k) & ((q - k) % 2 == 0), 9.0, (64, 64, 4, 3)),
    (lambda b, h, q, k: DOC_LONG[q] == DOC_LONG[k], 0.0, (128, 64, 8, 3)),
])
def test_masks_that_cut_many_tiles_take_smaller_tiles(mask, cut, tiles):
    """On CUDA at D = 128 (16-bit) a mask of positions that cuts more KV tiles per query block
    than a causal diagonal (2 of the 128 x 64 tiles) takes 64 x 64 tiles: a band of 513 keys cuts
    3.25 on average at L = 1000 (fewer at its ends), a causal stride every tile it visits (9); a
    mask that reads a closure tensor is classified at call time, so the presets do not know it (0)."""
    # B 8, H 16: enough dK/dV programs that 64 x 128 tiles stay (launch_defaults.backward_config).
    text = _softmax(ae.attention(mask_mod=mask), b=8, h=16, lq=1000, dk=128, dtype=torch.bfloat16)
    problem = presets.read_problem(parse_module(text, new_context()))
    assert problem.cut_tiles == pytest.approx(cut)
    options = presets.options_for("triton", problem, "cuda:90")
    assert (options.block_m, options.block_n, options.num_warps, options.num_stages) == tiles
    assert presets.options_for("triton", problem, "hip:gfx942").block_m == 128
    # The backward's dK/dV kernel takes 32 x 64 tiles for them, its dQ kernel 64 x 64 (128 x 64
    # for the others).
    backward = presets.options_for("triton", problem, "cuda:90", backward=True)
    cut = tiles == (64, 64, 4, 3)
    assert (backward.dkdv_block_m, backward.dkdv_block_n) == ((32, 64) if cut else (64, 128))
    assert (backward.block_m, backward.block_n, backward.num_warps) == ((64, 64, 4) if cut else (128, 64, 8))


def test_triton_text_names_every_option():
    options = presets.options_for("triton", _problem("causal-bf16"), "cuda:90")
    assert presets.pipeline_text("triton", options) == (
        "builtin.module(attn-verify,attn-fuse-online-softmax,"
        "attn-chunk-recurrence{split=true block-v=64 block-k=64},"
        "attn-tile{block-m=128 block-n=64 call-time-tables=true kv-splits=1 pack-gqa=false whole-tiles=false prescale-q=false "
        "mirror-reads=true raw-row-max=true},"
        "attn-fold-index-clamps{padded-tiles=true},canonicalize,cse,"
        "attn-lower-to-triton{assume-aligned=true input-precision=ieee tensor-descriptors=true host-descriptors=true "
        "fast-tanh=true wave-programs=132})")
    assert (options.num_warps, options.num_stages) == (4, 3)


def test_linear_and_hip_options():
    options = presets.options_for("triton", _problem("linear-token-dim-bf16"), "hip:gfx942")
    assert (options.block_m, options.block_v, options.num_stages, options.split) == (32, 128, 2, True)
    assert options.launch_config() == {"block_m": 32, "block_n": 32, "num_warps": 4, "num_stages": 2,
                                       "block_v": 128, "block_k": 32, "decays_num_warps": 0,
                                       "decays_num_stages": 1, "states_num_stages": 2}
    assert options.launch_text() == ("num-warps=4 num-stages=2 decays-num-warps=4 decays-num-stages=1 "
                                     "states-num-stages=2")
    # The cumulative-decay and GLA's chunk-state kernels launch with their own stage counts; a
    # num_stages override reaches them unless they are given their own.
    cuda = presets.options_for("triton", _problem("linear-token-dim-bf16"), "cuda:90")
    stages = [("gla_decays", "decays"), ("gla_states", "states"), ("gla_scores", "scores"), ("gla", None)]
    assert [cuda.kernel_launch(*kernel) for kernel in stages] == [(4, 1), (4, 2), (4, 3), (4, 3)]
    # The stage is the kernel's abi.CHUNK_STAGE, not its name: an output kernel whose function
    # is named like a stage launches as the output kernel.
    assert cuda.kernel_launch("my_decays") == (4, 3)
    tuned = presets.options_for("triton", _problem("linear-token-dim-bf16"), "cuda:90", num_stages="1",
                                decays_num_stages="2")
    assert [tuned.kernel_launch(*kernel) for kernel in stages] == [(4, 2), (4, 1), (4, 1), (4, 1)]


@pytest.mark.parametrize("decay, dk, batch_heads, target, launches", [
    ("token", 128, 32, "cuda:90", [(1, 1), (4, 3), (4, 2)]),   # the output kernel's value loop: 2 stages
    ("token", 64, 128, "cuda:90", [(1, 1), (4, 3), (4, 3)]),   # one V block, no loop
    ("head", 128, 32, "cuda:90", [(4, 1), (4, 3), (4, 3)]),
    ("token", 128, 128, "cuda:90", [(1, 1), (4, 2), (4, 2)]),  # 512 chunk-state programs: 2 stages
    ("head", 128, 128, "cuda:90", [(4, 1), (4, 2), (4, 3)]),
    ("token", 128, 128, "hip:gfx942", [(4, 1), (4, 2), (4, 2)]),
])
def test_simple_gla_output_stages(decay, dk, batch_heads, target, launches):
    """Simple GLA's output kernel takes two stages where it walks V blocks (Dk wider than a
    block); the chunk-state kernel takes three, or two where its programs fill the GPU more than
    twice over; MI300 keeps two for all. Simple GLA's cumulative-decay kernel runs on one warp on
    NVIDIA GPUs."""
    problem = presets.Problem(2048, 2048, dk, dk, "bf16", decay, 64, batch_heads)
    options = presets.options_for("triton", problem, target)
    kernels = [("l_decays", "decays"), ("l_states", "states"), ("l", None)]
    assert [options.kernel_launch(*kernel) for kernel in kernels] == launches


def test_decay_warps_follow_num_warps_unless_given():
    """A num_warps override reaches the cumulative-decay kernel unless decays_num_warps is given
    too; the launch text and the bundle's config say which it took."""
    problem = presets.Problem(2048, 2048, 128, 128, "bf16", "token", 64, 128)
    kernels = [("l_decays", "decays"), ("l_states", "states"), ("l", None)]
    eight = presets.options_for("triton", problem, "cuda:90", num_warps="8")
    assert [eight.kernel_launch(*kernel)[0] for kernel in kernels] == [8, 8, 8]
    own = presets.options_for("triton", problem, "cuda:90", num_warps="8", decays_num_warps="2")
    assert [own.kernel_launch(*kernel)[0] for kernel in kernels] == [2, 8, 8]
    assert "decays-num-warps=2" in own.launch_text() and own.launch_config()["decays_num_warps"] == 2
    with pytest.raises(presets.CompileError, match="decays_num_warps' expects an integer"):
        presets.options_for("triton", problem, "cuda:90", decays_num_warps="one")


@pytest.mark.parametrize("option, value, message", [
    ("num_warps", "3", "'num_warps' must be a power of two from 1 to 32, got 3"),
    ("num_warps", "0", "'num_warps' must be a power of two from 1 to 32, got 0"),
    ("num_warps", "64", "'num_warps' must be a power of two from 1 to 32, got 64"),
    ("dkdv_num_warps", "6", r"'dkdv_num_warps' must be a power of two from 1 to 32 \(or 0: as num-warps\), got 6"),
    ("decays_num_warps", "-1", "'decays_num_warps' must be a power of two"),
    ("num_stages", "0", "'num_stages' must be at least 1, got 0"),
    ("states_num_stages", "-2", r"'states_num_stages' must be at least 1 \(or 0: as num-stages\), got -2"),
])
def test_launch_counts_are_checked(option, value, message):
    """A warp or stage count Triton cannot launch is a diagnostic naming the option, at compile
    time, not a failure when the kernel first launches on a GPU; 0 lets a kernel's own count
    follow the shared one."""
    problem = presets.Problem(2048, 2048, 64, 64, "bf16", "token", 64, 32)
    with pytest.raises(presets.CompileError, match=message):
        presets.options_for("triton", problem, "cuda:90", **{option: value})
    follows = presets.options_for("triton", problem, "cuda:90", num_warps="2", num_stages="1",
                                  decays_num_warps="0", states_num_stages="0")
    assert follows.kernel_launch("l_decays", "decays") == (2, 1)
    assert follows.kernel_launch("l_states", "states") == (2, 1)


@pytest.mark.parametrize("batch_heads, dk, dv, block_k", [
    (128, 128, 128, 64),   # 256 chunk-state programs of 64 rows: enough
    (32, 128, 128, 32),    # 64 programs: 32-row blocks double them
    (128, 64, 64, 32),     # 128 programs
    (64, 128, 256, 64),    # two V blocks of 128 columns: 64 x 2 x 2 programs
    (1024, 64, 64, 64),
])
def test_gla_state_rows_follow_the_programs(batch_heads, dk, dv, block_k):
    """GLA's chunk-state kernel takes 32-row blocks where 64 would leave fewer than 256
    programs; the other decays keep 64."""
    problem = presets.Problem(2048, 2048, dk, dv, "bf16", "token_dim", 64, batch_heads)
    assert linear_defaults.linear_config(problem)["block_k"] == block_k
    assert linear_defaults.linear_config(dataclasses.replace(problem, decay="token"))["block_k"] == 64


def test_cpu_stages_and_overrides():
    options = presets.options_for("cpu", _problem("plain-f32"), unit_inner_stride="false", vector_bits="256",
                                  no_avx512_bf16="true")
    assert [s.name for s in presets.stages("cpu", options)] == ["l1", "llvm"]
    assert (presets.pipeline_text("cpu", options, "llvm")
            == "builtin.module(attn-lower-to-cpu{unit-inner-stride=false vector-bits=256 no-avx512-bf16=true "
               "narrow-isa=false amx=false})")
    tile = ("attn-tile{block-m=64 block-n=64 call-time-tables=true kv-splits=1 pack-gqa=false whole-tiles=true prescale-q=true "
            "mirror-reads=true raw-row-max=false}")
    assert tile in presets.pipeline_text("cpu", options, "l1")
    assert "canonicalize" not in presets.pipeline_text(
        "triton", presets.options_for("triton", _problem("plain-f32"), canonicalize=False))


@pytest.mark.parametrize("flags,bits", [("fpu sse2 avx avx2 fma", 256), ("avx2 avx512f avx512bw", 512),
                                        ("fpu sse2 sse4_2", 128), ("fp asimd", 128)])
def test_cpu_vector_bits_follow_the_host(monkeypatch, flags, bits):
    from ae_mlir.backends import cpu_cache

    monkeypatch.setattr(cpu_cache, "host_features", lambda: flags)
    assert presets.options_for("cpu", _problem("plain-f32")).vector_bits == bits
    # The disk cache keys kernels by the width their register tiles were chosen for.
    assert cpu_cache.key("module", {}) == cpu_cache.key("module", {"vector_bits": bits})
    assert cpu_cache.key("module", {}) != cpu_cache.key("module", {"vector_bits": bits * 2})


@pytest.mark.parametrize("preset,target,overrides,message", [
    ("cpu", "cuda:90", {}, "pipeline 'cpu' compiles for --target=host"),
    ("triton", "host", {}, "pipeline 'triton' compiles for a cuda or hip target"),
    ("gpu", None, {}, "unknown pipeline 'gpu'"),
    ("triton", None, {"colour": "red"}, "the presets have no option 'colour'"),
    ("triton", None, {"assume-aligned": "maybe"}, "expects true or false"),
    ("triton", None, {"input-precision": "fp8"}, "must be one of ieee, tf32, tf32x3"),
])
def test_bad_preset_requests(preset, target, overrides, message):
    with pytest.raises(CompileError, match=message):
        presets.options_for(preset, None, target, **overrides)


def test_cli_rejects_a_cpu_pipeline_for_a_gpu_target(tmp_path):
    result = subprocess.run([sys.executable, "-m", "ae_mlir.cli", str(_write(tmp_path, MODULES["plain-f32"])),
                             "--pipeline=cpu", "--target=cuda:90"], capture_output=True, text=True, timeout=600)
    assert result.returncode == 1
    assert "error: pipeline 'cpu' compiles for --target=host, got 'cuda:90'" in result.stderr


SOFTCAP = ae.attention(score_mod=lambda s, b, h, i, j: 30.0 * torch.tanh(s / 30.0),
                       mask_mod=lambda b, h, i, j: i >= j)


@pytest.mark.parametrize("dtype, target, fast", [(torch.bfloat16, "cuda:90", True), (torch.float16, "cuda:90", True),
                                                 (torch.float32, "cuda:90", False),
                                                 (torch.bfloat16, "hip:gfx942", False)])
def test_fast_tanh_for_16_bit_attention_on_nvidia(dtype, target, fast):
    """16-bit attention on NVIDIA GPUs lowers a score_mod's tanh to tanh.approx.f32, forward and
    backward; fp32 and AMD keep the exact expansion (exp2 and a division)."""
    text = _softmax(SOFTCAP, lq=96, dk=32, dtype=dtype)
    problem = presets.read_problem(parse_module(text, new_context()))
    assert presets.options_for("triton", problem, target).fast_tanh is fast
    for bundle in (tb.build_bundle(text, target), tb.build_backward_bundle(text, target)):
        for kernel in [bundle] + list(bundle.stages):
            ttir = kernel.variants["aligned"].ttir
            assert ("tanh.approx.f32" in ttir) is fast
            assert ('"math.exp2"' in ttir)  # the softmax's own exp2 either way


def test_fast_tanh_needs_an_nvidia_target():
    problem = presets.read_problem(parse_module(_softmax(SOFTCAP, dtype=torch.bfloat16), new_context()))
    with pytest.raises(CompileError, match="fast-tanh"):
        presets.options_for("triton", problem, "hip:gfx942", fast_tanh="true")
    assert presets.options_for("triton", problem, "cuda:90", fast_tanh="false").fast_tanh is False


def test_fast_tanh_stays_exact_where_it_decides():
    """A tanh whose value reaches a comparison (a mask's) keeps the exact expansion under fast-tanh,
    so the kernel decides as the compile-time tile classification does; the score_mod's tanh in
    the same module takes the approximation."""
    attn = ae.attention(score_mod=lambda s, b, h, i, j: 30.0 * torch.tanh(s / 30.0),
                        mask_mod=lambda b, h, i, j: torch.tanh((i - j) / 64.0) > -0.5)
    ttir = tb.build_bundle(_softmax(attn, lq=96, dk=32, dtype=torch.bfloat16), "cuda:90").variants["aligned"].ttir
    assert ttir.count("tanh.approx.f32") == 1
    assert '"math.exp2"' in ttir and '"arith.cmpf"' in ttir


@pytest.mark.parametrize("target, fast", [("cuda:75", True), ("cuda:70", False)])
def test_fast_tanh_needs_sm75(target, fast):
    problem = presets.read_problem(parse_module(_softmax(SOFTCAP, dtype=torch.bfloat16), new_context()))
    assert presets.options_for("triton", problem, target).fast_tanh is fast
    if not fast:
        with pytest.raises(CompileError, match="sm75"):
            presets.options_for("triton", problem, target, fast_tanh="true")


def test_linear_attention_keeps_the_exact_tanh():
    problem = presets.read_problem(parse_module(_linear("head", dtype=torch.bfloat16), new_context()))
    assert presets.options_for("triton", problem, "cuda:90").fast_tanh is False


def test_short_sequences_give_the_dq_kernel_four_warps():
    """8 dQ warps are for its 128 x 64 tiles; a short sequence's smaller tiles take 4, unless the
    user gives the warps."""
    short = launch_defaults.backward_config(32, 32, 128, 128, "bf16", "cuda:90")
    assert (short["block_m"], short["block_n"], short["num_warps"]) == (32, 32, 4)
    problem = presets.read_problem(parse_module(_softmax(SOFTCAP, lq=256, dk=128, dtype=torch.bfloat16),
                                                new_context()))
    assert presets.options_for("triton", problem, "cuda:90", backward=True, block_m="32").num_warps == 4
    assert presets.options_for("triton", problem, "cuda:90", backward=True, block_m="32",
                               num_warps="8").num_warps == 8
