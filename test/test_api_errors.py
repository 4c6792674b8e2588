"""Bad and degenerate input from Python: a clear ValueError/TypeError naming the argument, or an
empty result without a kernel launch."""
from __future__ import annotations

import math

import pytest
import torch

import ae_mlir as ae


def _t(*shape, dtype=torch.float32, device="cpu"):
    return torch.randn(*shape, dtype=dtype).to(device)


@pytest.mark.parametrize("backend", ["reference", None])
def test_zero_queries_or_batch_give_empty_output(backend):
    attn = ae.attention(mask_mod=lambda b, h, i, j: i >= j)
    for q_shape in ((2, 3, 0, 8), (0, 3, 4, 8)):
        q = _t(*q_shape)
        k = _t(q_shape[0], 3, 5, 8)
        out, lse = attn(q, k, k, return_lse=True, backend=backend)
        assert out.shape == (q_shape[0], 3, q_shape[2], 8) and lse.shape == q_shape[:3]


def test_zero_keys_give_zero_output_and_minus_inf_lse():
    q, k = _t(2, 3, 4, 8), _t(2, 3, 0, 8)
    out, lse = ae.attention()(q, k, k, return_lse=True)
    assert (out == 0).all() and torch.isneginf(lse).all()


def test_zero_length_linear_attention_passes_the_state_through():
    q = _t(1, 2, 0, 4)
    state = _t(1, 2, 4, 4)
    out, final = ae.linear_attention()(q, q, q, initial_state=state, return_state=True)
    assert out.shape == (1, 2, 0, 4)
    torch.testing.assert_close(final, state)


def test_zero_head_dim_is_rejected():
    with pytest.raises(ValueError, match="head dim 0"):
        ae.attention()(_t(1, 1, 4, 0), _t(1, 1, 4, 0), _t(1, 1, 4, 0))


def test_mismatched_devices_are_named():
    q = _t(1, 2, 4, 8)
    k = torch.empty(1, 2, 4, 8, device="meta")
    with pytest.raises(ValueError, match="q and k must have the same device"):
        ae.attention()(q, k, q)


def test_unsupported_dtype_is_named():
    q = _t(1, 2, 4, 8, dtype=torch.float64)
    with pytest.raises(ValueError, match="q must be float16, bfloat16 or float32"):
        ae.attention()(q, q, q)


def test_non_tensor_argument_is_a_type_error():
    with pytest.raises(TypeError, match="k must be a torch.Tensor"):
        ae.attention()(_t(1, 1, 4, 8), [[1.0]], _t(1, 1, 4, 8))


def test_nan_in_inputs_propagates_like_the_reference():
    q = _t(1, 1, 6, 8)
    q[0, 0, 2, 3] = math.nan
    out = ae.attention()(q, _t(1, 1, 6, 8), _t(1, 1, 6, 8))
    assert torch.isnan(out[0, 0, 2]).all()
    assert torch.isfinite(out[0, 0, [0, 1, 3, 4, 5]]).all()


def test_mod_returning_wrong_type_is_named():
    q = _t(1, 1, 4, 8)
    with pytest.raises(ValueError, match="mask_mod 'bad_mask' must return a boolean"):
        def bad_mask(b, h, i, j):
            return i - j

        ae.attention(mask_mod=bad_mask)(q, q, q)
    with pytest.raises(ValueError, match="score_mod 'returns_none' must return a scalar expression"):
        def returns_none(s, b, h, i, j):
            return None

        ae.attention(score_mod=returns_none)(q, q, q)
