"""Packed variable-length batches (FlashAttention's cu_seqlens): `attn(q, k, v, cu_seqlens_q=cq,
cu_seqlens_k=ck)` with q [T, H, D] (layout "blhd") or [H, T, D] attends each sequence's queries
to its own keys, the mods seeing the sequence as b and positions within it. Checked against a
float64 oracle written here, one sequence at a time, with 1 to 17 sequences of ragged lengths
(some 0 and 1, Lq != Lk), through the reference, the CPU backend and the TTIR interpreter at the
default configs."""
from __future__ import annotations

import math

import pytest
import torch

import ae_mlir as ae
from ae_mlir.backends import triton as tb
from ae_mlir.frontend import varlen
from bundle_interp import interpret, interpret_roles

WINDOW = 7


def _mods():
    slopes = torch.tensor([0.3, 0.1, 0.05, 0.2])
    attn = ae.attention(score_mod=lambda s, b, h, i, j: s - slopes[h] * (i - j) + 0.1 * b,
                        mask_mod=lambda b, h, i, j: j <= i + WINDOW, layout="blhd")

    def score_mod(s, b, h, i, j):
        return s - slopes[:len(s)].view(-1, 1, 1).double() * (i - j) + 0.1 * b

    return attn, score_mod, (lambda i, j: j <= i + WINDOW)


def _oracle(q, k, v, lens_q, lens_k, score_mod=None, keep=None):
    """float64 attention of packed [T, H, D] tensors, sequence by sequence: (out [T, H, Dv], lse [H, T])."""
    outs, lses = [], []
    iq = ik = 0
    group = q.shape[1] // k.shape[1]
    for b, (nq, nk) in enumerate(zip(lens_q, lens_k)):
        qs = q[iq:iq + nq].double().transpose(0, 1)
        ks, vs = (t[ik:ik + nk].double().transpose(0, 1).repeat_interleave(group, 0) for t in (k, v))
        s = qs @ ks.transpose(-1, -2) / math.sqrt(q.shape[2])
        i, j = torch.arange(nq).view(nq, 1), torch.arange(nk).view(1, nk)
        if score_mod is not None:
            s = score_mod(s, b, None, i, j)
        if keep is not None:
            s = s.masked_fill(~keep(i, j), -math.inf)
        lse = torch.logsumexp(s, dim=-1) if nk else torch.full((q.shape[1], nq), -math.inf, dtype=torch.float64)
        p = torch.nan_to_num(torch.exp(s - lse.unsqueeze(-1)))
        outs.append((p @ vs).transpose(0, 1))
        lses.append(lse)
        iq, ik = iq + nq, ik + nk
    return torch.cat(outs), torch.cat(lses, dim=1)


def _batch(lens_q, lens_k, h=4, hkv=2, d=16, dv=16, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(lens_q), h, d, generator=gen).to(dtype)
    k = torch.randn(sum(lens_k), hkv, d, generator=gen).to(dtype)
    v = torch.randn(sum(lens_k), hkv, dv, generator=gen).to(dtype)
    cq, ck = (torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32) for lens in (lens_q, lens_k))
    return q, k, v, cq, ck


CASES = [([9], [9]), ([5, 0, 17, 1, 30], [5, 3, 17, 40, 30]),
         ([3, 1, 0, 8, 2, 11, 5, 1, 7, 0, 4, 6, 9, 2, 1, 13, 3], [3, 2, 4, 8, 0, 11, 9, 1, 7, 1, 4, 6, 12, 2, 1, 13, 5])]


