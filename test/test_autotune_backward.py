"""Autotuning of the backward kernels (`backends.triton_tuning.tuned_backward_bundle`): the dQ kernel's
candidates are searched first, then the dK/dV kernel's over that choice; the record kept on disk,
the shape bucket's choice, tuning from candidates compiled on another machine, and the tuned
bundle's gradients in the TTIR interpreter. Kernel times come from a stand-in timer (there is no
GPU here); what the timer is given is the real candidate bundle."""
from __future__ import annotations

import dataclasses
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
from bundle_interp import interpret_roles
from test_autotune import ROOT, _records


def causal(b, h, qi, ki):
    return qi >= ki


def _cost(config: dict) -> float:
    """A stand-in GPU: each kernel's time grows with its tiles."""
    return ((config["block_m"] + config["block_n"] + config["dkdv_block_m"] + config["dkdv_block_n"]) * 0.01
            + config["num_stages"] * 1e-4)


def _by_blocks(launch) -> float:
    return _cost(launch.args[0].meta["config"])


def _best(base: dict, group: list[dict]) -> dict:
    """The search's pick of `group` over `base`: the cheapest, if cheaper than the first by 3%."""
    costs = [_cost(dict(base, **c)) for c in group]
    best = min(range(len(group)), key=costs.__getitem__)
    return dict(base, **group[best if costs[best] < costs[0] * 0.97 else 0])


def _module(lq=256, lk=None, dtype=torch.bfloat16, dk=64):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, lq, dk, generator=gen).to(dtype)
    k = torch.randn(1, 2, lk or lq, dk, generator=gen).to(dtype)
    v = torch.randn(1, 2, lk or lq, dk, generator=gen).to(dtype)
    return ae.attention(mask_mod=causal).mlir(q, k, v), {"q": q, "k": k, "v": v}


def test_candidates_come_in_two_groups_each_keeping_the_other_kernels_options():
    problem = presets.Problem(lq=2048, lk=2048, dk=128, dv=128, dtype="bf16")
    default = launch_defaults.backward_config(2048, 2048, 128, 128, "bf16", "cuda:90")
    dq, dkdv = autotune.backward_candidates(problem, "cuda:90", default)
    assert dq[0] == {} and dkdv[0] == {}
    # The dQ kernel's candidates keep the dK/dV kernel's default (an override of block_m alone
    # would make the dK/dV kernel follow it).
    own = {"dkdv_block_m", "dkdv_block_n", "dkdv_num_warps", "dkdv_num_stages"}
    assert all(set(c) == {"block_m", "block_n", "num_warps", "num_stages"} | own for c in dq[1:])
    assert all({k: c[k] for k in own} == {k: default[k] for k in own} for c in dq[1:])
    assert all(set(c) == {"dkdv_block_m", "dkdv_block_n", "dkdv_num_warps", "dkdv_num_stages"} for c in dkdv[1:])
    # The default's own configuration is not tried twice.
    assert all({k: default[k] for k in c} != c for c in dq[1:] + dkdv[1:])
    # Decoding shapes keep the default; MI300 candidates take one stage.
    assert autotune.backward_candidates(presets.Problem(lq=1, lk=2048, dk=128, dv=128, dtype="bf16"),
                                        "cuda:90", default) == [[{}]]
    hip = autotune.backward_candidates(problem, "hip:gfx942", launch_defaults.backward_config(
        2048, 2048, 128, 128, "bf16", "hip:gfx942"))
    assert all(c["num_stages"] == 1 for c in hip[0][1:]) and all(c["dkdv_num_stages"] == 1 for c in hip[1][1:])


@pytest.mark.parametrize("dk", [128, 64])
def test_where_the_gluon_backward_is_the_default_it_is_tried_against_the_triton_ir_kernels_first(dk):
    problem = presets.Problem(lq=2048, lk=2048, dk=dk, dv=dk, dtype="bf16", simple_mask="causal",
                              gluon_backward="causal")
    default = launch_defaults.backward_config(2048, 2048, dk, dk, "bf16", "cuda:90")
    groups = autotune.backward_candidates(problem, "cuda:90", default)
    if dk == 64:  # the Triton IR kernels are the default there: no such group
        assert len(groups) == 2 and not any("warp_specialize" in c for g in groups for c in g)
        return
    first, dq, dkdv = groups
    assert first == [{}, {"warp_specialize": False}]
    # The Triton IR tiles are searched without the Gluon kernel, which takes none of them.
    assert dq[0] == {} and dkdv[0] == {} and len(dq) > 1 and len(dkdv) > 1
    assert all(c["warp_specialize"] is False for c in dq[1:] + dkdv[1:])


def test_a_score_mods_gluon_backward_is_a_candidate_against_the_default_triton_ir_kernels():
    """With a score_mod the Gluon backward is not the default (launch_defaults.warp_specialized)
    but a tuned call tries it first, then the Triton IR tiles."""
    problem = presets.Problem(lq=2048, lk=2048, dk=128, dv=128, dtype="bf16", gluon_backward="causal",
                              score_mod=True)
    default = launch_defaults.backward_config(2048, 2048, 128, 128, "bf16", "cuda:90")
    first, dq, dkdv = autotune.backward_candidates(problem, "cuda:90", default)
    assert first == [{}, {"warp_specialize": True}]
    assert all(c["warp_specialize"] is False for c in dq[1:] + dkdv[1:])
    # A mod reading a closure tensor whose gradient is wanted keeps the Triton IR kernels, which
    # compute it; without its gradient the Gluon kernels are tried too.
    reads = dataclasses.replace(problem, mod_reads_closures=True)
    groups = autotune.backward_candidates(reads, "cuda:90", default)
    assert len(groups) == 2 and not any(c.get("warp_specialize") for group in groups for c in group)
    assert autotune.backward_candidates(reads, "cuda:90", default, closure_grads=False)[0] == first


