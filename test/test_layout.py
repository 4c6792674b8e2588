"""layout="blhd" (FlashAttention's and fla's [B, L, H, D]) against the default "bhld" on
transposed copies: the same numbers, the output in the caller's layout, lse and the state as
FlashAttention and fla return them."""
from __future__ import annotations

import pytest
import torch

import ae_mlir as ae

BACKENDS = ["cpu", "reference"]


def _blhd(*shape, seed):
    """A random [B, L, H, D] tensor and its [B, H, L, D] contiguous copy."""
    t = torch.randn(*shape, generator=torch.Generator().manual_seed(seed))
    return t, t.transpose(1, 2).contiguous()


@pytest.mark.parametrize("backend", BACKENDS)
def test_softmax_blhd_matches_bhld(backend):
    (q, q0), (k, k0), (v, v0) = (_blhd(2, 20, 4, 16, seed=1), _blhd(2, 24, 2, 16, seed=2),
                                 _blhd(2, 24, 2, 8, seed=3))

    def causal(b, h, q_idx, kv_idx):
        return q_idx + 4 >= kv_idx

    out, lse = ae.attention(mask_mod=causal, layout="blhd")(q, k, v, return_lse=True, backend=backend)
    ref, ref_lse = ae.attention(mask_mod=causal)(q0, k0, v0, return_lse=True, backend=backend)
    assert out.shape == (2, 20, 4, 8) and lse.shape == (2, 4, 20)
    torch.testing.assert_close(out, ref.transpose(1, 2), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, ref_lse, atol=1e-5, rtol=1e-5)


def test_blhd_output_is_a_view_and_mlir_takes_the_same_tensors():
    (q, q0) = _blhd(1, 16, 2, 8, seed=4)
    attn = ae.attention(layout="blhd")
    assert attn.mlir(q, q, q) == ae.attention().mlir(q0, q0, q0)
    out = attn(q, q, q, backend="reference")
    assert out.shape == q.shape and out.transpose(1, 2).is_contiguous()  # a view, not a copy


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("decay", [None, "head", "token", "token_dim"])
def test_linear_blhd_matches_bhld(decay, backend):
    b, t, h, dk, dv = 2, 24, 3, 8, 4
    (q, q0), (k, k0), (v, v0) = (_blhd(b, t, h, dk, seed=5), _blhd(b, t, h, dk, seed=6), _blhd(b, t, h, dv, seed=7))
    gen = torch.Generator().manual_seed(8)
    g = g0 = None
    if decay == "head":
        g = g0 = -torch.rand(h, generator=gen)
    elif decay == "token":
        g = -torch.rand(b, t, h, generator=gen)
        g0 = g.transpose(1, 2).contiguous()
    elif decay == "token_dim":
        g = -torch.rand(b, t, h, dk, generator=gen)
        g0 = g.transpose(1, 2).contiguous()
    state0 = torch.randn(b, h, dk, dv, generator=gen)
    kwargs = dict(decay=decay, chunk_size=8)
    out, state = ae.linear_attention(layout="blhd", **kwargs)(q, k, v, g, initial_state=state0, return_state=True,
                                                             backend=backend)
    ref, ref_state = ae.linear_attention(**kwargs)(q0, k0, v0, g0, initial_state=state0, return_state=True,
                                                  backend=backend)
    assert out.shape == (b, t, h, dv) and state.shape == (b, h, dk, dv)
    torch.testing.assert_close(out, ref.transpose(1, 2), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(state, ref_state, atol=1e-4, rtol=1e-4)
    lin = ae.linear_attention(layout="blhd", **kwargs)
    assert lin.mlir(q, k, v, g, initial_state=state0) == ae.linear_attention(**kwargs).mlir(
        q0, k0, v0, g0, initial_state=state0)
