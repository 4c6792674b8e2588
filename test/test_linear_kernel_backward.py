"""The backward of linear attention (unnormalized GLA included) as runs of the compiled forward recurrence
(`frontend/linear_kernel_backward.py`): through the CPU kernels against float64 autograd of the
quadratic formula, and through the Triton kernels (the TTIR interpreter) against the torch
recomputation it replaces."""
from __future__ import annotations

import dataclasses

import pytest
import torch

import ae_mlir as ae
from ae_mlir.frontend import linear_backward, linear_kernel_backward
from bundle_interp import interpret
from test_linear_backward import _against_naive, _case, _mods_applied, naive

SHAPE = dict(b=2, h=2, l=37, dk=5, dv=3)  # a ragged last chunk (16 + 16 + 5), Dk != Dv, odd widths


@pytest.fixture
def kernels_only(monkeypatch):
    """Fail a test whose backward falls back to the torch recomputation."""

    def refuse(*args, **kwargs):
        raise AssertionError("the backward recomputed the recurrence with torch")

    monkeypatch.setattr(linear_backward, "chunked_recurrence", refuse)


@pytest.mark.parametrize("decay", [None, "head", "token", "token_dim"])
def test_float32_gradients_against_naive(decay, kernels_only):
    """q, k, v, g, the initial state and both closure tensors, from a loss on the output and the
    final state."""
    _against_naive(decay, False, torch.float32, 1e-4, **SHAPE)


@pytest.mark.parametrize("decay", [None, "head", "token", "token_dim"])
def test_normalized_form_against_naive(decay, kernels_only):
    """o = num / den from one more run with a column of ones after v; positive feature maps (a
    one-argument and a five-argument mod reading a closure tensor) keep den away from 0."""
    _against_naive(decay, True, torch.float32, 1e-4, **SHAPE)


@pytest.mark.parametrize("decay", ["head", "token"])
def test_blhd_layout(decay, kernels_only):
    _against_naive(decay, False, torch.float32, 1e-4, "blhd", b=1, h=3, l=40, dk=8, dv=16)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("normalize", [False, True])
def test_16bit_gradients_against_naive(dtype, normalize, kernels_only):
    """The runs round their operands to 16 bits as the forward does; g's gradient sums q . dq -
    k . dk over the tokens after each one in float32."""
    _against_naive("token", normalize, dtype, 2e-2, b=2, h=2, l=70, dk=16, dv=16)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gla_16bit_gradients_against_naive(dtype, kernels_only):
    """dq and dk from the value-decayed runs, dv from the key-decayed one, dg per dimension."""
    _against_naive("token_dim", False, dtype, 2e-2, b=2, h=2, l=70, dk=16, dv=24)


def test_which_calls_take_the_kernels():
    """Every decay, packed or normalized, takes the kernels; float64 inputs and the reference
    backend keep the torch recomputation."""
    lin, (q, k, v, g, s0), _ = _case("token_dim", False, dtype=torch.float32)
    call = lin._linear_call(q.shape[3], (), None, "cpu")
    assert linear_kernel_backward.applies(call, q)
    assert linear_kernel_backward.applies(dataclasses.replace(call, packing=(None, 4), normalize=True), q)
    assert not linear_kernel_backward.applies(call, q.double())
    head = dataclasses.replace(call, decay="head")
    assert linear_kernel_backward.applies(head, q)
    assert not linear_kernel_backward.applies(head, q.double())
    assert linear_kernel_backward.applies(dataclasses.replace(head, packing=(None, 4)), q)
    assert linear_kernel_backward.applies(dataclasses.replace(head, normalize=True), q)
    assert not linear_kernel_backward.applies(dataclasses.replace(head, backend="reference"), q)


