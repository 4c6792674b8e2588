"""`MathExpansions`: math ops Triton cannot lower on both targets (negf, tanh, log1p, expm1, powf,
roundeven, floordivsi), written with ones it can."""
from __future__ import annotations

from .builder import TileBuilder
from .values import Value

_LOG2E = 1.4426950408889634
FAST_TANH_PTX = "tanh.approx.f32 $0, $1;"


class MathExpansions(TileBuilder):
    def negf(self, x: Value) -> Value:
        # -0.0 - x flips the sign of zeros too, as negation does.
        return self.op("arith.subf", self.const("-0.0", x.elt), x)

    def floordivsi(self, a: Value, b: Value) -> Value:
        q = self.op("arith.divsi", a, b)
        r = self.op("arith.remsi", a, b)
        zero = self.const(0, a.elt)
        differ = self.op("arith.xori", self.cmpi("slt", r, zero), self.cmpi("slt", b, zero))
        fix = self.op("arith.andi", self.cmpi("ne", r, zero), differ)
        return self.select(fix, self.op("arith.subi", q, self.const(1, a.elt)), q)

    def approximate_tanh(self, x: Value) -> Value:
        """The hardware's tanh (one MUFU.TANH on NVIDIA sm75+, 2^-11 relative error), which Triton
        has no op for: inline PTX. The exact expansion (tanh) takes two transcendental
        instructions (exp2 and a reciprocal) and about fifteen others per element."""
        return self.generic("tt.elementwise_inline_asm", [x], x.shape, x.elt,
                            f'asm_string = "{FAST_TANH_PTX}", constraints = "=r,r", '
                            "packed_element = 1 : i32, pure = true")

    def tanh(self, x: Value) -> Value:
        # tanh|x| = (1 - e^-2|x|) / (1 + e^-2|x|); its cancellation near 0 is replaced by the
        # series x - x^3/3 + 2x^5/15, whose error below 0.05 is under 1e-10 relative.
        c = lambda v: self.const(v, x.elt)  # noqa: E731
        ax = self.op("math.absf", x)
        t = self.op("math.exp2", self.op("arith.mulf", ax, c(-2.0 * _LOG2E)))
        big = self.op("arith.divf", self.op("arith.subf", c(1.0), t), self.op("arith.addf", c(1.0), t))
        x2 = self.op("arith.mulf", ax, ax)
        series = self.op("arith.addf", c(-1.0 / 3.0), self.op("arith.mulf", x2, c(2.0 / 15.0)))
        small = self.op("arith.mulf", ax, self.op("arith.addf", c(1.0), self.op("arith.mulf", x2, series)))
        r = self.select(self.cmpf("olt", ax, c(0.05)), small, big)
        return self.select(self.cmpf("olt", x, c(0.0)), self.negf(r), r)

    def log1p(self, x: Value) -> Value:
        # log(u) * x / (u - 1) with u = 1 + x cancels u's rounding error (Goldberg).
        c = lambda v: self.const(v, x.elt)  # noqa: E731
        u = self.op("arith.addf", x, c(1.0))
        d = self.op("arith.subf", u, c(1.0))
        r = self.op("arith.mulf", self.op("math.log", u), self.op("arith.divf", x, d))
        r = self.select(self.cmpf("oeq", d, c(0.0)), x, r)
        return self.select(self.cmpf("oeq", x, c("inf")), x, r)

    def expm1(self, x: Value) -> Value:
        # (u - 1) * x / log(u) with u = e^x (Kahan).
        c = lambda v: self.const(v, x.elt)  # noqa: E731
        u = self.op("math.exp", x)
        d = self.op("arith.subf", u, c(1.0))
        r = self.op("arith.divf", self.op("arith.mulf", d, x), self.op("math.log", u))
        r = self.select(self.cmpf("oeq", d, c(-1.0)), c(-1.0), r)
        r = self.select(self.cmpf("oeq", d, c(0.0)), x, r)
        return self.select(self.cmpf("oeq", u, c("inf")), u, r)

    def powf(self, x: Value, y: Value) -> Value:
        # exp2(y log2|x|), with torch.pow's signs: a negative base needs an integer exponent
        # (odd exponents keep the sign), and x^0 = 1^y = 1 even for NaN.
        c = lambda v: self.const(v, x.elt)  # noqa: E731
        r = self.op("math.exp2", self.op("arith.mulf", y, self.op("math.log2", self.op("math.absf", x))))
        integral = self.cmpf("oeq", self.op("math.floor", y), y)
        odd = self.cmpf("oeq", self.op("math.absf", self.op("arith.remf", y, c(2.0))), c(1.0))
        negative = self.select(integral, self.select(odd, self.negf(r), r), c("nan"))
        r = self.select(self.cmpf("olt", x, c(0.0)), negative, r)
        one = self.op("arith.ori", self.cmpf("oeq", y, c(0.0)), self.cmpf("oeq", x, c(1.0)))
        return self.select(one, c(1.0), r)

    def roundeven(self, x: Value) -> Value:
        # The AMD backend has no lowering of math.roundeven. floor(x) + 1 where the fraction
        # x - floor(x) (exact) is over 1/2, or 1/2 with floor(x) odd; a zero result takes x's sign.
        # For |x| >= 2^23 (integers), inf and NaN the fraction is 0 or NaN and floor(x) stands.
        c = lambda v: self.const(v, x.elt)  # noqa: E731
        r = self.op("math.floor", x)
        frac = self.op("arith.subf", x, r)
        odd = self.cmpf("oeq", self.op("math.absf", self.op("arith.remf", r, c(2.0))), c(1.0))
        tie_up = self.op("arith.andi", self.cmpf("oeq", frac, c(0.5)), odd)
        up = self.op("arith.ori", self.cmpf("ogt", frac, c(0.5)), tie_up)
        r = self.select(up, self.op("arith.addf", r, c(1.0)), r)
        return self.select(self.cmpf("oeq", r, c(0.0)), self.op("arith.mulf", x, c(0.0)), r)


EXPANSIONS = {
    "arith.negf": MathExpansions.negf,
    "arith.floordivsi": MathExpansions.floordivsi,
    "math.tanh": MathExpansions.tanh,
    "math.log1p": MathExpansions.log1p,
    "math.expm1": MathExpansions.expm1,
    "math.powf": MathExpansions.powf,
    "math.roundeven": MathExpansions.roundeven,
}
