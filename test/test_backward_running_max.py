"""Backward kernels of user normalizers with a running max (tile_backward_running_max): softmax
written by hand, with a temperature, and one whose output depends on the max itself
(acc / (l + 1) over exp(x - m)), where the max's own gradient reaches the first key that attains
it. Every check is against float64 autograd through a materialized attention written here with
torch.max (not ae-mlir's reference backend): the L1 kernels in the interpreter, the CPU backend
through autograd (packed batches too), and the Triton bundles in the TTIR interpreter at each
target's default config, closure tensors' gradients included."""
from __future__ import annotations

import pytest
import torch

import ae_mlir as ae
from ae_mlir import variants
from ae_mlir.backends import triton as tb
from ae_mlir.core import abi
from bundle_interp import interpret_roles
from l1_interp import kernels_of, run_by_role
from test_backward_elementwise import check_packed_gradients_on_the_cpu
from test_backward_kernels import _leaves, backward_module, kernels_only


def _exp_difference(a, b):
    return torch.exp(a - b)


def _by_hand():
    return ae.OnlineNormalizer(prob=_exp_difference, finalize=lambda acc, l: acc / l, rescale=_exp_difference,
                               name="softmax_by_hand")


def _tempered():
    """exp2((x - m) / 2): softmax at temperature 2 ln 2."""
    return ae.OnlineNormalizer(prob=lambda s, m: torch.exp2((s - m) * 0.5), finalize=lambda acc, l: acc / l,
                               rescale=lambda m_old, m_new: torch.exp2((m_old - m_new) * 0.5), name="tempered")


def _plus_one():
    """acc / (l + 1) with p = exp(x - m): not invariant to m, so m's gradient counts."""
    return ae.OnlineNormalizer(prob=_exp_difference, finalize=lambda acc, l: acc / (l + 1.0),
                               rescale=_exp_difference, name="plus_one")


def _gated(s, b, h, i, j):
    return s * (1.0 + 0.25 * h) - 0.01 * (i - j)


def _window(b, h, i, j):
    return (i >= j) & (i - j <= 20)


def _clamped(s, b, h, i, j):
    """Ties at the row max: every score above 0.3 becomes 0.3."""
    return torch.clamp(s, max=0.3) + 0.5 * s * (s < 0.0)


# (normalizer, score_mod, mask_mod); every row sees a key (acc / l of none is 0 / 0).
VARIANTS = {
    "by_hand_causal": (_by_hand, None, lambda b, h, i, j: i >= j),
    "tempered_gated_window": (_tempered, _gated, _window),
    "plus_one_gated": (_plus_one, _gated, None),
    "plus_one_clamped_window": (_plus_one, _clamped, _window),
}


def _attention(spec, **kw):
    normalizer, score_mod, mask_mod = spec
    return ae.attention(normalize=normalizer(), score_mod=score_mod, mask_mod=mask_mod, **kw)


def materialized(spec, q, k, v):
    """The attention of `spec` (normalizer, score_mod, mask_mod) in float64 torch, [B, H, L, D]
    (GQA by repeating k and v), its row max by torch.max: the oracle."""
    normalizer, score_mod, mask_mod = spec
    group = q.shape[1] // k.shape[1]
    k, v = (t.repeat_interleave(group, dim=1) for t in (k, v))
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    b, h, i, j = torch.meshgrid(*(torch.arange(n) for n in s.shape), indexing="ij")
    x = s if score_mod is None else score_mod(s, b, h, i, j)
    keep = torch.ones_like(s, dtype=torch.bool) if mask_mod is None else mask_mod(b, h, i, j)
    m = x.masked_fill(~keep, -torch.inf).max(dim=-1, keepdim=True).values
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    norm = normalizer()
    p = torch.where(keep, norm.prob(x, m), torch.zeros_like(x))
    return norm.finalize(p @ v, p.sum(dim=-1, keepdim=True))


def _problem(spec, shape, seed, dtype=torch.float64):
    """float64 q, k, v and dO (values `dtype` holds: clamped scores of rounded inputs flip) and the
    oracle's dq, dk, dv."""
    q, k, v = variants.inputs(shape, dtype=torch.float64, seed=seed)
    d_out = torch.randn(*q.shape[:3], v.shape[3], generator=torch.Generator().manual_seed(seed + 1),
                        dtype=torch.float64)
    q, k, v, d_out = (t.to(dtype).double() for t in (q, k, v, d_out))
    leaves = _leaves(q, k, v)
    return (q, k, v), d_out, torch.autograd.grad(materialized(spec, *leaves), leaves, d_out)


def _assert_close(got, want, tol, roles=("dq", "dk", "dv")):
    for role, reference in zip(roles, want):
        g = got[role] if isinstance(got, dict) else got[roles.index(role)]
        assert torch.isfinite(g).all(), role
        err = float((g.double() - reference).abs().max() / reference.abs().max())
        assert err < tol, f"{role}: relative error {err:.3g}"


