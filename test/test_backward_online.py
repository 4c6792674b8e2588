"""Backward kernels of user normalizers without a running max (RetNet's division by max(|l|, 1),
or any prob/finalize pair): the dQ kernel sums each row's l and rowsum(p dP) and writes rscale and
delta for the dK/dV kernel (abi.ONLINE_BACKWARD_KERNELS). Checked in the L1 interpreter
(float64), on the CPU backend through autograd, and as Triton bundles in the TTIR interpreter at
each target's default config, all against float64 autograd on the reference backend, closure
tensors' gradients included (a second walk of the dQ kernel scatters them once rscale and delta
are known). Normalizers with a running max: test_backward_running_max."""
from __future__ import annotations

import pytest
import torch

import ae_mlir as ae
from ae_mlir import variants
from ae_mlir.backends import triton as tb
from ae_mlir.core import abi
from bundle_interp import interpret_roles
from test_backward_elementwise import (_assert_close, check_bundle_at_default_config, check_cpu_kernels,
                                       check_packed_gradients_on_the_cpu, l1_gradients, packed_problem)
from test_backward_kernels import _leaves, kernels_only


def _sigmoid_sum():
    """A normalizer whose prob is not linear and whose finalize is not RetNet's: sigmoid(s)
    divided by 1 + l."""
    return ae.OnlineNormalizer(prob=lambda s, m: torch.sigmoid(s), finalize=lambda acc, l: acc / (1.0 + l),
                               name="sigmoid_sum")


def _gated(s, b, h, i, j):
    return s * (1.0 + 0.25 * h) - 0.01 * (i - j)


VARIANTS = {
    "retnet": lambda shape: variants.build("retnet", shape)[0],  # decay score_mod, causal
    # Row 0 sees no key: l = 0, every p = 0, its gradients 0.
    "retnet_strict": lambda shape: ae.attention(mask_mod=lambda b, h, i, j: i > j,
                                                normalize=variants.retnet_normalizer()),
    "sigmoid_sum_window": lambda shape: ae.attention(
        score_mod=_gated, normalize=_sigmoid_sum(), mask_mod=lambda b, h, i, j: (i - j <= 20) & (j - i <= 20)),
}

# Lq != Lk, neither a multiple of the tiles; GQA (4 query heads on 2 KV heads).
RAGGED = variants.Shape(2, 4, 45, 70, 16, 16, heads_kv=2)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_l1_kernels_match_autograd(name):
    roles, got, want = l1_gradients(VARIANTS[name](RAGGED))
    assert roles == [["do", "dq", "delta", "rscale"], ["do", "delta", "rscale", "dk", "dv"]]
    _assert_close(got, want, 1e-6)


CPU_SHAPE = variants.Shape(1, 4, 64, 80, 16, 16)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_cpu_autograd_runs_the_kernels(name):
    check_cpu_kernels(VARIANTS[name](CPU_SHAPE))


def test_packed_gradients_on_the_cpu():
    attn = ae.attention(score_mod=_gated, normalize=_sigmoid_sum(), layout="blhd",
                        mask_mod=lambda b, h, i, j: i >= j)
    check_packed_gradients_on_the_cpu(attn)


@pytest.mark.parametrize("target", ["cuda:90", "hip:gfx942"])
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize("name", list(VARIANTS))
def test_triton_bundles_at_the_default_config(name, target, dtype, tol):
    check_bundle_at_default_config(VARIANTS[name], target, dtype, tol, ["delta", "rscale"])


