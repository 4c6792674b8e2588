"""Gradients of closure tensors from the backward kernels: the dQ kernel of `attn-tile-backward`
adds each tile's contributions into dc<i> with attn.scatter_add (atomic adds on GPUs, a private
copy per thread on the CPU). Checked in the L1 interpreter (float64), on the CPU backend through
autograd with the torch evaluation refused, for packed batches and under torch.compile, and as
Triton bundles in the TTIR interpreter at each target's default config, all against float64
autograd on the reference backend."""
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


def _catalogue(name):
    def build(shape):
        attn, _ = variants.build(name, shape)
        return attn
    return build


def _row_and_column(shape):
    # Indices that vary along one tile axis only: the Triton lowering sums a tile's values along
    # the other axis before its atomic adds.
    gen = torch.Generator().manual_seed(11)
    rows, cols = torch.randn(shape.seq_q, generator=gen), torch.randn(shape.seq_k, generator=gen)
    return ae.attention(score_mod=lambda s, b, h, i, j: s * (1.0 + 0.1 * rows[i]) + cols[j], mask_mod=_causal)


def _read_twice(shape):
    # One table read twice, a 0-d temperature, and an integer closure tensor only the mask reads.
    gen = torch.Generator().manual_seed(12)
    weights = torch.randn(shape.heads, 3, generator=gen)
    temperature = torch.tensor(0.7)
    doc = (torch.arange(max(shape.seq_q, shape.seq_k)) * 3 // shape.seq_k).to(torch.int32)

    def score_mod(s, b, h, i, j):
        return torch.tanh(s * temperature) * weights[h, 0] + weights[h, 2] * (i - j)

    return ae.attention(score_mod=score_mod, mask_mod=lambda b, h, i, j: (doc[i] == doc[j]) & (i >= j))


VARIANTS = {
    "alibi": _catalogue("alibi"),                    # slopes[h]: one add per tile
    "relative_bias": _catalogue("relative_bias"),    # table[h, i - j + offset]: one per element
    "t5_bias": _catalogue("t5_bias"),                # bias[h, bucket(i - j)], buckets from float math
    "row_and_column": _row_and_column,
    "read_twice": _read_twice,
}

# Lq != Lk, neither a multiple of the tiles; GQA (4 query heads on 2 KV heads).
RAGGED = variants.Shape(2, 4, 45, 70, 16, 16, heads_kv=2)


def _problem(attn, shape, seed=0, dtype=torch.float64):
    """Inputs (rounded to dtype), the closure tensors, dO, and float64 autograd's gradients of q,
    k, v and each float closure tensor on the reference backend."""
    q, k, v = (t.to(dtype) for t in variants.inputs(shape, seed=seed))
    gen = torch.Generator().manual_seed(seed + 1)
    d_out = torch.randn(*q.shape[:3], v.shape[3], generator=gen, dtype=torch.float64).to(dtype)
    # The closure tensors as the mods read them: T5's table, not the tensor composed per distance
    # (relative_reads), whose gradient reaches the table through torch.
    _, captures = attn._build(q.float(), k.float(), v.float(), compose=False)
    learnable = _learnable(captures)
    for c in learnable:
        c.requires_grad_()
    leaves = _leaves(q, k, v)
    want = torch.autograd.grad(attn(*leaves, backend="reference"), leaves + learnable, d_out.double())
    return (q, k, v), captures, d_out, want


def _learnable(captures: list) -> list:
    """The float closure tensors as the mods hold them (a kernel reads a 0-d one as a [1] view)."""
    return [c if c._base is None else c._base for c in captures if c.dtype.is_floating_point]


def _assert_close(got: list, want: list, tol: float, names):
    for name, g, w in zip(names, got, want):
        # The kernels write a 0-d tensor's gradient as [1].
        w = w.reshape(g.shape) if g is not None and w.numel() == g.numel() else w
        assert g is not None and g.shape == w.shape, name
        assert torch.isfinite(g).all(), name
        err = _relative_error(g, w)
        assert err < tol, f"{name}: relative error {err:.3g}"


def _grad_names(captures):
    return ["dq", "dk", "dv"] + [abi.closure_grad(i) for i, c in enumerate(captures) if c.dtype.is_floating_point]


@pytest.mark.parametrize("name", list(VARIANTS))
def test_l1_kernels_scatter_the_closure_gradients(name):
    attn = VARIANTS[name](RAGGED)
    (q, k, v), captures, d_out, want = _problem(attn, RAGGED)
    leaves = _leaves(q, k, v)
    out, lse = attn(*leaves, backend="reference", return_lse=True)
    text, _ = attn._build(q.float(), k.float(), v.float(), compose=False)
    ctx, module = backward_module(text, 16, 16)
    tensors = {"q": q, "k": k, "v": v, "do": d_out, "out": out.detach(), "lse": lse.detach(),
               "dlse": torch.zeros_like(lse)}
    tensors.update({abi.capture(i): c.detach() for i, c in enumerate(captures)})
    names = _grad_names(captures)
    with ctx:
        dq_kernel, dkdv_kernel = kernels_of(module)
        # The dQ kernel writes one gradient per float closure tensor the score_mod reads; the
        # dK/dV kernel none.
        assert abi.arg_roles(dq_kernel)[-len(names) + 3:] == names[3:]
        assert not any(abi.is_closure_grad(r) for r in abi.arg_roles(dkdv_kernel))
        got = run_by_role(module, tensors)
    # exp and the scale are f32 constants in the module (see test_backward_kernels.check_l1).
    _assert_close([got[n] for n in names], want, 1e-6, names)


CPU_SHAPE = variants.Shape(1, 4, 64, 80, 16, 16)


# ALiBi's slopes and the row and column tables are summed along the tile axes their index does
# not vary on before the CPU adds them (attn-cpu-lower-scatter); the others add per score.
@pytest.mark.parametrize("name", list(VARIANTS))
def test_cpu_autograd_takes_closure_gradients_from_the_kernels(name):
    attn = VARIANTS[name](CPU_SHAPE)
    (q, k, v), captures, d_out, want = _problem(attn, CPU_SHAPE, seed=3)
    leaves = _leaves(q, k, v, dtype=torch.float32)
    learnable = _learnable(captures)
    with kernels_only():
        got = torch.autograd.grad(attn(*leaves, backend="cpu"), leaves + learnable, d_out.float())
    for g, c in zip(got[3:], learnable):
        assert g.dtype == c.dtype
    _assert_close(got, want, 1e-4, _grad_names(captures))


def test_cpu_threads_each_add_into_their_own_copy(monkeypatch):
    # With one thread and with several, the same sums up to the order of the additions; with
    # several, the same bits on every call (a copy per range of programs, summed in range order).
    attn = VARIANTS["alibi"](CPU_SHAPE)
    (q, k, v), captures, d_out, want = _problem(attn, CPU_SHAPE, seed=4)
    results = []
    for threads in ("1", "3", "3"):
        monkeypatch.setenv("AE_MLIR_CPU_THREADS", threads)
        leaves = _leaves(q, k, v, dtype=torch.float32)
        with kernels_only():
            results.append(torch.autograd.grad(attn(*leaves, backend="cpu"), leaves + captures, d_out.float()))
    for got in results:
        _assert_close(got, want, 1e-4, _grad_names(captures))
    torch.testing.assert_close(results[0][3], results[1][3], rtol=1e-5, atol=0)
    assert torch.equal(results[1][3], results[2][3])


def test_cpu_bfloat16_closure_gradients():
    attn = VARIANTS["relative_bias"](CPU_SHAPE)
    (q, k, v), captures, d_out, want = _problem(attn, CPU_SHAPE, seed=5, dtype=torch.bfloat16)
    leaves = _leaves(q, k, v, dtype=torch.bfloat16)
    with kernels_only():
        got = torch.autograd.grad(attn(*leaves, backend="cpu"), leaves + captures, d_out)
    assert got[3].dtype == torch.float32  # the table's own dtype
    _assert_close(got, want, 2e-2, _grad_names(captures))


def test_packed_batches_take_closure_gradients():
    # Each sequence's positions index the table, as in an unpacked call per sequence.
    lengths = [9, 0, 30, 17]
    heads, dim = 2, 16
    gen = torch.Generator().manual_seed(6)
    table = torch.randn(heads, 2 * 30 - 1, generator=gen)
    attn = ae.attention(score_mod=lambda s, b, h, i, j: s + table[h, i - j + 29], mask_mod=_causal,
                        layout="blhd")
    total = sum(lengths)
    q, k, v = (torch.randn(total, heads, dim, generator=gen) for _ in range(3))
    d_out = torch.randn(total, heads, dim, generator=gen)
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)] + [table.requires_grad_()]
    with kernels_only():
        out = attn(*leaves[:3], backend="cpu", cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=30, max_seqlen_k=30)
        got = torch.autograd.grad(out, leaves, d_out)
    want = [torch.zeros_like(t, dtype=torch.float64) for t in leaves]
    for s, n in enumerate(lengths):
        if n == 0:
            continue
        lo = int(cu[s])
        ref = _leaves(*(t[lo:lo + n].unsqueeze(0) for t in (q, k, v)), table.detach())
        table64 = ref[3]
        per_sequence = ae.attention(score_mod=lambda s_, b, h, i, j: s_ + table64[h, i - j + 29], mask_mod=_causal,
                                    layout="blhd")
        grads = torch.autograd.grad(per_sequence(*ref[:3], backend="reference"), ref,
                                    d_out[lo:lo + n].unsqueeze(0).double())
        for total_grad, g in zip(want[:3], grads[:3]):
            total_grad[lo:lo + n] += g[0]
        want[3] += grads[3]
    _assert_close(got, want, 1e-4, ["dq", "dk", "dv", "dtable"])


