"""attn-differentiate: every derivative rule against torch's autograd, in float64.

Each case writes a score_mod region around one op, runs the pass, and evaluates the derivative
regions it wrote (score_mod_grad, closure_grad, normalize_grad's prob_grad and finalize_grad) with
`core.scalar_eval`; the expected gradients are torch.autograd's on scalar_eval's evaluation of
the forward region, so both sides read the same program and only the chain rule differs.
"""
from __future__ import annotations


import pytest
import torch

import ae_mlir as ae
from ae_mlir import variants
from ae_mlir.core import scalar_eval
from ae_mlir.core.context import new_context, parse_module
from ae_mlir.core.regions import from_region
from ae_mlir.core.verifier import check_module
from ae_mlir.passes import create_pass

B, H, LQ, LK = 1, 2, 3, 4
SCORES = f"tensor<{B}x{H}x{LQ}x{LK}xf32>"

UNARY = ["arith.negf", "math.exp", "math.exp2", "math.expm1", "math.log", "math.log2", "math.log1p",
         "math.sqrt", "math.rsqrt", "math.tanh", "math.sin", "math.cos", "math.absf", "math.erf",
         "math.floor", "math.ceil", "math.roundeven"]
BINARY = ["arith.addf", "arith.subf", "arith.mulf", "arith.divf", "arith.remf", "arith.maximumf",
          "arith.minimumf", "math.powf"]


def _module(body: str, closure_elt: str = "f32") -> str:
    """A softmax attention whose score_mod is `body` over %x (the score) and %w = w[h, kv_idx]."""
    closure = f"tensor<{H}x{LK}x{closure_elt}>"
    read = f"%wr = tensor.extract %w[%h, %j] : {closure}"
    widen = {"f32": "%wv = arith.addf %wr, %zero : f32", "bf16": "%wv = arith.extf %wr : bf16 to f32",
             "f64": "%wv = arith.truncf %wr : f64 to f32"}[closure_elt]
    qk, v = f"tensor<{B}x{H}x{LQ}x8xf32>", f"tensor<{B}x{H}x{LK}x8xf32>"
    return f"""
func.func @attention(%q: {qk}, %k: tensor<{B}x{H}x{LK}x8xf32>, %v: {v}, %w: {closure}) -> {qk} {{
  %s = "attn.score"(%q, %k) {{scale = 0.125 : f32}} : ({qk}, tensor<{B}x{H}x{LK}x8xf32>) -> {SCORES}
  %sm = "attn.score_mod"(%s) ({{
  ^bb0(%x: f32, %b: index, %h: index, %i: index, %j: index):
    %zero = arith.constant 0.0 : f32
    {read}
    {widen}
    {body}
    "gpu.yield"(%y) : (f32) -> ()
  }}) : ({SCORES}) -> {SCORES}
  %p = "attn.normalize"(%sm) ({{}}, {{}}, {{}}) {{kind = "softmax", operandSegmentSizes = array<i32: 1, 0>, resultSegmentSizes = array<i32: 1, 0>}} : ({SCORES}) -> {SCORES}
  %o = "attn.aggregate"(%p, %v) : ({SCORES}, {v}) -> {qk}
  return %o : {qk}
}}
"""


def _differentiate(text: str):
    """The parsed module after attn-differentiate (verified), and its functions by name."""
    ctx = new_context()
    module = parse_module(text, ctx)
    with ctx:
        create_pass("attn-differentiate").apply(module.operation)
    check_module(module)
    funcs = {op.attributes["sym_name"].value: op for op in module.body.operations}
    return ctx, module, funcs


def _ops(func, name: str) -> list:
    return [op for op in func.regions[0].blocks[0].operations if op.operation.name == name]


def _grid():
    return [torch.arange(n).view([n if a == axis else 1 for a in range(4)]) for axis, n in enumerate((B, H, LQ, LK))]


