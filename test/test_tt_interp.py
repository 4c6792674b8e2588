"""Tests of the TTIR interpreter (test/tt_interp.py) on Triton's own TTIR for small kernels.

No GPU is needed: `ttir_from_triton` runs Triton's front end and the CUDA backend's `make_ttir`
stage (target-independent passes) for GPUTarget("cuda", 90, 32) and stops there, so neither a
driver nor ptxas runs. Sizes are deliberately not multiples of the block sizes.
"""

import math

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from tt_interp import OutOfBoundsError, run_ttir
from tt_pretty import generic_from_pretty_ttir, ttir_from_triton

RNG = np.random.default_rng(0)


def randn(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def bf16(x):
    return torch.from_numpy(np.asarray(x, np.float32)).bfloat16().float().numpy()


@triton.jit
def add_kernel(x, y, o, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(o + offs, tl.load(x + offs, mask=m, other=0.0) + tl.load(y + offs, mask=m), mask=m)


@triton.jit
def add_unmasked_kernel(x, y, o, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(o + offs, tl.load(x + offs) + tl.load(y + offs))


@triton.jit
def matmul_kernel(a, b, c, M, N, K, sam, sak, sbk, sbn, scm, scn,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        ka = k0 + rk
        x = tl.load(a + rm[:, None] * sam + ka[None, :] * sak, mask=(rm[:, None] < M) & (ka[None, :] < K), other=0.0)
        y = tl.load(b + ka[:, None] * sbk + rn[None, :] * sbn, mask=(ka[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(x, y, acc)
    tl.store(c + rm[:, None] * scm + rn[None, :] * scn, acc.to(c.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def softmax_kernel(x, y, C, sx, sy, BC: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BC)
    v = tl.load(x + row * sx + cols, mask=cols < C, other=-float("inf"))
    v = v - tl.max(v, axis=0)
    e = tl.exp(v)
    tl.store(y + row * sy + cols, e / tl.sum(e, axis=0), mask=cols < C)


@triton.jit
def attention_kernel(Q, K, V, O, sm_scale, Lq, Lk, sqh, sqm, skh, skn, svh, svn, soh, som,
                     D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, CAUSAL: tl.constexpr):
    h = tl.program_id(1)
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.arange(0, BN)
    rd = tl.arange(0, D)
    q = tl.load(Q + h * sqh + rm[:, None] * sqm + rd[None, :], mask=rm[:, None] < Lq, other=0.0)
    m_i = tl.full((BM,), -float("inf"), tl.float32)
    l_i = tl.zeros((BM,), tl.float32)
    acc = tl.zeros((BM, D), tl.float32)
    qk_scale = sm_scale * 1.4426950408889634
    for start in range(0, Lk, BN):
        cn = start + rn
        k = tl.load(K + h * skh + cn[:, None] * skn + rd[None, :], mask=cn[:, None] < Lk, other=0.0)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        keep = cn[None, :] < Lk
        if CAUSAL:
            keep = keep & (cn[None, :] <= rm[:, None])
        s = tl.where(keep, s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
        p = tl.math.exp2(s - m_safe[:, None])
        alpha = tl.math.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + h * svh + cn[:, None] * svn + rd[None, :], mask=cn[:, None] < Lk, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), v)
        m_i = m_new
    acc = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    tl.store(O + h * soh + rm[:, None] * som + rd[None, :], acc.to(tl.float16), mask=rm[:, None] < Lq)


@triton.jit
def reductions_kernel(x, amax, csum, total, R, C, BR: tl.constexpr, BC: tl.constexpr):
    rows = tl.arange(0, BR)
    cols = tl.arange(0, BC)
    m = (rows[:, None] < R) & (cols[None, :] < C)
    v = tl.load(x + rows[:, None] * C + cols[None, :], mask=m, other=-1.0e30)
    tl.store(amax + rows, tl.argmax(v, axis=1), mask=rows < R)
    tl.store(csum + rows[:, None] * C + cols[None, :], tl.cumsum(tl.where(m, v, 0.0), axis=1), mask=m)
    tl.store(total, tl.sum(tl.reshape(tl.where(m, v, 0.0), (BR * BC,)), axis=0))


@triton.jit(noinline=True)
def scaled(v, s):
    return v * s


@triton.jit
def control_flow_kernel(x, o, n, step):
    pid = tl.program_id(0)
    acc = 0.0
    i = pid
    while i < n:
        acc += tl.load(x + i)
        i += step * tl.num_programs(0)
    if pid % 2 == 0:
        acc = scaled(acc, 2.0)
    else:
        acc = -acc
    tl.store(o + pid, acc)
    if pid == 0:
        tl.store(o + tl.num_programs(0), acc)


@triton.jit
def int_and_cmp_kernel(a, b, x, y, q, r, shr, cmp, h, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK).to(tl.int64)
    m = offs < n
    ia = tl.load(a + offs, mask=m, other=1)
    ib = tl.load(b + offs, mask=m, other=1)
    tl.store(q + offs, ia // ib, mask=m)
    tl.store(r + offs, ia % ib, mask=m)
    tl.store(shr + offs, ia >> 2, mask=m)
    fx = tl.load(x + offs, mask=m, other=0.0)
    fy = tl.load(y + offs, mask=m, other=0.0)
    bits = ((fx < fy).to(tl.int32) | ((fx <= fy).to(tl.int32) << 1) | ((fx == fy).to(tl.int32) << 2)
            | ((fx != fy).to(tl.int32) << 3) | ((fx > fy).to(tl.int32) << 4) | ((fx >= fy).to(tl.int32) << 5))
    tl.store(cmp + offs, bits, mask=m)
    tl.store(h + offs, fx.to(tl.float16, fp_downcast_rounding="rtz"), mask=m)


@triton.jit
def math_kernel(x, y, o, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    a = tl.load(x + offs, mask=m, other=1.0)
    b = tl.load(y + offs, mask=m, other=1.0)
    r = tl.sqrt_rn(tl.abs(a)) + tl.div_rn(a, b) + tl.clamp(a, -0.5, 0.5) + tl.fma(a, b, a) + tl.erf(a)
    r += tl.rsqrt(tl.abs(b)) + tl.floor(a) + tl.ceil(b) + tl.exp(a) + tl.log(tl.abs(b)) + tl.sin(a) + tl.cos(b)
    r += tl.minimum(a, b) + tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL) + tl.sqrt(tl.abs(b))
    tl.store(o + offs, r + tl.log2(tl.abs(a)), mask=m, cache_modifier=".cg", eviction_policy="evict_last")


def i32s(*names):
    return {n: "i32" for n in names}


ADD_SIG = {"x": "*fp32", "y": "*fp32", "o": "*fp32", "n": "i32"}
MATMUL_SIG = dict(a="*fp32", b="*fp32", c="*fp32", **i32s("M", "N", "K", "sam", "sak", "sbk", "sbn", "scm", "scn"))
SOFTMAX_SIG = dict(x="*fp32", y="*fp32", **i32s("C", "sx", "sy"))
ATTENTION_SIG = dict(Q="*fp16", K="*fp16", V="*fp16", O="*fp16", sm_scale="fp32",
                     **i32s("Lq", "Lk", "sqh", "sqm", "skh", "skn", "svh", "svn", "soh", "som"))
REDUCTIONS_SIG = dict(x="*fp32", amax="*i32", csum="*fp32", total="*fp32", **i32s("R", "C"))
CONTROL_FLOW_SIG = dict(x="*fp32", o="*fp32", **i32s("n", "step"))
MATH_SIG = dict(x="*fp32", y="*fp32", o="*fp32", n="i32")
INT_AND_CMP_SIG = dict(a="*i32", b="*i32", x="*fp32", y="*fp32", q="*i32", r="*i32", shr="*i32", cmp="*i32",
                       h="*fp16", n="i32")


def test_vector_add_fp32():
    ttir = ttir_from_triton(add_kernel, ADD_SIG, {"BLOCK": 128})
    n = 1000
    x, y, o = randn(n), randn(n), np.zeros(n, np.float32)
    run_ttir(ttir, "add_kernel", [x, y, o, n], (triton.cdiv(n, 128), 1, 1))
    np.testing.assert_array_equal(o, x + y)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_vector_add_half_types_round_like_the_gpu(dtype):
    sig = {**ADD_SIG, "x": f"*{dtype}", "y": f"*{dtype}", "o": f"*{dtype}"}
    ttir = ttir_from_triton(add_kernel, sig, {"BLOCK": 64})
    n = 100
    if dtype == "fp16":
        x, y, o = randn(n, dtype=np.float16), randn(n, dtype=np.float16), np.zeros(n, np.float16)
        expected = x + y
    else:
        x, y, o = bf16(randn(n)), bf16(randn(n)), np.zeros(n, np.float32)
        expected = bf16(x + y)
    run_ttir(ttir, None, [x, y, o, n], (2,))
    np.testing.assert_array_equal(o, expected)


def test_unmasked_out_of_bounds_access_raises():
    ttir = ttir_from_triton(add_unmasked_kernel, {"x": "*fp32", "y": "*fp32", "o": "*fp32"}, {"BLOCK": 64})
    n = 100
    x, y, o = randn(n), randn(n), np.zeros(n, np.float32)
    with pytest.raises(OutOfBoundsError, match=r"tt.load .*element 100 of argument buffer #0 \(size 100\)"):
        run_ttir(ttir, None, [x, y, o], (2,))
    run_ttir(ttir, None, [x[:64].copy(), y[:64].copy(), o[:64]], (1,))
    np.testing.assert_array_equal(o[:64], x[:64] + y[:64])


@pytest.mark.parametrize("in_dtype", [np.float32, np.float16])
def test_matmul_k_loop(in_dtype):
    M, N, K = 70, 45, 50
    tname = {np.float32: "*fp32", np.float16: "*fp16"}[in_dtype]
    ttir = ttir_from_triton(matmul_kernel, {**MATMUL_SIG, "a": tname, "b": tname}, dict(BM=32, BN=32, BK=16))
    a, b, c = randn(M, K, dtype=in_dtype), randn(K, N, dtype=in_dtype), np.zeros((M, N), np.float32)
    run_ttir(ttir, "matmul_kernel", [a, b, c, M, N, K, K, 1, N, 1, N, 1], (3, 2, 1))
    ref = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(c, ref, rtol=1e-5, atol=1e-5)


def test_row_softmax():
    R, C = 7, 100
    ttir = ttir_from_triton(softmax_kernel, SOFTMAX_SIG, {"BC": 128})
    x, y = randn(R, C) * 3, np.full((R, C), np.nan, np.float32)
    run_ttir(ttir, None, [x, y, C, C, C], (R,))
    e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(y, e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("causal", [False, True])
def test_flash_attention_fp16(causal):
    H, Lq, Lk, D = 2, 70, 90, 32
    ttir = ttir_from_triton(attention_kernel, ATTENTION_SIG, dict(D=D, BM=32, BN=16, CAUSAL=causal))
    q, k, v = randn(H, Lq, D, dtype=np.float16), randn(H, Lk, D, dtype=np.float16), randn(H, Lk, D, dtype=np.float16)
    o = np.zeros((H, Lq, D), np.float16)
    scale = D ** -0.5
    run_ttir(ttir, None, [q, k, v, o, scale, Lq, Lk, Lq * D, D, Lk * D, D, Lk * D, D, Lq * D, D],
             (triton.cdiv(Lq, 32), H, 1))
    s = np.einsum("hqd,hkd->hqk", q.astype(np.float64), k.astype(np.float64)) * scale
    if causal:
        s = np.where(np.arange(Lk)[None, :] <= np.arange(Lq)[:, None], s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    ref = np.einsum("hqk,hkd->hqd", p / p.sum(axis=-1, keepdims=True), v.astype(np.float64))
    np.testing.assert_allclose(o.astype(np.float64), ref, rtol=0, atol=2e-3)


def test_general_reduce_scan_and_reshape():
    R, C = 5, 13
    ttir = ttir_from_triton(reductions_kernel, REDUCTIONS_SIG, {"BR": 8, "BC": 16})
    assert '"tt.reduce"' in ttir and '"tt.scan"' in ttir and '"tt.reshape"' in ttir
    x = randn(R, C)
    x[2, 4] = x[2, 9] = 10.0
    amax, csum, total = np.zeros(R, np.int32), np.zeros((R, C), np.float32), np.zeros(1, np.float32)
    run_ttir(ttir, None, [x, amax, csum, total, R, C], (1,))
    np.testing.assert_array_equal(amax, np.argmax(x, axis=1))
    np.testing.assert_allclose(csum, np.cumsum(x.astype(np.float64), axis=1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(total[0], x.astype(np.float64).sum(), rtol=1e-5)


def test_while_if_call_and_num_programs():
    ttir = ttir_from_triton(control_flow_kernel, CONTROL_FLOW_SIG, {})
    assert all(f'"{op}"' in ttir for op in ("scf.while", "scf.if", "tt.call", "tt.get_num_programs"))
    n, programs = 23, 4
    x, o = randn(n), np.zeros(programs + 1, np.float32)
    run_ttir(ttir, "control_flow_kernel", [x, o, n, 1], (programs,))
    sums = np.array([x[p::programs].astype(np.float64).sum() for p in range(programs)])
    expected = np.where(np.arange(programs) % 2 == 0, 2 * sums, -sums)
    np.testing.assert_allclose(o, np.append(expected, expected[0]), rtol=1e-6)


def test_integer_division_shift_nan_comparisons_and_rtz():
    n = 12
    a = np.array([7, -7, 7, -7, 0, 9, -9, 1, -1, 100, -100, 5], np.int32)
    b = np.array([2, 2, -2, -2, 3, 4, 4, -3, 3, 7, 7, 5], np.int32)
    x = np.array([1, np.nan, 2, -np.inf, 0, -0.0, np.nan, 3, 1, 1, 2, 1 + 3 * 2 ** -12], np.float32)
    y = np.array([2, 1, 2, np.inf, -0.0, 0, np.nan, 1, 1, np.nan, 2, 0], np.float32)
    outs = dict(q=np.zeros(n, np.int32), r=np.zeros(n, np.int32), shr=np.zeros(n, np.int32),
                cmp=np.zeros(n, np.int32), h=np.zeros(n, np.float16))
    ttir = ttir_from_triton(int_and_cmp_kernel, INT_AND_CMP_SIG, {"BLOCK": 16})
    assert '"tt.fp_to_fp"' in ttir
    run_ttir(ttir, None, [a, b, x, y, *outs.values(), n], (1,))
    np.testing.assert_array_equal(outs["q"], np.trunc(a / b).astype(np.int32))
    np.testing.assert_array_equal(outs["r"], a - b * np.trunc(a / b).astype(np.int32))
    np.testing.assert_array_equal(outs["shr"], a >> 2)
    with np.errstate(invalid="ignore"):
        expected = sum(c.astype(np.int32) << i for i, c in enumerate([x < y, x <= y, x == y, x != y, x > y, x >= y]))
    np.testing.assert_array_equal(outs["cmp"], expected)
    rtz = x.astype(np.float16)
    rtz = np.where(np.abs(rtz.astype(np.float32)) > np.abs(x), np.nextafter(rtz, np.float16(0)), rtz)
    np.testing.assert_array_equal(outs["h"], rtz)
    assert outs["h"][-1] == np.float16(1.0) and x[-1].astype(np.float16) > 1.0


def test_math_ops():
    ttir = ttir_from_triton(math_kernel, MATH_SIG, {"BLOCK": 64})
    assert all(f'"{op}"' in ttir for op in ("tt.precise_sqrt", "tt.precise_divf", "tt.clampf", "math.erf"))
    n = 100
    x, y, o = randn(n), randn(n), np.zeros(n, np.float32)
    run_ttir(ttir, None, [x, y, o, n], (2,))
    a, b = x.astype(np.float64), y.astype(np.float64)
    ref = (np.sqrt(abs(a)) + a / b + np.clip(a, -0.5, 0.5) + a * b + a + np.vectorize(math.erf)(a)
           + 1 / np.sqrt(abs(b)) + np.floor(a) + np.ceil(b) + np.exp(a) + np.log(abs(b)) + np.sin(a) + np.cos(b)
           + np.minimum(a, b) + np.maximum(a, b) + np.sqrt(abs(b)) + np.log2(abs(a)))
    np.testing.assert_allclose(o, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kernel, signature, constexprs", [
    (add_kernel, ADD_SIG, {"BLOCK": 128}),
    (matmul_kernel, MATMUL_SIG, dict(BM=32, BN=32, BK=16)),
    (softmax_kernel, SOFTMAX_SIG, {"BC": 128}),
    (attention_kernel, ATTENTION_SIG, dict(D=32, BM=32, BN=16, CAUSAL=True)),
    (reductions_kernel, REDUCTIONS_SIG, {"BR": 8, "BC": 16}),
    (control_flow_kernel, CONTROL_FLOW_SIG, {}),
    (int_and_cmp_kernel, INT_AND_CMP_SIG, {"BLOCK": 16}),
    (math_kernel, MATH_SIG, {"BLOCK": 64}),
], ids=lambda p: getattr(p, "__name__", ""))
def test_generic_text_round_trips_through_triton(tmp_path, kernel, signature, constexprs):
    """Triton parses the generic form the interpreter reads, verifies it and prints back the same TTIR."""
    from triton._C.libtriton import ir
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend

    generic = ttir_from_triton(kernel, signature, constexprs)
    path = tmp_path / "kernel.ttir"
    path.write_text(generic)
    context = ir.context()
    ir.load_dialects(context)
    make_backend(GPUTarget("cuda", 90, 32)).load_dialects(context)
    module = ir.parse_mlir_module(str(path), context)
    assert module.verify()
    assert generic_from_pretty_ttir(module.str_nodebug()) == generic


HAND_WRITTEN = """
"builtin.module"() ({
  "tt.func"() <{function_type = (!tt.ptr<f32>) -> (), sym_name = "k", sym_visibility = "public"}> ({
  ^bb0(%arg0: !tt.ptr<f32>):
    %0 = "tt.make_range"() {end = 4 : i32, start = 0 : i32} : () -> tensor<4xi32>
    %1 = "tt.splat"(%arg0) : (!tt.ptr<f32>) -> tensor<4x!tt.ptr<f32>>
    %2 = "tt.addptr"(%1, %0) : (tensor<4x!tt.ptr<f32>>, tensor<4xi32>) -> tensor<4x!tt.ptr<f32>>
    %3 = "tt.load"(%2) {cache = 1 : i32, evict = 1 : i32, isVolatile = false, operandSegmentSizes = array<i32: 1, 0, 0>} : (tensor<4x!tt.ptr<f32>>) -> tensor<4xf32>
    %4 = "OP"(%3) : (tensor<4xf32>) -> tensor<4xf32>
    "tt.store"(%2, %4) {cache = 1 : i32, evict = 1 : i32} : (tensor<4x!tt.ptr<f32>>, tensor<4xf32>) -> ()
    "tt.return"() : () -> ()
  }) {noinline = false} : () -> ()
}) : () -> ()
"""


@pytest.mark.parametrize("op, ref", [
    ("math.sqrt", np.sqrt), ("math.tanh", np.tanh), ("math.exp2", np.exp2), ("math.rsqrt", lambda x: 1 / np.sqrt(x)),
    ("math.absf", np.abs), ("arith.negf", np.negative),
])
def test_hand_written_generic_ttir(op, ref):
    x = np.array([1.0, -2.0, 0.25, 9.0], np.float32)
    with np.errstate(invalid="ignore"):
        expected = ref(x)
    run_ttir(HAND_WRITTEN.replace('"OP"', f'"{op}"'), "k", [x], (1,))
    np.testing.assert_allclose(x, expected, rtol=1e-6)


def test_unknown_op_and_bad_arguments_are_reported():
    with pytest.raises(NotImplementedError, match="tt.histogram"):
        run_ttir(HAND_WRITTEN.replace('"OP"', '"tt.histogram"'), "k", [np.zeros(4, np.float32)], (1,))
    good = HAND_WRITTEN.replace('"OP"', '"math.exp"')
    with pytest.raises(TypeError, match=r"!tt.ptr<f32> but the array is float64"):
        run_ttir(good, "k", [np.zeros(4)], (1,))
    with pytest.raises(TypeError, match="takes 1 arguments, got 2"):
        run_ttir(good, "k", [np.zeros(4, np.float32), 3], (1,))
