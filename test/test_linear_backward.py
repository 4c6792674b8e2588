"""The backward of `ae.linear_attention` (`frontend/linear_backward.py`): torch.autograd.gradcheck
on float64 through the reference backend, and float32/bfloat16 through the CPU kernel against
float64 autograd of a naive quadratic formula written here."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import ae_mlir as ae

CHUNK = 16
GRADCHECK = dict(fast_mode=True, atol=1e-6, rtol=1e-4)


def feature(x):
    return F.elu(x) + 1


def _g(decay, b, h, l, dk, dtype, gen):
    """A log-decay for `decay` (in [-0.5, 0)), or None."""
    shape = {None: None, "head": (h,), "token": (b, h, l), "token_dim": (b, h, l, dk)}[decay]
    if shape is None:
        return None
    return (-0.5 * torch.rand(shape, generator=gen, dtype=torch.float64) - 0.01).to(dtype)


def _case(decay, normalize, b=1, h=2, l=36, dk=4, dv=3, dtype=torch.float64, seed=0):
    """(lin, inputs, closure tensors): a variant whose mods read learnable closure tensors. With
    normalize, q and k go through positive feature maps (a one-argument and a five-argument
    mod); without, five-argument mods scale k per head and v per token (Mamba2's dt)."""
    gen = torch.Generator().manual_seed(seed)
    wide = torch.float64 if dtype == torch.float64 else torch.float32  # closure tensors, initial state
    q, k, v = (torch.randn(b, h, l, d, generator=gen, dtype=torch.float64).to(dtype) for d in (dk, dk, dv))
    w = (0.5 + torch.rand(h, generator=gen, dtype=torch.float64)).to(wide)
    dt = (0.5 + torch.rand(b, h, l, generator=gen, dtype=torch.float64)).to(wide)
    s0 = torch.randn(b, h, dk, dv, generator=gen, dtype=torch.float64).to(wide)
    g = _g(decay, b, h, l, dk, dtype, gen)
    if normalize:
        mods = dict(q_mod=feature, k_mod=lambda x, b, h, t, d: F.elu(x) + 1 + w[h])
        closures = [w]
    else:
        mods = dict(k_mod=lambda x, b, h, t, d: x * w[h] + 0.01 * d, v_mod=lambda x, b, h, t, d: x * dt[b, h, t])
        closures = [w, dt]
    lin = ae.linear_attention(**mods, decay=decay, normalize=normalize, chunk_size=CHUNK)
    return lin, [q, k, v, g, s0], closures


def _blhd(t):
    return t.transpose(1, 2).contiguous() if t is not None and t.dim() >= 3 else t


def _call(lin, q, k, v, g, s0, backend):
    return lin(q, k, v, g, initial_state=s0, return_state=True, backend=backend)


def _gradcheck(lin, inputs, closures, backend="reference"):
    present = [t for t in inputs if t is not None]
    for t in present + closures:
        t.requires_grad_()

    def f(*ts):
        # The closure tensors (the last arguments) reach the call through the mods' closures.
        it = iter(ts)
        args = [None if t is None else next(it) for t in inputs]
        return _call(lin, *args, backend)

    assert torch.autograd.gradcheck(f, tuple(present + closures), **GRADCHECK)


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("decay", [None, "head", "token", "token_dim"])
def test_gradcheck_every_decay(decay, normalize):
    """Ragged L (36 = 16 + 16 + 4), initial and final state, closure gradients."""
    _gradcheck(*_case(decay, normalize))


@pytest.mark.parametrize("l", [5, 32])
@pytest.mark.parametrize("decay", ["token", "token_dim"])
def test_gradcheck_short_and_whole_chunks(decay, l):
    _gradcheck(*_case(decay, False, b=2, h=1, l=l))


@pytest.mark.parametrize("decay,normalize", [("token", False), ("token_dim", True), ("head", False)])
def test_gradcheck_blhd_layout(decay, normalize):
    lin, inputs, closures = _case(decay, normalize, b=2)
    lin = ae.linear_attention(**{r: f for r, f in lin.mods.items() if f is not None}, decay=decay,
                              normalize=normalize, chunk_size=CHUNK, layout="blhd")
    q, k, v, g, s0 = inputs
    _gradcheck(lin, [_blhd(q), _blhd(k), _blhd(v), _blhd(g), s0], closures)


def test_gradcheck_zero_dim_closure_and_one_argument_mods():
    gen = torch.Generator().manual_seed(3)
    temp = torch.tensor(0.7, dtype=torch.float64)
    q, k, v = (torch.randn(1, 2, 18, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    lin = ae.linear_attention(q_mod=lambda x: x * temp, k_mod=lambda x: torch.sigmoid(x), v_mod=lambda x: x.tanh(),
                              decay="head", chunk_size=CHUNK)
    g = torch.tensor([-0.2, -0.05], dtype=torch.float64)
    _gradcheck(lin, [q, k, v, g, None], [temp])


# --- float32 / bfloat16 through the CPU kernel against a naive formula ----------------------


def naive(q, k, v, g, s0, decay, scale, normalize):
    """out and final state of DESIGN.md section 3 written quadratically: o_t = scale * (sum_{s<=t}
    sum_d q_t[d] k_s[d] exp(G_t[d] - G_s[d]) v_s + (q_t exp(G_t)) S_0), G = cumsum(g); normalize
    divides sum_{s<=t} (...) v_s + (q_t exp(G_t)) S_0 by the pair sum alone (the key sum starts at 0)."""
    b, h, l, dk = q.shape
    if decay is None:
        G = torch.zeros(b, h, l, 1, dtype=q.dtype)
    elif decay == "head":
        G = g.view(1, h, 1, 1) * torch.arange(1, l + 1, dtype=q.dtype).view(1, 1, l, 1)
    elif decay == "token":
        G = g.cumsum(2).unsqueeze(-1)
    else:
        G = g.cumsum(2)
    G = G.expand(b, h, l, dk)
    keep = torch.ones(l, l, dtype=torch.bool).tril()
    diff = torch.where(keep.unsqueeze(-1), G.unsqueeze(3) - G.unsqueeze(2), torch.zeros((), dtype=q.dtype))
    pairs = torch.where(keep, (q.unsqueeze(3) * k.unsqueeze(2) * torch.exp(diff)).sum(-1), 0.0)
    out = pairs @ v
    state = (k * torch.exp(G[:, :, -1:] - G)).transpose(2, 3) @ v
    if s0 is not None:
        out = out + (q * torch.exp(G)) @ s0
        state = state + torch.exp(G[:, :, -1]).unsqueeze(-1) * s0
    out = out / pairs.sum(-1, keepdim=True) if normalize else scale * out
    return out, state


def _mods_applied(lin, q, k, v):
    out = []
    for role, x in (("q_mod", q), ("k_mod", k), ("v_mod", v)):
        fn = lin.mods[role]
        grid = [torch.arange(n).view([n if i == a else 1 for i in range(4)]) for a, n in enumerate(x.shape)]
        out.append(x if fn is None else (fn(x) if lin.arities[role] == 1 else fn(x, *grid)).expand(x.shape))
    return out


def _close(got, want, rel):
    torch.testing.assert_close(got.double(), want, rtol=rel, atol=rel * max(want.abs().max().item(), 1.0))


def _against_naive(decay, normalize, dtype, rel, layout="bhld", **shape):
    """Gradients of sum(out * r1) + sum(state * r2) from the CPU kernel on q, k, v, g in `dtype`
    (closure tensors and the initial state in float32) against float64 autograd of `naive` on
    the same values."""
    lin, inputs, closures = _case(decay, normalize, dtype=dtype, **shape)
    lin64, inputs64, closures64 = _case(decay, normalize, **shape)
    with torch.no_grad():  # the float64 side takes the low-precision values; the mods read closures64
        for t64, t in zip(inputs64 + closures64, inputs + closures):
            if t is not None:
                t64.copy_(t.double())
    for t in inputs + closures + inputs64 + closures64:
        if t is not None:
            t.requires_grad_()
    q, k, v, g, s0 = inputs64
    want_out, want_state = naive(*_mods_applied(lin64, q, k, v), g, s0, decay, q.shape[3] ** -0.5, normalize)
    gen = torch.Generator().manual_seed(11)
    r_out, r_state = (torch.randn(t.shape, generator=gen, dtype=torch.float64) for t in (want_out, want_state))
    ((want_out * r_out).sum() + (want_state * r_state).sum()).backward()

    q, k, v, g, s0 = inputs
    if layout == "blhd":
        lin = ae.linear_attention(**{r: f for r, f in lin.mods.items() if f is not None}, decay=decay,
                                  normalize=normalize, chunk_size=CHUNK, layout="blhd")
        out, state = _call(lin, _blhd(q), _blhd(k), _blhd(v), _blhd(g), s0, "cpu")
        out = out.transpose(1, 2)
    else:
        out, state = _call(lin, q, k, v, g, s0, "cpu")
    assert out.dtype == dtype and state.dtype == torch.float32
    _close(out, want_out.detach(), rel)
    _close(state, want_state.detach(), rel)
    ((out.double() * r_out).sum() + (state.double() * r_state).sum()).backward()
    for name, got, want in zip(["q", "k", "v", "g", "initial_state", "closure 0", "closure 1"],
                               inputs + closures, inputs64 + closures64):
        if got is not None:
            assert got.grad is not None and got.grad.dtype == got.dtype, name
            _close(got.grad, want.grad, rel)


@pytest.mark.parametrize("decay,normalize,layout", [
    (None, True, "bhld"), ("head", False, "bhld"), ("token", False, "blhd"), ("token_dim", False, "bhld"),
    ("token_dim", True, "blhd")])
def test_float32_cpu_against_naive(decay, normalize, layout):
    _against_naive(decay, normalize, torch.float32, 1e-4, layout, b=2, h=2, l=40, dk=8, dv=8)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16bit_cpu_against_naive(dtype):
    """The kernel rounds its products' operands to 16 bits, and so do the backward's runs."""
    _against_naive("token", False, dtype, 2e-2, b=2, h=2, l=40, dk=8, dv=8)


# --- the call around the backward ------------------------------------------------------------


def test_forward_is_the_kernel_and_state_alone_backpropagates():
    """With grad the output and state are the kernel's, bit for bit; a loss on the final state
    alone (no gradient for the output) reaches k, v, g and the initial state."""
    lin, inputs, _ = _case("token_dim", False, dtype=torch.float32)
    with torch.no_grad():
        want_out, want_state = _call(lin, *inputs, "cpu")
    for t in inputs:
        t.requires_grad_()
    out, state = _call(lin, *inputs, "cpu")
    assert type(out.grad_fn).__name__ == "_LinearAttentionBackward"
    assert torch.equal(out, want_out) and torch.equal(state, want_state)
    state.sum().backward()
    q, k, v, g, s0 = inputs
    assert q.grad is None or not q.grad.any()  # the state does not depend on q
    for t in (k, v, g, s0):
        assert t.grad is not None and torch.isfinite(t.grad).all() and t.grad.abs().sum() > 0
    assert k.grad[:, :, 0].abs().sum() > 0  # the first chunk reaches the final state


def test_only_a_closure_tensor_requires_grad():
    lin, (q, k, v, g, s0), (w, dt) = _case("token", False, dtype=torch.float32)
    dt.requires_grad_()
    out = lin(q, k, v, g, initial_state=s0, backend="cpu")
    out.square().sum().backward()
    assert dt.grad.shape == dt.shape and dt.grad.abs().sum() > 0
    assert q.grad is None and w.grad is None


def test_a_rebound_closure_tensor_is_an_error_in_backward():
    table = {"w": torch.rand(2, requires_grad=True)}
    lin = ae.linear_attention(v_mod=lambda x, b, h, t, d: x * table["w"][h], chunk_size=CHUNK)
    q = torch.randn(1, 2, 8, 4)
    out = lin(q, q, q, backend="cpu")
    table["w"] = torch.rand(2, requires_grad=True)
    with pytest.raises(RuntimeError, match="reads other closure tensors than it did in the forward"):
        out.sum().backward()


def test_float64_runs_on_the_reference_backend_only():
    q = torch.randn(1, 1, 4, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"q must be float16, bfloat16 or float32 for backend='cpu', got "
                                         r"torch.float64; float64 inputs run with backend='reference' only"):
        ae.linear_attention()(q, q, q, backend="cpu")
    g = torch.full((1,), -0.1, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"g must be .* for backend='cpu', got torch.float64"):
        ae.linear_attention(decay="head")(q.float(), q.float(), q.float(), g, backend="cpu")
    out64 = ae.linear_attention(decay="head")(q, q, q, g, backend="reference")
    out32 = ae.linear_attention(decay="head")(q.float(), q.float(), q.float(), g.float(), backend="reference")
    assert out64.dtype == torch.float64
    torch.testing.assert_close(out64.float(), out32)


def test_float64_module_types_and_no_compile_on_cpu(monkeypatch):
    """float64 tensors are f64 in the module (the final state stays f32); a compiled backend
    refuses them with a ValueError before anything compiles."""
    import ae_mlir.backends as backends
    import ae_mlir.backends.cpu as cpu

    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 8, d, generator=gen, dtype=torch.float64) for d in (4, 4, 3))
    g = _g("token", 1, 2, 8, 4, torch.float64, gen)
    s0 = torch.randn(1, 2, 4, 3, generator=gen, dtype=torch.float64)
    lin = ae.linear_attention(q_mod=feature, decay="token", chunk_size=CHUNK)
    text = lin.mlir(q, k, v, g, initial_state=s0)
    sig = ("(tensor<1x2x8x4xf64>, tensor<1x2x8x4xf64>, tensor<1x2x8x3xf64>, tensor<1x2x8xf64>, "
           "tensor<1x2x4x3xf64>) -> (tensor<1x2x8x3xf64>, tensor<1x2x4x3xf32>)")
    assert sig in text
    assert "f64" in ae.linear_attention().mlir(q, k, v)

    def compiled(*args, **kwargs):
        raise AssertionError("a float64 call reached a compiled backend")

    monkeypatch.setattr(backends, "run", compiled)
    monkeypatch.setattr(cpu, "run_module_text", compiled)
    for inputs in ((q, k, v, g, s0), (q.float(), k.float(), v.float(), g, None),
                   (q.float(), k.float(), v.float(), g.float(), s0)):
        with pytest.raises(ValueError, match=r"for backend='cpu', got torch.float64; float64 inputs run "
                                             r"with backend='reference' only"):
            lin(*inputs[:4], initial_state=inputs[4], backend="cpu")
    with pytest.raises(ValueError, match=r"for backend='cpu', got torch.float64"):
        ae.linear_attention()(q.clone().requires_grad_(), k, v, backend="cpu")  # the autograd path too
