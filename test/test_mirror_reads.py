"""Closure reads that step back along a tile's rows, which the kernels read from a mirrored copy
of the tensor (passes/mirror_reads.py, attn-tile(-backward){mirror-reads}): the Triton bundles
take the copy as an input the runtime makes, and their gradients, run in the TTIR interpreter at
the default config, match float64 autograd; the CPU backend makes the copy per call."""
from __future__ import annotations

import pytest
import torch

import ae_mlir as ae
from ae_mlir import runtime, variants
from ae_mlir.backends import triton as tb
from ae_mlir.core import abi
from bundle_interp import interpret_roles
from test_backward_triton import _check, _problem


def _closures(attn, h, hkv, lq, lk, d, dtype):
    """The closure tensors the kernels read (composed where the frontend composes them)."""
    meta = [torch.empty(1, n, length, d, dtype=dtype) for n, length in ((h, lq), (hkv, lk), (hkv, lk))]
    return attn._build(*meta)[1]


def _mirrored_roles(bundle) -> list[str]:
    return [spec.role for spec in bundle.inputs if abi.mirrored_capture(spec.role)]


@pytest.mark.parametrize("target", ["cuda:90", "hip:gfx942"])
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
def test_relative_table_composed_reads_its_mirror_in_the_dkdv_kernel(target, dtype, tol):
    # The catalogue's table[h, q_idx - kv_idx + Lk - 1] is composed reversed (kv_idx - q_idx + Lq - 1),
    # which steps back along the dK/dV kernel's rows of queries; ragged Lq != Lk, GQA.
    attn, shape = variants.build("relative_bias", variants.Shape(1, 4, 77, 70, 32, 32, heads_kv=2))
    closures = _closures(attn, 4, 2, 77, 70, 32, dtype)
    bundle = _check(attn, dtype, target, tol, h=4, hkv=2, lq=77, lk=70, dk=32, closures=closures)
    assert _mirrored_roles(bundle) == ["c0_mirrored"]
    # The dK/dV kernel (the bundle's own) reads the copy; the dQ kernel (its stage) the table.
    assert "c0_mirrored" in bundle.variants["aligned"].args
    assert "c0_mirrored" not in bundle.stages[0].variants["aligned"].args


def test_clamped_read_with_a_head_offset():
    # table[h, kv_idx - q_idx + 12 + h] for |kv_idx - q_idx| up to 76: the frontend's clamp into
    # [0, 39] cuts most reads, and the mirrored read must clamp the same elements.
    table = torch.randn(2, 40, dtype=torch.float64)

    def bias(s, b, h, q_idx, kv_idx):
        return s + table[h, kv_idx - q_idx + 12 + h]

    attn = ae.attention(score_mod=bias)
    closures = _closures(attn, 2, 2, 77, 77, 32, torch.float32)
    bundle = _check(attn, torch.float32, "cuda:90", 1e-5, lq=77, closures=closures)
    assert _mirrored_roles(bundle) == ["c0_mirrored"]


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
def test_reads_that_step_back_along_the_keys_are_mirrored_in_the_dq_kernel(dtype, tol):
    # Left uncomposed (as with per-entry lengths or packed sequences), table[h, q_idx - kv_idx + c]
    # steps back along the dQ kernel's rows of keys and ascends along the dK/dV kernel's rows of
    # queries; a per-query bias ascends along the queries and is constant along the keys.
    rows, table = torch.randn(2, 77), torch.randn(2, 153)
    attn = ae.attention(score_mod=lambda s, b, h, i, j: s + rows[h, i] + table[h, i - j + 76])
    (q, k, v), out, d_out, lse, d_lse, want = _problem(attn, 1, 2, 2, 77, 77, 32, 32)
    inputs = [t.detach().to(dtype) for t in (q, k, v)]
    bundle = tb.build_backward_bundle(attn.mlir(*inputs, compose=False), "cuda:90")
    assert _mirrored_roles(bundle) == ["c1_mirrored"]
    assert "c1_mirrored" in bundle.stages[0].variants["aligned"].args
    assert "c1_mirrored" not in bundle.variants["aligned"].args
    tensors = dict(zip(("q", "k", "v"), inputs), out=out.detach().to(dtype), do=d_out.to(dtype),
                   lse=lse.detach().float(), dlse=d_lse.float(), c0=rows, c1=table)
    got = interpret_roles(bundle, tensors)
    for role, reference in zip(("dq", "dk", "dv"), want):
        scale = reference.abs().max()
        torch.testing.assert_close(got[role].double() / scale, reference / scale, atol=tol, rtol=0, msg=role)


