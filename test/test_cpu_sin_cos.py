"""sin and cos on the CPU (`attn-cpu-expand-sin-cos`): an f64 argument reduction by pi/2 and f32
polynomials instead of a libm call per lane, with libm kept for a vector that holds an argument
past 2^30 or NaN. Compared with float64 near 0, over positions times frequencies, up to 2^30,
at the f32 values nearest to multiples of pi/2 (where the reduction cancels most), and for
vectors that take libm: NaN, infinities, arguments past 2^30 beside ordinary ones."""
from __future__ import annotations

import math

import pytest
import torch

from cpu_l1 import run_math_op

_REFERENCE = {"sin": torch.sin, "cos": torch.cos}


def _ulp_error(got: torch.Tensor, want: torch.Tensor) -> float:
    ulp = (want.float().abs().double() * 2.0 ** -23).clamp(min=2.0 ** -149)
    return ((got.double() - want).abs() / ulp).max().item()


@pytest.mark.parametrize("op", ["sin", "cos"])
def test_within_two_ulp_up_to_two_to_the_thirty(op):
    gen = torch.Generator().manual_seed(0)
    multiples = (torch.arange(-200000, 200000, dtype=torch.float64) * (math.pi / 2)).float()
    x = torch.cat([torch.linspace(-10.0, 10.0, 20001), torch.rand(20000, generator=gen) * 2e4 - 1e4,
                   (torch.rand(20000, generator=gen) * 2 - 1) * 2.0 ** 30, multiples,
                   torch.tensor([1e-30, -1e-30, 2.0 ** -149, 2.0 ** 30, -(2.0 ** 30)])])
    got, lowered = run_math_op(op, x)
    assert "llvm.intr.roundeven" in lowered  # the reduction: the expansion ran
    assert _ulp_error(got, _REFERENCE[op](x.double())) <= 2


@pytest.mark.parametrize("op", ["sin", "cos"])
def test_vectors_with_arguments_past_the_range_take_libm(op):
    inf, nan = math.inf, math.nan
    special = torch.tensor([nan, inf, -inf, 2.0 ** 31, 1e38, -3e9])
    x = torch.cat([special, torch.linspace(-7.0, 7.0, 122)])
    got, _ = run_math_op(op, x)
    want = _REFERENCE[op](x.double())
    assert got[:3].isnan().all()
    assert _ulp_error(got[3:], want[3:]) <= 1


def test_signed_zeros():
    zeros = torch.tensor([-0.0, 0.0] * 32)
    sine, _ = run_math_op("sin", zeros)
    assert torch.equal(sine.signbit(), zeros.signbit()) and (sine == 0).all()
    assert (run_math_op("cos", zeros)[0] == 1.0).all()
