"""Closure reads indexed by a function of kv_idx - q_idx alone (T5's buckets) read a tensor
composed once per call (ae_mlir/frontend/relative_reads.py): which reads qualify, the module the
kernels get, and outputs and gradients against the reference backend, which evaluates the mods
as written (float64 autograd)."""
from __future__ import annotations

import pytest
import torch

import ae_mlir as ae
from ae_mlir import variants
from ae_mlir.frontend import relative_reads
from ae_mlir.frontend.relative_reads import kernel_closures
from bundle_interp import interpret

SHAPE = variants.Shape(1, 4, 45, 70, 16, 16)


def _bucketed(table, scale=0.3):
    """table[h, bucket(kv_idx - q_idx)] with a log-spaced bucket on each side, as T5's."""
    half = table.shape[1] // 2

    def score_mod(s, b, h, i, j):
        distance = j - i
        n = distance.abs()
        far = 4 + (torch.log(torch.clamp(n, min=1) / 4.0) * 2.0 + 1e-4).long()
        bucket = torch.where(distance > 0, half, 0) + torch.where(n < 4, n, torch.clamp(far, max=half - 1))
        return s * scale + table[h, bucket]

    return score_mod


def _table(heads=4, buckets=16, seed=0):
    return torch.randn(heads, buckets, generator=torch.Generator().manual_seed(seed))


def _captures(attn, compose=True):
    q, k, v = variants.inputs(SHAPE)
    text, captures = attn._build(q, k, v, compose=compose)
    return text, [tuple(c.shape) for c in captures]


def test_t5_reads_a_table_composed_per_distance():
    attn, shape = variants.build("t5_bias", SHAPE)
    q, k, v = variants.inputs(shape)
    text = attn.mlir(q, k, v)
    # Lq + Lk - 1 = 114 distances, read at kv_idx - q_idx + Lq - 1: no log left in the kernel.
    assert "tensor<4x114xf32>" in text and "math.log" not in text
    written = attn.mlir(q, k, v, compose=False)
    assert "tensor<4x32xf32>" in written and "math.log" in written


def test_a_table_read_at_q_idx_minus_kv_idx_is_reversed():
    """The catalogue's relative bias reads table[h, q_idx - kv_idx + Lk - 1]: along a row of keys its
    addresses fall, which Triton loads one element at a time; the composed tensor is the table
    reversed, read at kv_idx - q_idx + Lq - 1."""
    attn, shape = variants.build("relative_bias", SHAPE)
    q, k, v = variants.inputs(shape)
    (table,) = attn._build(q, k, v, compose=False)[1]
    (composed,) = attn._build(q, k, v)[1]
    torch.testing.assert_close(composed, table.flip(1))


