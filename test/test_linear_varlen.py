"""Linear attention on packed variable-length batches (fla's cu_seqlens): q/k/v [1, T, H, D]
(layout "blhd") hold sequences back to back; each runs its own recurrence from its own initial
state, the mods seeing the sequence as b and positions within it as t. Checked against a float64
oracle written here (the recurrence token by token, one sequence at a time) with 1 to 17
sequences of ragged lengths (some 0 and 1), every decay and the normalized form, through the
reference, the CPU backend and the TTIR interpreter at both targets' default configs, and the
gradients against the oracle's."""
from __future__ import annotations

import pytest
import torch

import ae_mlir as ae
from ae_mlir.backends import triton as tb
from ae_mlir.core import abi
from bundle_interp import interpret

H, D = 2, 16
CASES = {"one": [9], "five": [5, 0, 17, 1, 40],
         "seventeen": [3, 1, 0, 8, 2, 11, 5, 1, 7, 0, 4, 6, 9, 2, 1, 13, 3]}


def _offsets(lens):
    return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)


def _problem(lens, decay, dtype=torch.float32, d=D, seed=0):
    gen = torch.Generator().manual_seed(seed)
    t = sum(lens)
    q, k, v = (torch.randn(1, t, H, d, generator=gen).to(dtype) for _ in range(3))
    g = {None: None, "head": -0.3 * torch.rand(H, generator=gen), "token": -0.3 * torch.rand(1, t, H, generator=gen),
         "token_dim": -0.3 * torch.rand(1, t, H, d, generator=gen)}[decay]
    s0 = torch.randn(len(lens), H, d, d, generator=gen).to(dtype)
    if g is not None and dtype == torch.float64:
        g = g.double()
    return q, k, v, g, s0


BIAS = torch.tensor([0.5, -0.25])
DECAYS = [(None, False), (None, True), ("head", False), ("token", False), ("token_dim", False)]


def _layer(decay, normalize=False, bias=BIAS, **kw):
    """A variant whose mods read b (the sequence), h, t and a closure tensor."""
    if normalize:
        return ae.linear_attention(q_mod=lambda x: torch.nn.functional.elu(x) + 1,
                                   k_mod=lambda x, b, h, t, d: (torch.nn.functional.elu(x) + 1) * (1.0 + 0.125 * b),
                                   normalize=True, layout="blhd", **kw)
    return ae.linear_attention(k_mod=lambda x, b, h, t, d: x * (1.0 + 0.125 * b) + 0.015625 * t + bias[h],
                               decay=decay, layout="blhd", **kw)


def _oracle(q, k, v, g, s0, lens, decay, normalize=False, bias=BIAS):
    """(out [1, T, H, Dv], state [S, H, Dk, Dv]) in float64, token by token, sequence by sequence."""
    outs, states = [], []
    lo = 0
    d = q.shape[3]
    scale = d ** -0.5
    heads = torch.arange(H).view(H, 1, 1)
    for s, n in enumerate(lens):
        qs, ks, vs = (x[0, lo:lo + n].double().transpose(0, 1) for x in (q, k, v))  # [H, n, D]
        t = torch.arange(n).view(1, n, 1)
        if normalize:
            qs = torch.nn.functional.elu(qs) + 1
            ks = (torch.nn.functional.elu(ks) + 1) * (1.0 + 0.125 * s)
        else:
            ks = ks * (1.0 + 0.125 * s) + 0.015625 * t + bias.double()[heads]
        state = s0[s].double()
        z = torch.zeros(H, d, dtype=torch.float64)
        rows = []
        for i in range(n):
            if decay is not None:
                gt = {"head": lambda: g.double().view(H, 1), "token": lambda: g[0, lo + i].double().view(H, 1),
                      "token_dim": lambda: g[0, lo + i].double()}[decay]()
                state = state * torch.exp(gt).unsqueeze(-1)
                z = z * torch.exp(gt)
            state = state + ks[:, i].unsqueeze(-1) * vs[:, i].unsqueeze(-2)
            z = z + ks[:, i]
            o = torch.einsum("hd,hde->he", qs[:, i], state)
            rows.append(o / (qs[:, i] * z).sum(-1, keepdim=True) if normalize else o * scale)
        outs.append(torch.stack(rows, 0) if rows else torch.zeros(0, H, vs.shape[2], dtype=torch.float64))
        states.append(state)
        lo += n
    return torch.cat(outs).unsqueeze(0), torch.stack(states)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("decay, normalize", DECAYS, ids=["none", "normalized", "head", "token", "token_dim"])
