"""`attn-cpu-legalize-for-llvm`: the last rewrites of the memref and vector IR before the upstream
conversion to the llvm dialect, for what that conversion would reject, miscompile or make slow.

It reports i1 buffers and vector views of padded rows (which the conversion cannot handle) at the
op, aligns buffers viewed as vectors, writes expm1 with exp and log (Kahan) and tanh with a
polynomial and exp, replaces f32 exp and exp2 and erf by polynomials, runs math ops on n-D
vectors as 1-D ones, and lets max/min reductions ignore the sign of zero.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from . import ModulePass
from .cpu_support import fail, rows_padded_in_memory, walk

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


@dataclass(frozen=True)
class LegalizeForLlvm(ModulePass):
    name: ClassVar[str] = "attn-cpu-legalize-for-llvm"
    summary: ClassVar[str] = ("CPU lowering: reject i1 buffers and padded vector views, align buffers viewed "
                              "as vectors, expm1 as Kahan's formula, tanh as a series and exp, exp/exp2/erf as "
                              "polynomials, math on n-D vectors as 1-D, max/min reductions without the sign of zero")

    def apply(self, module_op) -> None:
        _reject_bool_buffers(module_op)
        _reject_padded_vector_views(module_op)
        align_vector_views(module_op)
        expand_erf(module_op)
        expand_tanh(module_op)
        expand_expm1(module_op)
        expand_exponentials(module_op)
        flatten_math_vectors(module_op)
        ignore_zero_signs_of_extrema(module_op)


def _reject_bool_buffers(module_op) -> None:
    """The LLVM conversion aborts the process on an i1 load or store (it asserts on sub-byte
    elements); deallocation with run-time ownership flags is what makes i1 buffers (see
    `attn-cpu-carry-state-in-place`), so report one instead of crashing."""
    from mlir import ir

    for name in ("memref.alloc", "memref.alloca"):
        for op in walk(module_op, name):
            elt = op.results[0].type.element_type
            if isinstance(elt, ir.IntegerType) and elt.width == 1:
                raise fail(op, "is a buffer of i1 (run-time buffer ownership), which the LLVM conversion "
                               "cannot load or store")


def _reject_padded_vector_views(module_op) -> None:
    """A buffer of scalars viewed as vectors whose rows LLVM pads in memory (rows of 24 floats
    take 32) would be overrun by the vector stores; `_tile_sizes` keeps tile rows to powers of two,
    and this says so if some other op still made one, rather than corrupting memory."""
    from mlir import ir

    for op in walk(module_op, "vector.type_cast"):
        source = op.operands[0].type
        vector = ir.MemRefType(op.results[0].type).element_type
        if isinstance(source.element_type, ir.VectorType) or not isinstance(vector, ir.VectorType):
            continue
        if rows_padded_in_memory(vector):
            raise fail(op, f"views a buffer as {vector}, whose rows LLVM pads in memory; the CPU lowering "
                           "needs power-of-two vector rows here")


def align_vector_views(module_op) -> None:
    """Align each buffer viewed as vectors (`vector.type_cast`) to the vector rows' own size.

    The whole-vector load or store through such a view becomes an LLVM load or store with the
    vector's ABI alignment (its size: 64 bytes for 16 floats), but the staging buffers that
    `split_transfer_full_partial` allocates for partial tiles are 32-byte aligned. With AVX-512,
    LLVM then emits an aligned 64-byte move into a 32-byte-aligned stack slot, which faults
    whenever the incoming stack pointer happens to be an odd multiple of 32.
    """
    from mlir import ir

    for op in walk(module_op, "vector.type_cast"):
        vector = ir.MemRefType(op.results[0].type).element_type
        if not isinstance(vector, ir.VectorType):
            continue
        row_bytes = vector.shape[-1] * max(1, vector.element_type.width // 8)
        alignment = 1 << (row_bytes - 1).bit_length()
        buffer = op.operands[0].owner
        if not isinstance(buffer, ir.OpView) or buffer.operation.name not in ("memref.alloca", "memref.alloc"):
            raise fail(op, f"views a buffer not allocated here as {vector}, whose alignment the CPU lowering "
                           "cannot raise to the vector's")
        buffer = buffer.operation
        if "alignment" in buffer.attributes and ir.IntegerAttr(buffer.attributes["alignment"]).value >= alignment:
            continue
        buffer.attributes["alignment"] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64, op.context), alignment)


def _float_constant(ftype, value: float):
    """A constant of f32 type `ftype`, or a splat of a vector type."""
    from mlir import ir
    from mlir.dialects import arith

    if isinstance(ftype, ir.VectorType):
        return arith.constant(ftype, ir.DenseElementsAttr.get_splat(ftype, ir.FloatAttr.get(ftype.element_type, value)))
    return arith.constant(ftype, ir.FloatAttr.get(ftype, value))


def _horner(coefficients, r, constant):
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
            clamped = arith.minimumf(arith.maximumf(x, _float_constant(ftype, -4.0)), _float_constant(ftype, 4.0))
            x2 = arith.mulf(clamped, clamped)
            r = arith.divf(arith.mulf(clamped, _horner(ERF_NUMERATOR, x2, lambda c: _float_constant(ftype, c))),
                           _horner(ERF_DENOMINATOR, x2, lambda c: _float_constant(ftype, c)))
            r = arith.minimumf(arith.maximumf(r, _float_constant(ftype, -1.0)), _float_constant(ftype, 1.0))
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
                return _float_constant(ftype, value)

            magnitude = math_ops.absf(x)
            near_zero = arith.mulf(x, _horner(TANH_SERIES, arith.mulf(x, x), const))
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
                return _float_constant(x.type, value)

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
                itype = ir.IntegerType.get_signless(32)
                if shape is not None:
                    itype = ir.VectorType.get(shape, itype)

                def const(t, value):
                    elt = t.element_type if shape is not None else t
                    attr = ir.FloatAttr.get(elt, value) if isinstance(value, float) else ir.IntegerAttr.get(elt, value)
                    return arith.constant(t, ir.DenseElementsAttr.get_splat(t, attr) if shape is not None else attr)

                # The select below passes NaN through, so the clamp need not: `nnan` lets it be
                # one min and one max instruction, where NaN-propagating ones take a compare and
                # a blend each.
                nnan = ir.Attribute.parse("#arith.fastmath<nnan>")
                clamped = arith.minnumf(arith.maxnumf(x, const(ftype, -160.0), fastmath=nnan), const(ftype, 160.0),
                                        fastmath=nnan)
                if name == "math.exp2":
                    n = math_ops.floor(arith.addf(clamped, const(ftype, 0.5)))
                    p = _horner(EXP2_POLYNOMIAL, arith.subf(clamped, n), lambda c: const(ftype, c))
                else:
                    n = math_ops.floor(arith.addf(arith.mulf(clamped, const(ftype, LOG2E)), const(ftype, 0.5)))
                    r = arith.subf(arith.subf(clamped, arith.mulf(n, const(ftype, LN2_HIGH))),
                                   arith.mulf(n, const(ftype, LN2_LOW)))
                    tail = _horner(EXP_POLYNOMIAL, r, lambda c: const(ftype, c))
                    p = arith.addf(arith.addf(arith.mulf(tail, arith.mulf(r, r)), r), const(ftype, 1.0))
                ni = arith.fptosi(itype, n)
                half = arith.shrsi(ni, const(itype, 1))
                for part in (half, arith.subi(ni, half)):
                    bits = arith.shli(arith.addi(part, const(itype, 127)), const(itype, 23))
                    p = arith.mulf(p, arith.bitcast(ftype, bits))
                result = arith.select(arith.cmpf(arith.CmpFPredicate.UNO, x, x), x, p)
            op.results[0].replace_all_uses_with(result)
            op.erase()


def ignore_zero_signs_of_extrema(module_op) -> None:
    """Let vector max/min reductions (`maximumf`, `minimumf`) take either zero where both signs
    are among the candidates (fastmath `nsz`).

    IEEE maximum orders -0 below +0 and propagates NaN; LLVM's x86 lowering spends a sign-bit blend
    per step on the first, which the reductions of an L1 kernel do not need: they are row maxima
    of scores (each score then enters exp2(s - m), the same for either zero) and the largest
    decay span of a chunk (compared with a bound). NaN still propagates, and `nsz`, unlike
    `nnan`, makes no input poison. On the 2-core AMD EPYC with AVX-512 the forward's kernels ran
    3-6% faster (full and causal, L 512, one and two threads), with bit-identical outputs."""
    from mlir import ir

    for op in walk(module_op, "vector.reduction"):
        kind = str(op.attributes["kind"])
        if kind.endswith(("<maximumf>", "<minimumf>")):
            op.attributes["fastmath"] = ir.Attribute.parse("#arith.fastmath<nsz>", op.context)


def flatten_math_vectors(module_op) -> None:
    """Run math ops on n-D vectors as 1-D ones (shape casts around them).

    The math-to-LLVM conversion takes some ops (math.absi, for one) only on scalars and 1-D
    vectors, and the libm conversion only on scalars and vectors it can unroll; vectorized mods
    (`(q_idx - kv_idx).abs()`) produce them on the 2-D vectors of a row block.
    """
    from mlir import ir
    from mlir.dialects import vector

    for op in walk(module_op, "math."):
        types = [v.type for v in list(op.operands) + list(op.results)]
        if not any(isinstance(t, ir.VectorType) and t.rank > 1 for t in types):
            continue
        with op.context, op.location, ir.InsertionPoint(op):
            def flat(t):
                return ir.VectorType.get([math.prod(t.shape)], t.element_type)

            operands = [vector.shape_cast(flat(v.type), v) for v in op.operands]
            result_types = [flat(r.type) for r in op.results]
            attributes = {name: op.attributes[name] for name in op.attributes}
            flat_op = ir.Operation.create(op.name, results=result_types, operands=operands, attributes=attributes)
            for old, new in zip(op.results, flat_op.results):
                old.replace_all_uses_with(vector.shape_cast(old.type, new))
        op.erase()