@pytest.mark.parametrize("lens_q, lens_k", CASES, ids=["one", "five", "seventeen"])
@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_packed_batches_match_the_oracle(lens_q, lens_k, backend):
    attn, score_mod, keep = _mods()
    q, k, v, cq, ck = _batch(lens_q, lens_k)
    out, lse = attn(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck, backend=backend, return_lse=True)
    want, want_lse = _oracle(q, k, v, lens_q, lens_k, score_mod, keep)
    assert out.shape == want.shape and lse.shape == want_lse.shape
    torch.testing.assert_close(out.double(), want, rtol=0, atol=2e-6)
    finite = torch.isfinite(want_lse)
    assert torch.equal(finite, torch.isfinite(lse))
    torch.testing.assert_close(lse.double()[finite], want_lse[finite], rtol=0, atol=2e-6)


def test_the_bhld_layout_and_other_lengths_reuse_the_module():
    attn = ae.attention(layout="blhd")
    q, k, v, cq, ck = _batch([4, 6, 2], [4, 6, 2])
    out = attn(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck)
    heads_first = ae.attention(layout="bhld")
    got = heads_first(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), cu_seqlens_q=cq, cu_seqlens_k=ck)
    torch.testing.assert_close(got.transpose(0, 1), out)
    torch.testing.assert_close(out.double(), _oracle(q, k, v, [4, 6, 2], [4, 6, 2])[0], rtol=0, atol=2e-6)
    # Other lengths with the same total, sequence-count bucket and longest-sequence bucket compile
    # to the same module: the offsets are read at run time.
    other = torch.tensor([0, 1, 9, 12], dtype=torch.int32)
    assert attn.mlir(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=cq) == attn.mlir(q, k, v, cu_seqlens_q=other,
                                                                               cu_seqlens_k=other)


@pytest.mark.parametrize("target", ["cuda:90", "hip:gfx942"])
@pytest.mark.parametrize("lens_q, lens_k", [([300, 0, 17, 1, 129], [300, 5, 17, 40, 129]),
                                            ([1000, 24, 1, 511], [1000, 24, 1, 511])])
def test_default_config_bundles_in_the_ttir_interpreter(target, lens_q, lens_k):
    attn, score_mod, keep = _mods()
    q, k, v, cq, ck = _batch(lens_q, lens_k, h=4, hkv=2, d=64, dv=64, dtype=torch.bfloat16)
    bundle = tb.compile_bundle(attn, q, k, v, target=target, cu_seqlens_q=cq, cu_seqlens_k=ck,
                               max_seqlen_q=max(lens_q), max_seqlen_k=max(lens_k))
    qv, kv, vv = varlen.packed_views(q, k, v, "blhd")
    sequences = varlen.prepare(qv, kv, cq, ck, None, None, False)
    closures = [torch.tensor([0.3, 0.1, 0.05, 0.2]), sequences.kv_len, sequences.cu_q, sequences.cu_k]
    (out, lse), _ = interpret(bundle, qv, kv, vv, *closures)
    check_packed_results(out, lse, *_oracle(q, k, v, lens_q, lens_k, score_mod, keep))


def check_packed_results(out, lse, want, want_lse):
    """A 16-bit kernel's packed out [1, H, T, D] and lse [1, H, T] against the oracle's."""
    got = out[0].transpose(0, 1).double()
    assert (got - want).abs().max() < 2e-2 * want.abs().max()
    finite = torch.isfinite(want_lse)
    assert torch.equal(finite, torch.isfinite(lse[0]))
    assert (lse[0].double()[finite] - want_lse[finite]).abs().max() < 1e-3


