"""Packed variable-length batches of any total row count: a packed module's rows are `?`, so the
batches that share its sequence-count and longest-sequence buckets run one compiled kernel
whatever their totals (a serving loop's prefill batches, training batches packed without a fixed
token budget). Checked against the float64 oracles of test_varlen and test_linear_varlen at
several totals through the CPU backend (forward and backward, compiled once) and through one
Triton bundle per target in the TTIR interpreter (linear attention's split form sizing its
workspaces from the call's rows), and with offsets past the rows a call has, which the kernels
clamp into that call's rows (not the rows of the batch the kernel was compiled from)."""
from __future__ import annotations

import math

import pytest
import torch

import ae_mlir as ae
from ae_mlir.backends import cpu as cpu_backend
from ae_mlir.backends import triton as tb
from ae_mlir.frontend import varlen
from bundle_interp import interpret, interpret_roles
from test_linear_varlen import BIAS, DECAYS, _layer, _offsets, _problem
from test_linear_varlen import _oracle as _linear_oracle
from test_varlen import _batch, _mods, _oracle, check_packed_results

# Four sequences each (bucket 4), the longest 33-64 (bucket 64); totals 100, 151 and 59 for the
# queries, other totals for the keys.
BATCHES = [([30, 0, 40, 30], [30, 5, 40, 33]),
           ([64, 20, 33, 34], [50, 64, 1, 60]),
           ([1, 2, 55, 1], [3, 2, 60, 0])]


def _closures(sequences):
    return [torch.tensor([0.3, 0.1, 0.05, 0.2]), sequences.kv_len, sequences.cu_q, sequences.cu_k]


def test_batches_of_other_totals_write_one_module():
    attn, _, _ = _mods()
    texts = set()
    for lens_q, lens_k in BATCHES:
        q, k, v, cq, ck = _batch(lens_q, lens_k)
        texts.add(attn.mlir(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck))
    assert len(texts) == 1
    assert "tensor<1x4x?x16xf32>" in texts.pop()


@pytest.fixture
def compiled(monkeypatch):
    """The ids of the CPU kernels `compile_module` hands out while a test runs."""
    kernels = set()
    real = cpu_backend.compile_module

    def spy(*args, **kwargs):
        kernel = real(*args, **kwargs)
        kernels.add(id(kernel))
        return kernel

    monkeypatch.setattr(cpu_backend, "compile_module", spy)
    return kernels


def test_the_cpu_backend_compiles_once_for_every_total(compiled):
    attn, score_mod, keep = _mods()
    for lens_q, lens_k in BATCHES:
        q, k, v, cq, ck = _batch(lens_q, lens_k, dtype=torch.float64)
        q, k, v = (t.float().requires_grad_() for t in (q, k, v))
        out, lse = attn(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck, backend="cpu", return_lse=True)
        q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
        want, want_lse = _oracle(q64, k64, v64, lens_q, lens_k, score_mod, keep)
        assert out.shape == want.shape and lse.shape == want_lse.shape
        torch.testing.assert_close(out.double(), want, rtol=0, atol=2e-6)
        d_out = torch.randn(out.shape, dtype=torch.float64)
        got = torch.autograd.grad(out, (q, k, v), d_out.float())
        expected = torch.autograd.grad(want, (q64, k64, v64), d_out)
        for role, g, w in zip(("dq", "dk", "dv"), got, expected):
            torch.testing.assert_close(g.double(), w, rtol=0, atol=2e-5, msg=role)
    # One forward kernel and one of each backward kernel, each the same object for every total.
    assert len(compiled) == 3, compiled


@pytest.mark.parametrize("target", ["cuda:90", "hip:gfx942"])
def test_one_bundle_runs_every_total_in_the_ttir_interpreter(target):
    attn, score_mod, keep = _mods()
    q, k, v, cq, ck = _batch(*BATCHES[0], h=4, hkv=2, d=64, dv=64, dtype=torch.bfloat16)
    bundle = tb.compile_bundle(attn, q, k, v, target=target, cu_seqlens_q=cq, cu_seqlens_k=ck)
    for lens_q, lens_k in BATCHES:
        q, k, v, cq, ck = _batch(lens_q, lens_k, h=4, hkv=2, d=64, dv=64, dtype=torch.bfloat16, seed=len(lens_q))
        qv, kv, vv = varlen.packed_views(q, k, v, "blhd")
        sequences = varlen.prepare(qv, kv, cq, ck, None, None, False)
        (out, lse), _ = interpret(bundle, qv, kv, vv, *_closures(sequences))
        assert out.shape[2] == sum(lens_q) and lse.shape[2] == sum(lens_q)
        check_packed_results(out, lse, *_oracle(q, k, v, lens_q, lens_k, score_mod, keep))


