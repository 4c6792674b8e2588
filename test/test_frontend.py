"""Tracing of mods into L0 `attn` modules: the emitted IR and its typing (the errors users see:
test_frontend_errors.py)."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.attention.flex_attention import and_masks, noop_mask, or_masks

import ae_mlir as ae
from ae_mlir.core.context import new_context, parse_module
from ae_mlir.core.verifier import verify_module

B, H, L, D = 2, 4, 17, 16


def rand(*shape, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


def qkv(h=H, hkv=None, lq=L, lk=L, dk=D, dv=D, dtype=torch.float32, seed=0):
    hkv = h if hkv is None else hkv
    return (rand(B, h, lq, dk, seed=seed, dtype=dtype), rand(B, hkv, lk, dk, seed=seed + 1, dtype=dtype),
            rand(B, hkv, lk, dv, seed=seed + 2, dtype=dtype))


def verified(text: str) -> str:
    """Parse `text` with the attn dialect loaded and assert the shape verifier has no complaint."""
    module = parse_module(text, new_context())
    assert verify_module(module) == []
    return text


def signature(text: str) -> str:
    return next(line for line in text.splitlines() if "func.func" in line)


def region_of(text: str, op: str) -> str:
    """The text of the first region of `"attn.<op>"` (from its header to its closing `})`)."""
    start = text.index(f'"attn.{op}"')
    return text[start:text.index("})", start)]


SLOPES = rand(H, seed=1)
DOC = torch.tensor([0] * 6 + [1] * 6 + [2] * 5, dtype=torch.int32)
REL = rand(H, 2 * L - 1, seed=2)


def alibi(score, b, h, q_idx, kv_idx):
    return score + SLOPES[h] * (kv_idx - q_idx)


def document(b, h, q_idx, kv_idx):
    return DOC[q_idx] == DOC[kv_idx]


def relpos(score, b, h, q_idx, kv_idx):
    return score + REL[h, q_idx - kv_idx + L - 1]


def softcap(score, b, h, q_idx, kv_idx):
    return 30.0 * torch.tanh(score / 30.0)


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def bucketed(score, b, h, q_idx, kv_idx):
    bucket = torch.clamp((q_idx - kv_idx) // 4, -3, 3) + 3
    return score + torch.where(bucket > 3, SLOPES[h], -SLOPES[h]) * bucket


SOFTMAX_MODULES = {
    "plain": dict(),
    "alibi_causal": dict(score_mod=alibi, mask_mod=causal),
    "document": dict(mask_mod=document),
    "relpos": dict(score_mod=relpos),
    "softcap": dict(score_mod=softcap, mask_mod=and_masks(causal, noop_mask)),
    "bucketed_sigmoid": dict(score_mod=bucketed, normalize="sigmoid"),
    "relu_or_masks": dict(mask_mod=or_masks(causal, document), normalize="relu"),
    "none": dict(normalize="none", scale=0.5),
}


@pytest.mark.parametrize("case", list(SOFTMAX_MODULES))
def test_attention_module_parses_and_verifies(case):
    q, k, v = qkv(h=4, hkv=2, lq=9, lk=L, dv=24, seed=3)
    verified(ae.attention(**SOFTMAX_MODULES[case]).mlir(q, k, v))


@pytest.mark.parametrize("dtype,elt", [(torch.float32, "f32"), (torch.bfloat16, "bf16"), (torch.float16, "f16")])
def test_module_types_follow_inputs(dtype, elt):
    q, k, v = qkv(h=4, hkv=2, lq=9, lk=L, dv=24, dtype=dtype, seed=4)
    text = verified(ae.attention().mlir(q, k, v))
    sig = signature(text)
    assert f"%q: tensor<{B}x4x9x{D}x{elt}>" in sig
    assert f"%k: tensor<{B}x2x{L}x{D}x{elt}>" in sig
    assert f"%v: tensor<{B}x2x{L}x24x{elt}>" in sig
    # output in q's dtype, lse always f32
    assert f"-> (tensor<{B}x4x9x24x{elt}>, tensor<{B}x4x9xf32>)" in sig
    assert f"scale = {1 / math.sqrt(D)}" in text


@pytest.mark.parametrize("decay,g_shape", [(None, None), ("head", (H,)), ("token", (B, H, L)),
                                           ("token_dim", (B, H, L, D))])
def test_linear_module_parses_and_verifies(decay, g_shape):
    q, k, v = qkv(dv=12, seed=5)
    g = None if g_shape is None else -torch.rand(*g_shape)
    s0 = rand(B, H, D, 12, seed=6)

    def elu1(x, b, h, t, d):
        return torch.where(x > 0, x + 1, torch.exp(x))

    lin = ae.linear_attention(q_mod=elu1, k_mod=elu1, decay=decay, normalize=decay is None)
    text = verified(lin.mlir(q, k, v, g, initial_state=s0))
    sig = signature(text)
    if g is not None:
        assert f"%g: tensor<{'x'.join(map(str, g_shape))}xf32>" in sig
    assert f"%s0: tensor<{B}x{H}x{D}x12xf32>" in sig
    assert f'decay = "{decay or "none"}"' in text
    assert f"-> (tensor<{B}x{H}x{L}x12xf32>, tensor<{B}x{H}x{D}x12xf32>)" in sig


def test_linear_capture_becomes_argument():
    dt = rand(B, H, L, seed=7).abs()

    def v_dt(x, b, h, t, d):
        return x * dt[b, h, t]

    q, k, v = qkv(seed=8)
    text = verified(ae.linear_attention(v_mod=v_dt).mlir(q, k, v))
    assert f"%c0: tensor<{B}x{H}x{L}xf32>" in signature(text)
    assert "tensor.extract" in region_of(text, "linear_recurrence")


def test_captures_of_different_types_in_one_op():
    # IRDL gives a variadic operand group one type; captures of different shapes and dtypes in one
    # op must still parse (they are read from the function's arguments, not passed as operands).
    w = rand(D, seed=9)
    dt = rand(B, H, L, seed=10)
    q, k, v = qkv(seed=11)
    lin = ae.linear_attention(q_mod=lambda x, b, h, t, d: x * w[d], v_mod=lambda x, b, h, t, d: x * dt[b, h, t])
    sig = signature(verified(lin.mlir(q, k, v)))
    assert f"%c0: tensor<{D}xf32>" in sig and f"%c1: tensor<{B}x{H}x{L}xf32>" in sig


# --------------------------------------------------------------------------------------------
# captures


def reads(region: str, tensor: str, index: str, size: int) -> bool:
    """Whether `region` reads `tensor` at `index` clamped into [0, size - 1], as the frontend
    writes every closure index."""
    import re

    const = r"(%\w+) = arith.constant (\d+) : index"
    consts = {name: int(value) for name, value in re.findall(const, region)}
    for low, arg, zero in re.findall(r"(%\w+) = arith.maxsi (%\w+), (%\w+) : index", region):
        if arg != index or consts.get(zero) != 0:
            continue
        for high, top in re.findall(rf"(%\w+) = arith.minsi {low}, (%\w+) : index", region):
            if consts.get(top) == size - 1 and f"tensor.extract {tensor}[{high}]" in region:
                return True
    return False


def test_captured_tensors_become_function_arguments():
    q, k, v = qkv(seed=12)
    text = verified(ae.attention(score_mod=alibi, mask_mod=document).mlir(q, k, v))
    sig = signature(text)
    assert f"%c0: tensor<{H}xf32>" in sig
    assert f"%c1: tensor<{L}xi32>" in sig
    assert "%c2" not in sig
    assert reads(region_of(text, "score_mod"), "%c0", "%h", H)
    assert reads(region_of(text, "mask"), "%c1", "%q_idx", L)


def test_tensor_shared_by_two_mods_is_one_argument():
    def doc_bias(score, b, h, q_idx, kv_idx):
        return score + DOC[kv_idx]

    q, k, v = qkv(seed=13)
    text = verified(ae.attention(score_mod=doc_bias, mask_mod=document).mlir(q, k, v))
    sig = signature(text)
    assert f"%c0: tensor<{L}xi32>" in sig and "%c1" not in sig
    assert reads(region_of(text, "score_mod"), "%c0", "%kv_idx", L)
    assert reads(region_of(text, "mask"), "%c0", "%q_idx", L)


def test_capture_dtypes_map_to_element_types():
    allowed = torch.rand(L, L, generator=torch.Generator().manual_seed(14)) > 0.3
    table = rand(H, L, seed=15, dtype=torch.bfloat16)

    def from_bool(b, h, q_idx, kv_idx):
        return allowed[q_idx, kv_idx]

    def from_bf16(score, b, h, q_idx, kv_idx):
        return score + table[h, kv_idx]

    q, k, v = qkv(seed=16)
    text = verified(ae.attention(score_mod=from_bf16, mask_mod=from_bool).mlir(q, k, v))
    sig = signature(text)
    assert f"tensor<{H}x{L}xbf16>" in sig and f"tensor<{L}x{L}xi1>" in sig
    assert "arith.extf" in region_of(text, "score_mod")  # bf16 storage widened to f32
    # and numerically: the bool tensor keeps exactly its True pairs, the bf16 table adds a bias
    o = ae.attention(score_mod=from_bf16, mask_mod=from_bool)(q, k, v, backend="reference")
    s = q.double() @ k.double().transpose(-1, -2) / math.sqrt(D) + table.double().view(1, H, 1, L)
    p = torch.softmax(s.masked_fill(~allowed, -math.inf), dim=-1).nan_to_num(0.0)
    torch.testing.assert_close(o.double(), p @ v.double(), atol=1e-5, rtol=1e-5)


def test_zero_dim_closure_tensor_is_a_capture():
    temperature = torch.tensor(0.7)

    def temp(score, b, h, q_idx, kv_idx):
        return score / temperature

    q, k, v = qkv(seed=17)
    text = verified(ae.attention(score_mod=temp).mlir(q, k, v))
    # A scalar travels as a one-element vector: backends then need no rank-0 memrefs or pointers.
    assert "%c0: tensor<1xf32>" in signature(text)
    want = ae.attention(scale=1 / (math.sqrt(D) * 0.7))(q, k, v, backend="reference")
    for backend in ("reference", "cpu"):
        o = ae.attention(score_mod=temp)(q, k, v, backend=backend)
        torch.testing.assert_close(o, want, atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------------------------
# operators -> arith/math ops, and the types they keep


def mod_text(score_mod=None, mask_mod=None, **kw):
    q, k, v = qkv(seed=18)
    return verified(ae.attention(score_mod=score_mod, mask_mod=mask_mod, **kw).mlir(q, k, v))


@pytest.mark.parametrize("fn,ops", [
    (lambda s, b, h, qi, ki: s + SLOPES[h] * ((qi - ki) // 3), ["arith.floordivsi", "tensor.extract", "arith.subi"]),
    (lambda s, b, h, qi, ki: 2.0 * torch.tanh(s / 2.0), ["math.tanh", "arith.divf", "arith.mulf"]),
    (lambda s, b, h, qi, ki: torch.where(qi >= ki, s, -s), ["arith.select", "arith.cmpi sge", "arith.negf"]),
    (lambda s, b, h, qi, ki: torch.exp(s) + torch.sigmoid(s), ["math.exp"]),
    (lambda s, b, h, qi, ki: torch.clamp(s, -1.0, 1.0), ["arith.maximumf", "arith.minimumf"]),
    (lambda s, b, h, qi, ki: s.clamp(min=0.0).abs(), ["arith.maximumf", "math.absf"]),
    (lambda s, b, h, qi, ki: s * torch.rsqrt(torch.abs(s) + 1), ["math.rsqrt", "math.absf"]),
    (lambda s, b, h, qi, ki: s - (qi - ki).abs(), ["math.absi", "arith.sitofp"]),
    (lambda s, b, h, qi, ki: torch.maximum(s, torch.log2(torch.exp2(s))), ["math.exp2", "math.log2", "arith.maximumf"]),
    (lambda s, b, h, qi, ki: torch.where(s > 0.5, s, 0.0), ["arith.cmpf ogt", "arith.select"]),
])
def test_operators_emit_expected_ops(fn, ops):
    region = region_of(mod_text(score_mod=fn), "score_mod")
    for op in ops:
        assert op in region, (op, region)


def test_mask_operators():
    def m(b, h, q_idx, kv_idx):
        return ((q_idx - kv_idx) % 3 == 0) | ~(kv_idx < 2) & (b != h)

    region = region_of(mod_text(mask_mod=m), "mask")
    for op in ("arith.remsi", "arith.ori", "arith.andi", "arith.xori", "arith.cmpi eq", "arith.cmpi slt",
               "arith.cmpi ne"):
        assert op in region, op
    assert "f32" not in region  # pure index/boolean logic, no float detour


def test_index_arithmetic_stays_integer():
    def m(b, h, q_idx, kv_idx):
        return (q_idx - kv_idx) * 2 + 1 <= (kv_idx // 3) * 5

    region = region_of(mod_text(mask_mod=m), "mask")
    assert "arith.muli" in region and "arith.addi" in region and "arith.floordivsi" in region
    assert "sitofp" not in region and "f32" not in region
    assert "arith.constant 2 : index" in region


def test_score_times_int_stays_float():
    region = region_of(mod_text(score_mod=lambda s, b, h, qi, ki: s * 2), "score_mod")
    assert "arith.constant 2.0 : f32" in region
    assert "arith.mulf" in region and "arith.muli" not in region
    assert '"gpu.yield"' in region and "(f32) -> ()" in region


def test_true_division_of_indices_is_float():
    region = region_of(mod_text(score_mod=lambda s, b, h, qi, ki: s + qi / 4), "score_mod")
    assert "arith.sitofp" in region and "arith.divf" in region and "arith.floordivsi" not in region


def test_score_mod_returning_index_is_cast_to_float():
    # a pure position bias: the region must still yield f32
    region = region_of(mod_text(score_mod=lambda s, b, h, qi, ki: ki - qi), "score_mod")
    assert "arith.sitofp" in region and "(f32) -> ()" in region


def test_python_modulo_follows_python_semantics():
    # (q_idx - kv_idx) is negative above the diagonal: C's remainder would differ from Python's
    def every_third(b, h, q_idx, kv_idx):
        return (q_idx - kv_idx) % 3 == 0

    def shifted(b, h, q_idx, kv_idx):
        return (kv_idx - q_idx) % -4 == -1  # a negative divisor too

    q, k, v = qkv(lq=13, lk=20, seed=19)
    qi, ki = torch.arange(13).view(-1, 1), torch.arange(20).view(1, -1)
    for mask_mod, keep in ((every_third, torch.remainder(qi - ki, 3) == 0),
                           (shifted, torch.remainder(ki - qi, -4) == -1)):
        o = ae.attention(mask_mod=mask_mod)(q, k, v, backend="reference")
        s = q.double() @ k.double().transpose(-1, -2) / math.sqrt(D)
        p = torch.softmax(s.masked_fill(~keep, -math.inf), dim=-1).nan_to_num(0.0)
        torch.testing.assert_close(o.double(), p @ v.double(), atol=1e-5, rtol=1e-5)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(shift=st.integers(-9, 9), m=st.integers(-5, 5).filter(lambda m: m != 0), r=st.integers(-4, 4),
       d=st.integers(-4, 4).filter(lambda d: d != 0))
def test_integer_floordiv_and_mod_match_torch(shift, m, r, d):
    # both operands' signs vary: C-style truncation would differ from Python/torch floor semantics
    def keep(b, h, q_idx, kv_idx):
        x = q_idx - kv_idx + shift
        return (x % m == r) | (x // d == r)

    qi, ki = torch.arange(5).view(-1, 1), torch.arange(7).view(1, -1)
    x = qi - ki + shift
    want = (torch.remainder(x, m) == r) | (torch.div(x, d, rounding_mode="floor") == r)
    q, k, v = (rand(1, 1, n, 4, seed=70 + i) for i, n in enumerate((5, 7, 7)))
    o = ae.attention(mask_mod=keep, normalize="none", scale=1.0)(q, k, v, backend="reference")
    s = (q.double() @ k.double().transpose(-1, -2)).masked_fill(~want, 0.0)
    torch.testing.assert_close(o.double(), s @ v.double(), atol=1e-5, rtol=1e-5)


def test_python_floordiv_on_negative_indices():
    def bias(score, b, h, q_idx, kv_idx):
        return score + (q_idx - kv_idx) // 4

    q, k, v = qkv(seed=20)
    o = ae.attention(score_mod=bias)(q, k, v, backend="reference")
    qi, ki = torch.arange(L).view(-1, 1), torch.arange(L).view(1, -1)
    s = q.double() @ k.double().transpose(-1, -2) / math.sqrt(D) + torch.div(qi - ki, 4, rounding_mode="floor")
    torch.testing.assert_close(o.double(), torch.softmax(s, -1) @ v.double(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("c", [1e-5, 2.5e-7, 1e20, 1e39, -0.1])
def test_float_constants_in_any_notation(c):
    # repr() gives "1e-05" / "1e+20", which MLIR's float literal grammar rejects without a '.'
    def bump(score, b, h, q_idx, kv_idx):
        return torch.minimum(score + c * (kv_idx + 1), torch.tensor(3.0))

    q, k, v = qkv(seed=24)
    o = ae.attention(score_mod=bump)(q, k, v, backend="reference")
    s = q.double() @ k.double().transpose(-1, -2) / math.sqrt(D)
    # the constant is an f32 literal: 1e39 becomes +inf there, clamped back to 3 by minimum
    c32 = torch.tensor(c, dtype=torch.float32).double()
    s = torch.minimum(s + c32 * torch.arange(1, L + 1).double(), torch.tensor(3.0, dtype=torch.float64))
    torch.testing.assert_close(o.double(), torch.softmax(s, -1) @ v.double(), atol=1e-5, rtol=1e-5)


def test_constant_masks():
    q, k, v = qkv(seed=21)
    full = ae.attention()(q, k, v, backend="reference")
    torch.testing.assert_close(ae.attention(mask_mod=lambda b, h, qi, ki: True)(q, k, v, backend="reference"), full)
    none = ae.attention(mask_mod=lambda b, h, qi, ki: False)(q, k, v, backend="reference")
    assert (none == 0).all()


def test_where_of_minus_infinity_acts_like_a_mask():
    def causal_by_score(score, b, h, q_idx, kv_idx):
        return torch.where(q_idx >= kv_idx, score, float("-inf"))

    q, k, v = qkv(seed=22)
    text = mod_text(score_mod=causal_by_score)
    assert "0xFF800000" in text
    o, lse = ae.attention(score_mod=causal_by_score)(q, k, v, return_lse=True, backend="reference")
    o2, lse2 = ae.attention(mask_mod=causal)(q, k, v, return_lse=True, backend="reference")
    torch.testing.assert_close(o, o2)
    torch.testing.assert_close(lse, lse2)


def test_tensor_method_forms():
    def methods(score, b, h, q_idx, kv_idx):
        return score.clamp(-2.0, 2.0).exp().where(q_idx > kv_idx, score.abs()) + (q_idx - kv_idx).abs().float()

    q, k, v = qkv(seed=23)
    o = ae.attention(score_mod=methods)(q, k, v, backend="reference")
    s = q.double() @ k.double().transpose(-1, -2) / math.sqrt(D)
    qi, ki = torch.arange(L).view(-1, 1), torch.arange(L).view(1, -1)
    s = torch.where(qi > ki, s.clamp(-2.0, 2.0).exp(), s.abs()) + (qi - ki).abs()
    torch.testing.assert_close(o.double(), torch.softmax(s, -1) @ v.double(), atol=1e-5, rtol=1e-5)


def test_flex_helpers_trace_to_boolean_constants():
    # and_masks/or_masks/noop_mask call b.new_ones/new_zeros(dtype=torch.bool)
    text = mod_text(mask_mod=and_masks(noop_mask, or_masks(causal)))
    region = region_of(text, "mask")
    assert "arith.constant true" in region and "arith.constant false" in region