def test_state_gradient_alone_and_no_output_gradient(kernels_only):
    """A loss on the final state only: q gets no gradient, k, v, g and the initial state do, as
    float64 autograd of the quadratic formula gives them."""
    lin, inputs, _ = _case("token", False, dtype=torch.float32, **SHAPE)
    for t in inputs:
        t.requires_grad_()
    _, state = lin(*inputs[:4], initial_state=inputs[4], return_state=True, backend="cpu")
    weights = torch.randn(state.shape, generator=torch.Generator().manual_seed(2))
    grads = torch.autograd.grad((state * weights).sum(), inputs, allow_unused=True)
    ref_inputs = [t.detach().double().requires_grad_() for t in inputs]
    q, k, v, g, s0 = ref_inputs
    _, ref_state = naive(*_mods_applied(lin, q, k, v), g, s0, "token", q.shape[3] ** -0.5, False)
    want = torch.autograd.grad((ref_state * weights.double()).sum(), ref_inputs, allow_unused=True)
    assert grads[0] is None or not grads[0].any()
    for got, ref in zip(grads[1:], want[1:]):
        torch.testing.assert_close(got.double(), ref, rtol=1e-4, atol=1e-4 * ref.abs().max().item())


def _interpreted(backend_target="cuda:90", default_config=False):
    """A `run` for `linear_kernel_backward.gradients` that builds each plain recurrence for the
    GPU (at the preset's config, or 2 stages) and runs its Triton IR in the interpreter."""
    from ae_mlir.backends import triton as tb

    def run(*args, reverse=False, packing=None, like=None):
        text = linear_kernel_backward.plain_module(*args, packing)
        bundle = tb.build_bundle(text, backend_target, None if default_config else {"num_warps": 4, "num_stages": 2})
        q, k, v, g, s0, out_dtype = args[3:]
        if reverse:  # the GPU reads them backwards in place (`kernel_args.ReversedRows`)
            q, k, v = (t.flip(2) for t in (q, k, v))
        (out, state), _ = interpret(bundle, q, k, v, *linear_kernel_backward.run_operands(g, s0, packing))
        out = (out.flip(2) if reverse else out).to(out_dtype)
        # Laid out as `run_plain` lays out the GPU's output.
        return linear_kernel_backward.run_output(out.shape, out_dtype, out.device, like).copy_(out), state

    return run


@pytest.mark.parametrize("decay,normalize,state_grad", [("head", False, True), ("head", False, False),
                                                        ("token", False, True), ("token", True, True),
                                                        ("token_dim", False, True), ("token_dim", False, False)])
def test_triton_kernels_match_the_recomputation(decay, normalize, state_grad):
    """The backward's runs compiled for the GPU (in the TTIR interpreter) give the gradients of the
    torch recomputation, closure tensors included; without a state gradient, RetNet's reversed
    runs keep the "head" decay."""
    lin, inputs, closures = _case(decay, normalize, dtype=torch.float32, b=1, h=2, l=40, dk=16, dv=16)
    q, k, v, g, s0 = inputs
    for c in closures:
        c.requires_grad_()
    call = lin._linear_call(q.shape[3], tuple(closures), None, "triton")
    gen = torch.Generator().manual_seed(5)
    d_out = torch.randn(1, 2, 40, 16, generator=gen)
    d_state = torch.randn(1, 2, 16, 16, generator=gen) if state_grad else None
    with torch.no_grad():
        _, final = lin(q, k, v, g, initial_state=s0, return_state=True, backend="cpu")
    wanted = [True] * (5 + len(closures))
    got = linear_kernel_backward.gradients(call, (q, k, v, g, s0), (d_out, d_state), wanted, final,
                                           run=_interpreted())
    torch_call = dataclasses.replace(call, backend="reference")
    want = linear_backward.gradients(torch_call, (q, k, v, g, s0), (d_out, d_state), wanted)
    for name, a, b in zip(["q", "k", "v", "g", "s0"] + [f"closure {i}" for i in range(len(closures))], got, want):
        torch.testing.assert_close(a, b, rtol=2e-4, atol=2e-4 * b.abs().max().item(), msg=name)


