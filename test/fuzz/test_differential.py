"""Differential fuzzing: random attention programs through every backend available here (the
CPU backend's LLVM JIT and the Triton IR in the NumPy interpreter), each compared with the float64
reference executor.

CI runs a fixed budget (AE_FUZZ_EXAMPLES, default 300 programs through each path, seeded, about
three minutes on two cores). A longer run is one command:

    AE_FUZZ_EXAMPLES=5000 AE_FUZZ_SEED=7 python -m pytest -q test/fuzz

Every failure found is minimized by hypothesis; keep it as a regression case in
test_regressions.py.
"""
from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, given, seed, settings

import ae_mlir as ae
from programs import Program, programs

EXAMPLES = int(os.environ.get("AE_FUZZ_EXAMPLES", "300"))
SEED = int(os.environ.get("AE_FUZZ_SEED", "20261130"))
SMALL = {"block_m": 32, "block_n": 16, "num_warps": 4, "num_stages": 2}

# Outputs are in the input dtype; unnormalized normalizers (relu, none) also see P rounded to the
# input dtype before P @ V, as every backend does, so their bound scales with the row sum.
TOL = {torch.float32: 3e-5, torch.bfloat16: 3e-2, torch.float16: 5e-3}


def _attention(p: Program):
    return ae.attention(score_mod=p.score_mod(), mask_mod=p.mask_mod(), normalize=p.normalize)


def _assert_close(p: Program, got, want, what: str):
    got, want = got.double(), want.double()
    scale = 1.0
    if p.normalize in ("relu", "none") and p.dtype != torch.float32:
        scale *= p.seq_k ** 0.5
    tol = TOL[p.dtype] * scale
    both_nan = torch.isnan(got) & torch.isnan(want)
    diff = (got - want).abs().masked_fill(both_nan, 0.0)
    assert not torch.isnan(diff).any(), f"{what}: NaN where the reference has a number\n{p}"
    if diff.numel() == 0:
        return
    finite = want[torch.isfinite(want)]
    bound = tol + tol * (float(finite.abs().max()) if finite.numel() else 0.0)
    assert float(diff.max()) <= bound, f"{what}: max error {float(diff.max()):.3g} > {bound:.3g}\n{p}"


def _reference(p: Program, attn, q, k, v):
    return attn(q, k, v, backend="reference")


def triton_interpreted(attn, q, k, v):
    """The attention compiled to Triton IR exactly as for a GPU, run in the NumPy interpreter."""
    from bundle_interp import interpret

    from ae_mlir.backends import triton as tb

    bundle = tb.compile_bundle(attn, q, k, v, config=SMALL)
    _, captures = attn._build(q, k, v)
    (out, *_), _ = interpret(bundle, q, k, v, *captures)
    return out


FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=False, database=None,
                suppress_health_check=list(HealthCheck), print_blob=True)


@seed(SEED)
@FUZZ
@given(programs())
def test_triton_ir_matches_reference(p: Program):
    attn = _attention(p)
    q, k, v = p.inputs()
    _assert_close(p, triton_interpreted(attn, q, k, v), _reference(p, attn, q, k, v), "Triton IR (interpreted)")


@seed(SEED + 1)
@FUZZ
@given(programs(max_seq=64))
def test_cpu_backend_matches_reference(p: Program):
    attn = _attention(p)
    q, k, v = p.inputs()
    _assert_close(p, attn(q, k, v, backend="cpu"), _reference(p, attn, q, k, v), "CPU backend")


def test_generator_covers_the_space():
    # A budget spent on one corner finds nothing: check the strategy reaches the main axes.
    from hypothesis import find

    find(programs(), lambda p: p.mask_tree is not None and p.score_tree is not None and p.heads != p.heads_kv)
    find(programs(), lambda p: p.transposed and p.dtype == torch.bfloat16 and p.seq_q != p.seq_k)
    find(programs(), lambda p: p.normalize == "none" and p.dim_qk != p.dim_v)


pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
