"""Autotuning of the kernels' launch configuration (`ae_mlir.autotune`; `backends.triton_tuning.tuned_bundle`,
`backends.cpu.tuned_blocks`): the candidates, the search, the record kept on disk, and tuning on a
machine without the MLIR bindings from candidates compiled elsewhere. Kernel times come from a stand-in timer (there is no
GPU here); what the timer is given is the real candidate bundle."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import ae_mlir as ae
from ae_mlir import autotune, launch_defaults, presets, runtime
from ae_mlir.backends import triton as tb
from ae_mlir.backends import triton_tuning as tuning
from inputs import qkv

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def causal(b, h, qi, ki):
    return qi >= ki


def _shared_bytes(config: dict, dk: int, dv: int, buffers: int) -> int:
    return (buffers * config["block_n"] * (dk + dv) + config["block_m"] * dk) * 2


def test_candidates_start_with_the_default_and_fit_the_targets_memory():
    problem = presets.Problem(lq=2048, lk=2048, dk=128, dv=128, dtype="bf16", batch_heads=128)
    cuda = autotune.candidates(problem, "cuda:90")
    assert cuda[0] == {} and len(cuda) > 4
    assert len({tuple(sorted(c.items())) for c in cuda}) == len(cuda)
    sized = [c for c in cuda if "block_m" in c]
    assert all(_shared_bytes(c, 128, 128, c["num_stages"]) <= 200 * 1024 for c in sized)
    assert {"block_m": 128, "block_n": 128, "num_warps": 8, "num_stages": 2} in cuda
    # Hopper tries each configuration, the default's too, the other way round for TMA tile loads:
    # 16-bit attention at D 128 takes them by default (launch_defaults.host_tma), so through pointers.
    half = len(cuda) // 2
    assert all(c.pop("tensor_descriptors") is False for c in cuda[half:]) and cuda[half:] == cuda[:half]
    fp32 = autotune.candidates(presets.Problem(lq=2048, lk=2048, dk=128, dv=128, dtype="f32", batch_heads=128),
                               "cuda:90")
    assert all(c.pop("tensor_descriptors") is True for c in fp32[len(fp32) // 2:])
    hip = autotune.candidates(problem, "hip:gfx942")
    assert all(c["num_stages"] <= 2 and _shared_bytes(c, 128, 128, 1) <= 64 * 1024 for c in hip[1:])
    assert not any("tensor_descriptors" in c for c in hip + autotune.candidates(problem, "cuda:80"))
    short = autotune.candidates(presets.Problem(lq=40, lk=20, dk=16, dv=16, dtype="f32"), "cuda:90")
    assert all(c["block_m"] <= 64 and c["block_n"] <= 32 for c in short if "block_m" in c)


def test_plain_attention_tries_each_candidate_through_pointers_too():
    # Its default loads through TMA descriptors (launch_defaults._PLAIN_LONG): the second half of
    # the candidates turns them off, the default's own configuration included.
    plain = presets.Problem(lq=2048, lk=2048, dk=128, dv=128, dtype="bf16", batch_heads=128, plain=True)
    options = presets.options_for("triton", plain, "cuda:90")
    # The bundle's recorded config says so (what benches and tuning records print).
    assert options.tensor_descriptors and options.launch_config()["tensor_descriptors"] is True
    assert "tensor_descriptors" not in presets.options_for("triton", plain, "hip:gfx942").launch_config()
    cuda = autotune.candidates(plain, "cuda:90")
    half = len(cuda) // 2
    assert cuda[half] == {"tensor_descriptors": False}
    assert all(c.pop("tensor_descriptors") is False for c in cuda[half:]) and cuda[half:] == cuda[:half]
    assert {"block_m": 128, "block_n": 64, "num_warps": 4, "num_stages": 3} in cuda


def test_candidates_leave_out_the_default_they_would_repeat():
    short = presets.Problem(lq=40, lk=40, dk=16, dv=16, dtype="f32")
    default = launch_defaults.default_config(40, 40, 16, 16, "f32", "cuda:90")
    found = [c for c in autotune.candidates(short, "cuda:90") if "tensor_descriptors" not in c]
    assert len(found) > 1 and all(any(default[k] != v for k, v in c.items()) for c in found[1:])
    cpu = autotune.candidates(short, "host")
    assert {"block_m": 64, "block_n": 64} not in cpu and {"block_m": 32, "block_n": 32} in cpu
    # An sm_86 GPU has less shared memory than an H200: fewer of the large tiles fit.
    problem = presets.Problem(lq=2048, lk=2048, dk=128, dv=128, dtype="bf16", batch_heads=128)
    assert len(autotune.candidates(problem, "cuda:86")) < len(autotune.candidates(problem, "cuda:90"))


def test_the_gluon_kernel_is_tried_with_each_schedule_and_against_triton_ir():
    full = presets.Problem(lq=2048, lk=2048, dk=128, dv=128, dtype="bf16", batch_heads=128, simple_mask="none")
    found = autotune.candidates(full, "cuda:90")
    # The default (the persistent grid), one program per query block, the same with ping-pong.
    assert found[0] == {} and {"warp_specialize": True, "persistent": False} in found
    assert {"warp_specialize": True, "persistent": False, "pingpong": True} in found
    assert {"warp_specialize": False} in found and all(c.get("warp_specialize") is not None for c in found[1:])
    # At D = 64 causal, L 2048, the Triton IR kernel is the default: the Gluon one is a candidate
    # on both grids (asked for, it takes a program per block), without ping-pong (its three
    # consumer warpgroups do not take turns; the two-warpgroup form is tried without it).
    causal64 = presets.Problem(lq=2048, lk=2048, dk=64, dv=64, dtype="bf16", batch_heads=128, simple_mask="causal")
    found = autotune.candidates(causal64, "cuda:90")
    assert {"warp_specialize": True} in found and {"warp_specialize": True, "persistent": True} in found
    assert not any(c.get("pingpong") for c in found)
    # Its two-warpgroup form (128-row programs) on both grids.
    assert {"warp_specialize": True, "warpgroups": 2, "persistent": True} in found
    assert {"warp_specialize": True, "warpgroups": 2, "persistent": False} in found
    assert not any(c.get("warpgroups") for c in autotune.candidates(full, "cuda:90"))
    assert not presets.options_for("triton", causal64, "cuda:90", warp_specialize=True).persistent
    # Where a program per query block is the default (causal over few heads), the persistent grid
    # is the other candidate.
    few_heads = presets.Problem(lq=8192, lk=8192, dk=128, dv=128, dtype="bf16", batch_heads=16, simple_mask="causal")
    found = autotune.candidates(few_heads, "cuda:90")
    assert not presets.options_for("triton", few_heads, "cuda:90").persistent
    assert {"warp_specialize": True, "persistent": True} in found


def test_decoding_shapes_keep_the_default_and_linear_attention_tunes_its_blocks():
    decoding = presets.Problem(lq=1, lk=8192, dk=128, dv=128, dtype="bf16", batch_heads=32)
    assert autotune.candidates(decoding, "cuda:90") == [{}]
    linear = presets.Problem(lq=2048, lk=2048, dk=128, dv=128, dtype="bf16", decay="token", chunk_size=64)
    found = autotune.candidates(linear, "cuda:90")
    assert found[0] == {} and all({"block_v", "block_k", "num_warps", "num_stages"} == set(c) for c in found[1:])
    assert all(c["num_stages"] <= 2 for c in autotune.candidates(linear, "hip:gfx942")[1:])


def test_search_takes_the_fastest_and_skips_a_candidate_that_cannot_launch():
    configs = [{}, {"block_n": 32}, {"block_n": 64}, {"block_n": 128}]

    def cannot():
        raise RuntimeError("out of shared memory")

    launches = [lambda: 1.0, lambda: 0.7, cannot, lambda: 0.5]
    chosen, times = autotune.search("attention", configs, launches, timer=lambda launch: launch())
    assert chosen == {"block_n": 128}
    assert times[:2] == [1.0, 0.7] and math.isinf(times[2]) and times[3] == 0.5
    # A win within the margin is as likely noise: the default stays.
    near = [lambda: 1.0, lambda: 0.98, lambda: 1.2]
    assert autotune.search("attention", configs[:3], near, timer=lambda launch: launch())[0] == {}
    with pytest.raises(RuntimeError, match="out of shared memory"):
        autotune.search("attention", configs, [cannot] + launches[1:], timer=lambda launch: launch())


def test_a_candidate_that_does_not_compile_is_left_out(tuning_cache):
    def launcher(config):
        if config.get("block_n") == 64:
            raise RuntimeError("the compiler rejected it")
        return lambda: {None: 1.0, 32: 0.5, 128: 0.9}[config.get("block_n")]

    configs = [{}, {"block_n": 32}, {"block_n": 64}, {"block_n": 128}]
    chosen = autotune.choose("k", "attention", "cuda:90", configs, launcher, timer=lambda launch: launch())
    assert chosen == {"block_n": 32}
    assert autotune.load("k")["candidates"] == [{}, {"block_n": 32}, {"block_n": 128}]
    with pytest.raises(RuntimeError, match="rejected"):
        autotune.choose("k2", "attention", "cuda:90", [{"block_n": 64}, {}], launcher)
    # One candidate, or one left: chosen without timing.
    def never(launch):
        raise AssertionError("a lone candidate was timed")

    assert autotune.choose("k3", "attention", "cuda:90", [{}], launcher, timer=never) == {}
    assert autotune.choose("k4", "attention", "cuda:90", [{}, {"block_n": 64}], launcher, timer=never) == {}


def _by_blocks(launch) -> float:
    """A stand-in GPU where smaller tiles run faster: (32, 32) wins."""
    config = launch.args[0].meta["config"]
    return config["block_m"] * 0.01 + config["block_n"] * 0.001 + config["num_stages"] * 1e-4


def _records(tuning_cache) -> list[dict]:
    return [json.loads(path.read_text()) for path in (tuning_cache / "tuned").glob("*.json")]


def _record(tuning_cache) -> dict:
    """The one module's own record (its shape bucket's copy says which module it was tuned as)."""
    (record,) = [r for r in _records(tuning_cache) if "tuned_as" not in r]
    return record


def test_a_tuned_module_is_searched_once_and_its_choice_kept_on_disk(tuning_cache, monkeypatch):
    timed = []

    def timer(launch):
        timed.append(launch.args[0].key)
        return _by_blocks(launch)

    monkeypatch.setattr(autotune, "median_ms", timer)
    q, k, v = qkv(h=2, lq=40, dk=16)
    text = ae.attention(mask_mod=causal).mlir(q, k, v)
    bundle = tuning.tuned_bundle(text, "cuda:90", [q, k, v])
    record = _record(tuning_cache)
    assert record["target"] == "cuda:90" and record["candidates"][0] == {}
    assert len(record["ms"]) == len(record["candidates"]) == len(timed) == len(set(timed))
    assert record["chosen"] == {"block_m": 32, "block_n": 32, "num_warps": 4, "num_stages": 3}
    assert {k: bundle.meta["config"][k] for k in record["chosen"]} == record["chosen"]
    # Later calls, in this process or a new one (memory cleared), launch the choice untimed.
    assert tuning.tuned_bundle(text, "cuda:90", [q, k, v]) is bundle
    autotune._RECORDS.clear()
    runtime.CACHE.clear_memory()
    assert tuning.tuned_bundle(text, "cuda:90", [q, k, v]).meta["config"] == bundle.meta["config"]
    assert len(timed) == len(record["candidates"])


def test_a_record_that_is_not_one_is_searched_again(tuning_cache, monkeypatch):
    monkeypatch.setattr(autotune, "median_ms", _by_blocks)
    q, k, v = qkv(h=2, lq=40, dk=16)
    text = ae.attention(mask_mod=causal).mlir(q, k, v)
    path = autotune.record_path(tuning.tuning_key(text, "cuda:90"))
    path.parent.mkdir(parents=True)
    for broken in ('{"candidates": []}', '{"candidates": [{}], "chosen": {"block_m": 7}}', "[1, 2]", "{not json"):
        path.write_text(broken)
        autotune._RECORDS.clear()
        assert autotune.load(tuning.tuning_key(text, "cuda:90")) is None
    assert tuning.tuned_bundle(text, "cuda:90", [q, k, v]).meta["config"]["block_m"] == 32


def test_decoding_shapes_are_not_timed(tuning_cache, monkeypatch):
    def never(launch):
        raise AssertionError("a decoding shape was timed")

    monkeypatch.setattr(autotune, "median_ms", never)
    q, k, v = qkv(h=2, lq=1, lk=64, dk=16)
    text = ae.attention().mlir(q, k, v)
    assert tuning.tuned_bundle(text, "cuda:90", [q, k, v]).key == tb.get_bundle(text, "cuda:90").key
    assert _record(tuning_cache)["chosen"] == {}


def test_without_mlir_and_without_a_record_the_default_runs(tuning_cache):
    q, k, v = qkv(h=2, lq=40, dk=16)
    text = ae.attention(mask_mod=causal).mlir(q, k, v)
    default = tb.get_bundle(text, "cuda:90")
    env = dict(os.environ, AE_MLIR_CACHE_DIR=str(tuning_cache))
    code = textwrap.dedent(f"""
        import sys
        sys.modules["mlir"] = None
        import torch
        from ae_mlir.backends import triton_tuning as tuning
        q, k, v = (torch.zeros(1, 2, 40, 16) for _ in range(3))
        print(tuning.tuned_bundle({text!r}, "cuda:90", [q, k, v]).key)
        print(tuning.tuned_bundle({text!r}, "cuda:90", [q, k, v]).key)
    """)
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [default.key, default.key]
    assert result.stderr.count("launching the default configuration") == 1


def test_candidates_compiled_here_are_tuned_where_mlir_is_missing(tuning_cache):
    q, k, v = qkv(h=2, lq=40, dk=16)
    text = ae.attention(mask_mod=causal).mlir(q, k, v)
    prepared = tuning.prepare_tuning(text, "cuda:90")
    assert "chosen" not in _record(tuning_cache)
    env = dict(os.environ, AE_MLIR_CACHE_DIR=str(tuning_cache), AE_MLIR_QUIET="1")
    code = textwrap.dedent(f"""
        import sys
        sys.modules["mlir"] = None
        sys.path.insert(0, {os.path.join(ROOT, "test")!r})
        import torch
        from ae_mlir import autotune
        from ae_mlir.backends import triton_tuning as tuning
        from test_autotune import _by_blocks
        autotune.median_ms = _by_blocks
        q, k, v = (torch.zeros(1, 2, 40, 16) for _ in range(3))
        print(tuning.tuned_bundle({text!r}, "cuda:90", [q, k, v]).meta["config"]["block_m"])
    """)
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["32"]
    assert _record(tuning_cache)["chosen"] == {"block_m": 32, "block_n": 32, "num_warps": 4, "num_stages": 3}
    assert len(prepared["candidates"]) == len(_record(tuning_cache)["ms"])


def test_run_with_autotune_launches_the_tuned_bundle(tuning_cache, monkeypatch):
    launched = []
    monkeypatch.setattr(autotune, "median_ms", _by_blocks)
    monkeypatch.setattr(runtime, "current_target", lambda device=None: "cuda:90")
    monkeypatch.setattr(runtime, "launch", lambda bundle, *inputs: launched.append(bundle) or [None])
    q, k, v = qkv(h=2, lq=40, dk=16)
    text = ae.attention(mask_mod=causal).mlir(q, k, v)
    tb.run(text, [q, k, v], torch.float32)
    tb.run(text, [q, k, v], torch.float32, autotune=True)
    default, tuned = launched
    assert default.meta["config"]["block_m"] == 64 and tuned.meta["config"]["block_m"] == 32


def test_every_forward_call_path_passes_autotune_on(tuning_cache, monkeypatch):
    """Eager, differentiable and packed calls of both attention kinds hand `autotune` to the
    backend that runs their forward kernels."""
    from ae_mlir import backends

    seen = []
    real = backends.run

    def spy(text, inputs, backend, out_dtype, autotune=False):
        seen.append(autotune)
        return real(text, inputs, backend, out_dtype)

    monkeypatch.setattr(backends, "run", spy)
    q, k, v = qkv(h=2, lq=40, dk=16)
    for flag in (False, True):
        attn = ae.attention(mask_mod=causal, autotune=flag)
        attn(q, k, v, backend="cpu")
        attn(q.clone().requires_grad_(), k, v, backend="cpu")
        packed = [t[:1].transpose(1, 2).reshape(1, 40, 2, 16)[0] for t in (q, k, v)]
        cu = torch.tensor([0, 15, 40], dtype=torch.int32)
        ae.attention(mask_mod=causal, layout="blhd", autotune=flag)(*packed, cu_seqlens_q=cu, cu_seqlens_k=cu,
                                                                    max_seqlen_q=25, max_seqlen_k=25, backend="cpu")
        lin = ae.linear_attention(decay="head", autotune=flag)
        g = -torch.rand(2)
        lin(q, k, v, g, backend="cpu")
        lin(q.clone().requires_grad_(), k, v, g, backend="cpu")
        assert seen == [flag] * 5, (flag, seen)
        seen.clear()


def test_autotune_must_be_a_bool():
    with pytest.raises(TypeError, match="autotune must be a bool"):
        ae.attention(autotune="yes")
    with pytest.raises(TypeError, match="autotune must be a bool"):
        ae.linear_attention(autotune=1)


def _cpu_clock(monkeypatch) -> list:
    """A stand-in wall clock for CPU candidates where smaller tiles run faster (32 x 32 wins);
    returns the list of the tiles it timed."""
    timed = []

    def clock(launch):
        kernel = launch.args[0]
        timed.append((kernel.block_m, kernel.block_n))
        return kernel.block_m * 0.01 + kernel.block_n * 0.001

    monkeypatch.setattr(autotune, "median_wall_ms", clock)
    return timed


def test_the_cpu_backend_tunes_its_tiles(tuning_cache, monkeypatch):
    """On the CPU the candidates are the tiles (rows per program, keys per KV tile), timed by the
    wall clock; the stand-in clock makes 32 x 32 tiles the fastest."""
    from ae_mlir.backends import cpu

    timed = _cpu_clock(monkeypatch)
    q, k, v = qkv(h=2, lq=40, dk=16)
    plain, tuned = ae.attention(mask_mod=causal), ae.attention(mask_mod=causal, autotune=True)
    torch.testing.assert_close(tuned(q, k, v, backend="cpu"), plain(q, k, v, backend="cpu"), rtol=1e-5, atol=1e-5)
    assert sorted(set(timed)) == [(32, 32), (32, 64), (64, 32), (64, 64)]
    record = _record(tuning_cache)
    assert record["target"] == "host" and record["chosen"] == {"block_m": 32, "block_n": 32}
    assert cpu.tuned_blocks(tuned.mlir(q, k, v), [q, k, v]) == {"block_m": 32, "block_n": 32}
    assert len(timed) == len(record["candidates"])  # searched once
    linear = presets.Problem(lq=2048, lk=2048, dk=64, dv=64, dtype="f32", decay="head", chunk_size=64)
    assert autotune.candidates(linear, "host") == [{}]


def test_shape_buckets_round_every_static_dimension_up_to_a_power_of_two():
    text = ('func.func @attention(%q: tensor<3x4x1500x80xbf16>, %t: tensor<?x17xf32>) -> tensor<3x4x1500xf32>'
            ' {scale = 0.111803398 : f32} memref<1x2048xi32, strided<[?, 1]>> vector<6xf32> %c1500 = 1500')
    assert autotune.shape_bucket(text) == (
        'func.func @attention(%q: tensor<4x4x2048x128xbf16>, %t: tensor<?x32xf32>) -> tensor<4x4x2048xf32>'
        ' {scale = 0.111803398 : f32} memref<1x2048xi32, strided<[?, 1]>> vector<6xf32> %c1500 = 1500')


def test_a_shape_of_a_tuned_bucket_takes_its_choice_without_a_search(tuning_cache, monkeypatch):
    """Lengths 40 and 50 round to one bucket (64): the second module launches the first's choice,
    compiled for its own shape, untimed, and keeps it as its own record; length 70 is another
    bucket, searched anew. A scale of its own makes another variant."""
    timed = []

    def timer(launch):
        timed.append(launch.args[0].meta["config"]["block_m"])
        return _by_blocks(launch)

    monkeypatch.setattr(autotune, "median_ms", timer)
    said = []
    monkeypatch.setattr(autotune.progress, "emit", said.append)
    attn = ae.attention(mask_mod=causal)
    q, k, v = qkv(h=2, lq=40, dk=16)
    first = tuning.tuned_bundle(attn.mlir(q, k, v), "cuda:90", [q, k, v])
    searched = len(timed)
    assert searched > 1 and first.meta["config"]["block_m"] == 32
    said.clear()
    q2, k2, v2 = qkv(h=2, lq=50, dk=16)
    second = tuning.tuned_bundle(attn.mlir(q2, k2, v2), "cuda:90", [q2, k2, v2])
    assert len(timed) == searched and second.key != first.key
    assert {k: second.meta["config"][k] for k in ("block_m", "block_n", "num_stages")} == {
        k: first.meta["config"][k] for k in ("block_m", "block_n", "num_stages")}
    assert said == ["ae-mlir: autotune: 'attention' takes block_m=32 block_n=32 num_warps=4 num_stages=3, the "
                    "choice searched for another shape of its bucket (no search)"]
    adopted = [r for r in _records(tuning_cache) if "adopted_from" in r]
    assert len(adopted) == 1 and adopted[0]["chosen"] == {"block_m": 32, "block_n": 32, "num_warps": 4,
                                                          "num_stages": 3}
    autotune._RECORDS.clear()  # a new process reads the adopted record: no search, no bucket lookup
    assert tuning.tuned_bundle(attn.mlir(q2, k2, v2), "cuda:90", [q2, k2, v2]).key == second.key
    q3, k3, v3 = qkv(h=2, lq=70, dk=16)
    tuning.tuned_bundle(attn.mlir(q3, k3, v3), "cuda:90", [q3, k3, v3])
    assert len(timed) > searched
    again = len(timed)
    tuning.tuned_bundle(ae.attention(mask_mod=causal, scale=0.3).mlir(q2, k2, v2), "cuda:90", [q2, k2, v2])
    assert len(timed) > again


def test_a_bucket_choice_that_does_not_build_for_a_shape_is_searched_anew(tuning_cache, monkeypatch):
    monkeypatch.setattr(autotune, "median_ms", _by_blocks)
    q, k, v = qkv(h=2, lq=40, dk=16)
    text = ae.attention(mask_mod=causal).mlir(q, k, v)
    bogus = {"block_m": 24}  # not a power of two: the tiling pass rejects it
    autotune.save(tuning.bucket_key(text, "cuda:90"), {"target": "cuda:90", "candidates": [{}, bogus], "chosen": bogus})
    assert tuning.tuned_bundle(text, "cuda:90", [q, k, v]).meta["config"]["block_m"] == 32
    assert _record(tuning_cache)["chosen"]["block_m"] == 32


def test_the_cpu_backend_shares_its_tiles_within_a_bucket(tuning_cache, monkeypatch):
    from ae_mlir.backends import cpu

    timed = _cpu_clock(monkeypatch)
    attn = ae.attention(mask_mod=causal, autotune=True)
    q, k, v = qkv(h=2, lq=40, dk=16)
    assert cpu.tuned_blocks(attn.mlir(q, k, v), [q, k, v]) == {"block_m": 32, "block_n": 32}
    searched = len(timed)
    q2, k2, v2 = qkv(h=2, lq=60, dk=16)
    torch.testing.assert_close(attn(q2, k2, v2, backend="cpu"), ae.attention(mask_mod=causal)(q2, k2, v2, backend="cpu"),
                               rtol=1e-5, atol=1e-5)
    assert len(timed) == searched
    assert cpu.tuned_blocks(attn.mlir(q2, k2, v2), [q2, k2, v2]) == {"block_m": 32, "block_n": 32}
