"""Per-entry key lengths: `attn(q, k, v, kv_len=n)` attends batch entry b to its first n[b] keys,
so a KV cache allocated once for Lk keys serves every step of decoding without a recompile.
Checked against a float64 oracle written here (not the reference executor), with the unfilled
part of each cache poisoned with NaN, through the reference, the CPU backend, the L1 interpreter
(both ways of bounding the tile loops) and the TTIR interpreter at the default configs."""
from __future__ import annotations

import math

import pytest
import torch

import ae_mlir as ae
from ae_mlir.backends import triton as tb
from ae_mlir.core.context import new_context, parse_module
from ae_mlir.passes import build_pass_manager
from bundle_interp import interpret
from l1_interp import run_by_role, run_kernel


def _inputs(b, h, hkv, lq, lk, d, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)
                 for shape in ((b, h, lq, d), (b, hkv, lk, d), (b, hkv, lk, d)))


def _poisoned(t, lengths):
    """`t` with every key row past its entry's length set to NaN, as an unfilled cache may hold."""
    t = t.clone()
    for b, n in enumerate(lengths.tolist()):
        t[b, :, max(n, 0):] = float("nan")
    return t


def _oracle(q, k, v, lengths, score_mod=None, keep=None):
    """Softmax attention in float64 over each entry's first lengths[b] keys: (out, lse)."""
    b, h, lq, d = q.shape
    lk = k.shape[2]
    group = h // k.shape[1]
    kk, vv = (t.double().repeat_interleave(group, 1) for t in (k, v))
    vv = torch.nan_to_num(vv)
    s = q.double() @ kk.transpose(-1, -2) / math.sqrt(d)
    i, j = torch.arange(lq).view(lq, 1), torch.arange(lk).view(1, lk)
    if score_mod is not None:
        s = score_mod(s, i, j)
    visible = (j < lengths.long().view(b, 1, 1, 1)).expand(b, h, lq, lk)
    if keep is not None:
        visible = visible & keep(i, j)
    s = s.masked_fill(~visible, -math.inf)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.where(visible, torch.exp(s - lse.unsqueeze(-1).clamp_min(-1e300)), torch.zeros(()).double())
    p = torch.nan_to_num(p)
    return p @ vv, lse


_WINDOW = 30


def _variants():
    """(name, attention, the oracle's score_mod, the oracle's keep)"""
    yield "plain", ae.attention(), None, None
    yield ("window", ae.attention(mask_mod=lambda b, h, i, j: (j <= i + 40) & (j > i + 40 - _WINDOW)),
           None, lambda i, j: (j <= i + 40) & (j > i + 40 - _WINDOW))
    yield ("softcap", ae.attention(score_mod=lambda s, b, h, i, j: 8.0 * torch.tanh(s / 8.0)),
           lambda s, i, j: 8.0 * torch.tanh(s / 8.0), None)


VARIANTS = list(_variants())


@pytest.mark.parametrize("name, attn, score_mod, keep", VARIANTS, ids=[v[0] for v in VARIANTS])
@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_lengths_match_the_oracle(name, attn, score_mod, keep, backend):
    q, k, v = _inputs(4, 4, 2, 5, 70, 16, dtype=torch.float32)
    lengths = torch.tensor([70, 0, 1, 33], dtype=torch.int32)
    out, lse = attn(q, _poisoned(k, lengths), _poisoned(v, lengths), kv_len=lengths, backend=backend,
                    return_lse=True)
    want, want_lse = _oracle(q, k, v, lengths, score_mod, keep)
    torch.testing.assert_close(out.double(), want, rtol=0, atol=2e-6)
    assert torch.equal(torch.isinf(lse), torch.isinf(want_lse))
    finite = torch.isfinite(want_lse)
    torch.testing.assert_close(lse.double()[finite], want_lse[finite], rtol=0, atol=2e-6)


def _tiled(attn, q, k, v, lengths, pipeline: str):
    ctx = new_context()
    module = parse_module(attn.mlir(q.float(), k.float(), v.float(), kv_len=lengths), ctx)
    build_pass_manager(f"builtin.module(attn-fuse-online-softmax,{pipeline})", ctx).run(module.operation)
    return module


@pytest.mark.parametrize("name, attn, score_mod, keep", VARIANTS, ids=[v[0] for v in VARIANTS])
@pytest.mark.parametrize("block_n", [8, 16])
def test_tile_loops_stop_at_each_entrys_length_in_the_l1_interpreter(name, attn, score_mod, keep, block_n):
    # The window's tile lists are not runs of consecutive blocks at block_n = 8: the trip count
    # then comes from a bound table; the others take it from each list's first block.
    q, k, v = _inputs(3, 2, 1, 37, 90, 8)
    lengths = torch.tensor([90, 0, 41], dtype=torch.int32)
    module = _tiled(attn, q, k, v, lengths, f"attn-tile{{block-m=16 block-n={block_n}}}")
    out, lse = run_kernel(module, [q, _poisoned(k, lengths), _poisoned(v, lengths), lengths])
    want, want_lse = _oracle(q, k, v, lengths, score_mod, keep)
    torch.testing.assert_close(out, want, rtol=0, atol=1e-6)
    finite = torch.isfinite(want_lse)
    assert torch.equal(finite, torch.isfinite(lse))
    torch.testing.assert_close(lse[finite], want_lse[finite], rtol=0, atol=1e-6)


