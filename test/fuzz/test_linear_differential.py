"""Differential fuzzing of linear attention: random programs (linear_programs.py) through the CPU
backend and the Triton bundle at each target's default `linear_config` (its kernels run in the
NumPy interpreter), each compared with the float64 reference executor, output and final state.

AE_FUZZ_EXAMPLES programs per target (100 by default), seeded by AE_FUZZ_SEED; the CPU backend
runs a fifth as many, since each program is a new native compile of one to several seconds.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, seed, settings
from hypothesis import strategies as st

from linear_programs import LinearProgram, linear_programs
from test_differential import EXAMPLES, FUZZ, SEED, TARGETS

# Relative to the largest reference value (at least 1): an element of a chunked recurrence sums
# many terms, so its error scales with them, not with itself. bf16 runs its products on bf16
# operands with f32 accumulation, a few bf16 roundings (2^-8 each).
TOL = {torch.float32: 5e-5, torch.bfloat16: 2**-6}


def _close(p: LinearProgram, got, want, what: str):
    got, want = got.double(), want.double()
    assert torch.isfinite(got).all(), f"{what}: non-finite values (unwritten or overflowed)\n{p}"
    bound = TOL[p.dtype] * max(float(want.abs().max()) if want.numel() else 0.0, 1.0)
    err = float((got - want).abs().max()) if want.numel() else 0.0
    assert err <= bound, f"{what}: max error {err:.3g} > {bound:.3g}\n{p}"


def _reference(p: LinearProgram, lin, inputs):
    q, k, v, g, s0 = inputs
    return lin(q, k, v, g, initial_state=s0, return_state=True, backend="reference")


def triton_linear_interpreted(lin, inputs, target: str):
    """The linear attention's bundle for `target` at its default config, run in the interpreter."""
    from bundle_interp import interpret

    from ae_mlir.backends import triton as tb

    q, k, v, g, s0 = inputs
    _, captures = lin._build(q, k, v, g, s0)
    bundle = tb.build_bundle(lin.mlir(q, k, v, g, s0), target)
    (out, state), _ = interpret(bundle, q, k, v, *[t for t in (g, s0) if t is not None], *captures)
    return out, state


def check_triton_linear(p: LinearProgram, target: str):
    lin, inputs = p.attention(), p.inputs()
    want = _reference(p, lin, inputs)
    for name, got, ref in zip(("output", "state"), triton_linear_interpreted(lin, inputs, target), want):
        _close(p, got, ref, f"Triton IR for {target} (interpreted), {name}")


def check_cpu_linear(p: LinearProgram):
    lin, inputs = p.attention(), p.inputs()
    q, k, v, g, s0 = inputs
    got = lin(q, k, v, g, initial_state=s0, return_state=True, backend="cpu")
    for name, out, ref in zip(("output", "state"), got, _reference(p, lin, inputs)):
        _close(p, out, ref, f"CPU backend, {name}")


@pytest.mark.parametrize("target", TARGETS)
def test_linear_triton_ir_matches_reference(target):
    @seed(SEED + 2)
    @FUZZ
    @given(linear_programs())
    def run(p: LinearProgram):
        check_triton_linear(p, target)

    run()


@seed(SEED + 3)
@settings(FUZZ, max_examples=max(1, EXAMPLES // 5))
@given(linear_programs())
def test_linear_cpu_backend_matches_reference(p: LinearProgram):
    check_cpu_linear(p)


@st.composite
def packed_linear_programs(draw):
    """A linear program run on a packed batch: 1-5 sequences of 0-120 tokens back to back."""
    p = draw(linear_programs(max_seq=120))
    lengths = draw(st.lists(st.integers(0, 120), min_size=1, max_size=5).filter(lambda ls: sum(ls) > 0))
    return p, lengths


def check_packed_linear(p: LinearProgram, lengths: list, target: str):
    """The packed program's Triton bundle for `target` at its default config, interpreted, against
    the reference executor (which the per-sequence oracle of test_linear_varlen checks): built
    for `lengths`, then run on them and on other lengths of another total (each 7 tokens shorter,
    in reverse order), which the same module serves."""
    from bundle_interp import interpret

    from ae_mlir.backends import triton as tb

    lin = p.attention()
    longest = max(lengths)
    bundle = None
    for batch in (lengths, [max(n - 7, 0) for n in reversed(lengths)]):
        q, k, v, g, s0 = p.inputs(batch)
        cu = torch.tensor([0] + torch.tensor(batch).cumsum(0).tolist(), dtype=torch.int32)
        want = lin(q, k, v, g, initial_state=s0, cu_seqlens=cu, max_seqlen=longest, return_state=True,
                   backend="reference")
        qb, kb, vb, gb, s0b, sequences = lin._packed(q, k, v, g, s0, cu, longest)
        _, captures = lin._build(qb, kb, vb, gb, s0b, sequences=sequences)
        bundle = bundle or tb.build_bundle(lin.mlir(q, k, v, g, s0, cu_seqlens=cu, max_seqlen=longest), target)
        fixed = [x for x in (gb, s0b) if x is not None] + [sequences.kv_len, sequences.cu_q]
        (out, state), _ = interpret(bundle, qb, kb, vb, *fixed, *captures)
        where = f"packed {batch}, Triton IR for {target} (interpreted)"
        _close(p, out, want[0], f"{where}, output")
        _close(p, state[:len(batch)], want[1], f"{where}, state")


@pytest.mark.parametrize("target", TARGETS)
def test_packed_linear_programs_at_default_configs(target):
    @seed(SEED + 4)
    @settings(FUZZ, max_examples=max(5, EXAMPLES // 5))
    @given(packed_linear_programs())
    def run(case):
        check_packed_linear(*case, target)

    run()


def test_linear_generator_covers_the_space():
    from hypothesis import find

    find(linear_programs(), lambda p: p.seq < p.chunk and p.decay == "token_dim" and p.dim_k != p.dim_v)
    find(linear_programs(), lambda p: p.normalize and p.initial_state and p.dtype == torch.bfloat16)
    find(linear_programs(), lambda p: sorted(p.arities[r] for r in p.trees if p.trees[r]) == [1, 5])


pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
