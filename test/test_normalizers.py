"""User-defined online normalizers: the Python API, the L0 regions, and their meaning."""
from __future__ import annotations

import math

import pytest
import torch

import ae_mlir as ae
from ae_mlir.variants import retnet_normalizer


def _inputs(lq=37, lk=37, d=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(2, 3, lq, d, generator=gen, dtype=torch.float64).float(),
            torch.randn(2, 3, lk, d, generator=gen, dtype=torch.float64).float(),
            torch.randn(2, 3, lk, d, generator=gen, dtype=torch.float64).float())


def _scores(q, k, scale=None):
    scale = scale or 1.0 / math.sqrt(q.shape[-1])
    return scale * q.double() @ k.double().transpose(-1, -2)


def test_retnet_abs_sum_normalizer_matches_formula():
    gamma = 0.9
    q, k, v = _inputs()
    attn = ae.attention(score_mod=lambda s, b, h, i, j: s * torch.exp((i - j) * math.log(gamma)),
                        mask_mod=lambda b, h, i, j: i >= j, normalize=retnet_normalizer())
    i = torch.arange(q.shape[2])
    decay = gamma ** (i[:, None] - i[None, :]).double() * (i[:, None] >= i[None, :])
    s = _scores(q, k) * decay
    expected = (s @ v.double()) / s.sum(-1, keepdim=True).abs().clamp(min=1.0)
    torch.testing.assert_close(attn(q, k, v, backend="reference").double(), expected, atol=1e-5, rtol=1e-5)


def test_softmax_written_as_user_normalizer_equals_builtin_softmax():
    # With a rescale the running row max m is kept; exp(s - m) / sum is softmax in natural log.
    user = ae.OnlineNormalizer(prob=lambda s, m: torch.exp(s - m),
                               rescale=lambda m_old, m_new: torch.exp(m_old - m_new),
                               finalize=lambda acc, l: torch.where(l == 0.0, 0.0, acc / l))
    q, k, v = _inputs(lq=20, lk=33)
    mask = lambda b, h, i, j: (i + 5 >= j)  # noqa: E731
    got = ae.attention(mask_mod=mask, normalize=user)(q, k, v, backend="reference")
    want = ae.attention(mask_mod=mask)(q, k, v, backend="reference")
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)


def test_user_normalizer_l0_carries_its_regions():
    q, k, v = _inputs()
    text = ae.attention(normalize=retnet_normalizer()).mlir(q, k, v)
    assert 'kind = "online"' in text
    assert "math.absf" in text and "arith.maximumf" in text and "arith.divf" in text


def test_fully_masked_row_of_user_normalizer_gives_zero():
    q, k, v = _inputs(lq=8, lk=8)
    attn = ae.attention(mask_mod=lambda b, h, i, j: (i != 3) & (i >= j), normalize=retnet_normalizer())
    out = attn(q, k, v, backend="reference")
    assert torch.isfinite(out).all()
    assert (out[:, :, 3] == 0).all()


def test_normalizer_functions_must_be_callable():
    with pytest.raises(TypeError, match="prob must be callable"):
        ae.OnlineNormalizer(prob=1.0, finalize=lambda acc, l: acc)
    with pytest.raises(TypeError, match="rescale must be callable"):
        ae.OnlineNormalizer(prob=lambda s, m: s, finalize=lambda acc, l: acc, rescale="max")


def test_normalizer_reading_a_closure_tensor_is_rejected():
    table = torch.ones(4)
    bad = ae.OnlineNormalizer(prob=lambda s, m: s * table[0], finalize=lambda acc, l: acc)
    q, k, v = _inputs()
    with pytest.raises(ValueError, match="must not read closure tensors"):
        ae.attention(normalize=bad).mlir(q, k, v)


def test_return_lse_needs_softmax():
    q, k, v = _inputs()
    with pytest.raises(ValueError, match="return_lse=True needs normalize='softmax'"):
        ae.attention(normalize=retnet_normalizer())(q, k, v, return_lse=True, backend="reference")


@pytest.mark.parametrize("kind", ["softmax", "sigmoid", "relu", "none"])
def test_builtin_regions_compute_what_the_python_normalizers_state(kind):
    # attn-fuse-online-softmax builds the built-in normalizers with the IR layer's builders; they
    # must compute what ae_mlir.normalizers writes in Python, region by region.
    from mlir import ir

    from ae_mlir.core.context import new_context
    from ae_mlir.core.normalizer_regions import BUILTIN, REGION_NAMES, build_regions
    from ae_mlir.core.regions import from_region
    from ae_mlir.core.scalar_eval import evaluate
    from ae_mlir.normalizers import BUILTIN as PYTHON_BUILTIN

    ctx = new_context()
    ctx.allow_unregistered_dialects = True
    with ctx, ir.Location.unknown() as loc:
        holder = ir.Operation.create("test.regions", regions=len(REGION_NAMES))
        build_regions(kind, list(holder.regions), True, loc)
    python = PYTHON_BUILTIN[kind]
    assert BUILTIN[kind].stat == (python.stat or "none") and BUILTIN[kind].log2_domain == python.log2_domain
    gen = torch.Generator().manual_seed(1)
    a = torch.randn(64, generator=gen, dtype=torch.float64) * 4
    b = torch.randn(64, generator=gen, dtype=torch.float64).abs() * 4
    b[::7] = 0.0  # empty rows (l = 0) for finalize and lse
    for name, region in zip(REGION_NAMES, holder.regions):
        fn = getattr(python, name)
        program = from_region(region)
        assert (program is None) == (fn is None), name
        if fn is not None:
            torch.testing.assert_close(evaluate(program, [a, b]), fn(a, b).to(torch.float64), msg=name)