@pytest.mark.parametrize("target", ["cuda:90", "hip:gfx942"])
@pytest.mark.parametrize("lq, lk, lengths", [(1, 65536, [65536, 0, 40001]), (4, 3000, [1, 2999, 1500]),
                                             (200, 300, [300, 17, 0])])
def test_default_config_bundles_in_the_ttir_interpreter(target, lq, lk, lengths):
    q, k, v = _inputs(3, 8, 2, lq, lk, 64, dtype=torch.bfloat16)
    lengths = torch.tensor(lengths, dtype=torch.int32)
    attn = ae.attention(mask_mod=lambda b, h, i, j: j <= i + lk - lq)
    bundle = tb.compile_bundle(attn, q, k, v, target=target, kv_len=lengths)
    if lq < 16:
        assert bundle.meta["config"].get("pack_gqa")
    (out, lse), _ = interpret(bundle, q, _poisoned(k, lengths), _poisoned(v, lengths), lengths)
    want, want_lse = _oracle(q, k, v, lengths, keep=lambda i, j: j <= i + lk - lq)
    assert (out.double() - want).abs().max() < 2e-2 * want.abs().max()
    finite = torch.isfinite(want_lse)
    assert torch.equal(finite, torch.isfinite(lse))
    assert (lse.double()[finite] - want_lse[finite]).abs().max() < 1e-4 * math.log(lk)


def test_gradients_with_lengths():
    attn = ae.attention(mask_mod=lambda b, h, i, j: (j <= i + 9) & (j > i - 8))
    q, k, v = (t.requires_grad_() for t in _inputs(3, 2, 1, 6, 20, 4))
    lengths = torch.tensor([20, 0, 9])
    assert torch.autograd.gradcheck(lambda q, k, v: attn(q, k, v, backend="reference", kv_len=lengths), (q, k, v))
    out = attn(q, k, v, backend="reference", kv_len=lengths)
    grad = torch.randn_like(out)
    want = torch.autograd.grad(out, (q, k, v), grad)
    # The CPU backward kernels, float32.
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    got = torch.autograd.grad(attn(q32, k32, v32, kv_len=lengths), (q32, k32, v32), grad.float())
    for g, w in zip(got, want):
        torch.testing.assert_close(g.double(), w, rtol=0, atol=2e-6)


def test_bf16_gradients_on_the_cpu_keep_the_lengths():
    # The CPU backward widens 16-bit inputs to a float32 module: it must keep kv_len too.
    attn = ae.attention(mask_mod=lambda b, h, i, j: j <= i + 12)
    q, k, v = (t.to(torch.bfloat16).requires_grad_() for t in _inputs(2, 2, 2, 5, 30, 16, dtype=torch.float32))
    lengths = torch.tensor([30, 9])
    out = attn(q, k, v, kv_len=lengths)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), grad)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    want = torch.autograd.grad(attn(q64, k64, v64, kv_len=lengths, backend="reference"), (q64, k64, v64),
                               grad.double())
    for g, w in zip(got, want):
        assert (g.double() - w).abs().max() < 2e-2 * w.abs().max()
    assert got[1][1, :, 9:].abs().max() == 0 and got[2][1, :, 9:].abs().max() == 0


def test_lengths_under_torch_compile():
    attn = ae.attention(score_mod=lambda s, b, h, i, j: s - 0.01 * (i - j))
    q, k, v = _inputs(2, 2, 2, 8, 24, 16, dtype=torch.float32)
    lengths = torch.tensor([24, 5])

    def step(q, k, v, lengths):
        return attn(q, k, v, kv_len=lengths).square().sum()

    qe, ke, ve = (t.clone().requires_grad_() for t in (q, k, v))
    eager = step(qe, ke, ve, lengths)
    eager.backward()
    qc, kc, vc = (t.clone().requires_grad_() for t in (q, k, v))
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)(qc, kc, vc, lengths)
    compiled.backward()
    torch.testing.assert_close(compiled, eager)
    for a, b in ((qc, qe), (kc, ke), (vc, ve)):
        torch.testing.assert_close(a.grad, b.grad)


def test_bad_lengths_are_value_errors():
    attn = ae.attention()
    q, k, v = _inputs(2, 2, 2, 4, 10, 8, dtype=torch.float32)
    with pytest.raises(ValueError, match="int32 or int64"):
        attn(q, k, v, kv_len=torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match=r"shape \(2,\)"):
        attn(q, k, v, kv_len=torch.tensor([1, 2, 3]))
    with pytest.raises(TypeError, match="kv_len must be a tensor"):
        attn(q, k, v, kv_len=[1, 2])
    with pytest.raises(ValueError, match=r"kv_len\[1\] = 11 is outside \[0, 10\]"):
        ae.attention(check_indices=True)(q, k, v, kv_len=torch.tensor([3, 11]))
    # Unchecked, a length past Lk means Lk and a negative one means no keys, as in the reference.
    out = attn(q, k, v, kv_len=torch.tensor([99, -4]))
    want = attn(q, k, v, kv_len=torch.tensor([10, 0]), backend="reference")
    torch.testing.assert_close(out, want.float(), rtol=0, atol=2e-6)


