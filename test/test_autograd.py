"""Autograd through `ae_mlir.attention`: gradients of q, k, v and closure tensors.

The float64 checks run `torch.autograd.gradcheck` (fast mode: random projections of the Jacobian
against central differences) on the reference backend; the float32/bfloat16/float16 checks run
the compiled CPU kernel forward and compare with torch's autograd on a float64 formula.
"""
from __future__ import annotations

import math

import pytest
import torch

import ae_mlir as ae
from ae_mlir import variants
from ae_mlir.frontend import backward

GRADCHECKED = ["full", "causal", "sliding_window", "causal_sliding", "prefix_lm", "document", "alibi",
               "relative_bias", "softcap", "t5_bias", "sigmoid", "relu", "retnet", "gqa", "mla_dims", "dilated"]


def _gradcheck(fn, *inputs):
    assert torch.autograd.gradcheck(fn, inputs, fast_mode=True)


def _leaves(*tensors):
    return [t.detach().double().requires_grad_() for t in tensors]


@pytest.mark.parametrize("name", GRADCHECKED)
def test_catalogue_gradcheck(name):
    attn, shape = variants.build(name, variants.Shape(1, 4, 6, 9, 4, 3))
    if name == "mla_dims":
        shape = variants.Shape(1, 4, 6, 9, 6, 3)
    q, k, v = _leaves(*variants.inputs(shape))
    _gradcheck(lambda q, k, v: attn(q, k, v, backend="reference"), q, k, v)


def _relative_bias(table, lk):
    def relative_bias(score, b, h, q_idx, kv_idx):
        return score + table[h, q_idx - kv_idx + lk - 1]

    return relative_bias


def test_learnable_relative_bias_table_and_ragged_gqa():
    gen = torch.Generator().manual_seed(1)
    lq, lk = 37, 53
    q, k, v = _leaves(torch.randn(1, 4, lq, 3, generator=gen), torch.randn(1, 2, lk, 3, generator=gen),
                      torch.randn(1, 2, lk, 2, generator=gen))
    (table,) = _leaves(torch.randn(4, lq + lk - 1, generator=gen))

    def fn(q, k, v, table):
        return ae.attention(score_mod=_relative_bias(table, lk))(q, k, v, backend="reference")

    _gradcheck(fn, q, k, v, table)


def test_closure_tensors_read_twice_and_a_scalar_temperature():
    gen = torch.Generator().manual_seed(2)
    q, k, v = _leaves(*(torch.randn(2, 2, 5, 4, generator=gen) for _ in range(3)))
    slopes, weights, temperature = _leaves(torch.rand(2, generator=gen), torch.randn(2, 3, generator=gen),
                                           torch.tensor(0.7))
    doc = torch.tensor([0, 0, 1, 1, 1])

    def fn(q, k, v, slopes, weights, temperature):
        def score_mod(s, b, h, i, j):
            return torch.tanh(s * temperature) * weights[h, 0] + weights[h, 2] + slopes[h] * (j - i)

        def same_doc(b, h, i, j):
            return (doc[i] == doc[j]) & (i >= j)

        return ae.attention(score_mod=score_mod, mask_mod=same_doc)(q, k, v, backend="reference")

    _gradcheck(fn, q, k, v, slopes, weights, temperature)


def test_only_the_closure_tensors_that_require_grad_are_accumulated(monkeypatch):
    gen = torch.Generator().manual_seed(5)
    q, k, v = _leaves(*(torch.randn(1, 2, 6, 4, generator=gen) for _ in range(3)))
    (weights,) = _leaves(torch.randn(2, generator=gen))
    slopes = torch.rand(3, generator=gen)  # a constant (one entry unused): no gradient wanted
    scattered = []
    accumulate = backward._accumulate

    def counting(total, *args):
        scattered.append(total.shape)
        accumulate(total, *args)

    monkeypatch.setattr(backward, "_accumulate", counting)
    attn = ae.attention(score_mod=lambda s, b, h, i, j: s * weights[h] + slopes[h] * (j - i))
    attn(q, k, v, backend="reference").sum().backward()
    assert weights.grad is not None and slopes.grad is None
    assert scattered and all(shape == weights.shape for shape in scattered)
    want = torch.autograd.grad(_reference_sum(q, k, v, weights, slopes), weights)[0]
    torch.testing.assert_close(weights.grad, want)


def _reference_sum(q, k, v, weights, slopes):
    i = torch.arange(q.shape[2]).view(-1, 1)
    j = torch.arange(k.shape[2]).view(1, -1)
    scores = (q @ k.transpose(-1, -2)) * q.shape[3] ** -0.5
    scores = scores * weights.view(1, -1, 1, 1) + slopes[:2].view(1, -1, 1, 1) * (j - i)
    return (torch.softmax(scores, -1) @ v).sum()