def test_bad_packed_calls():
    attn = ae.attention(layout="blhd")
    q, k, v, cq, ck = _batch([3, 4], [3, 4])
    with pytest.raises(ValueError, match="go together"):
        attn(q, k, v, cu_seqlens_q=cq)
    with pytest.raises(ValueError, match="never decrease"):
        attn(q, k, v, cu_seqlens_q=torch.tensor([0, 5, 3], dtype=torch.int32), cu_seqlens_k=ck)
    with pytest.raises(ValueError, match="end at the 7 packed rows"):
        attn(q, k, v, cu_seqlens_q=torch.tensor([0, 5, 9]), cu_seqlens_k=ck)
    # Rows past the last offset would belong to no sequence and be written by no kernel.
    with pytest.raises(ValueError, match="end at the 7 packed rows"):
        attn(q, k, v, cu_seqlens_q=torch.tensor([0, 3, 6]), cu_seqlens_k=ck)
    with pytest.raises(ValueError, match="max_seqlen_q = 2 is shorter than the longest sequence \\(4\\)"):
        attn(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=2)
    with pytest.raises(ValueError, match="return_lse=True needs normalize='softmax'"):
        ae.attention(normalize="sigmoid", layout="blhd")(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck, return_lse=True)
    with pytest.raises(ValueError, match=r"packed \[T, H, D\] tensor"):
        attn(q.unsqueeze(0), k, v, cu_seqlens_q=cq, cu_seqlens_k=ck)
    with pytest.raises(ValueError, match="do not combine with kv_len"):
        attn(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck, kv_len=torch.tensor([1, 2]))


def _grad_problem(lens_q, lens_k, d=16, seed=0):
    q, k, v, cq, ck = _batch(lens_q, lens_k, d=d, dv=d, dtype=torch.float64, seed=seed)
    attn, score_mod, keep = _mods()
    q64, k64, v64 = (t.clone().requires_grad_() for t in (q, k, v))
    out, lse = _oracle(q64, k64, v64, lens_q, lens_k, score_mod, keep)
    gen = torch.Generator().manual_seed(seed + 1)
    d_out = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    d_lse = torch.randn(lse.shape, generator=gen, dtype=torch.float64).masked_fill(~torch.isfinite(lse), 0.0)
    want = torch.autograd.grad((out, lse.nan_to_num(neginf=0.0)), (q64, k64, v64), (d_out, d_lse))
    return attn, (q, k, v, cq, ck), out, lse, d_out, d_lse, want


@pytest.mark.parametrize("lens_q, lens_k", CASES[1:], ids=["five", "seventeen"])
def test_gradients_from_the_cpu_backward_kernels(lens_q, lens_k):
    attn, (q, k, v, cq, ck), _, _, d_out, d_lse, want = _grad_problem(lens_q, lens_k)
    q32, k32, v32 = (t.float().requires_grad_() for t in (q, k, v))
    out, lse = attn(q32, k32, v32, cu_seqlens_q=cq, cu_seqlens_k=ck, return_lse=True)
    got = torch.autograd.grad((out, lse), (q32, k32, v32), (d_out.float(), d_lse.float()))
    for g, w in zip(got, want):
        torch.testing.assert_close(g.double(), w, rtol=0, atol=2e-5)


@pytest.mark.parametrize("target", ["cuda:90", "hip:gfx942"])
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
def test_backward_bundles_in_the_ttir_interpreter(target, dtype, tol):
    lens_q, lens_k = [70, 0, 17, 1, 129], [70, 5, 17, 40, 129]
    attn, (q, k, v, cq, ck), out, lse, d_out, d_lse, want = _grad_problem(lens_q, lens_k, d=32)
    qv, kv, vv = varlen.packed_views(q, k, v, "blhd")
    ov, dov, _ = varlen.packed_views(out.detach(), d_out, d_out, "blhd")
    cast = (lambda t: t.detach().to(dtype))
    text = attn.mlir(cast(q), cast(k), cast(v), cu_seqlens_q=cq, cu_seqlens_k=ck)
    bundle = tb.build_backward_bundle(text, target)
    sequences = varlen.prepare(qv, kv, cq, ck, None, None, False)
    closures = [torch.tensor([0.3, 0.1, 0.05, 0.2]), sequences.kv_len, sequences.cu_q, sequences.cu_k]
    tensors = {"q": cast(qv), "k": cast(kv), "v": cast(vv), "out": cast(ov), "do": cast(dov),
               "lse": lse.nan_to_num(neginf=-math.inf).float().unsqueeze(0), "dlse": d_lse.float().unsqueeze(0)}
    tensors.update({f"c{i}": t for i, t in enumerate(closures)})
    got = interpret_roles(bundle, tensors)
    for role, reference in zip(("dq", "dk", "dv"), want):
        packed = got[role][0].transpose(0, 1).double()
        scale = reference.abs().max()
        assert torch.isfinite(packed).all(), role
        torch.testing.assert_close(packed / scale, reference / scale, atol=tol, rtol=0, msg=role)


