"""Evaluate a `ScalarProgram` on broadcastable torch tensors.

One evaluator serves the reference executor (the oracle), the tile pass (compile-time tile
classification of positional masks) and the runtime (call-time classification of masks that read
closure tensors). It needs only torch, never MLIR, so a prebuilt kernel bundle can classify its
mask from the program it carries as JSON.

Values follow the reference's numerics: integers (index, iN) as int64, floats as float64, i1 as
bool; `tensor.extract` gathers from a closure tensor with bounds checking.
"""
from __future__ import annotations

import struct

from .regions import ScalarOp, ScalarProgram

_INTS = ("index", "i64", "i32", "i16", "i8")
_CMPI = {0: "eq", 1: "ne", 2: "lt", 3: "le", 4: "gt", 5: "ge", 6: "lt", 7: "le", 8: "gt", 9: "ge"}
# arith.cmpf predicates: (comparison, true when either side is NaN)
_CMPF = {1: ("eq", False), 2: ("gt", False), 3: ("ge", False), 4: ("lt", False), 5: ("le", False),
         6: ("ne", False), 8: ("eq", True), 9: ("gt", True), 10: ("ge", True), 11: ("lt", True),
         12: ("le", True), 13: ("ne", True)}
_HEX_FLOAT = {"f16": ("<H", "<e"), "f32": ("<I", "<f"), "f64": ("<Q", "<d")}


class ScalarEvalError(ValueError):
    """An op the evaluator cannot run; `index` is its position in the program's op list so a
    caller holding the MLIR region can point at the op's location."""

    def __init__(self, message: str, index: int):
        super().__init__(message)
        self.index = index


