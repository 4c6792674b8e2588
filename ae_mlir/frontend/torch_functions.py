"""The torch functions and Tensor methods a traced mod may call: one table, `HANDLERS`.

`HANDLERS` maps the name that `Sym.__torch_function__` (or a Tensor-method lookup on a `Sym`)
sees to the handler recording it; `SUPPORTED` lists the public forms the table serves
("torch.erf", "Tensor.erf", "torch.nn.functional.elu", ...), each of which
test/test_torch_functions.py runs on every backend. A name outside the table fails in the tracer
with a `TraceError` naming the function and the mod.

Composite functions (silu, gelu, elu, softplus, logsigmoid, sign, relu, square, ...) decompose
here, with torch's formulas and defaults, into the primitives of `UNARY_FLOAT` and arithmetic,
which every backend lowers; emit.py maps the primitives onto `math` ops.
"""
from __future__ import annotations

import math

from .trace import F32, I1, INDEX, Expr, Sym, _extract, _to, _unify, lift

# Primitives: one `math` op each (emit.py's _MATH); `round` is torch's half-to-even rounding.
UNARY_FLOAT = (
    "exp", "exp2", "log", "log2", "sqrt", "rsqrt", "tanh", "sigmoid", "sin", "cos", "floor", "ceil",
    "round", "erf", "log1p", "expm1",
)


def _unary(name):
    def handler(state, x, *rest, **kw):
        if rest or any(k not in ("out",) for k in kw) or kw.get("out") is not None:
            state.fail(f"torch.{name} with extra arguments is not supported")
        x = _to(lift(x, state), F32)
        return Sym(Expr(name, F32, (x.expr,)), state)

    return handler


_PRIMITIVE = {name: _unary(name) for name in UNARY_FLOAT}


def _float(state, x) -> Sym:
    return _to(lift(x, state), F32)


def where(state, cond, a, b):
    cond = lift(cond, state)
    if cond.expr.type != I1:
        cond = cond != 0
    a, b, ty = _unify(lift(a, state), lift(b, state), allow_bool=True)
    return Sym(Expr("select", ty, (cond.expr, a.expr, b.expr)), state)


def _minmax(op):
    def handler(state, a, b, **kw):
        a, b, ty = _unify(lift(a, state), lift(b, state))
        return Sym(Expr(op, ty, (a.expr, b.expr)), state)

    return handler


def _clamp(state, x, min=None, max=None):
    x = lift(x, state)
    if min is not None:
        x = _minmax("max")(state, x, min)
    if max is not None:
        x = _minmax("min")(state, x, max)
    return x


def _getitem(state, tensor, item):
    import torch

    if not isinstance(tensor, torch.Tensor):
        state.fail("indexing a symbolic value; only closure tensors can be indexed")
    items = item if isinstance(item, tuple) else (item,)
    for it in items:
        if not isinstance(it, (Sym, int)) or isinstance(it, bool):
            state.fail(f"closure tensors must be indexed by index expressions, got {type(it).__name__}")
    return _extract(tensor, items, state)


def _binary_fn(op):
    def handler(state, a, b, **kw):
        if kw.get("alpha", 1) != 1:
            b = b * kw["alpha"]
        return lift(a, state)._bin(b, op)

    return handler


def _logical(op):
    def handler(state, a, b=None):
        if op == "not":
            return ~(lift(a, state) != 0 if lift(a, state).expr.type != I1 else lift(a, state))
        a, b = lift(a, state), lift(b, state)
        a = a if a.expr.type == I1 else a != 0
        b = b if b.expr.type == I1 else b != 0
        return a._logic(b, op)

    return handler


def _cmp_fn(pred):
    return lambda state, a, b: lift(a, state)._cmp(b, pred)


def _round(state, x, *, decimals=0):
    if decimals != 0:
        state.fail(f"torch.round with decimals={decimals!r} is not supported (decimals=0 only)")
    return _PRIMITIVE["round"](state, x)


def _sign(state, x):
    # torch.sign(0) and torch.sign(NaN) are 0; the result keeps x's type, as torch's does.
    x = lift(x, state)
    x = _to(x, INDEX) if x.expr.type == I1 else x
    one, zero, minus_one = (x._filled(v, None) for v in (1, 0, -1))
    return where(state, x > zero, one, where(state, x < zero, minus_one, zero))


# Activations ignore `inplace`: a mod's value is the same either way.
def _relu(state, x, inplace=False):
    return _minmax("max")(state, x, 0.0)


def _elu(state, x, alpha=1.0, inplace=False):
    x = _float(state, x)
    return where(state, x > 0.0, x, _PRIMITIVE["expm1"](state, x) * alpha)


def _silu(state, x, inplace=False):
    x = _float(state, x)
    return x * _PRIMITIVE["sigmoid"](state, x)


def _gelu(state, x, approximate="none"):
    x = _float(state, x)
    if approximate == "none":
        inner = _PRIMITIVE["erf"](state, x * math.sqrt(0.5))
    elif approximate == "tanh":
        inner = _PRIMITIVE["tanh"](state, (x + x * x * x * 0.044715) * math.sqrt(2.0 / math.pi))
    else:
        state.fail(f"torch.nn.functional.gelu with approximate={approximate!r} (use 'none' or 'tanh')")
    return x * 0.5 * (inner + 1.0)