def test_gradients_the_kernels_do_not_compute_are_refused():
    attn, (q, k, v, cq, ck), *_ = _grad_problem([3, 4], [3, 4])
    with pytest.raises(ValueError, match="run as backward kernels"):
        attn(q.requires_grad_(), k, v, cu_seqlens_q=cq, cu_seqlens_k=ck, backend="reference")


def test_packed_training_under_torch_compile():
    attn = ae.attention(mask_mod=lambda b, h, i, j: i >= j, layout="blhd")
    q, k, v, cq, ck = _batch([5, 9, 2], [5, 9, 2])

    def step(q, k, v):
        return attn(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=9, max_seqlen_k=9).square().sum()

    eager = [t.clone().requires_grad_() for t in (q, k, v)]
    step(*eager).backward()
    compiled = [t.clone().requires_grad_() for t in (q, k, v)]
    explained = torch._dynamo.explain(step)(*[t.clone().requires_grad_() for t in (q, k, v)])
    assert explained.graph_break_count == 0, explained.break_reasons
    torch.compile(step, backend="aot_eager", fullgraph=True)(*compiled).backward()
    for a, b in zip(compiled, eager):
        torch.testing.assert_close(a.grad, b.grad)
    with pytest.raises(Exception, match="max_seqlen_q is needed here"):
        torch.compile(lambda q: attn(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck), backend="aot_eager",
                      fullgraph=True)(q)


def test_closure_gradients_of_packed_calls_under_torch_compile():
    # The backward kernels scatter the closure gradient, under compile as in eager.
    bias = torch.tensor([0.1, -0.2, 0.3, 0.05], requires_grad=True)
    attn = ae.attention(score_mod=lambda s, b, h, i, j: s + bias[h] * (i - j), layout="blhd")
    q, k, v, cq, ck = _batch([3, 5], [3, 5])

    def step(q):
        return attn(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=5, max_seqlen_k=5).square().sum()

    step(q).backward()
    eager = bias.grad.clone()
    bias.grad = None
    torch.compile(step, backend="aot_eager", fullgraph=True)(q).backward()
    assert torch.count_nonzero(eager) == 4
    torch.testing.assert_close(bias.grad, eager)


def test_checked_mode_checks_each_sequences_own_positions():
    length = 5
    table = torch.randn(2 * length - 1)
    relative = ae.attention(score_mod=lambda s, b, h, i, j: s + table[i - j + length - 1], layout="blhd",
                            check_indices=True)
    q, k, v, cq, ck = _batch([3, 5], [3, 5])
    relative(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck)  # in range inside every sequence
    small = torch.randn(length)
    too_small = ae.attention(score_mod=lambda s, b, h, i, j: s + small[i - j + 4], layout="blhd",
                             check_indices=True)
    with pytest.raises(IndexError, match="index 5 is out of range"):
        too_small(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck)


def test_offsets_on_the_meta_device_need_the_longest_sequences():
    attn, *_ = _mods()
    q = (torch.Size([64, 4, 32]), torch.bfloat16)
    cu = (torch.Size([4]), torch.int32)
    with pytest.raises(ValueError, match="max_seqlen_q is needed here"):
        tb.compile_bundle(attn, q, q, q, cu_seqlens_q=cu, cu_seqlens_k=cu)
    bundle = tb.compile_bundle(attn, q, q, q, cu_seqlens_q=torch.tensor([0, 10, 30, 64], dtype=torch.int32),
                               cu_seqlens_k=cu, max_seqlen_q=34, max_seqlen_k=34)
    assert bundle.grid[0] * bundle.grid[1] * bundle.grid[2] > 0