@pytest.mark.parametrize("name, score_mod", [
    # A read at kv_idx - q_idx plus a constant is the composed form already: kept as written.
    ("affine", lambda t: lambda s, b, h, i, j: s + t[h, j - i + 44]),
    # The index reads a position on its own, or the head inside the bucket's function.
    ("query position", lambda t: lambda s, b, h, i, j: s + t[h, torch.clamp(i // 4, max=15)]),
    ("head inside", lambda t: lambda s, b, h, i, j: s + t[h, torch.clamp((j - i).abs() // 8 + h, max=15)]),
    ("score inside", lambda t: lambda s, b, h, i, j: s + t[h, torch.clamp((s * 0.0).long() + (j - i).abs(), max=15)]),
])
def test_reads_that_are_not_a_function_of_the_distance_stay(name, score_mod):
    table = _table(buckets=139 if name == "affine" else 16)
    _, shapes = _captures(ae.attention(score_mod=score_mod(table)))
    assert shapes == [tuple(table.shape)]


def test_either_sign_of_the_distance_and_several_reads():
    a, b_ = _table(seed=1), _table(buckets=8, seed=2)

    def score_mod(s, b, h, i, j):
        return s + a[h, torch.clamp((j - i).abs() // 3, max=15)] + b_[h, torch.clamp(i - j, 0, 7) // 2]

    text, shapes = _captures(ae.attention(score_mod=score_mod))
    assert shapes == [(4, 114), (4, 114)]


@pytest.mark.parametrize("backend", ["cpu", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_outputs_match_the_reference(backend, dtype):
    attn = ae.attention(score_mod=_bucketed(_table()), mask_mod=lambda b, h, i, j: i + 30 >= j)
    q, k, v = variants.inputs(SHAPE, dtype=dtype, seed=4)
    want = attn(q.double(), k.double(), v.double(), backend="reference")
    if backend == "cpu":
        got = attn(q, k, v, backend="cpu")
    else:
        from ae_mlir.backends import triton as tb

        bundle = tb.compile_bundle(attn, q, k, v, target="cuda:90")
        got = interpret(bundle, q, k, v, *attn._build(q, k, v)[1])[0][0]
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    assert (got.double() - want).abs().max().item() < tol


def test_table_gradients_reach_the_table_through_torch():
    table64 = _table(seed=5).double().requires_grad_()
    table = table64.detach().float().requires_grad_()
    q, k, v = variants.inputs(SHAPE, dtype=torch.float64, seed=6)
    d_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    want = torch.autograd.grad(ae.attention(score_mod=_bucketed(table64))(*leaves, backend="reference"),
                               leaves + [table64], d_out)
    leaves = [t.detach().float().requires_grad_() for t in (q, k, v)]
    got = torch.autograd.grad(ae.attention(score_mod=_bucketed(table))(*leaves, backend="cpu"),
                              leaves + [table], d_out.float())
    for name, g, w in zip(("dq", "dk", "dv", "dtable"), got, want):
        err = float((g.double() - w).abs().max() / w.abs().max())
        assert err < 1e-4, f"{name}: relative error {err:.3g}"


def test_composed_with_key_lengths():
    # Per-entry lengths leave the positions 0 .. Lq - 1 and 0 .. Lk - 1: the table is composed
    # per distance as without them (test_mirror_reads.py: packed sequences; test_paged_kv.py).
    attn = ae.attention(score_mod=_bucketed(_table(seed=8)))
    q, k, v = variants.inputs(SHAPE, seed=9)
    lengths = torch.full((1,), 60, dtype=torch.int32)
    _, captures = attn._build(q, k, v, kv_len=lengths)
    assert tuple(captures[0].shape) == (4, 45 + 70 - 1)
    want = attn(q.double(), k.double(), v.double(), kv_len=lengths, backend="reference")
    got = attn(q, k, v, kv_len=lengths, backend="cpu")
    assert float((got.double() - want).abs().max() / want.abs().max()) < 1e-5


def test_gradients_with_key_lengths_on_both_backends():
    """The reference backend reads the table as written: one closure tensor where the composed
    call has one per read, so kv_len sits elsewhere among them. Its backward looked for kv_len at
    the composed call's place and failed (an IndexError, found by the packed-sequence fuzz test's
    oracle)."""
    table64 = _table(seed=14).double().requires_grad_()
    table = table64.detach().float().requires_grad_()

    def _twice(t):
        bucketed = _bucketed(t)

        def score_mod(s, b, h, i, j):
            return bucketed(s, b, h, i, j) + 0.5 * t[h, (i - j) % 16]

        return score_mod

    q, k, v = variants.inputs(SHAPE, dtype=torch.float64, seed=15)
    lengths = torch.full((1,), 60, dtype=torch.int32)
    d_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(16), dtype=torch.float64)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    want = torch.autograd.grad(ae.attention(score_mod=_twice(table64))(*leaves, kv_len=lengths, backend="reference"),
                               leaves + [table64], d_out)
    leaves = [t.detach().float().requires_grad_() for t in (q, k, v)]
    got = torch.autograd.grad(ae.attention(score_mod=_twice(table))(*leaves, kv_len=lengths, backend="cpu"),
                              leaves + [table], d_out.float())
    for name, g, w in zip(("dq", "dk", "dv", "dtable"), got, want):
        err = float((g.double() - w).abs().max() / w.abs().max())
        assert err < 1e-4, f"{name}: relative error {err:.3g}"


def test_torch_compile_composes_from_the_tensors_it_fetches():
    """Under torch.compile the op takes the table itself; the module reads it composed, and the
    table's gradient is the composed tensor's added back at the positions it gathered. A second
    table read as written rides along, as does the same table read at a constant."""
    from test_backward_kernels import kernels_only

    table, other = _table(seed=12).requires_grad_(), _table(buckets=3, seed=13).requires_grad_()
    bucketed = _bucketed(table)

    def score_mod(s, b, h, i, j):
        return bucketed(s, b, h, i, j) + other[h, 1] * table[h, 0]

    attn = ae.attention(score_mod=score_mod, mask_mod=lambda b, h, i, j: i >= j)
    q, k, v = variants.inputs(SHAPE, seed=14)
    d_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(15))

    def step(q):
        return (attn(q, k, v, backend="cpu") * d_out).sum()

    eager_q = q.clone().requires_grad_()
    step(eager_q).backward()
    eager = [eager_q.grad, table.grad.clone(), other.grad.clone()]
    table.grad = other.grad = None
    compiled_q = q.clone().requires_grad_()
    fed = []

    def recording(plan, given):
        out = kernel_closures(plan, given)
        fed.append(sorted(tuple(t.shape) for t in out))
        return out

    with kernels_only(), pytest.MonkeyPatch.context() as patch:
        patch.setattr(relative_reads, "kernel_closures", recording)
        explained = torch._dynamo.explain(step)(q.clone().requires_grad_())
        assert explained.graph_break_count == 0, explained.break_reasons
        torch.compile(step, backend="aot_eager", fullgraph=True)(compiled_q).backward()
    # The forward and the backward op each fed the kernels the composed table beside the others.
    assert fed and all(shapes == [(4, 3), (4, 16), (4, 114)] for shapes in fed)
    for got, want in zip((compiled_q.grad, table.grad, other.grad), eager):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_checked_indices_check_the_mods_as_written():
    table = _table(buckets=8, seed=10)
    # Buckets reach 13 for a table of 8: checked mode names the read, as without composition.
    attn = ae.attention(score_mod=lambda s, b, h, i, j: s + table[h, (j - i).abs() // 5], check_indices=True)
    q, k, v = variants.inputs(SHAPE, seed=11)
    with pytest.raises(IndexError, match="score_mod"):
        attn(q, k, v, backend="cpu")
