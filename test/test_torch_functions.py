"""Every entry of the tracer's table of torch functions and Tensor methods
(`ae_mlir.frontend.trace.SUPPORTED`) on every backend: the float64 reference executor, the CPU
backend (LLVM JIT) and the Triton IR (built for cuda:90 at its default config, run in the NumPy
interpreter), each against eager torch applied to materialized float64 scores; and the Triton IR
of entries holding every op of the table's mods compiled for hip:gfx942 and cuda:90. Outside the table, the tracer names the function and
the mod. Also the linear family's one-argument feature maps (fla's elu+1, relu, ...).

One attention holds all entries, entry e on head e (a score_mod selecting by h), so that each
backend compiles once; where that compile fails, each entry's test compiles the entry alone, so
that the failure names its entry.
"""
from __future__ import annotations

import functools
import re

import pytest
import torch
import torch.nn.functional as F

import ae_mlir as ae
from ae_mlir import runtime
from ae_mlir.backends import triton as tb
from ae_mlir.frontend import trace
from ae_mlir.frontend.trace import TraceError
from bundle_interp import interpret

L, D = 40, 16
TOL = dict(atol=2e-5, rtol=1e-4)
# index-only arguments (`d = q_idx - kv_idx`) make the discontinuous entries exact on every backend
# (halves for round: its ties go to even); the others take the score, kept in each one's domain.
_ENTRIES = {
    "exp": lambda f, s, i, j: f(s), "exp2": lambda f, s, i, j: f(s),
    "log": lambda f, s, i, j: f(s.abs() + 0.5), "log2": lambda f, s, i, j: f(s.abs() + 0.5),
    "sqrt": lambda f, s, i, j: f(s.abs()), "rsqrt": lambda f, s, i, j: f(s.abs() + 0.25),
    "tanh": lambda f, s, i, j: f(2.0 * s), "sigmoid": lambda f, s, i, j: f(2.0 * s),
    "sin": lambda f, s, i, j: f(3.0 * s), "cos": lambda f, s, i, j: f(3.0 * s),
    "floor": lambda f, s, i, j: f((i - j) / 3.0) * 0.25 + s,
    "ceil": lambda f, s, i, j: f((i - j) / 3.0) * 0.25 + s,
    "round": lambda f, s, i, j: f((i - j) * 0.5) * 0.25 + s,
    "sign": lambda f, s, i, j: f((i - j) * 1.0) * 0.5 + s,
    "erf": lambda f, s, i, j: f(2.0 * s), "log1p": lambda f, s, i, j: f(s.abs()),
    "expm1": lambda f, s, i, j: f(s),
    "abs": lambda f, s, i, j: f(s), "neg": lambda f, s, i, j: f(s), "negative": lambda f, s, i, j: f(s),
    "square": lambda f, s, i, j: f(s), "relu": lambda f, s, i, j: f(s),
    "where": lambda f, s, i, j: f(i >= j, s, -s),
    "maximum": lambda f, s, i, j: f(s, 0.5 * s), "max": lambda f, s, i, j: f(s, 0.5 * s),
    "fmax": lambda f, s, i, j: f(s, 0.5 * s), "minimum": lambda f, s, i, j: f(s, 0.5 * s),
    "min": lambda f, s, i, j: f(s, 0.5 * s), "fmin": lambda f, s, i, j: f(s, 0.5 * s),
    "clamp": lambda f, s, i, j: f(s, -0.5, 0.5) + f(s, max=0.2),
    "clip": lambda f, s, i, j: f(s, min=-0.3) + f(s, -0.2, 0.2),
    "add": lambda f, s, i, j: f(s, i - j, alpha=0.05), "sub": lambda f, s, i, j: f(s, s * s),
    "mul": lambda f, s, i, j: f(s, 1.5), "div": lambda f, s, i, j: f(s, 1.5),
    "true_divide": lambda f, s, i, j: f(i - j, 16) + s,
    "floor_divide": lambda f, s, i, j: f(i - j, 4) * 0.1 + s,
    "remainder": lambda f, s, i, j: f(i - j, 5) * 0.1 + s,
    "pow": lambda f, s, i, j: f(s.abs(), 1.5),
    "logical_and": lambda f, s, i, j: torch.where(f(i >= j, i - j < 5), s, -s),
    "logical_or": lambda f, s, i, j: torch.where(f(i >= j, j > 30), s, -s),
    "logical_xor": lambda f, s, i, j: torch.where(f(i >= j, j > 30), s, -s),
    "logical_not": lambda f, s, i, j: torch.where(f(i >= j), s, -s),
    **{p: lambda f, s, i, j: torch.where(f(i, j + 3), s, -s) for p in ("eq", "ne", "lt", "le", "gt", "ge")},
}
# Tensor-method forms call the method on the first operand: `f(x, *rest)` is `x.name(*rest)`.
_METHOD_ONLY = {
    "Tensor.where": lambda s, i, j: s.where(i >= j, -s),
    "Tensor.to": lambda s, i, j: (i - j).to(torch.float32) * 0.1 + ((i - j) * 0.25).to(torch.int64) * 0.2 + s,
    "Tensor.float": lambda s, i, j: (i - j).float() * 0.1 + s,
    "Tensor.bool": lambda s, i, j: torch.where((i - j).bool(), s, -s),
    "Tensor.long": lambda s, i, j: ((i - j) * 0.25).long() * 0.1 + s,
    "Tensor.int": lambda s, i, j: ((i - j) * 0.25).int() * 0.1 + s,
    "Tensor.new_ones": lambda s, i, j: s + s.new_ones(()),
    "Tensor.new_zeros": lambda s, i, j: s.new_zeros(()) - s,
    "Tensor.new_full": lambda s, i, j: s.new_full((), 0.5) * s,
    "Tensor.new_tensor": lambda s, i, j: s.new_tensor(1.5) * s,
}
_F = "torch.nn.functional"
EXAMPLES = {
    **{f"torch.{name}": functools.partial(entry, getattr(torch, name)) for name, entry in _ENTRIES.items()},
    **{f"Tensor.{name}": functools.partial(entry, lambda x, *rest, n=name, **kw: getattr(x, n)(*rest, **kw))
       for name, entry in _ENTRIES.items()},
    **_METHOD_ONLY,
    "torch.pow[float base]": lambda s, i, j: torch.pow(2.0, s),
    f"{_F}.relu": lambda s, i, j: F.relu(s),
    f"{_F}.elu": lambda s, i, j: F.elu(s) + F.elu(2.0 * s, alpha=0.5),
    f"{_F}.silu": lambda s, i, j: F.silu(2.0 * s),
    f"{_F}.gelu": lambda s, i, j: F.gelu(2.0 * s),
    f"{_F}.gelu[tanh]": lambda s, i, j: F.gelu(2.0 * s, approximate="tanh"),
    f"{_F}.softplus": lambda s, i, j: F.softplus(2.0 * s),
    f"{_F}.softplus[beta, threshold]": lambda s, i, j: F.softplus(10.0 * s, beta=2.0, threshold=5.0) * 0.1,
    f"{_F}.logsigmoid": lambda s, i, j: F.logsigmoid(3.0 * s),
}
NAMES = list(EXAMPLES)