def test_every_preset_mirrors():
    # Triton stages a descending gather one element at a time; the CPU's vectorizer gathers it
    # lane by lane (test/lit/passes/cpu-mirror-reads-*.mlir).
    from ae_mlir import presets

    for preset, target in (("triton", "cuda:90"), ("triton", "hip:gfx942"), ("cpu", "host")):
        for backward in (False, True):
            options = presets.options_for(preset, None, target, backward=backward)
            assert "mirror-reads=true" in presets.pipeline_text(preset, options, "l1")


def _double_grads(attn_of, tensors, grad_out):
    """Float64 autograd of the reference backend through `attn_of(closures)`."""
    leaves = [t.detach().double().requires_grad_() for t in tensors]
    q, k, v, *closures = leaves
    out = attn_of(*closures)(q, k, v, backend="reference")
    return out, torch.autograd.grad(out, leaves, grad_out.double())


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 2e-5), (torch.bfloat16, 3e-2)])
def test_cpu_backward_reads_the_composed_table_mirrored(dtype, tol):
    # The catalogue's relative bias, composed (kv_idx - q_idx + c), steps back along the dK/dV
    # kernel's rows of queries: that kernel takes the mirrored copy, which the CPU backend makes
    # per call. Ragged Lq != Lk, GQA, a learnable table: every gradient against float64.
    from ae_mlir.backends import cpu

    gen = torch.Generator().manual_seed(5)
    h, hkv, lq, lk, d = 4, 2, 77, 70, 32
    q = torch.randn(1, h, lq, d, generator=gen)
    k, v = (torch.randn(1, hkv, lk, d, generator=gen) for _ in range(2))
    table = torch.randn(h, lq + lk - 1, generator=gen)

    def attn_of(t):
        return ae.attention(score_mod=lambda s, b, hh, i, j: s + t[hh, i - j + lk - 1])

    leaves = [x.to(dtype).requires_grad_() for x in (q, k, v)] + [table.clone().requires_grad_()]
    out = attn_of(leaves[3])(*leaves[:3])
    grad_out = torch.randn(out.shape, generator=gen)
    got = torch.autograd.grad(out, leaves, grad_out.to(dtype))
    want_out, want = _double_grads(attn_of, [q, k, v, table], grad_out)
    assert (out.double() - want_out).abs().max() < tol * want_out.abs().max()
    for role, g, w in zip(("dq", "dk", "dv", "dtable"), got, want):
        assert (g.double() - w).abs().max() < tol * w.abs().max(), role
    text = attn_of(table).mlir(*(x.to(dtype) for x in (q, k, v)))
    assert list(cpu.compile_module(text, backward="dkdv").mirrored.values()) == [0]
    assert cpu.compile_module(text, backward="dq").mirrored == {}


def test_cpu_forward_with_lengths_reads_the_table_mirrored():
    # A table read at the queries' positions in the cache steps back along the forward's rows of
    # keys; a kernel called directly takes the inputs without the copy.
    from ae_mlir.backends import cpu

    gen = torch.Generator().manual_seed(6)
    q = torch.randn(3, 4, 90, 32, generator=gen)
    k, v = (torch.randn(3, 4, 130, 32, generator=gen) for _ in range(2))
    lengths = torch.tensor([130, 17, 64], dtype=torch.int32)
    table, attn = _at_cache_positions(90, 130, 4, lengths, gen)
    got = attn(q, k, v, kv_len=lengths)
    want = attn(q.double(), k.double(), v.double(), kv_len=lengths, backend="reference")
    assert (got.double() - want).abs().max() < 1e-5 * want.abs().max()
    closures = attn._build(q, k, v, kv_len=lengths)[1]
    kernel = cpu.compile_module(attn.mlir(q, k, v, kv_len=lengths))
    assert list(kernel.mirrored.values()) == [next(i for i, t in enumerate(closures) if t is table)]
    out, _ = kernel([q, k, v, *closures])
    assert (out.double() - want).abs().max() < 1e-5 * want.abs().max()


def test_runtime_makes_the_mirror_from_the_closure_tensor():
    attn, shape = variants.build("relative_bias", variants.Shape(1, 2, 40, 40, 16, 16))
    q, k, v = (t.to(torch.bfloat16) for t in variants.inputs(shape))
    bundle = tb.build_backward_bundle(attn.mlir(q, k, v), "cuda:90")
    table = attn._build(q, k, v)[1][0]
    made = runtime.backward_inputs_made(bundle, {"q": q, "k": k, "v": v, "c0": table}, "cpu")
    assert torch.equal(made["c0_mirrored"], table.flip(-1))
    # A caller that gives the copy keeps it.
    assert "c0_mirrored" not in runtime.backward_inputs_made(
        bundle, {"q": q, "k": k, "v": v, "c0": table, "c0_mirrored": table.flip(-1)}, "cpu")


