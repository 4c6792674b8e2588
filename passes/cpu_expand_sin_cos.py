"""`attn-cpu-expand-sin-cos`: f32 `math.sin` and `math.cos` on vectors as an argument reduction and
polynomials, with libm kept for the vectors that hold an argument beyond the reduction's range.

The LLVM conversion calls libm once per vector lane for sin and cos (a score mod adding
0.5 cos(0.05 (kv_idx - q_idx)) took 2.1x plain attention's causal forward on a 2-core AVX-512
host, bench/results/cpu-mods-2026-12-07-sin-cos/), and upstream's polynomial approximations
(MathPolynomialApproximation) are not exposed as a pass or transform op. x = k pi/2 + r with
k = roundeven(2x / pi) and r in [-pi/4, pi/4] computed in f64 from pi/2 in three parts
(`PI_OVER_2`: k times either of the first two is exact for |k| < 2^30), then sin(r) and cos(r)
in f32 (Cephes sinf/cosf's polynomials) and k's quadrant picks and signs one. The expansion runs
where no lane's |x| exceeds 2^30 and none is NaN (an scf.if on the vector's lanes): a vector that
has one calls libm, as before, which is exact over the whole range. Scalars keep libm's call.
Runs after attn-cpu-lower-vectors, before the structured control flow is lowered.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from . import ModulePass
from .cpu_math_expansions import horner, i32_like, typed_constant
from .cpu_support import walk

# pi/2 = PI_OVER_2[0] + PI_OVER_2[1] + PI_OVER_2[2] + O(2^-99): the first two have 23 significant
# bits each (k * part is exact in f64 for |k| < 2^30), the third is the rest rounded to f64.
PI_OVER_2 = (float.fromhex("0x1.921fb4p+0"), float.fromhex("0x1.4442dp-24"), 5.390302858158119e-15)
TWO_OVER_PI = 0.6366197723675814
REDUCED_RANGE = 2.0 ** 30
# sin(r) = r + r^3 P(r^2) and cos(r) = 1 - r^2 / 2 + r^4 Q(r^2) on [-pi/4, pi/4] (Cephes sinf and
# cosf), highest degree first.
SIN_POLYNOMIAL = (-1.9515295891e-4, 8.3321608736e-3, -1.6666654611e-1)
COS_POLYNOMIAL = (2.443315711809948e-5, -1.388731625493765e-3, 4.166664568298827e-2)


@dataclass(frozen=True)
class ExpandSinCos(ModulePass):
    name: ClassVar[str] = "attn-cpu-expand-sin-cos"
    summary: ClassVar[str] = ("CPU lowering: f32 sin and cos on vectors as an f64 argument reduction and "
                              "polynomials, libm for vectors with an argument past 2^30 or NaN")

    def apply(self, module_op) -> None:
        from mlir import ir

        for name in ("math.sin", "math.cos"):
            for op in walk(module_op, name):
                ftype = op.operands[0].type
                if isinstance(ftype, ir.VectorType) and ftype.element_type == ir.F32Type.get(op.context):
                    _expand(op, name == "math.cos")


def _expand(op, cosine: bool) -> None:
    from mlir import ir
    from mlir.dialects import arith, scf, vector
    from mlir.dialects import math as math_ops

    x = op.operands[0]
    ftype = x.type
    with op.context, op.location, ir.InsertionPoint(op):
        lanes = ir.VectorType.get([math.prod(ftype.shape)], ir.IntegerType.get_signless(1))
        # Unordered-or-greater: NaN lanes take libm too.
        beyond = arith.cmpf(arith.CmpFPredicate.UGT, math_ops.absf(x), typed_constant(ftype, REDUCED_RANGE))
        flat = beyond if ftype.rank == 1 else vector.shape_cast(lanes, beyond)
        any_beyond = vector.reduction(ir.IntegerType.get_signless(1), vector.CombiningKind.OR, flat)
        branch = scf.IfOp(any_beyond, [ftype], has_else=True)
        with ir.InsertionPoint(branch.then_block):
            kept = ir.Operation.create(op.name, results=[ftype], operands=[x],
                                       attributes={n: op.attributes[n] for n in op.attributes})
            scf.yield_([kept.results[0]])
        with ir.InsertionPoint(branch.else_block):
            scf.yield_([_polynomial(x, cosine)])
    op.results[0].replace_all_uses_with(branch.results[0])
    op.erase()


def _polynomial(x, cosine: bool):
    """sin(x) (cos(x) with `cosine`) of an f32 vector whose |x| <= 2^30, at the insertion point."""
    from mlir import ir
    from mlir.dialects import arith
    from mlir.dialects import math as math_ops

    ftype, itype = x.type, i32_like(x.type)
    dtype = ir.VectorType.get(list(ftype.shape), ir.F64Type.get())
    wide = arith.extf(dtype, x)
    k = math_ops.roundeven(arith.mulf(wide, typed_constant(dtype, TWO_OVER_PI)))
    r = wide
    for part in PI_OVER_2:
        r = arith.subf(r, arith.mulf(k, typed_constant(dtype, part)))
    r = arith.truncf(ftype, r)
    z = arith.mulf(r, r)

    def poly(coefficients):
        return horner(coefficients, z, lambda c: typed_constant(ftype, c))

    def const(value):
        return typed_constant(ftype if isinstance(value, float) else itype, value)

    sine = arith.addf(r, arith.mulf(arith.mulf(r, z), poly(SIN_POLYNOMIAL)))
    cos_r = arith.addf(arith.subf(const(1.0), arith.mulf(z, const(0.5))),
                       arith.mulf(arith.mulf(z, z), poly(COS_POLYNOMIAL)))
    # sin(x) = sin r, cos r, -sin r, -cos r and cos(x) = cos r, -sin r, -cos r, sin r for k mod 4
    # = 0, 1, 2, 3: odd quadrants swap the two, and the sign flips where (k, or k + 1 for cos)
    # mod 4 is 2 or 3.
    quadrant = arith.fptosi(itype, k)
    odd = arith.cmpi(arith.CmpIPredicate.ne, arith.andi(quadrant, const(1)), const(0))
    first, second = (cos_r, sine) if cosine else (sine, cos_r)
    value = arith.select(odd, second, first)
    if cosine:
        quadrant = arith.addi(quadrant, const(1))
    negative = arith.cmpi(arith.CmpIPredicate.ne, arith.andi(quadrant, const(2)), const(0))
    value = arith.select(negative, arith.negf(value), value)
    if cosine:
        return value
    # The reduction's x - 0 * (pi / 2) is +0 for x = -0, whose sine is -0.
    return arith.select(arith.cmpf(arith.CmpFPredicate.OEQ, x, const(0.0)), x, value)
