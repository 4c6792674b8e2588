"""Scalar programs: the body of a mod region as a flat list of ops, readable without MLIR.

A `ScalarProgram` records each op's name, operands, attributes and result types once, so a mod
can be evaluated (`core.scalar_eval`: the reference executor, compile-time mask classification),
carried as JSON to classify masks at call time, and asked which arguments it reads.
"""
from __future__ import annotations

import functools
import json
import math
import re
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ScalarOp:
    name: str
    operands: tuple[str, ...]  # keys: "arg<i>" block argument, "ext<i>" outer value, "v<j>_<k>" result
    attributes: tuple[tuple[str, str], ...]
    result_types: tuple[str, ...]
    operand_types: tuple[str, ...]

    def attr(self, key: str) -> str | None:
        for k, v in self.attributes:
            if k == key:
                return v
        return None


@dataclass(frozen=True)
class ScalarProgram:
    arg_types: tuple[str, ...]
    ops: tuple[ScalarOp, ...]
    result: str  # the key of the yielded value
    result_type: str
    # The enclosing function's values the region reads, by "ext<i>"; MLIR values, so they take
    # no part in comparing programs: `sources` says what each one is.
    externals: tuple = field(default=(), compare=False)
    # Per external: ("operand", i) for the function's i-th argument (a closure tensor),
    # ("constant", value attribute, type) for an arith.constant, ("other",) for anything else.
    sources: tuple = ()
    # The keys of every yielded value, `result` first; derivative regions yield several.
    results: tuple[str, ...] = ()

    def uses_arg(self, index: int) -> bool:
        key = f"arg{index}"
        return self.result == key or any(key in op.operands for op in self.ops)

    def to_json(self) -> str:
        """The program as JSON, its outer values as sources; ValueError when one is neither a
        function argument nor a constant (it could not be bound without the MLIR module)."""
        if any(s[0] == "other" for s in self.sources):
            raise ValueError("the program reads an outer value that is neither a function argument nor a constant")
        ops = [{"name": op.name, "operands": list(op.operands), "attributes": [list(a) for a in op.attributes],
                "result_types": list(op.result_types), "operand_types": list(op.operand_types)} for op in self.ops]
        data = {"arg_types": list(self.arg_types), "ops": ops, "result": self.result,
                "result_type": self.result_type, "sources": [list(s) for s in self.sources]}
        if len(self.results) > 1:
            data["results"] = list(self.results)
        return json.dumps(data, separators=(",", ":"), sort_keys=True)

    @staticmethod
    def from_json(text: str) -> "ScalarProgram":
        data = json.loads(text)
        ops = tuple(ScalarOp(op["name"], tuple(op["operands"]), tuple(tuple(a) for a in op["attributes"]),
                             tuple(op["result_types"]), tuple(op["operand_types"])) for op in data["ops"])
        return ScalarProgram(tuple(data["arg_types"]), ops, data["result"], data["result_type"],
                             sources=tuple(tuple(s) for s in data["sources"]),
                             results=tuple(data.get("results", [data["result"]])))


def _source(value) -> tuple:
    owner = value.owner
    operation = getattr(owner, "operation", None)
    if operation is not None:
        if operation.name == "arith.constant":
            return ("constant", str(operation.attributes["value"]), str(value.type))
        return ("other",)
    parent = owner.owner if hasattr(owner, "owner") else None
    if parent is not None and parent.operation.name == "func.func":
        return ("operand", value.arg_number)
    return ("other",)


def from_region(region) -> ScalarProgram | None:
    """Read a one-block mod region ending in gpu.yield; None for an empty region."""
    blocks = list(region.blocks)
    if not blocks:
        return None
    block = blocks[0]
    keys = {}
    for i, arg in enumerate(block.arguments):
        keys[arg] = f"arg{i}"
    ops = []
    externals = []
    result = None
    result_type = None
    for op in block.operations:
        operation = op.operation
        operand_keys = []
        for v in operation.operands:
            if v not in keys:
                keys[v] = f"ext{len(externals)}"
                externals.append(v)
            operand_keys.append(keys[v])
        if operation.name == "gpu.yield":
            results = tuple(operand_keys)
            result = operand_keys[0]
            result_type = str(operation.operands[0].type)
            break
        if len(operation.regions):
            raise ValueError(f"'{operation.name}' with regions is not supported inside mod regions")
        for j, r in enumerate(operation.results):
            keys[r] = f"v{len(ops)}_{j}"
        attrs = tuple((name, str(operation.attributes[name])) for name in operation.attributes)
        ops.append(ScalarOp(operation.name, tuple(operand_keys), attrs,
                            tuple(str(r.type) for r in operation.results),
                            tuple(str(v.type) for v in operation.operands)))
    if result is None:
        raise ValueError("mod region does not end with gpu.yield")
    return ScalarProgram(tuple(str(a.type) for a in block.arguments), tuple(ops), result, result_type,
                         tuple(externals), tuple(_source(v) for v in externals), results)


class TextEmitter:
    """Emits SSA text with fresh names (the frontend writes L0 modules with it)."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.lines: list[str] = []
        self.count = 0

    def fresh(self) -> str:
        self.count += 1
        return f"%{self.prefix}{self.count}"

    def __call__(self, text: str) -> str:
        name = self.fresh()
        self.lines.append(f"{name} = {text}")
        return name

    def raw(self, text: str) -> None:
        self.lines.append(text)

    def results(self, n: int, text: str) -> list[str]:
        name = self.fresh()
        self.lines.append(f"{name}:{n} = {text}")
        return [f"{name}#{i}" for i in range(n)]


def float_literal(v: float) -> str:
    if math.isnan(v):
        return "0x7FC00000"
    if math.isinf(v):
        return "0x7F800000" if v > 0 else "0xFF800000"
    # MLIR's float literal needs a '.' even with an exponent: "1e-05" does not parse, "1.0e-05" does.
    text = repr(float(v))
    if "." not in text:
        text = text.replace("e", ".0e") if "e" in text else text + ".0"
    return text


# The trailing ` loc("file":line:col)` the frontend writes after an op; cache keys drop it so that
# one attention called from two source lines is one kernel.
_LOC_SUFFIX = re.compile(r' loc\("(?:[^"\\]|\\.)*":\d+:\d+\)')


@functools.lru_cache(maxsize=64)
def strip_locations(text: str) -> str:
    """Module text without the file locations written after its ops (cached: each call of an
    attention strips the module it writes, a few kilobytes of text through a regex)."""
    return _LOC_SUFFIX.sub("", text)