@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_packed_batches_match_the_oracle(case, decay, normalize, backend):
    lens = CASES[case]
    q, k, v, g, s0 = _problem(lens, decay)
    layer = _layer(decay, normalize, chunk_size=16)
    out, state = layer(q, k, v, g, s0, cu_seqlens=_offsets(lens), return_state=True, backend=backend)
    want, want_state = _oracle(q, k, v, g, s0, lens, decay, normalize)
    assert out.shape == want.shape and state.shape == want_state.shape
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state.double(), want_state, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("target", ["cuda:90", "hip:gfx942"])
@pytest.mark.parametrize("decay, normalize", DECAYS, ids=["none", "normalized", "head", "token", "token_dim"])
def test_default_config_bundles_in_the_ttir_interpreter(target, decay, normalize):
    # Sequences of several chunks (the default chunk is 64), one of 0 and one of 1 token.
    lens = [300, 0, 17, 1, 129]
    q, k, v, g, s0 = _problem(lens, decay, dtype=torch.bfloat16, seed=1)
    layer = _layer(decay, normalize)
    cu = _offsets(lens)
    bundle = tb.build_bundle(layer.mlir(q, k, v, g, s0, cu_seqlens=cu), target, None)
    qb, kb, vb, gb, s0b, sequences = layer._packed(q, k, v, g, s0, cu, None)
    inputs = [t for t in (gb, s0b) if t is not None] + [sequences.kv_len, sequences.cu_q] + ([] if normalize else [BIAS])
    (out, state), _ = interpret(bundle, qb, kb, vb, *inputs)
    want, want_state = _oracle(q, k, v, g, s0, lens, decay, normalize)
    got = out.transpose(1, 2).double()
    assert (got - want).abs().max() < 1e-2 * want.abs().max()
    assert (state[:len(lens)].double() - want_state).abs().max() < 1e-2 * want_state.abs().max()


def test_the_bhld_layout_and_other_lengths_reuse_the_module():
    lens = [4, 6, 2]
    q, k, v, g, s0 = _problem(lens, "token")
    layer = _layer("token", chunk_size=4)
    out = layer(q, k, v, g, s0, cu_seqlens=_offsets(lens))
    heads_first = ae.linear_attention(k_mod=lambda x, b, h, t, d: x * (1.0 + 0.125 * b) + 0.015625 * t + BIAS[h],
                                      decay="token", chunk_size=4)
    got = heads_first(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), g.transpose(1, 2), s0,
                      cu_seqlens=_offsets(lens))
    torch.testing.assert_close(got.transpose(1, 2), out)
    # Other lengths with the same total and buckets compile to the same module.
    other = torch.tensor([0, 1, 9, 12], dtype=torch.int32)
    assert layer.mlir(q, k, v, g, s0, cu_seqlens=_offsets(lens)) == layer.mlir(q, k, v, g, s0, cu_seqlens=other)
    # Without an initial state each sequence starts from zeros, and no state entry is shared.
    out, state = layer(q, k, v, g, cu_seqlens=other, return_state=True, backend="cpu")
    want, want_state = _oracle(q, k, v, g, torch.zeros(3, H, D, D), [1, 8, 3], "token")
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state.double(), want_state, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("decay, normalize", DECAYS, ids=["none", "normalized", "head", "token", "token_dim"])
@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_gradients_match_the_oracle(decay, normalize, backend):
    lens = [5, 0, 17, 1, 9]
    dtype = torch.float64 if backend == "reference" else torch.float32
    q, k, v, g, s0 = _problem(lens, decay, dtype=dtype, seed=2)
    bias = BIAS.to(dtype).clone().requires_grad_()
    leaves = [t.clone().requires_grad_() for t in (q, k, v, s0)] + ([g.clone().requires_grad_()] if g is not None
                                                                      else [])
    gl = leaves[4] if g is not None else None
    layer = _layer(decay, normalize, bias=bias, chunk_size=8)
    out, state = layer(*leaves[:3], gl, leaves[3], cu_seqlens=_offsets(lens), return_state=True, backend=backend)
    gen = torch.Generator().manual_seed(3)
    d_out, d_state = torch.randn(out.shape, generator=gen), torch.randn(state.shape, generator=gen)
    params = leaves + ([] if normalize else [bias])
    got = torch.autograd.grad((out, state), params, (d_out.to(out.dtype), d_state.to(state.dtype)))

    ref = [t.detach().double().requires_grad_() for t in params]
    rg = ref[4] if g is not None else None
    want_out, want_state = _oracle(ref[0], ref[1], ref[2], rg, ref[3], lens, decay, normalize,
                                   bias=ref[-1] if not normalize else BIAS)
    want = torch.autograd.grad((want_out, want_state), ref, (d_out.double(), d_state.double()))
    tol = 1e-9 if backend == "reference" else 2e-4
    for a, b in zip(got, want):
        torch.testing.assert_close(a.double(), b, rtol=tol, atol=tol * max(1.0, b.abs().max().item()))