def test_every_supported_form_has_an_example():
    assert {name.split("[")[0] for name in EXAMPLES} == set(trace.SUPPORTED)


def _attention(names):
    """Entry names[e] on head e."""
    def score_mod(s, b, h, q_idx, kv_idx):
        out = s
        for e, name in enumerate(names):
            out = torch.where(h == e, EXAMPLES[name](s, q_idx, kv_idx), out)
        return out

    return ae.attention(score_mod=score_mod)


def _inputs(heads):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(1, heads, L, D, generator=g) for _ in range(3)]


def _eager(names, q, k, v):
    """Softmax attention with each head's entry applied by torch to float64 scores."""
    q, k, v = (t.double() for t in (q, k, v))
    scores = q @ k.transpose(-1, -2) / D ** 0.5
    i, j = torch.arange(L)[:, None], torch.arange(L)[None, :]
    modded = torch.stack([EXAMPLES[name](scores[:, e], i, j).double() for e, name in enumerate(names)], dim=1)
    return torch.softmax(modded, dim=-1) @ v


def _triton_interpreted(attn, q, k, v):
    bundle = tb.compile_bundle(attn, q, k, v)  # cuda:90 at its default config
    (out, *_), _ = interpret(bundle, q, k, v)
    return out


BACKENDS = {
    "reference": lambda attn, q, k, v: attn(q, k, v, backend="reference"),
    "cpu": lambda attn, q, k, v: attn(q, k, v, backend="cpu"),
    "triton-interpreted": _triton_interpreted,
}


def _run(backend, names):
    q, k, v = _inputs(len(names))
    return BACKENDS[backend](_attention(names), q, k, v).double(), _eager(names, q, k, v)


@functools.cache
def _all_entries(backend):
    try:
        return _run(backend, NAMES)
    except Exception as err:  # each entry's test then compiles the entry alone
        return err


@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize("name", NAMES)
def test_entry_matches_eager_torch(name, backend):
    result = _all_entries(backend)
    if isinstance(result, Exception):
        got, want = _run(backend, [name])
    else:
        e = NAMES.index(name)
        got, want = result[0][:, e], result[1][:, e]
    torch.testing.assert_close(got, want, **TOL)


def _covering_entries():
    """Entries whose mods, together, hold every arith and math op that any entry's mod holds:
    compiling all entries at once would take minutes for a compile that checks op lowerings."""
    q, k, v = _inputs(1)
    ops = {name: set(re.findall(r"\b(?:arith|math)\.\w+", _attention([name]).mlir(q, k, v))) for name in NAMES}
    uncovered, chosen = set().union(*ops.values()), []
    while uncovered:
        best = max(NAMES, key=lambda name: len(ops[name] & uncovered))
        chosen.append(best)
        uncovered -= ops[best]
    return chosen


