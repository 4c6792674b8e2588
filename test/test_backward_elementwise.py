"""Backward kernels of the element-wise normalizers (sigmoid, relu, none: P = f(s), no row
statistic): `attn-tile-backward`'s dQ and dK/dV kernels without lse, delta or the forward's output,
checked in the L1 interpreter (float64), on the CPU backend through autograd, and as Triton bundles
in the TTIR interpreter at each target's default config, all against float64 autograd on the
reference backend (user normalizers: test_backward_online)."""
from __future__ import annotations

import pytest
import torch

import ae_mlir as ae
from ae_mlir import launch_defaults, variants
from ae_mlir.backends import triton as tb
from ae_mlir.core import abi
from bundle_interp import interpret_roles
from l1_interp import kernels_of, run_by_role
from test_backward_kernels import _leaves, _relative_error, backward_module, kernels_only


def _causal(b, h, i, j):
    return i >= j


def _softcap(s, b, h, i, j):
    return 4.0 * torch.tanh(s / 4.0)


def _gated(s, b, h, i, j):
    # A score_mod whose derivative is not 1, and a window the mask keeps.
    return s * (1.0 + 0.25 * h)


VARIANTS = {
    "sigmoid": lambda shape: variants.build("sigmoid", shape)[0],          # sigmoid(s - log Lk)
    "relu": lambda shape: variants.build("relu", shape)[0],                # relu(s / Lk), causal
    "none_softcap_causal": lambda shape: ae.attention(score_mod=_softcap, mask_mod=_causal, normalize="none"),
    "sigmoid_window": lambda shape: ae.attention(score_mod=_gated, normalize="sigmoid",
                                                 mask_mod=lambda b, h, i, j: (i - j <= 20) & (j - i <= 20)),
}


