"""The linear-attention catalogue on the CPU backend and as Triton IR (NumPy interpreter), against
the reference executor's step-by-step float64 recurrence; and the state carried across calls."""
from __future__ import annotations

import pytest
import torch

import ae_mlir as ae
from ae_mlir import variants
from ae_mlir.backends import triton as tb
from bundle_interp import interpret

SHAPE = variants.Shape(batch=1, heads=2, seq_q=45, seq_k=45, dim_qk=16, dim_v=32)
SMALL = {"block_m": 32, "block_n": 16, "num_warps": 4, "num_stages": 2}
TOL = dict(atol=1e-4, rtol=1e-4)


def _case(name):
    lin, g = variants.build_linear(name, SHAPE)
    q, k, v = variants.inputs(SHAPE, seed=7)
    return lin, g, q, k, v


@pytest.mark.parametrize("name", list(variants.LINEAR_CATALOGUE))
def test_linear_entry_on_cpu(name):
    lin, g, q, k, v = _case(name)
    want, want_state = lin(q, k, v, g, return_state=True, backend="reference")
    got, state = lin(q, k, v, g, return_state=True, backend="cpu")
    torch.testing.assert_close(got, want, **TOL)
    torch.testing.assert_close(state, want_state, **TOL)


@pytest.mark.parametrize("name", list(variants.LINEAR_CATALOGUE))
def test_linear_entry_as_triton_ir(name):
    lin, g, q, k, v = _case(name)
    text = lin.mlir(q, k, v, g)
    _, captures = lin._build(q, k, v, g, None)
    bundle = tb.build_bundle(text, "cuda:90", SMALL)
    (out, state), _ = interpret(bundle, q, k, v, *[t for t in (g,) if t is not None], *captures)
    want, want_state = lin(q, k, v, g, return_state=True, backend="reference")
    torch.testing.assert_close(out, want, **TOL)
    torch.testing.assert_close(state, want_state, **TOL)


@pytest.mark.parametrize("dk,dv", [(3, 4), (5, 7), (12, 16), (6, 3)])
@pytest.mark.parametrize("decay", [None, "head", "token", "token_dim"])
def test_head_dims_that_are_not_powers_of_two_on_cpu(decay, dk, dv):
    """A ragged last chunk (37 = 16 + 16 + 5) whose rows (Dk or Dv wide) are not a power of two
    long is staged row by row (`attn-cpu-lower-vectors`); whole-vector staging of a [16, 5] tile
    failed to compile."""
    gen = torch.Generator().manual_seed(3)
    q, k = (torch.randn(1, 2, 37, dk, generator=gen) for _ in range(2))
    v = torch.randn(1, 2, 37, dv, generator=gen)
    g = {None: None, "head": (2,), "token": (1, 2, 37), "token_dim": (1, 2, 37, dk)}[decay]
    g = None if g is None else -0.3 * torch.rand(g, generator=gen)
    s0 = torch.randn(1, 2, dk, dv, generator=gen)
    lin = ae.linear_attention(decay=decay, chunk_size=16)
    want, want_state = lin(q, k, v, g, initial_state=s0, return_state=True, backend="reference")
    got, state = lin(q, k, v, g, initial_state=s0, return_state=True, backend="cpu")
    torch.testing.assert_close(got, want, **TOL)
    torch.testing.assert_close(state, want_state, **TOL)


@pytest.mark.parametrize("name", ["retnet", "gated_retention", "gla"])
def test_state_carry_across_two_halves_equals_one_run(name):
    lin, g, q, k, v = _case(name)
    whole, whole_state = lin(q, k, v, g, return_state=True, backend="cpu")
    cut = 20
    gs = (g, g) if g is None or g.dim() == 1 else (g[:, :, :cut], g[:, :, cut:])
    first, mid = lin(q[:, :, :cut], k[:, :, :cut], v[:, :, :cut], gs[0], return_state=True, backend="cpu")
    second, last = lin(q[:, :, cut:], k[:, :, cut:], v[:, :, cut:], gs[1], initial_state=mid,
                       return_state=True, backend="cpu")
    torch.testing.assert_close(torch.cat([first, second], dim=2), whole, **TOL)
    torch.testing.assert_close(last, whole_state, **TOL)


def _strided(t, dtype, pad: int = 0):
    """t's values in fla's [B, T, H, D] storage, seen as a [B, H, T, D] view (non-contiguous);
    `pad` extra columns per row make the row strides odd."""
    b, h, n, d = t.shape
    storage = torch.zeros(b, n, h, d + pad, dtype=dtype)
    storage[..., :d] = t.transpose(1, 2)
    return storage[..., :d].transpose(1, 2)


def _close_16bit(got, want):
    """Within a few 16-bit roundings of the largest value (matmul operands are rounded)."""
    assert torch.isfinite(got).all()
    scale = max(want.abs().max().item(), 1.0)
    torch.testing.assert_close(got.double(), want.double(), atol=2**-6 * scale, rtol=2**-6)


@pytest.mark.parametrize("name", ["gated_retention", "gla"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16bit_strided_on_cpu(name, dtype):
    lin, g, q, k, v = _case(name)
    q, k, v = (_strided(t, dtype) for t in (q, k, v))
    assert not q.is_contiguous()
    want, want_state = lin(q, k, v, g, return_state=True, backend="reference")
    got, state = lin(q, k, v, g, return_state=True, backend="cpu")
    assert got.dtype == dtype
    _close_16bit(got, want)
    _close_16bit(state, want_state)


@pytest.mark.parametrize("name", ["retnet", "gla"])
def test_fp16_strided_as_triton_ir(name):
    # The split kernels on fp16 [B, T, H, D] views with rows of 19 elements: strides no
    # multiple of 16, so the general (any-strides) variant of every kernel runs.
    lin, g, q, k, v = _case(name)
    q, k, v = (_strided(t, torch.float16, pad=3) for t in (q, k, v))
    _, captures = lin._build(q, k, v, g, None)
    bundle = tb.build_bundle(lin.mlir(q, k, v, g), "cuda:90", SMALL)
    (out, state), chosen = interpret(bundle, q, k, v, *[t for t in (g,) if t is not None], *captures)
    assert not chosen.aligned
    want, want_state = lin(q, k, v, g, return_state=True, backend="reference")
    _close_16bit(out, want)
    _close_16bit(state, want_state)