def test_logsumexp_output_is_differentiable():
    gen = torch.Generator().manual_seed(3)
    q, k, v = _leaves(*(torch.randn(1, 2, 6, 4, generator=gen) for _ in range(3)))
    attn = ae.attention(mask_mod=lambda b, h, i, j: i >= j)
    _gradcheck(lambda q, k, v: attn(q, k, v, return_lse=True, backend="reference"), q, k, v)


@pytest.mark.parametrize("normalize", ["softmax", "sigmoid", variants.retnet_normalizer()])
def test_a_row_with_every_key_masked_has_zero_gradient(normalize):
    gen = torch.Generator().manual_seed(8)
    q, k, v = _leaves(*(torch.randn(1, 2, 5, 4, generator=gen) for _ in range(3)))
    attn = ae.attention(mask_mod=lambda b, h, i, j: i > j, normalize=normalize)
    _gradcheck(lambda q, k, v: attn(q, k, v, backend="reference"), q, k, v)
    q.grad = None
    attn(q, k, v, backend="reference").sum().backward()
    assert torch.all(q.grad[:, :, 0] == 0) and torch.isfinite(q.grad).all()


def test_user_normalizer_with_a_running_max_and_blhd_layout():
    gen = torch.Generator().manual_seed(4)
    normalizer = ae.OnlineNormalizer(prob=lambda s, m: torch.exp(s - m), rescale=lambda a, b: torch.exp(a - b),
                                     finalize=lambda acc, l: torch.where(l == 0.0, 0.0, acc / (l + 0.5)),
                                     name="damped_softmax")
    attn = ae.attention(mask_mod=lambda b, h, i, j: i >= j, normalize=normalizer, layout="blhd")
    q, k, v = _leaves(*(torch.randn(1, 5, 2, 4, generator=gen) for _ in range(3)))
    _gradcheck(lambda q, k, v: attn(q, k, v, backend="reference"), q, k, v)


def test_blocks_of_query_rows_give_the_same_gradients(monkeypatch):
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, 19, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    table = torch.randn(2, 37, generator=gen, dtype=torch.float64)
    attn = ae.attention(score_mod=_relative_bias(table, 19), mask_mod=lambda b, h, i, j: i >= j)

    def grads():
        leaves = _leaves(q, k, v, table)
        out = ae.attention(score_mod=_relative_bias(leaves[3], 19), mask_mod=attn.mask_mod)(
            *leaves[:3], backend="reference")
        return torch.autograd.grad(out, leaves, torch.ones_like(out))

    whole = grads()
    monkeypatch.setattr(backward, "BLOCK_ELEMENTS", 2 * 19 * 3)  # 3 query rows per block
    for a, b in zip(whole, grads()):
        torch.testing.assert_close(a, b)