def test_the_kernels_are_searched_in_turn_once_and_the_choice_kept_on_disk(tuning_cache, monkeypatch):
    timed = []

    def timer(launch):
        timed.append(launch.args[0].key)
        return _by_blocks(launch)

    monkeypatch.setattr(autotune, "median_ms", timer)
    text, tensors = _module()
    bundle = tuning.tuned_backward_bundle(text, "cuda:90", tensors)
    (record,) = [r for r in _records(tuning_cache) if "tuned_as" not in r]
    problem = presets.Problem(lq=256, lk=256, dk=64, dv=64, dtype="bf16")
    dq, dkdv = autotune.backward_candidates(problem, "cuda:90",
                                            launch_defaults.backward_config(256, 256, 64, 64, "bf16", "cuda:90"))
    assert len(record["candidates"]) == len(record["ms"]) == len(timed) == len(dq) + len(dkdv)
    # The dQ kernel's cheapest, then the dK/dV kernel's cheapest over it.
    default = tb.get_backward_bundle(text, "cuda:90").meta["config"]
    first = _best(default, dq)
    assert first != default
    want = _best(first, dkdv)
    assert want != first
    config = bundle.meta["config"]
    assert {k: config[k] for k in want} == want
    assert all(config[k] == v for k, v in record["chosen"].items())
    assert all(dict(default, **c)["block_m"] == first["block_m"] for c in record["candidates"][len(dq):])
    # Later calls, in this process or a new one (memory cleared), launch the choice untimed.
    assert tuning.tuned_backward_bundle(text, "cuda:90", tensors) is bundle
    autotune._RECORDS.clear()
    runtime.CACHE.clear_memory()
    assert tuning.tuned_backward_bundle(text, "cuda:90", tensors).meta["config"] == config
    assert len(timed) == len(record["candidates"])


def test_a_shape_of_a_tuned_bucket_takes_its_choice_without_a_search(tuning_cache, monkeypatch):
    monkeypatch.setattr(autotune, "median_ms", _by_blocks)
    text, tensors = _module(lq=256)
    chosen = tuning.tuned_backward_bundle(text, "cuda:90", tensors).meta["config"]

    def never(launch):
        raise AssertionError("a shape of a tuned bucket was timed")

    monkeypatch.setattr(autotune, "median_ms", never)
    other, tensors = _module(lq=200)
    assert tuning.tuned_backward_bundle(other, "cuda:90", tensors).meta["config"] == chosen


def test_the_tuned_bundle_computes_the_defaults_gradients(tuning_cache, monkeypatch):
    monkeypatch.setattr(autotune, "median_ms", _by_blocks)
    text, tensors = _module(lq=80, dtype=torch.float32, dk=32)
    attn = ae.attention(mask_mod=causal)
    out, lse = attn(tensors["q"], tensors["k"], tensors["v"], backend="reference", return_lse=True)
    tensors.update(out=out.float(), lse=lse.float(), do=torch.randn(out.shape), dlse=torch.zeros(lse.shape))
    tuned = tuning.tuned_backward_bundle(text, "cuda:90", tensors)
    default = tb.get_backward_bundle(text, "cuda:90")
    assert tuned.meta["config"] != default.meta["config"]
    got, want = interpret_roles(tuned, tensors), interpret_roles(default, tensors)
    for role in ("dq", "dk", "dv"):
        torch.testing.assert_close(got[role], want[role], atol=1e-4, rtol=1e-4)


def test_candidates_compiled_here_are_tuned_where_mlir_is_missing(tuning_cache):
    text, tensors = _module()
    prepared = tuning.prepare_backward_tuning(text, "cuda:90")
    env = dict(os.environ, AE_MLIR_CACHE_DIR=str(tuning_cache), AE_MLIR_QUIET="1")
    code = textwrap.dedent(f"""
        import sys
        sys.modules["mlir"] = None
        sys.path.insert(0, {os.path.join(ROOT, "test")!r})
        import torch
        from ae_mlir import autotune
        from ae_mlir.backends import triton_tuning as tuning
        from test_autotune_backward import _by_blocks
        autotune.median_ms = _by_blocks
        tensors = {{role: torch.zeros(1, 2, 256, 64, dtype=torch.bfloat16) for role in ("q", "k", "v")}}
        config = tuning.tuned_backward_bundle({text!r}, "cuda:90", tensors).meta["config"]
        print(config["block_m"], config["dkdv_block_m"], config["dkdv_block_n"])
    """)
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    default = tb.get_backward_bundle(text, "cuda:90").meta["config"]
    want = _best(_best(default, prepared["groups"][0]), prepared["groups"][1])
    assert result.stdout.split() == [str(want[k]) for k in ("block_m", "dkdv_block_m", "dkdv_block_n")]
    groups = prepared["groups"]
    assert len(prepared["candidates"]) == len(groups[0]) * len(groups[1])


def test_a_differentiable_call_hands_autotune_to_the_backward(monkeypatch):
    from ae_mlir import backends

    seen = []
    real = backends.run_backward

    def spy(text, tensors, backend, closure_grads=True, kind=None, stat="none", autotune=False):
        seen.append(autotune)
        return real(text, tensors, backend, closure_grads, kind, stat)

    monkeypatch.setattr(backends, "run_backward", spy)
    for flag in (False, True):
        q, k, v = (torch.randn(1, 2, 40, 16, requires_grad=True) for _ in range(3))
        ae.attention(mask_mod=causal, autotune=flag)(q, k, v, backend="cpu").sum().backward()
    assert seen == [False, True]
