"""Bad and degenerate input from Python: a clear ValueError/TypeError naming the argument, or an
empty result without a kernel launch."""
from __future__ import annotations

import math
import types

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


def test_an_integer_dtype_names_float64_for_the_reference_backend():
    q = _t(1, 2, 4, 8).to(torch.int32)
    with pytest.raises(ValueError, match=r"q must be float16, bfloat16, float32 or float64 \(backend='reference' "
                                         r"only\), got torch.int32"):
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


# --- devices -----------------------------------------------------------------------------------


def test_checks_still_run_after_a_call_that_passed():
    # A call's checks are skipped for tensors like ones that passed (their shapes, dtypes and
    # devices); anything else, and every other backend argument, is checked as on a first call.
    attn = ae.attention()
    q = _t(1, 2, 4, 8)
    attn(q, q, q)
    attn(q, q, q)
    with pytest.raises(ValueError, match="q and k must have the same head dim"):
        attn(q, _t(1, 2, 4, 6), _t(1, 2, 4, 6))
    with pytest.raises(ValueError, match="q and k must have the same dtype"):
        attn(q, q.half(), q.half())
    with pytest.raises(ValueError, match="q must be float16, bfloat16 or float32 for backend='cpu'"):
        attn(q.double(), q.double(), q.double())
    with pytest.raises(ValueError, match=r"backend='triton' runs on CUDA/ROCm tensors"):
        attn(q, q, q, backend="triton")
    with pytest.raises(ValueError, match="backend must be one of"):
        attn(q, q, q, backend=["cpu"])
    with pytest.raises(ValueError, match="q and k must have the same device"):
        attn(q, torch.empty(1, 2, 4, 8, device="meta"), q)
    # A subclass (a Parameter) is checked every time, and runs.
    weight = torch.nn.Parameter(q.clone(), requires_grad=False)
    torch.testing.assert_close(attn(weight, q, q), attn(q, q, q))


def test_triton_backend_on_cpu_tensors_says_what_to_do():
    q = _t(1, 2, 4, 8)
    with pytest.raises(ValueError, match=r"backend='triton' runs on CUDA/ROCm tensors.*'cpu'.*backend='cpu'"):
        ae.attention()(q, q, q, backend="triton")
    with pytest.raises(ValueError, match=r"backend='triton' runs on CUDA/ROCm tensors"):
        ae.linear_attention()(q, q, q, backend="triton")


def test_cpu_backend_on_gpu_tensors_says_what_to_do():
    from ae_mlir.frontend.checks import backend_for

    # Only the device is read, so a stand-in checks the rule without a GPU.
    gpu = types.SimpleNamespace(device=torch.device("cuda", 0))
    with pytest.raises(ValueError, match=r"backend='cpu' runs on CPU tensors.*'cuda:0'.*\.cpu\(\)"):
        backend_for("cpu", [("q", gpu), ("k", gpu)])
    assert backend_for(None, [("q", gpu)]) == "triton"


def test_closure_tensor_on_another_device_is_named():
    q = _t(1, 2, 4, 8)
    table = torch.empty(4, device="meta")
    with pytest.raises(ValueError, match=r"closure tensor 0 \(shape \(4,\)\).*'meta'"):
        ae.attention(score_mod=lambda s, b, h, i, j: s + table[i])(q, q, q)


# --- layout ------------------------------------------------------------------------------------


def test_bad_layout_is_named():
    with pytest.raises(ValueError, match="layout must be 'bhld'"):
        ae.attention(layout="bshd")
    with pytest.raises(ValueError, match="layout must be 'bhld'"):
        ae.linear_attention(layout=None)


def test_flash_attention_layout_is_recognised_in_the_error():
    q, k = _t(1, 5, 2, 8), _t(1, 7, 2, 8)  # [B, L, H, D] with Lq != Lk
    with pytest.raises(ValueError, match=r"look like \[B, L, H, D\]: pass layout='blhd'"):
        ae.attention()(q, k, k)
    with pytest.raises(ValueError, match=r"look like \[B, H, L, D\]: pass layout='bhld'"):
        ae.attention(layout="blhd").mlir(q.transpose(1, 2), k.transpose(1, 2), k.transpose(1, 2))