def _problem(attn, shape, seed=0):
    """Float64 inputs, dO, and dq, dk, dv by autograd on the reference backend."""
    q, k, v = variants.inputs(shape, dtype=torch.float64, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    d_out = torch.randn(*q.shape[:3], v.shape[3], generator=gen, dtype=torch.float64)
    leaves = _leaves(q, k, v)
    want = torch.autograd.grad(attn(*leaves, backend="reference"), leaves, d_out)
    return (q, k, v), d_out, want


def _assert_close(got: dict, want, tol):
    for name, w in zip(("dq", "dk", "dv"), want):
        assert got[name].shape == w.shape, name
        assert torch.isfinite(got[name]).all(), name
        err = _relative_error(got[name], w)
        assert err < tol, f"{name}: relative error {err:.3g}"


# Lq != Lk, neither a multiple of the tiles; GQA (4 query heads on 2 KV heads).
RAGGED = variants.Shape(2, 4, 45, 70, 16, 16, heads_kv=2)


def l1_gradients(attn, shape=RAGGED, seed=0):
    """(each backward kernel's roles after q, k, v and the closure tensors, the L1 kernels'
    gradients in the interpreter at 16 x 16 tiles, float64 autograd's dq, dk, dv)."""
    (q, k, v), d_out, want = _problem(attn, shape, seed=seed)
    text, captures = attn._build(q.float(), k.float(), v.float())
    ctx, module = backward_module(text, 16, 16)
    tensors = {"q": q, "k": k, "v": v, "do": d_out}
    tensors.update({abi.capture(i): c for i, c in enumerate(captures)})
    with ctx:
        roles = [abi.arg_roles(f)[3 + len(captures):] for f in kernels_of(module)]
        return roles, run_by_role(module, tensors), want


def check_bundle_at_default_config(build, target, dtype, tol, workspace: list[str]):
    """The backward bundle of the attention `build(shape)` at `target`'s default config for a
    [1, 4, 77, 77, 64] problem (2 KV heads) in the TTIR interpreter against float64 autograd on
    the reference backend; its workspace roles are `workspace`."""
    shape = variants.Shape(1, 4, 77, 77, 64, 64, heads_kv=2)
    attn = build(shape)
    (q, k, v), d_out, want = _problem(attn, shape, seed=6)
    q, k, v, d_out = (t.detach().to(dtype) for t in (q, k, v, d_out))
    bundle = tb.build_backward_bundle(attn.mlir(q, k, v), target)
    expected = launch_defaults.backward_config(77, 77, 64, 64, str(dtype).removeprefix("torch."), target)
    assert {key: bundle.meta["config"][key] for key in expected} == expected
    assert sorted(spec.role for spec in bundle.workspace) == workspace
    got = interpret_roles(bundle, {"q": q, "k": k, "v": v, "do": d_out})
    for role, reference in zip(("dq", "dk", "dv"), want):
        scale = reference.abs().max()
        assert torch.isfinite(got[role]).all(), role
        torch.testing.assert_close(got[role].double() / scale, reference / scale, atol=tol, rtol=0, msg=role)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_l1_kernels_match_autograd(name):
    roles, got, want = l1_gradients(VARIANTS[name](RAGGED))
    # Neither kernel reads the forward's output, lse or delta, and dQ writes no delta.
    assert roles == [["do", "dq"], ["do", "dk", "dv"]]
    assert "delta" not in got
    # exp and the scale are f32 constants in the module (see check_l1).
    _assert_close(got, want, 1e-6)


CPU_SHAPE = variants.Shape(1, 4, 64, 80, 16, 16)


def check_cpu_kernels(attn, shape=CPU_SHAPE, seed=3):
    """dq, dk, dv of `attn` by CPU autograd through the backward kernels alone (float32), against
    float64 autograd on the reference backend."""
    (q, k, v), d_out, want = _problem(attn, shape, seed=seed)
    leaves = _leaves(q, k, v, dtype=torch.float32)
    with kernels_only():
        attn(*leaves, backend="cpu").backward(d_out.float())
    _assert_close(dict(zip(("dq", "dk", "dv"), (t.grad for t in leaves))), want, 1e-4)


@pytest.mark.parametrize("name", ["sigmoid", "relu", "none_softcap_causal"])
def test_cpu_autograd_runs_the_kernels(name):
    check_cpu_kernels(VARIANTS[name](CPU_SHAPE))


def test_cpu_bfloat16_sigmoid():
    attn = VARIANTS["sigmoid"](CPU_SHAPE)
    q, k, v = (t.to(torch.bfloat16) for t in variants.inputs(CPU_SHAPE, seed=4))
    d_out = torch.randn(*q.shape[:3], v.shape[3], generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    # The oracle sees the inputs the CPU sees (rounded to bf16).
    rounded = _leaves(q, k, v)
    want = torch.autograd.grad(attn(*rounded, backend="reference"), rounded, d_out)
    leaves = _leaves(q, k, v, dtype=torch.bfloat16)
    with kernels_only():
        attn(*leaves, backend="cpu").backward(d_out.to(torch.bfloat16))
    _assert_close(dict(zip(("dq", "dk", "dv"), (t.grad for t in leaves))), want, 2e-2)


@pytest.mark.parametrize("target", ["cuda:90", "hip:gfx942"])
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize("name", ["sigmoid", "none_softcap_causal"])
def test_triton_bundles_at_the_default_config(name, target, dtype, tol):
    check_bundle_at_default_config(VARIANTS[name], target, dtype, tol, [])  # no delta


def packed_problem(attn, lens: list[int], heads: int, dim: int, seed: int):
    """Packed float64 q, k, v and dO [T, H, D] of sequences of `lens` tokens, their cu_seqlens,
    and the gradients of q, k, v with each sequence run alone by `attn` (layout "blhd") on the
    reference backend."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v, d_out = (torch.randn(sum(lens), heads, dim, generator=gen, dtype=torch.float64) for _ in range(4))
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32)
    leaves = _leaves(q, k, v)
    loss = sum((attn(*(t[a:b].unsqueeze(0) for t in leaves), backend="reference")[0] * d_out[a:b]).sum()
               for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()) if b > a)
    return (q, k, v), d_out, cu, torch.autograd.grad(loss, leaves)


def check_packed_gradients_on_the_cpu(attn):
    """Sequences of 5, 0, 33 and 17 tokens (one empty) of `attn` (layout "blhd"), the mods seeing
    the position within the sequence, through the CPU backward kernels alone; the oracle runs each
    sequence alone on the reference backend. Returns the float64 q, k, v and cu_seqlens."""
    (q, k, v), d_out, cu, want = packed_problem(attn, [5, 0, 33, 17], 2, 16, 11)
    leaves = _leaves(q, k, v, dtype=torch.float32)
    with kernels_only():
        out = attn(*leaves, cu_seqlens_q=cu, cu_seqlens_k=cu, backend="cpu")
        out.backward(d_out.float())
    _assert_close(dict(zip(("dq", "dk", "dv"), (t.grad for t in leaves))), want, 1e-4)
    return (q, k, v), cu


def test_packed_sigmoid_gradients_on_the_cpu():
    attn = ae.attention(score_mod=_gated, mask_mod=_causal, normalize="sigmoid", layout="blhd")
    (q, k, v), cu = check_packed_gradients_on_the_cpu(attn)
    # A packed call has no torch backward: the reference backend's gradients are refused.
    with pytest.raises(ValueError, match=r"normalize='softmax' or 'sigmoid' or 'relu' or 'none' or an "
                                         r"OnlineNormalizer on the 'cpu' or 'triton' backend, not "
                                         r"normalize='sigmoid' on 'reference'"):
        attn(*_leaves(q, k, v, dtype=torch.float32), cu_seqlens_q=cu, cu_seqlens_k=cu, backend="reference")
