"""The CPU lowering's math expansions (`attn-cpu-legalize-for-llvm` runs them): f32 erf, tanh,
expm1, exp, exp2, log, log2 and log1p written as polynomials and exponent arithmetic, scalar or
vector, in place of what the upstream LLVM conversion makes of them (sin and cos, which take a
branch: `attn-cpu-expand-sin-cos`).

Hand-written because upstream's polynomial approximations (MathPolynomialApproximation) are not
exposed as a pass or transform op, and the LLVM conversion leaves these functions to libm: on a
vector, one call per lane, which would cost more than a tile's matmuls.
"""
from __future__ import annotations

import math

from .cpu_support import walk

# exp2(r) on [-1/2, 1/2] (Cephes exp2f), highest degree first.
EXP2_POLYNOMIAL = (1.535336188319500e-4, 1.339887440266574e-3, 9.618437357674640e-3,
                   5.550332471162809e-2, 2.402264791363012e-1, 6.931472028550421e-1, 1.0)
# (exp(r) - 1 - r) / r^2 on [-ln(2)/2, ln(2)/2] (Cephes expf); ln 2 = LN2_HIGH + LN2_LOW, the high
# part exact in a few bits so that n * LN2_HIGH is exact.
EXP_POLYNOMIAL = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
                  1.6666665459e-1, 5.0000001201e-1)
LN2_HIGH = 0.693359375
LN2_LOW = -2.12194440e-4
LOG2E = 1.4426950408889634
# log(1 + r) = r - r^2 / 2 + r^3 P(r) for r = m - 1, m in [sqrt(1/2), sqrt(2)) (Cephes logf, highest
# degree first); the exponent's part is added as e * LN2_HIGH + e * LN2_LOW.
LOG_POLYNOMIAL = (7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1, -1.2420140846e-1, 1.4249322787e-1,
                  -1.6668057665e-1, 2.0000714765e-1, -2.4999993993e-1, 3.3333331174e-1)
# erf(x) = x P(x^2) / Q(x^2) on [-4, 4] (Eigen's generic_fast_erf_float), highest degree first;
# beyond 4, erf is +-1 in f32. Within 4.2e-7 relative of erf over f32 (measured).
ERF_NUMERATOR = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06, -5.69250639462346e-05,
                 -7.34990630326855e-04, -2.95459980854025e-03, -1.60960333262415e-02)
ERF_DENOMINATOR = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03,
                   -7.37332916720468e-03, -1.42647390514189e-02)
# tanh(x) = x P(x^2) below TANH_SMALL: the first nine terms of its Taylor series (2^2n (2^2n - 1)
# B_2n / (2n)!, highest degree first; within 5e-9 relative of tanh at the bound). From there on
# (1 - e) / (1 + e) with e = exp(-2|x|) <= 0.33, where 1 - e no longer cancels.
TANH_SERIES = (6404582 / 10854718875, -929569 / 638512875, 21844 / 6081075, -1382 / 155925, 62 / 2835,
               -17 / 315, 2 / 15, -1 / 3, 1.0)
TANH_SMALL = 0.55


def typed_constant(t, value):
    """A constant of scalar type `t` (float for a float `value`, else integer), or a splat of a
    vector type."""
    from mlir import ir
    from mlir.dialects import arith

    elt = t.element_type if isinstance(t, ir.VectorType) else t
    attr = ir.FloatAttr.get(elt, value) if isinstance(value, float) else ir.IntegerAttr.get(elt, value)
    return arith.constant(t, ir.DenseElementsAttr.get_splat(t, attr) if isinstance(t, ir.VectorType) else attr)


def i32_like(ftype):
    """i32, or a vector of i32 of `ftype`'s shape."""
    from mlir import ir

    i32 = ir.IntegerType.get_signless(32)
    return ir.VectorType.get(list(ftype.shape), i32) if isinstance(ftype, ir.VectorType) else i32


