"""The "token_value_dim" decay of attn.linear_recurrence (g [B, H, L, Dv], the state's columns
decayed; the kind GLA's backward runs for dq and dk): the CPU kernel, the Triton kernels at the
preset's configs (TTIR interpreter, for NVIDIA and AMD) and the reference executor against the
recurrence written out in float64, one token at a time."""
from __future__ import annotations

import pytest
import torch

import ae_mlir as ae
from ae_mlir import backends
from ae_mlir.backends import triton as tb
from ae_mlir.frontend.linear_kernel_backward import plain_module, run_operands
from bundle_interp import interpret


def naive(q, k, v, g, s0, scale):
    """(o, S_L) of S_t = S_{t-1} diag(exp(g_t)) + k_t^T v_t, o_t = scale q_t S_t, in float64."""
    q, k, v, g = (t.double() for t in (q, k, v, g))
    state = s0.double().clone()
    outs = []
    for t in range(q.shape[2]):
        state = state * torch.exp(g[:, :, t]).unsqueeze(-2) + k[:, :, t].unsqueeze(-1) * v[:, :, t].unsqueeze(-2)
        outs.append(scale * torch.einsum("bhd,bhde->bhe", q[:, :, t], state))
    out = torch.stack(outs, 2) if outs else torch.zeros(*q.shape[:3], v.shape[3], dtype=torch.float64)
    return out, state


def _problem(l, dk, dv, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(2, 2, l, dk, generator=gen).to(dtype) for _ in range(2))
    v = torch.randn(2, 2, l, dv, generator=gen).to(dtype)
    # Strong decays too (down to -4 a step): the chunk's exponents must never overflow.
    g = -4 * torch.rand(2, 2, l, dv, generator=gen) ** 4
    s0 = torch.randn(2, 2, dk, dv, generator=gen)
    return q, k, v, g, s0


# (L, chunk, Dk, Dv): ragged last chunks, Dk != Dv, a sequence shorter than its chunk, chunks
# of one block of 16 rows (the CPU's only) and of several, Dv split into value blocks.
SHAPES = [(37, 16, 5, 3), (150, 64, 16, 80), (10, 64, 32, 32), (130, 32, 8, 64)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_and_reference_against_the_recurrence(shape, dtype):
    l, chunk, dk, dv = shape
    q, k, v, g, s0 = _problem(l, dk, dv, dtype)
    text = plain_module("token_value_dim", 0.5, chunk, q, k, v, g, s0, torch.float32)
    want_out, want_state = naive(q, k, v, g, s0, 0.5)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for backend in ("cpu", "reference"):
        out, state = backends.run(text, [q, k, v, g, s0], backend, torch.float32)
        assert (out.double() - want_out).abs().max() <= tol * want_out.abs().max(), backend
        assert (state.double() - want_state).abs().max() <= tol * want_state.abs().max(), backend


@pytest.mark.parametrize("target", ["cuda:90", "hip:gfx942"])
@pytest.mark.parametrize("shape", SHAPES[1:], ids=lambda s: "x".join(map(str, s)))
def test_triton_kernels_at_the_preset_config(target, shape):
    l, chunk, dk, dv = shape
    q, k, v, g, s0 = _problem(l, dk, dv, torch.bfloat16, seed=1)
    text = plain_module("token_value_dim", 0.5, chunk, q, k, v, g, s0, torch.float32)
    (out, state), _ = interpret(tb.build_bundle(text, target, None), q, k, v, g, s0)
    want_out, want_state = naive(q, k, v, g, s0, 0.5)
    assert (out.double() - want_out).abs().max() <= 1e-2 * want_out.abs().max()
    assert (state.double() - want_state).abs().max() <= 1e-2 * want_state.abs().max()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_triton_blocks_past_the_span_limit(dtype):
    """Rows 40-59 decay by 6 a step in V column 3: the first chunk's program for V columns 0-31
    (120 nats) takes the chunk's blocks, of which blocks 2 and 3 (48 and 72 nats) take the
    diagonal block's exact 3-D form and the others the tensor-core one; its program for columns
    32-39 and the later chunks' take whole-chunk products from the scores kernel's A (f16
    operands a program per block, always the exact form). A chunk or block wrongly factorized
    there overflows its cap and misses by far more than the tolerance."""
    q, k, v, g, s0 = _problem(150, 16, 40, dtype, seed=4)
    g[:, :, 40:60, 3] = -6.0
    text = plain_module("token_value_dim", 0.5, 64, q, k, v, g, s0, torch.float32)
    bundle = tb.build_bundle(text, "cuda:90", None)
    # Launch grids, the program axis first: chunks (x blocks) x V blocks, heads, batch.
    stages = [(s.name, s.grid) for s in bundle.stages] + [(bundle.name, bundle.grid)]
    if dtype == torch.float16:
        assert stages[2:] == [("linear_attention", [3 * 4 * 2, 2, 2])]
    else:
        assert stages[2:] == [("linear_attention_scores", [3, 2, 2]), ("linear_attention", [3 * 2, 2, 2])]
    (out, state), _ = interpret(bundle, q, k, v, g, s0)
    want_out, want_state = naive(q, k, v, g, s0, 0.5)
    tol = 1e-4 if dtype == torch.float32 else 1e-2
    assert (out.double() - want_out).abs().max() <= tol * want_out.abs().max()
    assert (state.double() - want_state).abs().max() <= tol * want_state.abs().max()


@pytest.mark.parametrize("backend", ["cpu", "reference", "triton"])
def test_packed_sequences(backend):
    """Packed sequences (one empty) read in place: each starts from its own state."""
    lens = [70, 0, 5, 33]
    cu = torch.tensor([0, 70, 70, 75, 108], dtype=torch.int32)
    q, k, v, g, _ = _problem(sum(lens), 8, 16, torch.float32, seed=2)
    q, k, v, g = (t[:1] for t in (q, k, v, g))
    s0 = torch.randn(len(lens), 2, 8, 16, generator=torch.Generator().manual_seed(3))
    packing = (cu, 128)
    text = plain_module("token_value_dim", 0.5, 32, q, k, v, g, s0, torch.float32, packing)
    inputs = [q, k, v] + run_operands(g, s0, packing)
    if backend == "triton":
        (out, state), _ = interpret(tb.build_bundle(text, "cuda:90", None), *inputs)
    else:
        out, state = backends.run(text, inputs, backend, torch.float32)
    for i, (lo, hi) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        want_out, want_state = naive(q[:, :, lo:hi], k[:, :, lo:hi], v[:, :, lo:hi], g[:, :, lo:hi], s0[i:i + 1], 0.5)
        torch.testing.assert_close(out[:, :, lo:hi].double(), want_out, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(state[i:i + 1].double(), want_state, rtol=1e-4, atol=1e-4)


def test_no_call_takes_it():
    with pytest.raises(ValueError, match="decay must be one of"):
        ae.linear_attention(decay="token_value_dim")