def test_fla_gate_layout_is_recognised_in_the_error():
    q = _t(1, 2, 16, 8)
    with pytest.raises(ValueError, match=r"g for decay='token' must have shape \(1, 2, 16\).*looks like "
                                         r"\[B, T, H\].*layout='blhd'"):
        ae.linear_attention(decay="token")(q, q, q, -torch.rand(1, 16, 2))


# --- closure indices ---------------------------------------------------------------------------


def _bias_mod(table):
    def bias_mod(score, b, h, q_idx, kv_idx):
        return score + table[q_idx]

    return bias_mod


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_closure_index_out_of_range_is_clamped_by_default(backend):
    table = torch.randn(10)
    q, k, v = _t(1, 2, 64, 8), _t(1, 2, 64, 8), _t(1, 2, 64, 8)
    out = ae.attention(score_mod=_bias_mod(table))(q, k, v, backend=backend)
    clamped = table[torch.arange(64).clamp(max=9)]
    scores = q @ k.transpose(2, 3) / math.sqrt(8) + clamped[:, None]
    torch.testing.assert_close(out, torch.softmax(scores, -1) @ v, atol=1e-5, rtol=1e-5)


def test_checked_mode_names_the_mod_tensor_dimension_and_a_point():
    q = _t(1, 2, 64, 8)
    attn = ae.attention(score_mod=_bias_mod(torch.randn(10)), check_indices=True)
    with pytest.raises(IndexError, match=r"score_mod 'bias_mod' \(defined at .*test_api_errors.py:\d+\): index 10 "
                                         r"is out of range for dimension 0 \(size 10\) of closure tensor 0 of shape "
                                         r"\(10,\), e.g. at \(b=0, h=0, q_idx=10, kv_idx=0\)"):
        attn(q, q, q, backend="reference")


def test_checked_mode_from_the_environment_covers_masks_and_feature_mods(monkeypatch):
    monkeypatch.setenv("AE_MLIR_CHECK", "1")
    q = _t(1, 2, 16, 8)
    doc = torch.zeros(12, dtype=torch.int64)

    def doc_mask(b, h, q_idx, kv_idx):
        return doc[q_idx] == doc[kv_idx]

    with pytest.raises(IndexError, match=r"mask_mod 'doc_mask'.*index 12 .*q_idx=12, kv_idx=0"):
        ae.attention(mask_mod=doc_mask)(q, q, q, backend="reference")
    scales = torch.ones(2, 4)

    def k_mod(x, b, h, t, d):
        return x * scales[h, d - 1]

    with pytest.raises(IndexError, match=r"k_mod 'k_mod'.*index -1 is out of range for dimension 1.*d=0"):
        ae.linear_attention(k_mod=k_mod)(q, q, q, backend="reference")
    ae.attention(mask_mod=doc_mask, check_indices=False)(q, q, q, backend="reference")


def test_checked_mode_passes_in_range_reads_and_score_dependent_indices():
    q = _t(1, 2, 16, 8)
    table = torch.randn(2, 31)

    def relative(score, b, h, q_idx, kv_idx):
        return score + table[h, q_idx - kv_idx + 15]

    def by_score(score, b, h, q_idx, kv_idx):
        return score + table[h, (score.abs() * 100).long()]

    attn = ae.attention(score_mod=relative, check_indices=True)
    torch.testing.assert_close(attn(q, q, q, backend="reference"),
                               ae.attention(score_mod=relative)(q, q, q, backend="reference"))
    with pytest.raises(IndexError, match=r"score_mod 'by_score'.*dimension 1 \(size 31\)"):
        ae.attention(score_mod=by_score, check_indices=True)(q, q, q * 10, backend="reference")


def test_empty_closure_tensor_is_named():
    q = _t(1, 1, 4, 8)
    empty = torch.zeros(0)
    with pytest.raises(ValueError, match=r"closure tensor of shape \(0,\) is empty"):
        ae.attention(score_mod=lambda s, b, h, i, j: s + empty[i])(q, q, q)