def horner(coefficients, r, constant):
    """The polynomial with `coefficients` (highest degree first) at `r`, each coefficient made by
    `constant`, as multiply-adds at the current insertion point.

    The steps may contract to fused multiply-adds (`contract`): the approximations' error bounds
    hold either way, and on a host with FMA each step is one instruction instead of two (a
    row block's exp2 is most of the softmax's work). A host without FMA keeps the separate
    multiply and add; `math.fma` would instead become a libm call per lane there."""
    from mlir import ir
    from mlir.dialects import arith

    contract = ir.Attribute.parse("#arith.fastmath<contract>")
    p = constant(coefficients[0])
    for c in coefficients[1:]:
        p = arith.addf(arith.mulf(p, r, fastmath=contract), constant(c), fastmath=contract)
    return p


def _f32_ops(module_op, name: str) -> list:
    """The `name` ops of `module_op` on f32 scalars or vectors (the expansions' approximations are
    f32's; other types keep the op)."""
    from mlir import ir

    def f32(op) -> bool:
        ftype = op.operands[0].type
        return (ftype.element_type if isinstance(ftype, ir.VectorType) else ftype) == ir.F32Type.get(op.context)

    return [op for op in walk(module_op, name) if f32(op)]


def expand_erf(module_op) -> None:
    """Replace f32 `math.erf` (scalar or vector) by a rational approximation.

    LLVM has no erf intrinsic: the libm conversion would unroll a vector erf into one erff call
    per lane (a row block's 512 of them, slow to compile and to run), and upstream's polynomial
    approximation is not exposed as a pass (see `expand_exponentials`). The clamp of the result
    keeps |erf| <= 1 where the approximation overshoots by an ulp; NaN passes through.
    """
    from mlir import ir
    from mlir.dialects import arith

    for op in _f32_ops(module_op, "math.erf"):
        x = op.operands[0]
        ftype = x.type
        with op.context, op.location, ir.InsertionPoint(op):
            clamped = arith.minimumf(arith.maximumf(x, typed_constant(ftype, -4.0)), typed_constant(ftype, 4.0))
            x2 = arith.mulf(clamped, clamped)
            r = arith.divf(arith.mulf(clamped, horner(ERF_NUMERATOR, x2, lambda c: typed_constant(ftype, c))),
                           horner(ERF_DENOMINATOR, x2, lambda c: typed_constant(ftype, c)))
            r = arith.minimumf(arith.maximumf(r, typed_constant(ftype, -1.0)), typed_constant(ftype, 1.0))
        op.results[0].replace_all_uses_with(r)
        op.erase()


def expand_tanh(module_op) -> None:
    """Write f32 `math.tanh` (scalar or vector) as its Taylor series near 0 and with exp beyond
    (`TANH_SERIES`), both computed and one selected per lane; written before
    `expand_exponentials`, the exp becomes its polynomial.

    The upstream LLVM conversion leaves tanh to a libm call per lane, which made soft-capping's
    causal forward (fp32 B 1 H 4 L 1024 D 64) take 5x plain attention's time on a 2-core AVX-512
    host. tanh(-0) is -0, +-inf gives +-1 and NaN passes through (the exp branch's)."""
    from mlir import ir
    from mlir.dialects import arith
    from mlir.dialects import math as math_ops

    for op in _f32_ops(module_op, "math.tanh"):
        x = op.operands[0]
        ftype = x.type
        with op.context, op.location, ir.InsertionPoint(op):
            def const(value):
                return typed_constant(ftype, value)

            magnitude = math_ops.absf(x)
            near_zero = arith.mulf(x, horner(TANH_SERIES, arith.mulf(x, x), const))
            e = math_ops.exp(arith.mulf(magnitude, const(-2.0)))
            beyond = math_ops.copysign(arith.divf(arith.subf(const(1.0), e), arith.addf(const(1.0), e)), x)
            small = arith.cmpf(arith.CmpFPredicate.OLT, magnitude, const(TANH_SMALL))
            result = arith.select(small, near_zero, beyond)
        op.results[0].replace_all_uses_with(result)
        op.erase()