# Lq != Lk, neither a multiple of the tiles; GQA (4 query heads on 2 KV heads).
RAGGED = variants.Shape(2, 4, 45, 70, 16, 16, heads_kv=2)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_l1_kernels_match_autograd(name):
    (q, k, v), d_out, want = _problem(VARIANTS[name], RAGGED, seed=0)
    text, _ = _attention(VARIANTS[name])._build(q.float(), k.float(), v.float())
    ctx, module = backward_module(text, 16, 16)
    with ctx:
        assert [abi.arg_roles(f)[3:] for f in kernels_of(module)] == [
            ["do", "dq", "delta", "rscale", "rowmax", "maxkey", "dmax"],
            ["do", "delta", "rscale", "rowmax", "maxkey", "dmax", "dk", "dv"]]
        got = run_by_role(module, {"q": q, "k": k, "v": v, "do": d_out})
    _assert_close(got, want, 1e-6)


def test_the_reference_backend_agrees():
    """The torch backward of the derivative regions (the reference backend's) routes the max's
    gradient to the same key."""
    spec = VARIANTS["plus_one_clamped_window"]
    (q, k, v), d_out, want = _problem(spec, RAGGED, seed=1)
    leaves = _leaves(q, k, v)
    _assert_close(torch.autograd.grad(_attention(spec)(*leaves, backend="reference"), leaves, d_out), want, 1e-9)


CPU_SHAPE = variants.Shape(1, 4, 64, 80, 16, 16)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_cpu_autograd_runs_the_kernels(name):
    (q, k, v), d_out, want = _problem(VARIANTS[name], CPU_SHAPE, seed=3)
    leaves = _leaves(q, k, v, dtype=torch.float32)
    with kernels_only():
        _attention(VARIANTS[name])(*leaves, backend="cpu").backward(d_out.float())
    _assert_close([t.grad for t in leaves], want, 1e-4)


def test_packed_gradients_on_the_cpu():
    check_packed_gradients_on_the_cpu(_attention(VARIANTS["plus_one_gated"], layout="blhd"))


@pytest.mark.parametrize("target", ["cuda:90", "hip:gfx942"])
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize("name", ["tempered_gated_window", "plus_one_clamped_window"])
def test_triton_bundles_at_the_default_config(name, target, dtype, tol):
    shape = variants.Shape(1, 4, 77, 77, 64, 64, heads_kv=2)
    (q, k, v), d_out, want = _problem(VARIANTS[name], shape, seed=6, dtype=dtype)
    q, k, v, d_out = (t.to(dtype) for t in (q, k, v, d_out))
    bundle = tb.build_backward_bundle(_attention(VARIANTS[name]).mlir(q, k, v), target)
    assert sorted(spec.role for spec in bundle.workspace) == ["delta", "dmax", "maxkey", "rowmax", "rscale"]
    got = interpret_roles(bundle, {"q": q, "k": k, "v": v, "do": d_out})
    _assert_close(got, want, tol)


def _learnable(dtype):
    """Softmax by hand over a learnable per-head temperature and bias table [H, 9] of
    (q - k) // 8 (clamped), plus one in the denominator: closure gradients under a running max."""
    gen = torch.Generator().manual_seed(2)
    temperature = (1.0 + 0.2 * torch.rand(4, generator=gen, dtype=torch.float64)).to(dtype).requires_grad_()
    table = (0.3 * torch.randn(4, 9, generator=gen, dtype=torch.float64)).to(dtype).requires_grad_()

    def biased(s, b, h, i, j):
        return s * temperature[h] + table[h, torch.clamp((i - j) // 8, 0, 8)]

    return biased, [temperature, table]


def _learnable_check(run, shape, seed, tol):
    """`run(attn, q, k, v, d_out, closures)` (float32) against the oracle's gradients of q, k, v
    and both closure tensors."""
    def causal(b, h, i, j):
        return i >= j

    score_mod, closures = _learnable(torch.float64)
    q, k, v = variants.inputs(shape, dtype=torch.float64, seed=seed)
    d_out = torch.randn(*q.shape, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)
    leaves = _leaves(q, k, v)
    want = torch.autograd.grad(materialized((_plus_one, score_mod, causal), *leaves), leaves + closures, d_out)
    score_mod, closures = _learnable(torch.float32)
    got = run(_attention((_plus_one, score_mod, causal)), q.float(), k.float(), v.float(), d_out.float(), closures)
    _assert_close(got, want, tol, ("dq", "dk", "dv", "d_temperature", "d_table"))


def test_closure_gradients_from_the_cpu_kernels():
    def run(attn, q, k, v, d_out, closures):
        leaves = _leaves(q, k, v, dtype=torch.float32)
        with kernels_only():
            return torch.autograd.grad(attn(*leaves, backend="cpu"), leaves + closures, d_out)

    _learnable_check(run, variants.Shape(1, 4, 50, 50, 16, 16), 4, 1e-4)


@pytest.mark.parametrize("target", ["cuda:90", "hip:gfx942"])
def test_closure_gradients_from_the_triton_bundles(target):
    def run(attn, q, k, v, d_out, closures):
        text, captures = attn._build(q, k, v, compose=False)  # the table itself, not composed per distance
        tensors = {"q": q, "k": k, "v": v, "do": d_out}
        tensors.update({abi.capture(i): c.detach() for i, c in enumerate(captures)})
        got = interpret_roles(tb.build_backward_bundle(text, target), tensors)
        positions = {id(c): i for i, c in enumerate(captures)}
        return [got[r] for r in ("dq", "dk", "dv")] + [got[abi.closure_grad(positions[id(c)])] for c in closures]

    _learnable_check(run, variants.Shape(1, 4, 77, 77, 64, 64), 6, 1e-4)