def test_torch_compile_takes_closure_gradients_from_the_kernels():
    shape = variants.Shape(1, 2, 40, 40, 16, 16)
    gen = torch.Generator().manual_seed(7)
    table = torch.randn(2, 79, generator=gen, requires_grad=True)
    attn = ae.attention(score_mod=lambda s, b, h, i, j: s + table[h, i - j + 39], mask_mod=_causal)
    q, k, v = variants.inputs(shape, seed=7)

    def step(q):
        return attn(q, k, v, backend="cpu").square().sum()

    eager_q = q.clone().requires_grad_()
    step(eager_q).backward()
    eager = (eager_q.grad, table.grad.clone())
    table.grad = None
    compiled_q = q.clone().requires_grad_()
    with kernels_only():
        torch.compile(step, backend="aot_eager", fullgraph=True)(compiled_q).backward()
    torch.testing.assert_close(compiled_q.grad, eager[0])
    torch.testing.assert_close(table.grad, eager[1])


@pytest.mark.parametrize("target", ["cuda:90", "hip:gfx942"])
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize("name", ["alibi", "relative_bias", "row_and_column", "t5_bias"])
def test_triton_bundles_at_the_default_config(name, target, dtype, tol):
    shape = variants.Shape(1, 4, 77, 77, 64, 64, heads_kv=2)
    attn = VARIANTS[name](shape)
    (q, k, v), captures, d_out, want = _problem(attn, shape, seed=8, dtype=dtype)
    rounded = _leaves(q, k, v)
    out, lse = attn(*rounded, backend="reference", return_lse=True)
    text = attn.mlir(q, k, v, compose=False)
    bundle = tb.build_backward_bundle(text, target)
    expected = launch_defaults.backward_config(77, 77, 64, 64, str(dtype).removeprefix("torch."), target)
    assert {key: bundle.meta["config"][key] for key in expected} == expected
    names = _grad_names(captures)
    assert [spec.role for spec in bundle.outputs] == ["dq"] + names[3:] + ["dk", "dv"]
    tensors = {"q": q, "k": k, "v": v, "do": d_out, "out": out.detach().to(dtype), "lse": lse.detach().float(),
               "dlse": torch.zeros_like(lse, dtype=torch.float32)}
    tensors.update({abi.capture(i): c.detach() for i, c in enumerate(captures)})
    got = interpret_roles(bundle, tensors)
    _assert_close([got[n] for n in names], want, tol, names)
    # Relaxed f32 atomics on both targets; T5's table is summed per bucket (a loop of 32).
    text = bundle.stages[0].variants["aligned"].ttir
    assert '"tt.atomic_rmw"' in text and "atomic_rmw_op = 5 : i32" in text
    # (the KV loops over partial and full tiles carry the dQ accumulator; the bucket loops do not)
    loops_without_results = text.count('"scf.for"') - text.count('= "scf.for"')
    assert (loops_without_results > 0) == (name == "t5_bias")