def test_one_backward_bundle_runs_every_total_in_the_ttir_interpreter():
    attn, score_mod, keep = _mods()
    q, k, v, cq, ck = _batch(*BATCHES[0], d=32, dv=32)
    bundle = tb.build_backward_bundle(attn.mlir(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck), "cuda:90")
    for seed, (lens_q, lens_k) in enumerate(BATCHES[1:]):
        q, k, v, cq, ck = _batch(lens_q, lens_k, d=32, dv=32, dtype=torch.float64, seed=seed)
        q64, k64, v64 = (t.clone().requires_grad_() for t in (q, k, v))
        out, lse = _oracle(q64, k64, v64, lens_q, lens_k, score_mod, keep)
        d_out = torch.randn(out.shape, dtype=torch.float64)
        want = torch.autograd.grad(out, (q64, k64, v64), d_out)
        qv, kv, vv, ov, dov = (t.float().transpose(0, 1).unsqueeze(0) for t in (q, k, v, out.detach(), d_out))
        sequences = varlen.prepare(qv, kv, cq, ck, None, None, False)
        tensors = {"q": qv, "k": kv, "v": vv, "out": ov, "do": dov,
                   "lse": lse.detach().nan_to_num(neginf=-math.inf).float().unsqueeze(0),
                   "dlse": torch.zeros(1, *lse.shape)}
        tensors.update({f"c{i}": t for i, t in enumerate(_closures(sequences))})
        got = interpret_roles(bundle, tensors)
        for role, reference in zip(("dq", "dk", "dv"), want):
            packed = got[role][0].transpose(0, 1).double()
            assert packed.shape == reference.shape, role
            torch.testing.assert_close(packed, reference, atol=1e-4, rtol=0, msg=role)


@pytest.mark.parametrize("backend", ["cpu", "cuda:90"])
def test_offsets_past_the_rows_are_clamped_into_this_calls_rows(backend):
    """Under torch.compile the offsets are not read, so a wrong last offset reaches the kernels:
    they clamp it into the rows this call's tensors have, as the dialect's unpack_sequences
    does (keys past them are zeros), and the kernel compiled from a batch of more rows reads and
    writes none past this one's."""
    attn = ae.attention(layout="blhd")
    q, k, v, cq, ck = _batch([40, 60], [40, 60])
    qv, kv, vv = varlen.packed_views(q, k, v, "blhd")
    if backend == "cpu":
        attn(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck, backend="cpu")  # compiled for 100 rows
    else:
        bundle = tb.compile_bundle(attn, q, k, v, target=backend, cu_seqlens_q=cq, cu_seqlens_k=ck)
    q, k, v, _, _ = _batch([5, 15], [5, 15], seed=3)
    qv, kv, vv = varlen.packed_views(q, k, v, "blhd")
    past = torch.tensor([0, 5, 40], dtype=torch.int32)  # the second sequence claims 35 of 15 rows
    sequences = varlen.Sequences(past, past, torch.tensor([5, 35], dtype=torch.int32), 64, 64)
    text, captures = attn._prepare(qv, kv, vv, sequences=sequences)
    if backend == "cpu":
        out, _ = cpu_backend.run_module_text(text, [qv, kv, vv] + captures, torch.float32)
    else:
        (out, _), _ = interpret(bundle, qv, kv, vv, *captures)
    zeros = torch.zeros(20, *k.shape[1:])
    want, _ = _oracle(q, torch.cat([k, zeros]), torch.cat([v, zeros]), [5, 15], [5, 35])
    torch.testing.assert_close(out[0].transpose(0, 1).double(), want, rtol=0, atol=2e-6)


def test_torch_compile_with_dynamic_shapes_takes_every_total(compiled):
    """A training step over packed batches of varying totals under torch.compile(dynamic=True):
    dynamo traces the op once with a symbolic total, and ae-mlir compiles its kernels once."""
    attn = ae.attention(mask_mod=lambda b, h, i, j: i >= j, layout="blhd")

    def step(q, k, v, cu):
        return attn(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=64, max_seqlen_k=64, backend="cpu")

    compiled_step = torch.compile(step, dynamic=True)
    for lens in ([30, 40], [64, 1], [50, 55]):
        q, k, v, cu, _ = _batch(lens, lens)
        leaves = [t.requires_grad_() for t in (q, k, v)]
        out = compiled_step(*leaves, cu)
        grads = torch.autograd.grad(out.square().sum(), leaves)
        eager = [t.detach().requires_grad_() for t in (q, k, v)]
        want = step(*eager, cu)
        torch.testing.assert_close(out, want)
        for g, w in zip(grads, torch.autograd.grad(want.square().sum(), eager)):
            torch.testing.assert_close(g, w)
    assert len(compiled) == 3  # the forward and the two backward kernels