@pytest.mark.parametrize("splits", [2, 3, 7])
def test_split_kernels_deal_each_entrys_tiles_in_the_l1_interpreter(splits):
    # Each split takes its share of the tiles below its entry's length (run time), not of Lk.
    attn, score_mod, keep = VARIANTS[1][1:]
    q, k, v = _inputs(3, 4, 2, 2, 150, 8)
    lengths = torch.tensor([150, 0, 61], dtype=torch.int32)
    module = _tiled(attn, q, k, v, lengths, f"attn-tile{{block-m=16 block-n=16 kv-splits={splits} pack-gqa=true}}")
    assert [op.operation.attributes["sym_name"].value for op in module.body.operations] == [
        "attention_partial", "attention_combine"]
    got = run_by_role(module, {"q": q, "k": _poisoned(k, lengths), "v": _poisoned(v, lengths), "c0": lengths})
    want, want_lse = _oracle(q, k, v, lengths, score_mod, keep)
    torch.testing.assert_close(got["out"], want, rtol=0, atol=1e-6)
    finite = torch.isfinite(want_lse)
    assert torch.equal(finite, torch.isfinite(got["lse"]))
    torch.testing.assert_close(got["lse"][finite], want_lse[finite], rtol=0, atol=1e-6)


@pytest.mark.parametrize("target", ["cuda:90", "hip:gfx942"])
def test_backward_bundles_with_lengths_in_the_ttir_interpreter(target):
    from bundle_interp import interpret_roles

    attn = ae.attention(mask_mod=lambda b, h, i, j: j <= i + 50)
    q, k, v = (t.requires_grad_() for t in _inputs(3, 4, 2, 37, 150, 32))
    lengths = torch.tensor([150, 0, 61], dtype=torch.int32)
    out, lse = attn(q, k, v, backend="reference", kv_len=lengths, return_lse=True)
    gen = torch.Generator().manual_seed(5)
    d_out = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    want = torch.autograd.grad(out, (q, k, v), d_out)
    text = attn.mlir(q.float(), k.float(), v.float(), kv_len=lengths)
    bundle = tb.build_backward_bundle(text, target)
    tensors = {"q": q.detach().float(), "k": _poisoned(k.detach(), lengths).float(),
               "v": _poisoned(v.detach(), lengths).float(), "out": out.detach().float(), "do": d_out.float(),
               "lse": lse.detach().float(), "dlse": torch.zeros(lse.shape), "c0": lengths}
    got = interpret_roles(bundle, tensors)
    for role, reference in zip(("dq", "dk", "dv"), want):
        assert torch.isfinite(got[role]).all(), role
        torch.testing.assert_close(got[role].double(), reference, rtol=0, atol=1e-5, msg=role)


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_closure_gradients_ignore_an_unfilled_cache(backend):
    # The reference backend's torch evaluation of the derivative and the CPU's kernels (which
    # scatter the slopes' gradient): a NaN past kv_len must not reach dQ = dS K through a zero dS.
    slopes = torch.tensor([0.5, 0.25], dtype=torch.float64, requires_grad=True)
    attn = ae.attention(score_mod=lambda s, b, h, i, j: s - slopes[h] * (i - j))
    q, k, v = _inputs(2, 2, 2, 4, 20, 8)
    lengths = torch.tensor([20, 7])
    dtype = torch.float64 if backend == "reference" else torch.float32
    leaves = [t.to(dtype).requires_grad_() for t in (q, _poisoned(k, lengths), _poisoned(v, lengths))]
    s32 = slopes if backend == "reference" else slopes.detach().float().requires_grad_()
    attn_b = attn if backend == "reference" else ae.attention(score_mod=lambda s, b, h, i, j: s - s32[h] * (i - j))
    out = attn_b(*leaves, kv_len=lengths, backend=backend)
    grads = torch.autograd.grad(out.sum(), leaves + [s32])
    clean = [t.clone().requires_grad_() for t in (q, k, v)]
    want = torch.autograd.grad(attn(*clean, kv_len=lengths, backend="reference").sum(), clean + [slopes])
    for g, w in zip(grads[:1] + grads[3:], want[:1] + want[3:]):
        torch.testing.assert_close(g.double(), w, rtol=1e-5, atol=1e-5)
    for g, w in zip(grads[1:3], want[1:3]):
        torch.testing.assert_close(g.double()[0], w[0], rtol=0, atol=1e-5)
        torch.testing.assert_close(g.double()[1, :, :7], w[1, :, :7], rtol=0, atol=1e-5)