def test_closure_gradients_only_when_wanted(monkeypatch):
    # A closure tensor that wants no gradient (the catalogue's constant ALiBi slopes) costs no
    # scatter: the kernels are built without dc<i>.
    from ae_mlir import backends

    calls = []
    run_backward = backends.run_backward

    def recording(text, tensors, backend, closure_grads=True, kind=None, stat="none", autotune=False):
        calls.append(closure_grads)
        return run_backward(text, tensors, backend, closure_grads, kind, stat)

    monkeypatch.setattr(backends, "run_backward", recording)
    attn = VARIANTS["alibi"](CPU_SHAPE)
    (q, k, v), captures, d_out, want = _problem(attn, CPU_SHAPE, seed=9)
    leaves = _leaves(q, k, v, dtype=torch.float32)
    for wanted in (False, True):
        captures[0].requires_grad_(wanted)
        with kernels_only():
            got = torch.autograd.grad(attn(*leaves, backend="cpu"), leaves, d_out.float())
        _assert_close(got, want, 1e-4, ["dq", "dk", "dv"])
    assert calls == [False, True]
    text = attn.mlir(q.float(), k.float(), v.float())
    without = tb.build_backward_bundle(text, "cuda:90", {"closure_grads": False})
    assert [spec.role for spec in without.outputs] == ["dq", "dk", "dv"]
    assert "atomic_rmw" not in without.stages[0].variants["aligned"].ttir
    assert without.meta["config"]["closure_grads"] is False
    with_grads = tb.get_backward_bundle(text, "cuda:90")
    assert [spec.role for spec in with_grads.outputs] == ["dq", "dc0", "dk", "dv"]