def _score_mod_case(body: str, closure_elt: str = "f32", x_range=(0.5, 2.0), w_range=(0.5, 1.5), seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = (x_range[0] + (x_range[1] - x_range[0]) * torch.rand(B, H, LQ, LK, generator=gen, dtype=torch.float64))
    w = (w_range[0] + (w_range[1] - w_range[0]) * torch.rand(H, LK, generator=gen, dtype=torch.float64))
    w = w.to({"f32": torch.float32, "bf16": torch.bfloat16, "f64": torch.float64}[closure_elt])
    g = torch.randn(B, H, LQ, LK, generator=gen, dtype=torch.float64)
    ctx, module, funcs = _differentiate(_module(body, closure_elt))
    with ctx:
        forward = from_region(_ops(funcs["attention"], "attn.score_mod")[0].regions[0])
        grad_fn = funcs["attention_grad"]
        score_grad = from_region(_ops(grad_fn, "attn.score_mod_grad")[0].regions[0])
        closure_grads = [from_region(op.regions[0]) for op in _ops(grad_fn, "attn.closure_grad")]
    x_leaf, w_leaf = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = scalar_eval.evaluate(forward, [x_leaf, *_grid()], scalar_eval.bind_externals(forward, [None] * 3 + [w_leaf]))
    dx, dw = torch.autograd.grad(y.expand(x.shape), [x_leaf, w_leaf], g, allow_unused=True)
    operands = [None, None, w]
    got = scalar_eval.evaluate(score_grad, [x, g, *_grid()], scalar_eval.bind_externals(score_grad, operands))
    torch.testing.assert_close(got.expand(x.shape).double(), dx if dx is not None else torch.zeros_like(x))
    got_w = torch.zeros(w.shape, dtype=torch.float64)
    for program in closure_grads:
        values = scalar_eval.evaluate_all(program, [x, g, *_grid()], scalar_eval.bind_externals(program, operands))
        for group in range(0, len(values), 3):
            value, rows, cols = (torch.broadcast_to(t, x.shape) for t in values[group : group + 3])
            got_w.index_put_((rows.reshape(-1), cols.reshape(-1)), value.double().reshape(-1), accumulate=True)
    expected_w = dw.double() if dw is not None else torch.zeros_like(got_w)
    tolerance = {"rtol": 1e-2, "atol": 1e-2} if closure_elt == "bf16" else {}
    torch.testing.assert_close(got_w, expected_w, **tolerance)
    return closure_grads


@pytest.mark.parametrize("op", UNARY)
def test_unary_rule_matches_autograd(op):
    # %x in (0.5, 2): inside every op's domain (log, sqrt, rsqrt) and away from abs's kink. The
    # unary op applied to x * w also puts the chain rule into the closure's gradient.
    _score_mod_case(f"%xw = arith.mulf %x, %wv : f32\n    %y = {op} %xw : f32")


@pytest.mark.parametrize("op", BINARY)
def test_binary_rule_matches_autograd_for_both_operands(op):
    closure_grads = _score_mod_case(f"%y = {op} %x, %wv : f32", x_range=(0.3, 2.0))
    assert len(closure_grads) == 1


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_abs_takes_the_sign_of_its_operand(sign):
    _score_mod_case(f"%c = arith.constant {sign} : f32\n    %xs = arith.mulf %x, %c : f32\n"
                    "    %y = math.absf %xs : f32")


def test_select_routes_the_gradient_to_the_taken_side():
    _score_mod_case("%c = arith.cmpf olt, %x, %wv : f32\n    %t = math.tanh %x : f32\n"
                    "    %y = arith.select %c, %t, %wv : f32", x_range=(0.0, 2.0))


def test_index_arithmetic_is_a_constant_factor():
    _score_mod_case("%d = arith.subi %j, %i : index\n    %d64 = arith.index_cast %d : index to i64\n"
                    "    %df = arith.sitofp %d64 : i64 to f32\n    %bias = arith.mulf %wv, %df : f32\n"
                    "    %y = arith.addf %x, %bias : f32")


@pytest.mark.parametrize("elt", ["bf16", "f64"])
def test_closure_tensors_of_other_float_types(elt):
    _score_mod_case("%y = arith.mulf %x, %wv : f32", closure_elt=elt)


def test_closure_read_only_through_a_comparison_gets_no_gradient():
    closure_grads = _score_mod_case("%c = arith.cmpf ogt, %wv, %x : f32\n    %y = arith.select %c, %x, %zero : f32")
    assert closure_grads == []


def _normalizer_regions(normalizer):
    q = torch.randn(1, 1, 4, 8)
    ctx, module, funcs = _differentiate(ae.attention(normalize=normalizer).mlir(q, q, q))
    with ctx:
        op = _ops(funcs["attention_grad"], "attn.normalize_grad")[0]
        return [from_region(r) for r in op.regions], op.attributes["stat"].value


def _retnet():
    return variants.retnet_normalizer()


def _softmax_as_user():
    return ae.OnlineNormalizer(prob=lambda s, m: torch.exp(s - m), rescale=lambda a, b: torch.exp(a - b),
                               finalize=lambda acc, l: torch.where(l == 0.0, 0.0, acc / l), name="user_softmax")


def _sqrt_log():
    return ae.OnlineNormalizer(prob=lambda s, m: torch.sqrt(torch.nn.functional.softplus(s) + 1.0) * torch.log1p(m * m),
                               finalize=lambda acc, l: acc * torch.rsqrt(l * l + 1.0), name="sqrt_log")


@pytest.mark.parametrize("make, stat", [(_retnet, "none"), (_softmax_as_user, "max"), (_sqrt_log, "none")])
def test_normalizer_region_derivatives_match_autograd(make, stat):
    (prob, finalize, prob_grad, finalize_grad), got_stat = _normalizer_regions(make())
    assert got_stat == stat
    gen = torch.Generator().manual_seed(1)
    for forward, derivative in ((prob, prob_grad), (finalize, finalize_grad)):
        a, c, g = (torch.randn(64, generator=gen, dtype=torch.float64) for _ in range(3))
        a_leaf, c_leaf = a.clone().requires_grad_(), c.clone().requires_grad_()
        y = scalar_eval.evaluate(forward, [a_leaf, c_leaf]).expand(a.shape)
        expected = torch.autograd.grad(y, [a_leaf, c_leaf], g, allow_unused=True)
        got = scalar_eval.evaluate_all(derivative, [a, c, g])
        for value, want in zip(got, expected):
            want = torch.zeros_like(a) if want is None else want
            torch.testing.assert_close(value.expand(a.shape).double(), want)


@pytest.mark.parametrize("name", sorted(variants.CATALOGUE))
def test_every_catalogue_variant_differentiates_to_a_valid_module(name):
    attn, shape = variants.build(name, variants.Shape(1, 4, 6, 5, 8, 8))
    q, k, v = variants.inputs(shape)
    _, module, funcs = _differentiate(attn.mlir(q, k, v))
    assert "attention_grad" in funcs
