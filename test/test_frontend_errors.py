"""The errors users see from the frontend: tracing errors that name the mod and the construct,
the APIs' argument validation, and the package's import."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import ae_mlir as ae
from ae_mlir.frontend.trace import TraceError
from test_frontend import B, D, H, L, REL, SLOPES, qkv

# --------------------------------------------------------------------------------------------
# errors: the message names the mod and the construct


def raises(match, fn):
    with pytest.raises((ValueError, TypeError), match=match) as info:
        fn()
    return info.value


def test_python_if_on_symbolic_value():
    def branchy(score, b, h, q_idx, kv_idx):
        if score > 0:
            return score
        return -score

    q, k, v = qkv(seed=30)
    err = raises("score_mod 'branchy'", lambda: ae.attention(score_mod=branchy)(q, k, v, backend="reference"))
    assert isinstance(err, TraceError)
    assert "`if`" in str(err) and "torch.where" in str(err)


def test_python_and_on_symbolic_values():
    def anded(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx and kv_idx > 2

    q, k, v = qkv(seed=31)
    err = raises("mask_mod 'anded'", lambda: ae.attention(mask_mod=anded).mlir(q, k, v))
    assert isinstance(err, TraceError) and "&" in str(err)


def test_unsupported_torch_function():
    def hyperbolic(score, b, h, q_idx, kv_idx):
        return torch.sinh(score)

    q, k, v = qkv(seed=32)
    err = raises("score_mod 'hyperbolic'", lambda: ae.attention(score_mod=hyperbolic).mlir(q, k, v))
    assert isinstance(err, TraceError) and "sinh" in str(err)


def test_unsupported_tensor_method():
    def hyperbolic(score, b, h, q_idx, kv_idx):
        return score.sinh()

    q, k, v = qkv(seed=33)
    err = raises("score_mod 'hyperbolic'", lambda: ae.attention(score_mod=hyperbolic).mlir(q, k, v))
    assert "sinh" in str(err)


def test_closure_tensor_wrong_number_of_indices():
    def short(score, b, h, q_idx, kv_idx):
        return score + REL[h]

    q, k, v = qkv(seed=34)
    err = raises("score_mod 'short'", lambda: ae.attention(score_mod=short).mlir(q, k, v))
    assert f"{tuple(REL.shape)}" in str(err) and "1 index" in str(err) and "exactly 2" in str(err)


def test_closure_tensor_unindexed():
    def whole(score, b, h, q_idx, kv_idx):
        return score + SLOPES

    q, k, v = qkv(seed=35)
    err = raises("score_mod 'whole'", lambda: ae.attention(score_mod=whole).mlir(q, k, v))
    assert "without indexing" in str(err)


@pytest.mark.parametrize("index", ["float_expr", "score"])
def test_closure_tensor_indexed_by_float(index):
    def float_index(score, b, h, q_idx, kv_idx):
        i = q_idx / 2 if index == "float_expr" else score
        return score + SLOPES[i]

    q, k, v = qkv(seed=36)
    err = raises("score_mod 'float_index'", lambda: ae.attention(score_mod=float_index).mlir(q, k, v))
    assert "integer" in str(err)


def test_closure_tensor_with_unsupported_dtype():
    table = torch.zeros(L, dtype=torch.complex64)

    def cplx(score, b, h, q_idx, kv_idx):
        return score + table[q_idx]

    q, k, v = qkv(seed=37)
    raises("score_mod 'cplx'.*complex64", lambda: ae.attention(score_mod=cplx).mlir(q, k, v))


@pytest.mark.parametrize("ret", ["float", "index"])
def test_mask_mod_must_return_boolean(ret):
    def not_a_mask(b, h, q_idx, kv_idx):
        return q_idx * 1.0 if ret == "float" else q_idx - kv_idx

    q, k, v = qkv(seed=38)
    err = raises("mask_mod 'not_a_mask'", lambda: ae.attention(mask_mod=not_a_mask).mlir(q, k, v))
    assert "boolean" in str(err)


def test_score_mod_returning_boolean():
    def cmp(score, b, h, q_idx, kv_idx):
        return score > 0

    q, k, v = qkv(seed=39)
    raises("score_mod 'cmp'.*float", lambda: ae.attention(score_mod=cmp).mlir(q, k, v))


def test_mod_returning_non_scalar():
    def tup(score, b, h, q_idx, kv_idx):
        return (score, score)

    q, k, v = qkv(seed=40)
    raises("score_mod 'tup'.*tuple", lambda: ae.attention(score_mod=tup).mlir(q, k, v))


def test_mod_that_raises_is_named():
    def divides(score, b, h, q_idx, kv_idx):
        return score + 1 / 0

    q, k, v = qkv(seed=41)
    err = raises("score_mod 'divides'.*ZeroDivisionError", lambda: ae.attention(score_mod=divides)(q, k, v))
    assert isinstance(err.__cause__, ZeroDivisionError)


def test_linear_mod_errors_name_the_role():
    def bad_v(x, b, h, t, d):
        if x > 0:
            return x
        return x

    q, k, v = qkv(seed=42)
    raises("v_mod 'bad_v'", lambda: ae.linear_attention(v_mod=bad_v)(q, k, v))

    def positive(x, b, h, t, d):
        return x > 0

    raises("k_mod 'positive'.*boolean", lambda: ae.linear_attention(k_mod=positive)(q, k, v))


def test_modulo_on_floats_is_rejected():
    def fmod(score, b, h, q_idx, kv_idx):
        return score % 2.0

    q, k, v = qkv(seed=43)
    raises("score_mod 'fmod'.*%", lambda: ae.attention(score_mod=fmod).mlir(q, k, v))


def test_invert_on_non_boolean_is_rejected():
    def inv(b, h, q_idx, kv_idx):
        return ~q_idx

    q, k, v = qkv(seed=44)
    raises("mask_mod 'inv'.*~", lambda: ae.attention(mask_mod=inv).mlir(q, k, v))


# --------------------------------------------------------------------------------------------
# API argument validation


def test_attention_constructor_arguments():
    raises("normalize.*'foo'", lambda: ae.attention(normalize="foo"))
    raises("score_mod", lambda: ae.attention(score_mod=3))
    raises("mask_mod", lambda: ae.attention(mask_mod="causal"))
    raises("scale", lambda: ae.attention(scale=float("nan")))
    raises("scale", lambda: ae.attention(scale="0.5"))


def test_attention_call_arguments():
    q, k, v = qkv(seed=50)
    attn = ae.attention()
    raises(r"q must have rank 4", lambda: attn(q[0], k, v))
    raises(r"k must have rank 4", lambda: attn(q, k[0], v))
    raises(r"q and k .*dtype", lambda: attn(q, k.half(), v.half()))
    raises(r"q and v .*dtype", lambda: attn(q, k, v.bfloat16()))
    raises(r"q must be float16, bfloat16 or float32", lambda: attn(q.double(), k.double(), v.double()))
    raises(r"q must be a torch.Tensor", lambda: attn(q.numpy(), k, v))
    raises(r"head dim", lambda: attn(q, k[..., :8], v))
    raises(r"batch size", lambda: attn(q, k[:1], v[:1]))
    raises(r"sequence length", lambda: attn(q, k, v[:, :, :5]))
    q4, k3, v3 = qkv(h=4, hkv=3, seed=51)
    raises(r"multiple of k/v heads", lambda: attn(q4, k3, v3))
    raises(r"return_lse.*normalize='softmax'.*'relu'", lambda: ae.attention(normalize="relu")(q, k, v, return_lse=True))
    raises(r"backend.*'foo'", lambda: attn(q, k, v, backend="foo"))


def test_linear_constructor_arguments():
    raises("decay.*'foo'", lambda: ae.linear_attention(decay="foo"))
    raises("normalize", lambda: ae.linear_attention(normalize="yes"))
    raises("q_mod", lambda: ae.linear_attention(q_mod=1.5))
    for bad in (0, -1, 2.5, True, 4096):
        raises("chunk_size", lambda: ae.linear_attention(chunk_size=bad))
    raises("scale", lambda: ae.linear_attention(scale=float("inf")))


@pytest.mark.parametrize("decay,bad_shape", [("head", (B, H, L)), ("token", (H,)), ("token", (B, H, L, D)),
                                             ("token_dim", (B, H, L)), ("token_dim", (B, H, L, D + 1))])
def test_linear_g_shape_must_match_decay(decay, bad_shape):
    q, k, v = qkv(seed=52)
    raises(rf"g for decay='{decay}' must have shape", lambda: ae.linear_attention(decay=decay)(q, k, v, torch.rand(*bad_shape)))


def test_linear_call_arguments():
    q, k, v = qkv(seed=53)
    raises(r"g was given but decay=None", lambda: ae.linear_attention()(q, k, v, -torch.rand(H)))
    raises(r"decay='token' needs g", lambda: ae.linear_attention(decay="token")(q, k, v))
    raises(r"g must be float16", lambda: ae.linear_attention(decay="head")(q, k, v, torch.arange(H)))
    raises(r"initial_state must have shape", lambda: ae.linear_attention()(q, k, v, initial_state=torch.rand(B, H, D, D + 1)))
    raises(r"q and k must have the same shape", lambda: ae.linear_attention()(q, k[:, :2], v))
    raises(r"backend.*'gpu'", lambda: ae.linear_attention()(q, k, v, backend="gpu"))


# --------------------------------------------------------------------------------------------
# packaging


def test_import_is_light():
    code = ("import ae_mlir, sys\n"
            "heavy = [m for m in ('torch', 'triton', 'mlir') if m in sys.modules]\n"
            "assert not heavy, heavy\n"
            "assert callable(ae_mlir.attention) and 'torch' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_unknown_attribute_of_package():
    with pytest.raises(AttributeError, match="no attribute 'flash'"):
        ae.flash  # noqa: B018