@pytest.fixture
def deterministic():
    """torch.use_deterministic_algorithms as the test sets it, restored after."""
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    yield torch.use_deterministic_algorithms
    torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def test_gpu_closure_gradients_follow_the_deterministic_switch(monkeypatch, deterministic):
    """The GPU backward's closure gradients are atomic sums: with torch.use_deterministic_algorithms
    on, a backward that wants them raises torch's RuntimeError before launching (a warning with
    warn_only, then it runs); without them, or with the switch off, it runs. Launches recorded,
    not run: there is no GPU here."""
    from ae_mlir import runtime

    launched = []
    monkeypatch.setattr(runtime, "current_target", lambda device=None: "cuda:90")
    monkeypatch.setattr(runtime, "launch_roles", lambda bundle, tensors: launched.append(bundle.outputs) or {})
    attn = VARIANTS["alibi"](CPU_SHAPE)
    (q, k, v), captures, d_out, _ = _problem(attn, CPU_SHAPE, seed=9)
    text = attn.mlir(q, k, v)
    tensors = {"q": q, "k": k, "v": v, "c0": captures[0], "do": d_out}
    deterministic(True)
    with pytest.raises(RuntimeError, match="use_deterministic_algorithms.*warn_only=True"):
        tb.run_backward(text, tensors, closure_grads=True)
    assert not launched
    tb.run_backward(text, tensors, closure_grads=False)
    deterministic(True, warn_only=True)
    with pytest.warns(UserWarning, match="atomic adds"):
        tb.run_backward(text, tensors, closure_grads=True)
    deterministic(False)
    tb.run_backward(text, tensors, closure_grads=True)
    roles = [[spec.role for spec in outputs] for outputs in launched]
    assert roles == [["dq", "dk", "dv"], ["dq", "dc0", "dk", "dv"], ["dq", "dc0", "dk", "dv"]]