def _softplus(state, x, beta=1.0, threshold=20.0):
    # torch: x where beta * x > threshold (the linear regime), else log1p(exp(beta * x)) / beta.
    # The soft branch takes beta * x capped at the threshold: past it exp would overflow, and the
    # derivative of the branch not taken, multiplied by zero, would be NaN (inf / inf).
    x = _float(state, x)
    bx = x * beta
    linear = bx > threshold
    soft = _PRIMITIVE["log1p"](state, _PRIMITIVE["exp"](state, where(state, linear, float(threshold), bx))) / beta
    return where(state, linear, x, soft)


def _logsigmoid(state, x):
    return -_softplus(state, -_float(state, x))


def _method(name):
    """A handler calling the `Sym` method of that name (casts and constructors)."""
    return lambda state, x, *args, **kwargs: getattr(lift(x, state), name)(*args, **kwargs)


_TORCH_AND_TENSOR = "torch Tensor"
_F = "torch.nn.functional"

# name -> (handler, public forms): "torch" stands for torch.<name>, "Tensor" for Tensor.<name>,
# a dotted form is spelled out. Tensor.where is `Sym.where` (Tensor's argument order).
_TABLE = {
    **{name: (_PRIMITIVE[name], _TORCH_AND_TENSOR) for name in UNARY_FLOAT if name != "round"},
    "round": (_round, _TORCH_AND_TENSOR),
    "sign": (_sign, _TORCH_AND_TENSOR),
    "where": (where, _TORCH_AND_TENSOR),
    "maximum": (_minmax("max"), _TORCH_AND_TENSOR), "max": (_minmax("max"), _TORCH_AND_TENSOR),
    "minimum": (_minmax("min"), _TORCH_AND_TENSOR), "min": (_minmax("min"), _TORCH_AND_TENSOR),
    "fmax": (_minmax("max"), _TORCH_AND_TENSOR), "fmin": (_minmax("min"), _TORCH_AND_TENSOR),
    "clamp": (_clamp, _TORCH_AND_TENSOR), "clip": (_clamp, _TORCH_AND_TENSOR),
    "abs": (lambda state, x: abs(lift(x, state)), _TORCH_AND_TENSOR),
    "neg": (lambda state, x: -lift(x, state), _TORCH_AND_TENSOR),
    "negative": (lambda state, x: -lift(x, state), _TORCH_AND_TENSOR),
    "add": (_binary_fn("add"), _TORCH_AND_TENSOR), "sub": (_binary_fn("sub"), _TORCH_AND_TENSOR),
    "mul": (_binary_fn("mul"), _TORCH_AND_TENSOR), "div": (_binary_fn("truediv"), _TORCH_AND_TENSOR),
    "true_divide": (_binary_fn("truediv"), _TORCH_AND_TENSOR),
    "floor_divide": (_binary_fn("floordiv"), _TORCH_AND_TENSOR),
    "remainder": (_binary_fn("mod"), _TORCH_AND_TENSOR), "pow": (_binary_fn("pow"), _TORCH_AND_TENSOR),
    **{f"logical_{op}": (_logical(op), _TORCH_AND_TENSOR) for op in ("and", "or", "xor", "not")},
    **{pred: (_cmp_fn(pred), _TORCH_AND_TENSOR) for pred in ("eq", "ne", "lt", "le", "gt", "ge")},
    "square": (lambda state, x: lift(x, state) * lift(x, state), _TORCH_AND_TENSOR),
    "relu": (_relu, f"torch Tensor {_F}.relu"),
    "elu": (_elu, f"{_F}.elu"),
    "silu": (_silu, f"{_F}.silu"),
    "gelu": (_gelu, f"{_F}.gelu"),
    "softplus": (_softplus, f"{_F}.softplus"),
    "log_sigmoid": (_logsigmoid, f"{_F}.logsigmoid"),
    **{name: (_method(name), "Tensor") for name in ("to", "float", "bool", "long", "int", "new_ones",
                                                   "new_zeros", "new_full", "new_tensor")},
}

HANDLERS = {name: handler for name, (handler, _) in _TABLE.items()}
# Python's operators on a closure tensor and a symbolic value (`bias_tensor * score`) reach
# __torch_function__ as Tensor's dunders; they are operators, not listed in SUPPORTED.
for _name in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow"):
    HANDLERS[f"__{_name}__"] = (lambda n: lambda state, a, b: lift(a, state)._bin(b, n))(_name)
    HANDLERS[f"__r{_name}__"] = (lambda n: lambda state, a, b: lift(b, state)._bin(a, n))(_name)
for _name in ("and", "or", "xor"):
    HANDLERS[f"__{_name}__"] = (lambda n: lambda state, a, b: lift(a, state)._logic(b, n))(_name)
    HANDLERS[f"__r{_name}__"] = (lambda n: lambda state, a, b: lift(b, state)._logic(a, n))(_name)
for _pred in ("lt", "le", "gt", "ge", "eq", "ne"):
    HANDLERS[f"__{_pred}__"] = _cmp_fn(_pred)
HANDLERS["__getitem__"] = _getitem


def _forms(name: str, forms: str) -> list[str]:
    return [form if "." in form else f"{form}.{name}" for form in forms.split()]


SUPPORTED = tuple(sorted(form for name, (_, forms) in _TABLE.items() for form in _forms(name, forms)))