def test_gradients_in_the_inputs_layout():
    """q, k, v and g as [B, H, T, D] views of [B, T, H, D] storage (fla's layout): the runs' outputs
    (`run_output`, which the interpreted runner shares with `run_plain`) come in their inputs'
    layout, dq, dk and dv with them, and dg's sums take the strided rates; the gradients equal
    those of contiguous inputs."""
    lin, inputs, _ = _case("token_dim", False, dtype=torch.float32, b=2, h=2, l=70, dk=16, dv=16)
    q, k, v, g, s0 = inputs
    strided = [t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v, g)]
    call = lin._linear_call(q.shape[3], (), None, "triton")
    d_out = torch.randn(2, 2, 70, 16, generator=torch.Generator().manual_seed(5))
    wanted = [True] * 5
    got = linear_kernel_backward.gradients(call, (*strided, s0), (d_out, None), wanted, None, run=_interpreted())
    want = linear_kernel_backward.gradients(call, (q, k, v, g, s0), (d_out, None), wanted, None, run=_interpreted())
    for name, x, a, b in zip(["q", "k", "v", "g", "s0"], strided + [s0], got, want):
        assert name not in "qkv" or a.stride() == x.stride(), name
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * b.abs().max().item(), msg=name)


@pytest.mark.parametrize("decay", [None, "head", "token", "token_dim"])
def test_packed_batches_take_the_kernels(decay, kernels_only):
    """Packed sequences (one of them empty): the reversed runs take the sequences in reverse order
    (offsets T - flip(cu)), their decays shifted within each sequence; gradients against the
    float64 oracle of test_linear_varlen, mods reading the sequence and position included."""
    from test_linear_varlen import test_gradients_match_the_oracle

    test_gradients_match_the_oracle(decay, False, "cpu")
    if decay is None:
        test_gradients_match_the_oracle(None, True, "cpu")


@pytest.mark.parametrize("decay", ["head", "token", "token_dim"])
def test_packed_triton_kernels_match_the_recomputation(decay):
    """Packed sequences through the interpreted Triton runs, Dv (8) != Dk (16); GLA's chunk of 32
    (two blocks of 16 rows) takes the scores kernels and their output kernels."""
    from ae_mlir.frontend import varlen
    from test_linear_varlen import _layer, _offsets, _problem

    lens = [5, 0, 17, 1, 9]
    q, k, v, g, s0 = _problem(lens, decay, seed=4)
    v, s0 = v[..., :8].contiguous(), s0[..., :8].contiguous()
    layer = _layer(decay, chunk_size=32 if decay == "token_dim" else 8)
    q, k, v, g = (x if x is None or x.dim() < 3 else x.transpose(1, 2) for x in (q, k, v, g))
    sequences = varlen.prepare(q, q, _offsets(lens), _offsets(lens), None, None, False)
    padded = sequences.kv_len.shape[0]
    s0 = torch.cat([s0, s0.new_zeros(padded - s0.shape[0], *s0.shape[1:])])
    call = layer._linear_call(q.shape[3], (), (sequences.cu_q, sequences.longest_q), "triton")
    gen = torch.Generator().manual_seed(6)
    d_out = torch.randn(v.shape, generator=gen)
    d_state = torch.randn(s0.shape, generator=gen)
    with torch.no_grad():
        _, final = layer(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                         g if g.dim() == 1 else g.transpose(1, 2), s0[:len(lens)], cu_seqlens=_offsets(lens),
                         return_state=True, backend="cpu")
    final = torch.cat([final, final.new_zeros(padded - len(lens), *final.shape[1:])])
    wanted = [True] * 5
    got = linear_kernel_backward.gradients(call, (q, k, v, g, s0), (d_out, d_state), wanted, final,
                                           run=_interpreted())
    want = linear_backward.gradients(dataclasses.replace(call, backend="reference"), (q, k, v, g, s0),
                                     (d_out, d_state), wanted)
    for name, a, b in zip(["q", "k", "v", "g", "s0"], got, want):
        torch.testing.assert_close(a, b, rtol=2e-4, atol=2e-4 * b.abs().max().item(), msg=name)