def _alibi_oracle(q, k, v, slopes, scale):
    """ALiBi attention under the mask j <= i + 16, in float64 with torch's own autograd: the
    independent answer."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    i = torch.arange(q.shape[2]).view(-1, 1)
    j = torch.arange(k.shape[2]).view(1, -1)
    s = scale * q @ k.transpose(-1, -2) + slopes.view(1, -1, 1, 1) * (j - i)
    return torch.softmax(s.masked_fill(i + 16 < j, -math.inf), dim=-1) @ v


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-4), (torch.bfloat16, 1e-2), (torch.float16, 2e-3)])
def test_compiled_cpu_forward_gradients_in_each_dtype(dtype, tol):
    gen = torch.Generator().manual_seed(6)
    q = torch.randn(1, 4, 37, 16, generator=gen)
    k, v = torch.randn(1, 2, 53, 16, generator=gen), torch.randn(1, 2, 53, 8, generator=gen)
    slopes = torch.rand(4, generator=gen)
    d_out = torch.randn(1, 4, 37, 8, generator=gen)
    leaves = [t.to(dtype).requires_grad_() for t in (q, k, v)] + [slopes.clone().requires_grad_()]
    attn = ae.attention(score_mod=lambda s, b, h, i, j: s + leaves[3][h] * (j - i),
                        mask_mod=lambda b, h, i, j: i + 16 >= j)
    out = attn(*leaves[:3], backend="cpu")
    out.backward(d_out.to(dtype))
    expected = _leaves(*(t.detach() for t in leaves))
    _alibi_oracle(*expected, 0.25).backward(d_out.double())
    for got, want in zip(leaves, expected):
        assert got.grad.dtype == got.dtype
        scale = want.grad.abs().max()
        torch.testing.assert_close(got.grad.double() / scale, want.grad / scale, atol=tol, rtol=tol)


def _causal_oracle(q, k, v, w, score_mod):
    """Causal softmax attention in float64 with torch's own autograd; `score_mod(s, w, h, i, j)`
    is evaluated on kept pairs only (j clamped to i), so no masked pair reaches the gradients."""
    h = torch.arange(q.shape[1]).view(1, -1, 1, 1)
    i = torch.arange(q.shape[2]).view(-1, 1)
    j = torch.arange(k.shape[2]).view(1, -1)
    s = score_mod(q @ k.transpose(-1, -2) / math.sqrt(q.shape[3]), w, h, i, torch.minimum(j, i))
    return torch.softmax(s.masked_fill(i < j, -math.inf), dim=-1) @ v


@pytest.mark.parametrize("formula", [lambda s, w, h, i, j: s - w[h] * torch.sqrt((i - j) * 1.0),
                                     lambda s, w, h, i, j: s * torch.sqrt((i - j + 1) * 1.0)],
                         ids=["closure", "score"])
def test_masked_pairs_with_a_non_finite_derivative_give_finite_gradients(formula):
    # Above the causal diagonal these square roots are NaN, and so are their derivatives; the
    # pairs are masked, so they must contribute nothing rather than 0 * NaN.
    gen = torch.Generator().manual_seed(10)
    leaves = _leaves(*(torch.randn(1, 2, 6, 4, generator=gen) for _ in range(3)), torch.rand(2, generator=gen))
    w = leaves[3]
    attn = ae.attention(score_mod=lambda s, b, h, i, j: formula(s, w, h, i, j), mask_mod=lambda b, h, i, j: i >= j)
    got = torch.autograd.grad(attn(*leaves[:3], backend="reference").sum(), leaves, allow_unused=True)
    expected = _leaves(*leaves)
    want = torch.autograd.grad(_causal_oracle(*expected, formula).sum(), expected, allow_unused=True)
    for name, a, b in zip("qkvw", got, want):
        if b is None:
            continue
        assert torch.isfinite(a).all(), name
        torch.testing.assert_close(a, b, msg=name)


def test_closure_gradients_are_deterministic():
    """Two backward passes on the CPU reference give the same bits for a closure tensor whose
    gradient many pairs add into (index_put_ accumulation); CUDA is not covered here."""
    gen = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, 2, 24, 8, generator=gen).requires_grad_() for _ in range(3))
    table = torch.randn(2, 47, generator=gen).requires_grad_()
    attn = ae.attention(score_mod=_relative_bias(table, 24))
    runs = []
    for _ in range(2):
        table.grad = None
        attn(q, k, v, backend="reference").sum().backward()
        runs.append(table.grad.clone())
    assert torch.equal(runs[0], runs[1])


def test_no_graph_without_grad():
    q = torch.randn(1, 1, 4, 8, requires_grad=True)
    attn = ae.attention(mask_mod=lambda b, h, i, j: i >= j)
    with torch.no_grad():
        assert attn(q, q, q, backend="reference").grad_fn is None
    assert attn(q.detach(), q.detach(), q.detach(), backend="reference").grad_fn is None
    assert attn(q, q.detach(), q.detach(), backend="reference").grad_fn is not None


def test_a_normalizer_without_derivative_is_named(monkeypatch):
    from ae_mlir.passes import region_derivative

    every_rule = region_derivative.rules()
    monkeypatch.setattr(region_derivative, "rules", lambda: {n: r for n, r in every_rule.items() if n != "math.absf"})
    backward.Derivative.of.cache_clear()
    try:
        q = torch.randn(1, 1, 4, 8, requires_grad=True)
        attn = ae.attention(normalize=variants.retnet_normalizer())
        with pytest.raises(NotImplementedError, match="normalize='retnet'.*'math.absf' op has no derivative rule "
                                                      r"\(in the finalize region\)"):
            attn(q, q, q, backend="reference")
    finally:
        backward.Derivative.of.cache_clear()


def test_linear_attention_backpropagates_to_inputs_and_closure_tensors():
    """linear_attention has a backward (its values: test_linear_backward.py): gradients reach the
    inputs and the closure tensors that require grad, and a no-grad call gives the same output."""
    gen = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(1, 2, 8, 4, generator=gen) for _ in range(3))
    g = -torch.rand(1, 2, 8, generator=gen)
    scale = torch.rand(2, generator=gen, requires_grad=True)
    lin = ae.linear_attention(decay="token")
    out = lin(q.requires_grad_(), k, v, g.requires_grad_(), backend="reference")
    out.square().sum().backward()
    assert q.grad.shape == q.shape and g.grad.shape == g.shape and k.grad is None
    with torch.no_grad():
        torch.testing.assert_close(lin(q, k, v, g, backend="reference"), out)
    scaled = ae.linear_attention(v_mod=lambda x, b, h, t, d: x * scale[h])
    scaled(q.detach(), k, v, backend="reference").square().sum().backward()
    assert scale.grad.shape == (2,) and scale.grad.abs().sum() > 0
