"""tanh on the CPU (`attn-cpu-legalize-for-llvm`'s `expand_tanh`): its Taylor series near 0 and
(1 - e) / (1 + e) with e = exp(-2|x|) beyond, instead of a libm call per lane. Compared with
float64 over the range where tanh is not yet +-1 in f32, through the switch between the two, at
tiny arguments (where the result is the argument), signed zeros, infinities and NaN."""
from __future__ import annotations

import math

import torch

from cpu_l1 import run_math_op


def _run(x: torch.Tensor) -> torch.Tensor:
    out, lowered = run_math_op("tanh", x)
    assert "intr.tanh" not in lowered and "tanhf" not in lowered, "tanh left to the LLVM conversion (libm per lane)"
    return out


def test_tanh_is_accurate_to_a_few_ulp():
    switch = torch.tensor(0.55)
    near_switch = torch.stack([torch.nextafter(switch, torch.tensor(0.0)), switch,
                               torch.nextafter(switch, torch.tensor(1.0))])
    special = torch.tensor([1e-30, -1e-30, 1e-8, -3e-6, 1e-4, 2.0 ** -126, 9.0, -9.0, 20.0, 1e30, -1e30])
    x = torch.cat([torch.linspace(-10.0, 10.0, 40001), torch.randn(4000) * 0.3, near_switch, -near_switch,
                   special])
    got = _run(x)
    want = torch.tanh(x.double())
    ulp = (want.float().abs().double() * 2.0 ** -23).clamp(min=2.0 ** -149)
    error = ((got.double() - want).abs() / ulp).max().item()
    assert error <= 4, error
    assert torch.equal(got[x.abs() < 1e-20], x[x.abs() < 1e-20])


def test_tanh_keeps_zero_signs_infinities_and_nan():
    x = torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan])
    got = _run(x)
    assert torch.equal(torch.signbit(got[:2]), torch.tensor([False, True])) and (got[:2] == 0).all()
    assert got[2].item() == 1.0 and got[3].item() == -1.0 and math.isnan(got[4].item())