def _torch_tables():
    import torch

    binary = {
        "arith.addf": torch.add, "arith.subf": torch.sub, "arith.mulf": torch.mul, "arith.divf": torch.div,
        "arith.addi": torch.add, "arith.subi": torch.sub, "arith.muli": torch.mul,
        "arith.maximumf": torch.maximum, "arith.minimumf": torch.minimum,
        "arith.maxsi": torch.maximum, "arith.minsi": torch.minimum,
        "arith.andi": torch.bitwise_and, "arith.ori": torch.bitwise_or, "arith.xori": torch.bitwise_xor,
        "arith.remf": torch.fmod, "arith.remsi": torch.fmod, "math.powf": torch.pow,
        "arith.floordivsi": lambda a, b: torch.div(a, b, rounding_mode="floor"),
        "arith.divsi": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    }
    unary = {
        "arith.negf": torch.neg, "math.exp": torch.exp, "math.exp2": torch.exp2, "math.log": torch.log,
        "math.log2": torch.log2, "math.sqrt": torch.sqrt, "math.rsqrt": torch.rsqrt, "math.tanh": torch.tanh,
        "math.absf": torch.abs, "math.absi": torch.abs, "math.sin": torch.sin, "math.cos": torch.cos,
        "math.floor": torch.floor, "math.ceil": torch.ceil, "math.erf": torch.erf, "math.log1p": torch.log1p,
        "math.expm1": torch.expm1, "math.roundeven": torch.round,  # torch.round: half to even
        "arith.index_cast": lambda a: a.to(torch.int64), "arith.index_castui": lambda a: a.to(torch.int64),
        "arith.extsi": lambda a: a.to(torch.int64), "arith.extui": lambda a: a.to(torch.int64),
        "arith.trunci": lambda a: a.to(torch.int64),
        "arith.sitofp": lambda a: a.to(torch.float64), "arith.uitofp": lambda a: a.to(torch.float64),
        "arith.extf": lambda a: a.to(torch.float64), "arith.truncf": lambda a: a.to(torch.float64),
        "arith.fptosi": lambda a: torch.trunc(a).to(torch.int64),
    }
    cmp = {"eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge}
    return binary, unary, cmp


_TABLES = None


def _tables():
    global _TABLES
    if _TABLES is None:
        _TABLES = _torch_tables()
    return _TABLES


def constant_value(text: str, ty: str, device=None):
    """A 0-d tensor for an `arith.constant` value attribute printed as `text` ("3 : index",
    "5.000000e-01 : f32", "0x7F800000 : f32", "true")."""
    import torch

    literal = text.rsplit(" : ", 1)[0].strip()
    if ty == "i1":
        return torch.tensor(literal in ("true", "1", "-1"), device=device)
    if ty in _INTS:
        return torch.tensor(int(literal, 0), dtype=torch.int64, device=device)
    if literal.lower().startswith("0x"):
        bits, fmt = _HEX_FLOAT.get(ty, (None, None))
        if ty == "bf16":
            value = struct.unpack("<f", struct.pack("<I", int(literal, 16) << 16))[0]
        elif bits is None:
            raise ValueError(f"hexadecimal constant of type {ty} is not supported")
        else:
            value = struct.unpack(fmt, struct.pack(bits, int(literal, 16)))[0]
    else:
        value = float(literal)
    return torch.tensor(value, dtype=torch.float64, device=device)


def _predicate(op: ScalarOp) -> int:
    return int(op.attr("predicate").split(":")[0])


def _cmpf(pred: int, a, b, cmp):
    import torch

    if pred in (0, 15):
        return torch.full(torch.broadcast_shapes(a.shape, b.shape), pred == 15, device=a.device)
    nan = torch.isnan(a) | torch.isnan(b)
    if pred in (7, 14):
        return ~nan if pred == 7 else nan
    name, unordered_true = _CMPF[pred]
    result = cmp[name](a, b)
    return (result | nan) if unordered_true else (result & ~nan)


def _extract(args, index: int, checked: bool = True):
    import torch

    tensor, idx = args[0], args[1:]
    if not idx:
        return tensor
    for axis, (i, size) in enumerate(zip(idx, tensor.shape)):
        if checked and bool(((i < 0) | (i >= size)).any()):
            raise ScalarEvalError(f"index out of bounds on axis {axis} of a closure tensor of shape "
                                  f"{tuple(tensor.shape)}", index)
    grid = torch.broadcast_tensors(*[i.to(tensor.device) for i in idx])
    value = tensor[tuple(grid)]
    return value.to(torch.float64) if value.dtype.is_floating_point else value


def supported_ops() -> frozenset:
    binary, unary, _ = _tables()
    return frozenset(binary) | frozenset(unary) | {"arith.constant", "arith.cmpi", "arith.cmpf", "arith.select",
                                                   "tensor.extract"}


def eval_op(op: ScalarOp, args: list, index: int = 0, device=None, checked: bool = True):
    """Evaluate one op on broadcastable tensors (int64 / float64 / bool); a closure read checks
    its indices against the tensor's bounds unless not `checked`."""
    import torch

    binary, unary, cmp = _tables()
    name = op.name
    if name == "arith.constant":
        return constant_value(op.attr("value"), op.result_types[0], device)
    if name in binary:
        return binary[name](args[0], args[1])
    if name in unary:
        return unary[name](args[0])
    if name == "arith.cmpi":
        return cmp[_CMPI[_predicate(op)]](args[0], args[1])
    if name == "arith.cmpf":
        return _cmpf(_predicate(op), args[0], args[1], cmp)
    if name == "arith.select":
        return torch.where(args[0], args[1], args[2])
    if name == "tensor.extract":
        return _extract(args, index, checked)
    raise ScalarEvalError("is not supported inside mod regions", index)


def _environment(program: ScalarProgram, args: list, externals: list, device, in_bounds=frozenset()) -> dict:
    env = {f"arg{i}": a for i, a in enumerate(args)}
    env.update({f"ext{i}": e for i, e in enumerate(externals)})
    for i, op in enumerate(program.ops):
        env[f"v{i}_0"] = eval_op(op, [env[k] for k in op.operands], i, device, i not in in_bounds)
    return env


def evaluate(program: ScalarProgram, args: list, externals: list = (), device=None, in_bounds=frozenset()):
    """The program's result on `args` (its block arguments) and `externals` (the tensors bound to
    "ext<i>", see `bind_externals`); constants are created on `device`. The closure reads at the
    op positions `in_bounds` skip their bounds checks (`interval_eval.gathers_in_bounds`)."""
    return _environment(program, args, externals, device, in_bounds)[program.result]


def evaluate_all(program: ScalarProgram, args: list, externals: list = (), device=None) -> list:
    """Every value the program yields, in order (derivative regions yield several)."""
    env = _environment(program, args, externals, device)
    return [env[key] for key in program.results or (program.result,)]


def bind_externals(program: ScalarProgram, operands: list, device=None) -> list:
    """The tensors a program's outer values stand for, from its `sources`: a kernel operand
    (a closure tensor, by position; moved to `device` when given) or a constant."""
    values = []
    for source in program.sources:
        if source[0] == "operand":
            operand = operands[source[1]]
            values.append(operand if device is None else operand.to(device))
        elif source[0] == "constant":
            values.append(constant_value(source[1], source[2], device))
        else:
            raise ValueError("the program reads an outer value that is neither a kernel operand nor a constant")
    return values