def _learnable(dtype):
    """RetNet with a learnable per-head decay rate and a learnable table [H, 9] of (q - k) // 8
    (clamped): the closure tensors' gradients under a user normalizer."""
    gen = torch.Generator().manual_seed(2)
    rate = (0.05 * torch.rand(4, generator=gen, dtype=torch.float64)).to(dtype).requires_grad_()
    table = (0.1 * torch.randn(4, 9, generator=gen, dtype=torch.float64)).to(dtype).requires_grad_()

    def decay(s, b, h, i, j):
        return s * torch.exp(-rate[h] * (i - j)) + table[h, torch.clamp((i - j) // 8, 0, 8)]

    return ae.attention(score_mod=decay, mask_mod=lambda b, h, i, j: i >= j,
                        normalize=variants.retnet_normalizer()), [rate, table]


def _learnable_problem(shape, seed):
    """float64 q, k, v, dO and the reference's gradients of q, k, v, rate and table."""
    attn, closures = _learnable(torch.float64)
    q, k, v = variants.inputs(shape, dtype=torch.float64, seed=seed)
    d_out = torch.randn(*q.shape, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)
    leaves = _leaves(q, k, v)
    return (q, k, v), d_out, torch.autograd.grad(attn(*leaves, backend="reference"), leaves + closures, d_out)


def _assert_relative(got, want, names):
    for name, g, w in zip(names, got, want):
        err = float((g.double() - w).abs().max() / w.abs().max())
        assert err < 1e-4, f"{name}: relative error {err:.3g}"


def test_closure_gradients_from_the_cpu_kernels():
    (q, k, v), d_out, want = _learnable_problem(variants.Shape(1, 4, 50, 50, 16, 16), 4)
    attn, closures = _learnable(torch.float32)
    leaves = _leaves(q, k, v, dtype=torch.float32)
    with kernels_only():
        got = torch.autograd.grad(attn(*leaves, backend="cpu"), leaves + closures, d_out.float())
    _assert_relative(got, want, ("dq", "dk", "dv", "d_rate", "d_table"))


@pytest.mark.parametrize("target", ["cuda:90", "hip:gfx942"])
def test_closure_gradients_from_the_triton_bundles(target):
    (q, k, v), d_out, want = _learnable_problem(variants.Shape(1, 4, 77, 77, 64, 64), 6)
    attn, closures = _learnable(torch.float32)
    q, k, v = (t.float() for t in (q, k, v))
    text, captures = attn._build(q, k, v, compose=False)  # the table itself, not composed per distance
    tensors = {"q": q, "k": k, "v": v, "do": d_out.float()}
    tensors.update({abi.capture(i): c.detach() for i, c in enumerate(captures)})
    got = interpret_roles(tb.build_backward_bundle(text, target), tensors)
    positions = {id(c): i for i, c in enumerate(captures)}
    roles = ["dq", "dk", "dv"] + [abi.closure_grad(positions[id(c)]) for c in closures]
    _assert_relative([got[r] for r in roles], want, roles)


@pytest.mark.parametrize("target", ["cuda:90", "hip:gfx942"])
def test_packed_bundles_in_the_ttir_interpreter(target):
    """Sequences of 70, 0, 17 and 129 tokens packed, RetNet's causal decay within each, float32,
    against each sequence alone in float64 autograd on the reference backend."""
    from ae_mlir.frontend import varlen

    attn = ae.attention(score_mod=lambda s, b, h, i, j: s * torch.exp((i - j) * -0.05),
                        mask_mod=lambda b, h, i, j: i >= j, normalize=variants.retnet_normalizer(), layout="blhd")
    (q, k, v), d_out, cu, want = packed_problem(attn, [70, 0, 17, 129], 2, 32, 12)
    text = attn.mlir(q.float(), k.float(), v.float(), cu_seqlens_q=cu, cu_seqlens_k=cu)
    views = varlen.packed_views(q.float(), k.float(), v.float(), "blhd")
    d_view = varlen.packed_views(d_out.float(), d_out.float(), d_out.float(), "blhd")[0]
    sequences = varlen.prepare(views[0], views[1], cu, cu, None, None, False)
    tensors = {"q": views[0], "k": views[1], "v": views[2], "do": d_view}
    # The mods read no closure tensor: the sequences' lengths and offsets are c0, c1, c2.
    tensors.update({abi.capture(i): c for i, c in enumerate((sequences.kv_len, sequences.cu_q, sequences.cu_k))})
    got = interpret_roles(tb.build_backward_bundle(text, target), tensors)
    for role, reference in zip(("dq", "dk", "dv"), want):
        packed = got[role][0].transpose(0, 1).double()
        scale = reference.abs().max()
        assert torch.isfinite(packed).all(), role
        torch.testing.assert_close(packed / scale, reference / scale, atol=1e-5, rtol=0, msg=role)


def test_training_under_torch_compile_runs_the_kernels():
    """A step through torch.compile (no graph break) takes the same gradients as eager, both from
    the kernels."""
    attn = VARIANTS["retnet"](CPU_SHAPE)
    q, k, v = variants.inputs(CPU_SHAPE, seed=5)

    def step(q, k, v):
        return attn(q, k, v, backend="cpu").square().sum()

    with kernels_only():
        eager = [t.clone().requires_grad_() for t in (q, k, v)]
        step(*eager).backward()
        explained = torch._dynamo.explain(step)(*[t.clone().requires_grad_() for t in (q, k, v)])
        assert explained.graph_break_count == 0, explained.break_reasons
        compiled = [t.clone().requires_grad_() for t in (q, k, v)]
        torch.compile(step, backend="aot_eager", fullgraph=True)(*compiled).backward()
    for a, b in zip(compiled, eager):
        torch.testing.assert_close(a.grad, b.grad)