def test_bad_packed_calls():
    lens = [3, 4]
    q, k, v, g, s0 = _problem(lens, "token")
    layer = _layer("token")
    cu = _offsets(lens)
    with pytest.raises(ValueError, match="batch size 1"):
        layer(q.expand(2, -1, -1, -1), k.expand(2, -1, -1, -1), v.expand(2, -1, -1, -1), g.expand(2, -1, -1),
              cu_seqlens=cu)
    with pytest.raises(ValueError, match=r"initial_state must have shape \(2, 2, 16, 16\)"):
        layer(q, k, v, g, s0[:1], cu_seqlens=cu)
    with pytest.raises(ValueError, match="max_seqlen was given without cu_seqlens"):
        layer(q, k, v, g, max_seqlen=4)
    with pytest.raises(ValueError, match="cu_seqlens must start at 0, never decrease and end at the 7 packed rows"):
        layer(q, k, v, g, cu_seqlens=torch.tensor([0, 3, 6]))
    with pytest.raises(ValueError, match=r"max_seqlen = 2 is shorter than the longest sequence \(4\)"):
        layer(q, k, v, g, cu_seqlens=cu, max_seqlen=2)
    with pytest.raises(TypeError, match="cu_seqlens must be a tensor of sequence offsets"):
        layer(q, k, v, g, cu_seqlens=[0, 3, 7])
    with pytest.raises(ValueError, match="cu_seqlens must be an int32 or int64 vector"):
        layer(q, k, v, g, cu_seqlens=cu.view(1, -1))
    with pytest.raises(ValueError, match=r"batch size 1 \(\[1, T, H, D\], as fla takes them\).*q.unsqueeze\(0\)"):
        layer(q[0], k[0], v[0], g[0], cu_seqlens=cu)


def test_checked_mode_checks_each_sequences_own_positions():
    # A table indexed by the position inside a sequence, as long as the longest sequence: in
    # range everywhere, though the module's rows are bucketed past it.
    lens = [3, 5]
    table = torch.randn(5)
    layer = ae.linear_attention(k_mod=lambda x, b, h, t, d: x + table[t], layout="blhd", check_indices=True)
    q, k, v, _, _ = _problem(lens, None)
    layer(q, k, v, cu_seqlens=_offsets(lens))
    short = torch.randn(4)
    too_short = ae.linear_attention(k_mod=lambda x, b, h, t, d: x + short[t], layout="blhd", check_indices=True)
    with pytest.raises(IndexError, match="index 4 is out of range"):
        too_short(q, k, v, cu_seqlens=_offsets(lens))


def test_mods_indexed_by_sequence_and_position_differentiate():
    # Tables as long as the sequence count and the longest sequence: the module's rows and
    # sequences are bucketed past them, and the backward evaluates the mods only where tokens are.
    lens = [3, 5, 2]
    per_sequence, per_position = torch.tensor([1.0, 0.5, 2.0]), torch.randn(5)
    layer = ae.linear_attention(k_mod=lambda x, b, h, t, d: x * per_sequence[b] + per_position[t],
                                decay="token", layout="blhd", check_indices=True)
    q, k, v, g, s0 = _problem(lens, "token")
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = layer(*leaves, g, cu_seqlens=_offsets(lens), backend="cpu")
    got = torch.autograd.grad(out.sum(), leaves)
    ref = [t.detach().double().requires_grad_() for t in (q, k, v)]
    outs, lo = [], 0
    for s, n in enumerate(lens):
        one = ae.linear_attention(k_mod=lambda x, b, h, t, d, w=float(per_sequence[s]): x * w + per_position[t],
                                  decay="token", layout="blhd")
        outs.append(one(*(t[:, lo:lo + n] for t in ref), g[:, lo:lo + n].double(), backend="reference"))
        lo += n
    want = torch.autograd.grad(torch.cat(outs, 1).sum(), ref)
    for a, b in zip(got, want):
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-4)


def _padded_module(decay: str | None, b: int, length: int, d: int, dtype: str) -> str:
    """An L0 linear recurrence over a padded batch with per-entry lengths and a k_mod that is not
    zero at zero (so padding that entered the state would show)."""
    t = f"tensor<{b}x2x{length}x{d}x{dtype}>"
    g_type = {None: None, "head": "tensor<2xf32>", "token": f"tensor<{b}x2x{length}xf32>",
              "token_dim": f"tensor<{b}x2x{length}x{d}xf32>"}[decay]
    params = f"%q: {t}, %k: {t}, %v: {t}" + (f", %g: {g_type}" if g_type else "") + f", %n: tensor<{b}xi32>"
    operands = "%q, %k, %v" + (", %g" if g_type else "") + ", %n"
    types = ", ".join([t, t, t] + ([g_type] if g_type else []) + [f"tensor<{b}xi32>"])
    state = f"tensor<{b}x2x{d}x{d}xf32>"
    return f"""func.func @padded({params}) -> ({t}, {state}) {{
  %o, %st = "attn.linear_recurrence"({operands}) ({{}}, {{
  ^bb0(%x: f32, %b: index, %h: index, %t: index, %d: index):
    %one = arith.constant 1.0 : f32
    %y = arith.addf %x, %one : f32
    "gpu.yield"(%y) : (f32) -> ()
  }}, {{}}) {{decay = "{decay or 'none'}", scale = 0.25 : f32, normalize = false, chunk_size = 16 : i64, operandSegmentSizes = array<i32: 1, 1, 1, {int(g_type is not None)}, 0, 1>}} : ({types}) -> ({t}, {state})
  return %o, %st : {t}, {state}
}}"""