def expand_expm1(module_op) -> None:
    """Write `math.expm1` as (u - 1) * x / log(u) with u = exp(x) (Kahan), scalar or vector.

    The upstream LLVM conversion writes it as exp(x) - 1, which loses every digit for small x,
    and has no option to leave it to libm's expm1f; written before `expand_exponentials`, the exp
    here becomes its polynomial, and the formula cancels u's rounding error (the result is within
    a few ulp). The selects give x where u rounds to 1, -1 where it underflows, inf where it
    overflows; NaN passes through.
    """
    from mlir import ir
    from mlir.dialects import arith
    from mlir.dialects import math as math_ops

    for op in walk(module_op, "math.expm1"):
        x = op.operands[0]
        with op.context, op.location, ir.InsertionPoint(op):
            def const(value):
                return typed_constant(x.type, value)

            u = math_ops.exp(x)
            d = arith.subf(u, const(1.0))
            r = arith.divf(arith.mulf(d, x), math_ops.log(u))
            r = arith.select(arith.cmpf(arith.CmpFPredicate.OEQ, d, const(-1.0)), const(-1.0), r)
            r = arith.select(arith.cmpf(arith.CmpFPredicate.OEQ, d, const(0.0)), x, r)
            r = arith.select(arith.cmpf(arith.CmpFPredicate.OEQ, u, const(math.inf)), u, r)
        op.results[0].replace_all_uses_with(r)
        op.erase()


def expand_exponentials(module_op) -> None:
    """Replace f32 `math.exp2` and `math.exp` (scalar or vector) by polynomials and exponent
    arithmetic.

    LLVM turns a vector exp into one libm call per lane, which would cost more than the matmuls of
    a tile; upstream's polynomial approximations (MathPolynomialApproximation) are not exposed as
    a pass or transform op. With n = round(x) (exp2) or round(x / ln 2) (exp), the result is
    p(r) * 2^(n >> 1) * 2^(n - (n >> 1)) for the reduced argument r (Cephes exp2f and expf, within
    2 ulp): the split keeps both scales normal, so results underflow to 0 (x = -inf included) and
    overflow to inf as the exact functions do; NaN passes through.
    """
    from mlir import ir
    from mlir.dialects import arith
    from mlir.dialects import math as math_ops

    for name in ("math.exp2", "math.exp"):
        for op in walk(module_op, name):
            x = op.operands[0]
            ftype = x.type
            shape = list(ftype.shape) if isinstance(ftype, ir.VectorType) else None
            if (ftype.element_type if shape is not None else ftype) != ir.F32Type.get(op.context):
                continue
            with op.context, op.location, ir.InsertionPoint(op):
                itype = i32_like(ftype)
                const = typed_constant

                # The select below passes NaN through, so the clamp need not: `nnan` lets it be
                # one min and one max instruction, where NaN-propagating ones take a compare and
                # a blend each.
                nnan = ir.Attribute.parse("#arith.fastmath<nnan>")
                clamped = arith.minnumf(arith.maxnumf(x, const(ftype, -160.0), fastmath=nnan), const(ftype, 160.0),
                                        fastmath=nnan)
                if name == "math.exp2":
                    n = math_ops.floor(arith.addf(clamped, const(ftype, 0.5)))
                    p = horner(EXP2_POLYNOMIAL, arith.subf(clamped, n), lambda c: const(ftype, c))
                else:
                    n = math_ops.floor(arith.addf(arith.mulf(clamped, const(ftype, LOG2E)), const(ftype, 0.5)))
                    r = arith.subf(arith.subf(clamped, arith.mulf(n, const(ftype, LN2_HIGH))),
                                   arith.mulf(n, const(ftype, LN2_LOW)))
                    tail = horner(EXP_POLYNOMIAL, r, lambda c: const(ftype, c))
                    p = arith.addf(arith.addf(arith.mulf(tail, arith.mulf(r, r)), r), const(ftype, 1.0))
                ni = arith.fptosi(itype, n)
                half = arith.shrsi(ni, const(itype, 1))
                for part in (half, arith.subi(ni, half)):
                    bits = arith.shli(arith.addi(part, const(itype, 127)), const(itype, 23))
                    p = arith.mulf(p, arith.bitcast(ftype, bits))
                result = arith.select(arith.cmpf(arith.CmpFPredicate.UNO, x, x), x, p)
            op.results[0].replace_all_uses_with(result)
            op.erase()