def _against_naive_plainly(lin, q, k, v, g, dtype, rel, wanted=(True, True, True, True)):
    """Gradients of sum(out * r) (no initial state, no state gradient) for the inputs in `wanted`,
    from the CPU kernels on `dtype` values, against float64 autograd of `naive` on the same values."""
    inputs = [t.to(dtype) for t in (q, k, v)] + [g]
    leaves = [t.clone().requires_grad_(w) for t, w in zip(inputs, wanted)]
    out = lin(*leaves, backend="cpu")
    r = torch.randn(out.shape, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    targets = [t for t in leaves if t.requires_grad]
    got = torch.autograd.grad((out.double() * r).sum(), targets)
    ref = [t.detach().double().requires_grad_(w) for t, w in zip(inputs, wanted)]
    want_out, _ = naive(*_mods_applied(lin, *ref[:3]), ref[3], None, lin.decay, q.shape[3] ** -0.5, lin.normalize)
    want = torch.autograd.grad((want_out * r).sum(), [t for t in ref if t.requires_grad])
    for a, b in zip(got, want):
        torch.testing.assert_close(a.double(), b, rtol=rel, atol=rel * b.abs().max().item())


@pytest.mark.parametrize("packed", [False, True])
def test_retnet_decay_without_a_state_gradient(packed, kernels_only, monkeypatch):
    """A loss on the output alone: the reversed runs take RetNet's constant decay as it is, not
    the shifted per-token g' (the shift only scales the initial state, which is then zero)."""
    decays = []
    run_plain = linear_kernel_backward.run_plain

    def spy(backend, decay, *args, **kwargs):
        decays.append(decay)
        return run_plain(backend, decay, *args, **kwargs)

    monkeypatch.setattr(linear_kernel_backward, "run_plain", spy)
    gen = torch.Generator().manual_seed(14)
    lin = ae.linear_attention(decay="head", chunk_size=16)
    g = torch.log(1 - 2.0 ** (-2 - torch.arange(3, dtype=torch.float32)))
    if not packed:
        q, k, v = (torch.randn(2, 3, 37, 8, generator=gen) for _ in range(3))
        _against_naive_plainly(lin, q, k, v, g, torch.float32, 1e-4)
    else:
        from test_linear_varlen import _offsets

        lens = [5, 0, 21, 9]
        q, k, v = (torch.randn(1, 3, sum(lens), 8, generator=gen, requires_grad=True) for _ in range(3))
        out = lin(q, k, v, g, cu_seqlens=_offsets(lens), backend="cpu")
        r = torch.randn(out.shape, generator=gen)
        got = torch.autograd.grad((out * r).sum(), (q, k, v))
        for i, (a, n) in enumerate(zip(_offsets(lens)[:-1].tolist(), lens)):
            if n == 0:
                continue
            parts = [t[:, :, a:a + n].detach().double().requires_grad_() for t in (q, k, v)]
            want_out, _ = naive(*parts, g.double(), None, "head", 8 ** -0.5, False)
            want = torch.autograd.grad((want_out * r[:, :, a:a + n].double()).sum(), parts)
            for x, y in zip(got, want):
                torch.testing.assert_close(x[:, :, a:a + n].double(), y, rtol=1e-4, atol=1e-4, msg=f"sequence {i}")
    assert decays == ["head"] * 3  # dq, then dk and dv reversed


@pytest.mark.parametrize("wanted", [(True, True, True, True), (False, False, False, True), (True, False, False, False)])
def test_no_initial_state_output_loss_and_subsets_of_gradients(wanted, kernels_only):
    """A q_mod without normalization, no initial state, no gradient of the final state, and only
    some inputs wanting gradients (g alone; q alone)."""
    gen = torch.Generator().manual_seed(12)
    q, k, v = (torch.randn(2, 2, 37, 8, generator=gen) for _ in range(3))
    g = -0.4 * torch.rand(2, 2, 37, generator=gen)
    lin = ae.linear_attention(q_mod=lambda x, b, h, t, d: x * (1.0 + 0.25 * h) - 0.01 * t, decay="token",
                              chunk_size=16)
    _against_naive_plainly(lin, q, k, v, g, torch.float32, 1e-4, wanted)


def test_16bit_normalized_with_values_far_from_zero(kernels_only):
    """dnum_t . v_s and dden_t cancel in dq and dk when v is far from zero: the normalized runs are
    float32, so bf16 inputs keep the forward's accuracy."""
    gen = torch.Generator().manual_seed(13)
    q, k = (torch.randn(1, 2, 40, 16, generator=gen) for _ in range(2))
    v = 3.0 + torch.randn(1, 2, 40, 16, generator=gen)
    g = -0.3 * torch.rand(1, 2, 40, generator=gen)
    lin = ae.linear_attention(q_mod=lambda x: torch.nn.functional.elu(x) + 1,
                              k_mod=lambda x: torch.nn.functional.elu(x) + 1, decay="token", normalize=True,
                              chunk_size=16)
    _against_naive_plainly(lin, q, k, v, g, torch.bfloat16, 1e-2)


def test_gla_at_the_default_chunk_through_triton(kernels_only):
    """GLA's runs at the default chunk (64, the scores kernels and their output kernels) and the presets' configs,
    interpreted, against float64 autograd of the quadratic formula: several chunks, the last
    ragged, Dk != Dv, bf16."""
    lin, inputs, closures = _case("token_dim", False, dtype=torch.bfloat16, b=1, h=2, l=150, dk=32, dv=48)
    lin = ae.linear_attention(k_mod=lin.k_mod, v_mod=lin.v_mod, decay="token_dim")
    q, k, v, g, s0 = inputs
    call = lin._linear_call(q.shape[3], tuple(closures), None, "triton")
    gen = torch.Generator().manual_seed(6)
    d_out = torch.randn(1, 2, 150, 48, generator=gen)
    d_state = torch.randn(1, 2, 32, 48, generator=gen)
    with torch.no_grad():
        _, final = lin(q, k, v, g, initial_state=s0, return_state=True, backend="cpu")
    got = linear_kernel_backward.gradients(call, (q, k, v, g, s0), (d_out, d_state), [True] * 5 + [False] * len(closures), final,
                                           run=_interpreted(default_config=True))
    ref = [t.detach().double().requires_grad_() for t in inputs]
    out, state = naive(*_mods_applied(lin, *ref[:3]), ref[3], ref[4], "token_dim", 32 ** -0.5, False)
    want = torch.autograd.grad([out, state], ref, [d_out.double(), d_state.double()])
    for name, a, b in zip("q k v g s0".split(), got, want):
        assert (a.double() - b).abs().max() <= 3e-2 * b.abs().max(), name


@pytest.mark.parametrize("shape", [(2, 3, 130, 5), (1, 2, 128, 7), (2, 2, 10), (1, 1, 1, 3)])
def test_reverse_cumsum_in_blocks(shape):
    """dg's sums over the later tokens, in blocks of 64: ragged and whole last blocks, a shorter
    sequence than a block, per dimension and per token; float64 within 1e-12 of one scan,
    float32 within a few roundings."""
    x = torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    want = x.flip(2).cumsum(2).flip(2)
    got = linear_kernel_backward.reverse_cumsum(x)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    wide = linear_kernel_backward.reverse_cumsum(x.float())
    assert (wide.double() - want).abs().max() <= 4 * torch.finfo(torch.float32).eps * x.abs().sum(2).max()
    # Tokens not the second-innermost dimension in memory (a [B, H, T, D] view of [B, T, H, D]).
    # The sums come back in that memory order (every pass ran over contiguous memory).
    strided = x.transpose(1, 2).contiguous().transpose(1, 2)
    sums = linear_kernel_backward.reverse_cumsum(strided)
    torch.testing.assert_close(sums, want, rtol=0, atol=1e-12)
    assert sums.stride(1) < sums.stride(2) or 1 in shape[1:3]
