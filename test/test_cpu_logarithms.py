"""log, log2 and log1p on the CPU (`attn-cpu-legalize-for-llvm`'s `expand_logarithms`): exponent
arithmetic and a polynomial instead of a libm call per lane. Compared with float64 over f32's
whole range (subnormals included), near 1 (where log's result is small and log1p's argument is),
at powers of two (log2 exact), and at the special values: +-0, negative arguments, +inf, NaN."""
from __future__ import annotations

import math

import pytest
import torch

from cpu_l1 import run_math_op

_REFERENCE = {"log": torch.log, "log2": torch.log2, "log1p": torch.log1p}


def _run(op: str, x: torch.Tensor) -> torch.Tensor:
    out, lowered = run_math_op(op, x)
    assert "intr.log" not in lowered and "logf" not in lowered and "log1pf" not in lowered, \
        f"{op} left to the LLVM conversion (libm per lane)"
    return out


def _positive_floats() -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    bits = torch.randint(1, 0x7F800000, (60000,), generator=gen, dtype=torch.int32)  # positive finite f32 bits
    near_one = 1.0 + torch.randn(20000, generator=gen) * 1e-3
    powers = torch.tensor([2.0 ** e for e in range(-149, 128)])
    return torch.cat([bits.view(torch.float32), near_one, powers, torch.linspace(0.01, 100.0, 20000)])


def _ulp_error(got: torch.Tensor, want: torch.Tensor) -> float:
    ulp = (want.float().abs().double() * 2.0 ** -23).clamp(min=2.0 ** -149)
    return ((got.double() - want).abs() / ulp).max().item()


@pytest.mark.parametrize("op", ["log", "log2"])
def test_log_is_accurate_to_a_few_ulp(op):
    x = _positive_floats()
    got = _run(op, x)
    want = _REFERENCE[op](x.double())
    # Near x = 1 the result is tiny and its ulp too: measured against the argument's scale there.
    far = (x - 1.0).abs() > 0.01
    assert _ulp_error(got[far], want[far]) <= 3
    near = ~far
    assert ((got[near].double() - want[near]).abs() / (x[near].double() - 1.0).abs().clamp(min=1e-30)).max() < 2.0 ** -21
    if op == "log2":
        powers = torch.tensor([2.0 ** e for e in range(-149, 128)])
        assert torch.equal(_run(op, powers), torch.arange(-149, 128, dtype=torch.float32))


def test_log1p_is_accurate_to_a_few_ulp():
    gen = torch.Generator().manual_seed(1)
    x = torch.cat([_positive_floats() - 1.0, torch.rand(20000, generator=gen) - 1.0,
                   torch.tensor([1e-30, -1e-30, 1e-8, -3e-6, 2.0 ** -126, 2.0 ** -149])])
    x = x[x > -1.0]
    got = _run("log1p", x)
    want = torch.log1p(x.double())
    assert _ulp_error(got, want) <= 4
    assert torch.equal(got[x.abs() < 1e-20], x[x.abs() < 1e-20])


@pytest.mark.parametrize("op", ["log", "log2", "log1p"])
def test_special_values(op):
    # log1p's pole and domain are one lower, and it keeps a zero's sign.
    inf, nan = math.inf, math.nan
    if op == "log1p":
        x = [-1.0, -2.0, -1.0000001, -inf, inf, nan, 0.0, -0.0]
        want = [-inf, nan, nan, nan, inf, nan, 0.0, -0.0]
    else:
        x = [0.0, -0.0, -1.0, -1e-30, -inf, inf, nan, 1.0]
        want = [-inf, -inf, nan, nan, nan, inf, nan, 0.0]
    got = _run(op, torch.tensor(x))
    assert torch.equal(got.isnan(), torch.tensor(want).isnan()), got
    finite_or_inf = ~torch.tensor(want).isnan()
    assert torch.equal(got[finite_or_inf], torch.tensor(want)[finite_or_inf]), got
    assert torch.equal(got[finite_or_inf].signbit(), torch.tensor(want)[finite_or_inf].signbit()), got