def expand_logarithms(module_op) -> None:
    """Replace f32 `math.log1p`, `math.log2` and `math.log` (scalar or vector) by exponent
    arithmetic and a polynomial (`LOG_POLYNOMIAL`), within a few ulp.

    T5's bucket (`log(distance / exact)`) where it is not composed per distance (read at a
    query's position in a cache) takes a log per score, and `expand_expm1` writes one. log1p is
    log(u) * x / (u - 1) with u = 1 + x (Kahan), which cancels u's rounding error. log2 adds the
    exponent unscaled, so powers of two give exact integers (T5's bucket edges). Subnormal
    arguments are scaled by 2^23 first; log(+-0) is -inf, a negative argument gives NaN, +inf
    gives +inf and NaN passes through.
    """
    from mlir import ir
    from mlir.dialects import arith

    for op in _f32_ops(module_op, "math.log1p"):
        x = op.operands[0]
        with op.context, op.location, ir.InsertionPoint(op):
            u = arith.addf(x, typed_constant(x.type, 1.0))
            d = arith.subf(u, typed_constant(x.type, 1.0))
            r = arith.mulf(_logarithm(u, False), arith.divf(x, d))
            r = arith.select(arith.cmpf(arith.CmpFPredicate.OEQ, d, typed_constant(x.type, 0.0)), x, r)
            r = arith.select(arith.cmpf(arith.CmpFPredicate.OEQ, u, typed_constant(x.type, math.inf)), u, r)
        op.results[0].replace_all_uses_with(r)
        op.erase()
    for name, base2 in (("math.log2", True), ("math.log", False)):
        for op in _f32_ops(module_op, name):
            with op.context, op.location, ir.InsertionPoint(op):
                r = _logarithm(op.operands[0], base2)
            op.results[0].replace_all_uses_with(r)
            op.erase()


def _logarithm(x, base2: bool):
    """log(x) (log2(x) with `base2`) of an f32 scalar or vector at the insertion point: x = m 2^e
    with m in [sqrt(1/2), sqrt(2)), then log(m) from LOG_POLYNOMIAL."""
    from mlir.dialects import arith

    ftype, itype = x.type, i32_like(x.type)

    def const(value):
        return typed_constant(ftype if isinstance(value, float) else itype, value)

    subnormal = arith.cmpf(arith.CmpFPredicate.OLT, x, const(2.0 ** -126))
    scaled = arith.select(subnormal, arith.mulf(x, const(2.0 ** 23)), x)
    bits = arith.bitcast(itype, scaled)
    # m in [1/2, 1), then doubled below sqrt(1/2) (the exponent one less).
    m = arith.bitcast(ftype, arith.ori(arith.andi(bits, const(0x007FFFFF)), const(0x3F000000)))
    low = arith.cmpf(arith.CmpFPredicate.OLT, m, const(math.sqrt(0.5)))
    e = arith.subi(arith.shrui(bits, const(23)), const(126))
    e = arith.subi(e, arith.select(subnormal, const(23), const(0)))
    e = arith.subi(e, arith.select(low, const(1), const(0)))
    r = arith.subf(arith.select(low, arith.addf(m, m), m), const(1.0))
    r2 = arith.mulf(r, r)
    tail = arith.mulf(arith.mulf(r, r2), horner(LOG_POLYNOMIAL, r, const))
    exponent = arith.sitofp(ftype, e)
    if base2:
        result = arith.addf(arith.mulf(arith.addf(r, arith.subf(tail, arith.mulf(r2, const(0.5)))), const(LOG2E)),
                            exponent)
    else:
        tail = arith.addf(tail, arith.mulf(exponent, const(LN2_LOW)))
        result = arith.addf(arith.addf(r, arith.subf(tail, arith.mulf(r2, const(0.5)))),
                            arith.mulf(exponent, const(LN2_HIGH)))
    result = arith.select(arith.cmpf(arith.CmpFPredicate.OEQ, x, const(math.inf)), x, result)
    result = arith.select(arith.cmpf(arith.CmpFPredicate.OEQ, x, const(0.0)), const(-math.inf), result)
    result = arith.select(arith.cmpf(arith.CmpFPredicate.OLT, x, const(0.0)), const(math.nan), result)
    return arith.select(arith.cmpf(arith.CmpFPredicate.UNO, x, x), x, result)