@pytest.mark.parametrize("decay", [None, "head", "token", "token_dim"])
def test_lengths_on_a_padded_batch(decay):
    # The op's own contract, outside packing: tokens past lengths[b] leave the state alone and
    # their output rows are zero, on the CPU backend and in default-config bundles.
    from ae_mlir import backends

    b, length, d = 3, 40, 16
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(b, 2, length, d, generator=gen) for _ in range(3))
    g = {None: None, "head": -0.3 * torch.rand(2, generator=gen), "token": -0.3 * torch.rand(b, 2, length, generator=gen),
         "token_dim": -0.3 * torch.rand(b, 2, length, d, generator=gen)}[decay]
    n = torch.tensor([0, 17, 40], dtype=torch.int32)
    inputs = [q, k, v] + ([g] if g is not None else []) + [n]
    want_out, want_state = backends.run(_padded_module(decay, b, length, d, "f32"), inputs, "reference", torch.float64)
    for i, count in enumerate(n.tolist()):  # the reference itself, entry by entry, on the tokens alone
        gi = None if g is None else (g if g.dim() == 1 else g[i:i + 1, :, :count])
        one = ae.linear_attention(k_mod=lambda x: x + 1, decay=decay)
        o, s = one(*(t[i:i + 1, :, :count] for t in (q, k, v)), gi, return_state=True, backend="reference")
        torch.testing.assert_close(want_out[i:i + 1, :, :count].float(), o, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(want_state[i:i + 1].float(), s, rtol=1e-5, atol=1e-5)
    assert (want_out[0] == 0).all() and (want_out[1, :, 17:] == 0).all()
    out, state = backends.run(_padded_module(decay, b, length, d, "f32"), inputs, "cpu", torch.float32)
    torch.testing.assert_close(out.double(), want_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state.double(), want_state, rtol=1e-5, atol=1e-5)
    text = _padded_module(decay, b, length, d, "bf16")
    bf = [t.to(torch.bfloat16) if t.dim() == 4 and t.shape[-1] == d and t is not g else t for t in inputs]
    want_out, want_state = backends.run(text, bf, "reference", torch.float64)
    for target in ("cuda:90", "hip:gfx942"):
        (out, state), _ = interpret(tb.build_bundle(text, target, None), *bf)
        assert (out.double() - want_out).abs().max() < 1e-2 * want_out.abs().max()
        assert (out[0] == 0).all() and (out[1, :, 17:] == 0).all()
        assert (state.double() - want_state).abs().max() < 1e-2 * want_state.abs().max()


def test_split_workspaces_grow_with_the_packed_tokens():
    # One long sequence among many short ones: the chunk states, cumulative decays and GLA's
    # scores of the split form follow the packed rows (T / C + S + 1 chunks, T + S C rows), not
    # S x the longest. The module takes any T: the runtime sizes them from the call's rows.
    lens = [4096] + [64] * 63
    total, count, chunk = sum(lens), len(lens), 64
    q = torch.empty(1, total, 4, 64, dtype=torch.bfloat16, device="meta")
    g = torch.empty(1, total, 4, 64, device="meta")
    cu = torch.empty(count + 1, dtype=torch.int32, device="meta")
    layer = ae.linear_attention(decay="token_dim", layout="blhd")
    bundle = tb.build_bundle(layer.mlir(q, q, q, g, cu_seqlens=cu, max_seqlen=4096), "cuda:90", None)
    assert all(w.shape[2] == -1 for w in bundle.workspace)
    shapes = {w.role: list(abi.sized_shape(w.role, w.shape, total, total, w.rows)) for w in bundle.workspace}
    assert shapes == {"w0": [1, 4, total // chunk + count + 1, 64, 64], "w1": [1, 4, total + count * chunk, 64],
                      "w2": [1, 4, total + count * chunk, chunk]}
    assert {w.role: w.dtype for w in bundle.workspace}["w2"] == "bfloat16"  # the scores, in the dot type