@pytest.mark.parametrize("target", ["cuda:90", "hip:gfx942", "cpu"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
# f32 scores of -120 carry rounding errors of 1e-5 into P = exp(s - lse): 1e-4 of the largest
# gradient there (the CPU's kernels reach 4e-5 on dK, with or without whole tiles).
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-4), (torch.bfloat16, 3e-2)])
def test_mask_only_backward_with_keys_past_an_end(target, causal, dtype, tol):
    # Softmax with a mask or none and no score_mod. Rows past a sequence's end load as zeros; the
    # lse of the first rows sits below -88 (scores of -113 there), where a key past the end left
    # unmasked in a dQ tile would give exp2(-lse) = inf times a zero key, NaN (as a kernel walking
    # the mask's whole tiles unmasked would, checked). Lengths cut the default configs' tiles
    # anywhere (Lq != Lk, empty and one-row sequences).
    lens_q, lens_k = [200, 0, 17, 1, 129], [190, 5, 17, 40, 129]
    keep = (lambda i, j: i >= j) if causal else None
    attn = ae.attention(mask_mod=(lambda b, h, i, j: i >= j) if causal else None, layout="blhd")
    q, k, v, cq, ck = _batch(lens_q, lens_k, d=32, dv=32, dtype=torch.float64, seed=5)
    q[:8], k[:8] = 8.0, -2.5  # s = -113 for the first rows of sequence 0 against its first keys
    k[8:190] = -k[8:190].abs() - 3.0  # and below -3 against the rest, so their lse stays below -88
    q, k, v = (t.to(dtype).double() for t in (q, k, v))  # the oracle sees what the kernels read
    q64, k64, v64 = (t.clone().requires_grad_() for t in (q, k, v))
    out, lse = _oracle(q64, k64, v64, lens_q, lens_k, None, keep)
    assert lse[:, :8].max() < -88
    gen = torch.Generator().manual_seed(6)
    d_out = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    want = torch.autograd.grad(out, (q64, k64, v64), d_out)
    if target == "cpu":
        qc, kc, vc = (t.to(dtype).requires_grad_() for t in (q, k, v))
        got = torch.autograd.grad(attn(qc, kc, vc, cu_seqlens_q=cq, cu_seqlens_k=ck), (qc, kc, vc), d_out.to(dtype))
        got = dict(zip(("dq", "dk", "dv"), (g.double() for g in got)))
    else:
        qv, kv, vv = varlen.packed_views(q, k, v, "blhd")
        ov, dov, _ = varlen.packed_views(out.detach(), d_out, d_out, "blhd")
        cast = (lambda t: t.detach().to(dtype))
        bundle = tb.build_backward_bundle(attn.mlir(cast(q), cast(k), cast(v), cu_seqlens_q=cq, cu_seqlens_k=ck),
                                          target)
        sequences = varlen.prepare(qv, kv, cq, ck, None, None, False)
        tensors = {"q": cast(qv), "k": cast(kv), "v": cast(vv), "out": cast(ov), "do": cast(dov),
                   "lse": lse.detach().float().unsqueeze(0), "dlse": torch.zeros(1, *lse.shape),
                   "c0": sequences.kv_len, "c1": sequences.cu_q, "c2": sequences.cu_k}
        got = {role: t[0].transpose(0, 1).double() for role, t in interpret_roles(bundle, tensors).items()}
    for role, reference in zip(("dq", "dk", "dv"), want):
        scale = reference.abs().max()
        assert torch.isfinite(got[role]).all(), role
        torch.testing.assert_close(got[role] / scale, reference / scale, atol=tol, rtol=0, msg=role)