# Linear attention: five sequences each (bucket 8), the longest 65-128 (bucket 128).
LINEAR_BATCHES = [[100, 0, 17, 1, 100], [128, 64, 3, 0, 1], [70, 70, 70, 70, 70]]


@pytest.mark.parametrize("decay, normalize", DECAYS, ids=["none", "normalized", "head", "token", "token_dim"])
def test_linear_cpu_kernels_compile_once_for_every_total(decay, normalize, compiled):
    layer = _layer(decay, normalize, chunk_size=16)
    counts = []
    for seed, lens in enumerate(LINEAR_BATCHES):
        q, k, v, g, s0 = _problem(lens, decay, seed=seed)
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out, state = layer(*leaves, g, s0, cu_seqlens=_offsets(lens), return_state=True, backend="cpu")
        want, want_state = _linear_oracle(q, k, v, g, s0, lens, decay, normalize)
        torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(state.double(), want_state, rtol=1e-5, atol=1e-5)
        d_out = torch.randn(out.shape, dtype=torch.float64)
        got = torch.autograd.grad(out, leaves, d_out.float())
        ref = [t.detach().double().requires_grad_() for t in (q, k, v)]
        expected = torch.autograd.grad(_linear_oracle(*ref, g, s0, lens, decay, normalize)[0], ref, d_out)
        for a, b in zip(got, expected):
            torch.testing.assert_close(a.double(), b, rtol=2e-4, atol=2e-4 * max(1.0, b.abs().max().item()))
        counts.append(len(compiled))
    assert counts[0] == counts[-1], counts  # the later totals compiled nothing


@pytest.mark.parametrize("target", ["cuda:90", "hip:gfx942"])
@pytest.mark.parametrize("decay, normalize", DECAYS, ids=["none", "normalized", "head", "token", "token_dim"])
def test_one_linear_bundle_runs_every_total_in_the_ttir_interpreter(target, decay, normalize):
    layer = _layer(decay, normalize)
    q, k, v, g, s0 = _problem(LINEAR_BATCHES[0], decay, dtype=torch.bfloat16)
    bundle = tb.build_bundle(layer.mlir(q, k, v, g, s0, cu_seqlens=_offsets(LINEAR_BATCHES[0])), target, None)
    for seed, lens in enumerate(LINEAR_BATCHES[1:]):
        q, k, v, g, s0 = _problem(lens, decay, dtype=torch.bfloat16, seed=seed + 1)
        qb, kb, vb, gb, s0b, sequences = layer._packed(q, k, v, g, s0, _offsets(lens), None)
        inputs = [t for t in (gb, s0b) if t is not None] + [sequences.kv_len, sequences.cu_q]
        (out, state), _ = interpret(bundle, qb, kb, vb, *inputs + ([] if normalize else [BIAS]))
        assert out.shape[2] == sum(lens)
        want, want_state = _linear_oracle(q, k, v, g, s0, lens, decay, normalize)
        got = out.transpose(1, 2).double()
        assert (got - want).abs().max() < 1e-2 * want.abs().max()
        assert (state[:len(lens)].double() - want_state).abs().max() < 1e-2 * want_state.abs().max()


@pytest.mark.parametrize("backend", ["cpu", "generic", "aligned"])
def test_strided_packed_views_of_other_totals(backend):
    """Packed q, k, v that are views of wider rows (a fused QKV projection's [T, H, 3D] cut in
    three): the CPU kernel and both Triton variants (the general one takes any strides) read
    them in place at two totals."""
    attn, score_mod, keep = _mods()
    bundle = None
    for seed, (lens_q, _) in enumerate(BATCHES[:2]):
        lens_k = lens_q
        q, k, v, cq, ck = _batch(lens_q, lens_k, h=4, hkv=4, d=16, dv=16, seed=seed)
        fused = torch.cat([q, k, v], dim=-1)
        q, k, v = fused[..., :16], fused[..., 16:32], fused[..., 32:]
        want, _ = _oracle(q, k, v, lens_q, lens_k, score_mod, keep)
        if backend == "cpu":
            out = attn(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck, backend="cpu")
        else:
            bundle = bundle or tb.compile_bundle(attn, q, k, v, target="cuda:90", cu_seqlens_q=cq, cu_seqlens_k=ck,
                                                 max_seqlen_q=64, max_seqlen_k=64)
            views = varlen.packed_views(q, k, v, "blhd")
            sequences = varlen.prepare(*views[:2], cq, ck, 64, 64, False)
            (packed, _), chosen = interpret(bundle, *views, *_closures(sequences), variant=backend)
            assert chosen.aligned == (backend == "aligned")
            out = packed[0].transpose(0, 1)
        torch.testing.assert_close(out.double(), want, rtol=0, atol=2e-6 if backend == "cpu" else 1e-5)