def _at_cache_positions(lq: int, lk: int, heads: int, lengths: torch.Tensor, gen):
    """A relative-position table read at the queries' positions in the cache, table[h, q_idx +
    shift[b] - kv_idx + c] with shift = kv_len - Lq (the queries last in each entry): not a
    function of the distance alone, so the frontend reads it as written, stepping back along the
    rows of keys."""
    table = torch.randn(heads, lq + 2 * lk, generator=gen)
    shift = (lengths - lq).to(torch.int64)
    return table, ae.attention(score_mod=lambda s, b, h, i, j: s + table[h, i + shift[b] - j + lk - 1])


@pytest.mark.parametrize("lq, lk, lengths", [(4, 3000, [1, 2999, 1500]), (200, 300, [300, 17, 0])],
                         ids=["decoding", "prefill"])
def test_forward_with_lengths_reads_the_table_mirrored(lq, lk, lengths):
    # The kernels (split and GQA-packed when decoding) read the mirrored copy the runtime makes,
    # at the default config.
    from bundle_interp import interpret

    gen = torch.Generator().manual_seed(3)
    q = torch.randn(3, 8, lq, 64, generator=gen).to(torch.bfloat16)
    k, v = (torch.randn(3, 2, lk, 64, generator=gen).to(torch.bfloat16) for _ in range(2))
    lengths = torch.tensor(lengths, dtype=torch.int32)
    table, attn = _at_cache_positions(lq, lk, 8, lengths, gen)
    bundle = tb.compile_bundle(attn, q, k, v, target="cuda:90", kv_len=lengths)
    closures = attn._build(q, k, v, kv_len=lengths)[1]
    assert _mirrored_roles(bundle) == [abi.mirrored(next(i for i, t in enumerate(closures) if t is table))]
    (out, lse), _ = interpret(bundle, q, k, v, *closures)
    want, want_lse = attn(q.double(), k.double(), v.double(), kv_len=lengths, backend="reference", return_lse=True)
    assert (out.double() - want).abs().max() < 2e-2 * want.abs().max()
    finite = torch.isfinite(want_lse)
    assert torch.equal(finite, torch.isfinite(lse))
    assert (lse.double()[finite] - want_lse[finite]).abs().max() < 1e-3


def test_a_table_of_the_distance_is_composed_with_lengths_and_packed_sequences():
    # With per-entry lengths, paged caches or packed sequences the positions are still 0 .. Lq - 1
    # and 0 .. Lk - 1 (a packed batch's: the longest sequences'), so T5's bucket is composed per
    # distance there too: one read of a [H, Lq + Lk - 1] table per score, no log.
    from ae_mlir import variants

    attn, _ = variants.build("t5_bias", variants.Shape(3, 4, 90, 130, 32, 32))
    gen = torch.Generator().manual_seed(4)
    q = torch.randn(3, 4, 90, 32, generator=gen)
    k, v = (torch.randn(3, 4, 130, 32, generator=gen) for _ in range(2))
    lengths = torch.tensor([130, 17, 64], dtype=torch.int32)
    text = attn.mlir(q, k, v, kv_len=lengths)
    assert "tensor<4x219xf32>" in text and "math.log" not in text
    assert "math.log" in attn.mlir(q, k, v, kv_len=lengths, compose=False)
    got = attn(q, k, v, kv_len=lengths)
    want = attn(q.double(), k.double(), v.double(), kv_len=lengths, backend="reference")
    assert (got.double() - want).abs().max() < 1e-5 * want.abs().max()
    offsets = torch.tensor([0, 50, 270], dtype=torch.int32)
    packed = [torch.randn(4, 270, 32, generator=gen) for _ in range(3)]
    where = dict(cu_seqlens_q=offsets, cu_seqlens_k=offsets, max_seqlen_q=220, max_seqlen_k=220)
    assert "math.log" not in attn.mlir(*packed, **where)
    got = attn(*packed, **where)
    want = attn(*(t.double() for t in packed), **where, backend="reference")
    assert (got.double() - want).abs().max() < 1e-5 * want.abs().max()


def test_the_mirrored_copy_is_kept_while_the_table_is_unchanged():
    # A decoding step or a layer's next call on the same table copies nothing; a table changed in
    # place (a learnable one after an optimizer step) is copied again.
    attn, shape = variants.build("relative_bias", variants.Shape(1, 2, 40, 40, 16, 16))
    q, k, v = (t.to(torch.bfloat16) for t in variants.inputs(shape))
    bundle = tb.build_backward_bundle(attn.mlir(q, k, v), "cuda:90")
    table = attn._build(q, k, v)[1][0].clone()
    given = {"q": q, "k": k, "v": v, "c0": table}
    first = runtime.backward_inputs_made(bundle, given, "cpu")["c0_mirrored"]
    assert runtime.backward_inputs_made(bundle, given, "cpu")["c0_mirrored"] is first
    table.add_(1.0)
    again = runtime.backward_inputs_made(bundle, given, "cpu")["c0_mirrored"]
    assert again is not first and torch.equal(again, table.flip(-1))