@pytest.mark.parametrize("target,kind", [("hip:gfx942", "amdgcn"), ("cuda:90", "ptx")])
def test_table_compiles(target, kind):
    names = _covering_entries()
    q, k, v = _inputs(len(names))
    bundle = tb.compile_bundle(_attention(names), q, k, v, target=target)
    for variant in bundle.variants.values():
        assert kind in runtime.compile_variant(variant, target, bundle.num_warps, bundle.num_stages).asm


def test_erf_score_mod_on_cpu():
    # torch.erf was traced, then failed in the LLVM JIT (a libm call unrolled too late).
    attn = ae.attention(score_mod=lambda score, b, h, q_idx, kv_idx: torch.erf(score))
    q, k, v = _inputs(2)
    torch.testing.assert_close(attn(q, k, v, backend="cpu"), attn(q, k, v, backend="reference"), **TOL)


@pytest.mark.parametrize("mod,function", [
    (lambda s, b, h, q_idx, kv_idx: torch.atan(s), "torch.atan"),
    (lambda s, b, h, q_idx, kv_idx: s.atan(), "Tensor.atan"),
    (lambda s, b, h, q_idx, kv_idx: F.hardtanh(s), "torch.nn.functional.hardtanh"),
    (lambda s, b, h, q_idx, kv_idx: torch.special.erf(s), "special_erf"),
    (lambda s, b, h, q_idx, kv_idx: torch.round(s, decimals=2), "torch.round with decimals=2"),
    (lambda s, b, h, q_idx, kv_idx: F.gelu(s, approximate="fast"), "approximate='fast'"),
])
def test_outside_the_table_fails_in_the_tracer(mod, function):
    q, k, v = _inputs(2)
    with pytest.raises(TraceError, match="score_mod '<lambda>'") as info:
        ae.attention(score_mod=mod).mlir(q, k, v)
    assert isinstance(info.value, ValueError) and function in str(info.value)


# fla's feature maps, one-argument mods of the feature value; the last is hedgehog's exponential
# map without its softmax denominator (the elementwise part of it).
FEATURE_MAPS = {
    "elu+1": lambda x: F.elu(x) + 1,
    "relu": F.relu,
    "1+elu": lambda x: 1.0 + F.elu(x),
    "exp": lambda x: torch.exp(x),
}


def _linear(feature_map):
    lin = ae.linear_attention(q_mod=feature_map, k_mod=feature_map, normalize=True)
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, L, D, generator=g) for _ in range(3))
    return lin, q, k, v, lin(q, k, v, backend="reference")


@pytest.mark.parametrize("name", list(FEATURE_MAPS))
def test_feature_map_on_cpu(name):
    lin, q, k, v, want = _linear(FEATURE_MAPS[name])
    torch.testing.assert_close(lin(q, k, v, backend="cpu"), want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", list(FEATURE_MAPS))
def test_feature_map_as_triton_ir(name):
    lin, q, k, v, want = _linear(FEATURE_MAPS[name])
    _, captures = lin._build(q, k, v, None, None)
    bundle = tb.build_bundle(lin.mlir(q, k, v), "cuda:90")
    (out, _), _ = interpret(bundle, q, k, v, *captures)
    torch.testing.assert_close(out, want, atol=1e-4, rtol=1e-4)


def test_feature_map_equals_its_five_argument_form():
    one = ae.linear_attention(q_mod=lambda x: F.elu(x) + 1)
    five = ae.linear_attention(q_mod=lambda x, b, h, t, d: F.elu(x) + 1)
    _, q, k, v, _ = _linear(None)
    assert one.mlir(q, k, v) == five.mlir(q, k, v)


@pytest.mark.parametrize("mod", [lambda x, b: x, lambda x, b, h, t: x, lambda: 1.0, torch.exp])
def test_feature_map_of_another_arity_is_refused(mod):
    with pytest.raises(ValueError, match="k_mod"):
        ae.linear_attention(k_mod=mod)


@pytest.mark.parametrize("mod", [
    lambda s, b, h, q_idx, kv_idx: F.softplus(10.0 * s, beta=2.0, threshold=5.0) * 0.1,
    lambda s, b, h, q_idx, kv_idx: F.logsigmoid(-40.0 * s) * 0.05,
], ids=["softplus", "logsigmoid"])
def test_softplus_gradients_stay_finite_where_exp_overflows(mod):
    """softplus decomposes into a select between x and log1p(exp(beta x)) / beta; where beta x
    passes 88, exp overflows in float32, and the branch not taken had a derivative of inf / inf,
    which the select's zero did not cancel: NaN gradients on every backend. Its exponent is
    capped at the threshold now."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, L, D, generator=g) * 3 for _ in range(3))
    attn = ae.attention(score_mod=mod)
    grads = []
    for backend, dtype in (("cpu", torch.float32), ("reference", torch.float64)):
        inputs = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
        attn(*inputs, backend=backend).sum().backward()
        grads.append([t.grad.double() for t in inputs])
    scores = q.double() @ k.double().transpose(-1, -2) / D ** 0.5
    assert (10.0 * scores).max() > 200  # exp's argument past float32's range
    for got, want in zip(*grads):
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-3)
