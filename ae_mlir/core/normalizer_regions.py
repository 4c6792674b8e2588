"""The built-in row normalizers as regions of `attn.online_attention`, built with MLIR's builders.

`attn-fuse-online-softmax` gives the fused op these regions for the normalize kinds "softmax",
"sigmoid", "relu" and "none"; a user's normalizer arrives at L0 already as regions. They compute
what `ae_mlir.normalizers` writes in Python (SOFTMAX, SIGMOID, RELU and NONE there; the module
docstring says what each region means), and test_normalizers checks that the two agree. Building
them here keeps the passes free of the frontend's tracer.

Each region is one block of two f32 arguments ending in `gpu.yield`: prob(s, m),
rescale(m_old, m_new), finalize(acc, l) and lse(m, l).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

REGION_NAMES = ("prob", "rescale", "finalize", "lse")


def _const(value: float):
    from mlir import ir
    from mlir.dialects import arith

    return arith.constant(ir.F32Type.get(), value)


def _exp2_of_difference(a, b):
    from mlir.dialects import arith
    from mlir.dialects import math as math_d

    return math_d.exp2(arith.subf(a, b))


def _softmax_finalize(acc, l):
    """acc / l, and 0 for a row that saw no key (l = 0)."""
    from mlir.dialects import arith

    zero = _const(0.0)
    empty = arith.cmpf(arith.CmpFPredicate.OEQ, l, zero)
    return arith.select(empty, zero, arith.divf(acc, l))


def _softmax_lse(m, l):
    """The log-sum-exp in natural log from the base-2 row max and sum; -inf for an empty row."""
    from mlir.dialects import arith
    from mlir.dialects import math as math_d

    empty = arith.cmpf(arith.CmpFPredicate.OEQ, l, _const(0.0))
    ninf = _const(-math.inf)
    natural = arith.mulf(arith.addf(m, math_d.log2(l)), _const(math.log(2.0)))
    return arith.select(empty, ninf, natural)


def _sigmoid(s, m):
    from mlir.dialects import arith
    from mlir.dialects import math as math_d

    exp = math_d.exp(arith.negf(s))
    one = _const(1.0)
    return arith.divf(one, arith.addf(one, exp))


def _relu(s, m):
    from mlir.dialects import arith

    return arith.maximumf(s, _const(0.0))


def _first(a, b):
    return a


@dataclass(frozen=True)
class BuiltinNormalizer:
    """How to build one built-in normalizer's regions; each builder takes the block's two
    arguments and returns the value to yield, written at the current insertion point."""

    prob: Callable
    finalize: Callable
    rescale: Callable | None = None
    lse: Callable | None = None
    log2_domain: bool = False

    @property
    def stat(self) -> str:
        return "max" if self.rescale is not None else "none"


BUILTIN = {
    "softmax": BuiltinNormalizer(prob=_exp2_of_difference, finalize=_softmax_finalize,
                                 rescale=_exp2_of_difference, lse=_softmax_lse, log2_domain=True),
    "sigmoid": BuiltinNormalizer(prob=_sigmoid, finalize=_first),
    "relu": BuiltinNormalizer(prob=_relu, finalize=_first),
    "none": BuiltinNormalizer(prob=_first, finalize=_first),
}


def build_regions(kind: str, regions: list, with_lse: bool, loc) -> None:
    """Fill the empty `regions` (prob, rescale, finalize, lse) with the built-in normalizer
    `kind`; every op is at `loc`. Regions the normalizer does not have, and lse without
    `with_lse`, stay empty."""
    from mlir import ir
    from mlir.dialects import gpu

    normalizer = BUILTIN[kind]
    for name, region in zip(REGION_NAMES, regions):
        build = getattr(normalizer, name)
        if build is None or (name == "lse" and not with_lse):
            continue
        with loc:
            f32 = ir.F32Type.get()
            block = region.blocks.append(f32, f32, arg_locs=[loc, loc])
            with ir.InsertionPoint(block):
                gpu.yield_([build(*block.arguments)])
