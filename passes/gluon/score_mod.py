"""Score mods in the Gluon kernels: a score_mod region and its derivative (the region of
attn-differentiate's `attn.score_mod_grad`) become `@gluon.jit` functions, and the backward's
kernels are instantiated with them.

Gluon compiles Python functions, so each region is written as one: a statement per op through
the table below, with the math ops Triton has no lowering of on every target written as
`passes/triton/expansions.py` writes them for the Triton IR kernels (its formulas called on this
module's writer), so both lowerings compute the same values. The function text is registered with
`linecache`, where Gluon's frontend reads a function's source.

A kernel's partitions (`gl.warp_specialize`) take no constexpr arguments, so a function cannot be
passed down to the consumer warpgroups as one: `instantiate` copies the kernel modules' jit
functions with globals that bind `MODDED`, `score_mod` and `score_mod_grad` instead.

What a region may hold: the scalar ops the tracer writes, on f32, i1, i64 and `index` (i32 in the
kernels) values, and constants; index arithmetic whose values stay inside i32 at the module's
shapes (the Triton IR kernels take the rest in 64 bits). A read of a closure tensor
(`tensor.extract`) loads from the kernels' `closures` tuple of pointers (the runtime's `c<i>`
arguments, contiguous), reading 0 out of bounds as the Triton IR kernels do, with no bounds
check where the index is clamped into the tensor (the tracer clamps every index it writes).
"""
from __future__ import annotations

import itertools
import linecache
import math
import types
from typing import NamedTuple

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonJITFunction

from ...core.regions import ScalarOp, ScalarProgram, from_region
from ...core.scalar_eval import ScalarEvalError, constant_value, eval_op
from ..index_bounds import I32, UNKNOWN, IndexBounds
from ..l1_ops import fail
from ..triton.expansions import FAST_TANH_PTX, MathExpansions


@gluon.jit
def divsi(a, b):
    # Triton's // on integers truncates, as arith.divsi does (the emulator binds its own).
    return a // b


@gluon.jit
def remsi(a, b):
    return a % b


@gluon.jit
def remf(a, b):
    # Triton's % on floats is C's fmod, arith.remf's.
    return a % b


_TANH_PTX = gl.constexpr(FAST_TANH_PTX)


@gluon.jit
def approximate_tanh(x):
    return gl.inline_asm_elementwise(_TANH_PTX, "=r,r", [x], dtype=gl.float32, is_pure=True, pack=1)


_DTYPES = {"f32": "gl.float32", "f16": "gl.float16", "bf16": "gl.bfloat16", "i64": "gl.int64",
           "i32": "gl.int32", "i16": "gl.int16", "i8": "gl.int8", "i1": "gl.int1"}
# Triton's names of the closure tensors' element types, for the kernels' signatures.
POINTEE = {"f32": "fp32", "f16": "fp16", "bf16": "bf16", "f64": "fp64", "i64": "i64", "i32": "i32", "i16": "i16",
           "i8": "i8", "i1": "i1"}
_INFIX = {"arith.addf": "+", "arith.addi": "+", "arith.subf": "-", "arith.subi": "-", "arith.mulf": "*",
          "arith.muli": "*", "arith.divf": "/", "arith.andi": "&", "arith.ori": "|", "arith.xori": "^"}
_CALLS = {"math.exp": "gl.exp", "math.exp2": "gl.exp2", "math.log": "gl.log", "math.log2": "gl.log2",
          "math.sqrt": "gl.sqrt", "math.rsqrt": "gl.rsqrt", "math.sin": "gl.sin", "math.cos": "gl.cos",
          "math.floor": "gl.floor", "math.ceil": "gl.ceil", "math.erf": "gl.erf", "math.absf": "gl.abs",
          "math.absi": "gl.abs", "arith.maxsi": "gl.maximum", "arith.minsi": "gl.minimum",
          "arith.divsi": "divsi", "arith.remsi": "remsi", "arith.remf": "remf", "arith.select": "gl.where"}
# arith.maximumf / minimumf propagate NaN; gl.maximum does where asked.
_NAN_CALLS = {"arith.maximumf": "gl.maximum", "arith.minimumf": "gl.minimum"}
_CASTS = ("arith.index_cast", "arith.index_castui", "arith.extsi", "arith.extui", "arith.trunci", "arith.sitofp",
          "arith.uitofp", "arith.fptosi", "arith.fptoui", "arith.extf", "arith.truncf")
_EXPANDED = {"arith.negf": MathExpansions.negf, "arith.floordivsi": MathExpansions.floordivsi,
             "math.tanh": MathExpansions.tanh, "math.log1p": MathExpansions.log1p,
             "math.expm1": MathExpansions.expm1, "math.powf": MathExpansions.powf,
             "math.roundeven": MathExpansions.roundeven}
# Predicates by arith's numbers. Unsigned integer ones compare as signed, as the reference
# evaluator does: the values they meet are positions, never negative.
_CMPI = {0: "==", 1: "!=", 2: "<", 3: "<=", 4: ">", 5: ">=", 6: "<", 7: "<=", 8: ">", 9: ">="}
_CMPI_NAMES = {"eq": 0, "ne": 1, "slt": 2, "sle": 3, "sgt": 4, "sge": 5}
# Triton's float comparisons are the ordered ones, and != the unordered one (NaN != x).
_CMPF = {1: "==", 2: ">", 3: ">=", 4: "<", 5: "<=", 13: "!="}
_CMPF_NAMES = {"oeq": 1, "ogt": 2, "oge": 3, "olt": 4, "ole": 5, "une": 13}


class _Value(NamedTuple):
    name: str
    elt: str
    tile: bool  # derived from the tile argument(s), so of the tile's shape
    value: object = None  # a constant's, as a Python number


class Closure(NamedTuple):
    """A closure tensor the kernels take: its place in their `closures` tuple (c<index>), its
    element type and its static shape (row-major)."""

    index: int
    elt: str
    shape: tuple


def closures_of(types: list, first: int, positions: list | None = None) -> dict:
    """{argument number: Closure} of a function's closure parameters, from `first` on; a
    derivative function's stand for the forward's arguments at `positions` (attn.closure_args),
    the forward's from its fourth on (after q, k, v)."""
    out = {}
    for j, t in enumerate(types[first:]):
        position = positions[j] if positions is not None else first + j
        out[first + j] = Closure(position - 3, str(t.element_type), tuple(t.shape))
    return out


class _Unsupported(Exception):
    def __init__(self, index: int, message: str):
        super().__init__(message)
        self.index = index


class _Writer:
    """Statements of one function body. It offers `op`, `const`, `cmpi`, `cmpf`, `select` and
    `negf` as the Triton IR lowering's builder does, so `MathExpansions`' formulas write here."""

    negf = MathExpansions.negf

    def __init__(self, constants: dict):
        self.lines: list[str] = []
        self.constants = constants  # (literal, elt) -> module-level constexpr name, shared by a module
        self._names = itertools.count()

    def _emit(self, expression: str, elt: str, *operands: _Value) -> _Value:
        name = f"v{next(self._names)}"
        self.lines.append(f"    {name} = {expression}")
        return _Value(name, elt, any(o.tile for o in operands))

    def const(self, value, elt: str) -> _Value:
        if elt == "i1":
            value = bool(value)
            literal = repr(value)
        elif elt in ("f32", "f16", "bf16", "f64"):
            value = float(value)
            if value != value:
                # Triton checks that a global constexpr keeps its value between the compiles of a
                # function, which a NaN never does (NaN != NaN): inf - inf makes it locally.
                infinity = self.const(float("inf"), elt).name
                return _Value(f"({infinity} - {infinity})", elt, False, value)
            literal = f'float("{value!r}")'
        else:
            value = int(value)
            literal = repr(value)
        key = (literal, elt)
        if key not in self.constants:
            self.constants[key] = f"C{len(self.constants)}"
        return _Value(self.constants[key], elt, False, value)

    def _folded(self, name: str, operands: tuple, elt: str, predicate: int | None = None) -> _Value | None:
        """The op's value where its operands are all constants (Gluon's frontend folds some ops on
        Python numbers and not others), as the reference evaluator computes it, rounded to f32."""
        import torch

        if not all(o.value is not None for o in operands):
            return None
        attributes = (("predicate", f"{predicate} : i64"), ) if predicate is not None else ()
        op = ScalarOp(name, tuple(f"c{i}" for i in range(len(operands))), attributes, (elt, ),
                      tuple(o.elt for o in operands))
        args = [torch.tensor(o.value, dtype=torch.bool if o.elt == "i1" else
                             torch.float64 if isinstance(o.value, float) else torch.int64) for o in operands]
        value = eval_op(op, args).item()
        return self.const(torch.tensor(value, dtype=torch.float32).item() if elt == "f32" else value, elt)

    def op(self, name: str, *operands: _Value, elt: str | None = None) -> _Value:
        elt = elt or operands[0].elt
        folded = self._folded(name, operands, elt)
        if folded is not None:
            return folded
        names = [o.name for o in operands]
        if name in _INFIX:
            return self._emit(f"{names[0]} {_INFIX[name]} {names[1]}", elt, *operands)
        if name in _CALLS:
            return self._emit(f"{_CALLS[name]}({', '.join(names)})", elt, *operands)
        if name in _NAN_CALLS:
            return self._emit(f"{_NAN_CALLS[name]}({names[0]}, {names[1]}, propagate_nan=PROPAGATE_ALL)", elt,
                              *operands)
        if name in _CASTS:
            return self._emit(f"{names[0]}.to({_DTYPES[elt]})", elt, *operands)
        if name in _EXPANDED:
            return _EXPANDED[name](self, *operands)
        raise KeyError(name)

    def cmpi(self, predicate, a: _Value, b: _Value) -> _Value:
        predicate = _CMPI_NAMES.get(predicate, predicate)
        folded = self._folded("arith.cmpi", (a, b), "i1", predicate)
        return folded or self._emit(f"{a.name} {_CMPI[predicate]} {b.name}", "i1", a, b)

    def cmpf(self, predicate, a: _Value, b: _Value) -> _Value:
        predicate = _CMPF_NAMES.get(predicate, predicate)
        folded = self._folded("arith.cmpf", (a, b), "i1", predicate)
        return folded or self._emit(f"{a.name} {_CMPF[predicate]} {b.name}", "i1", a, b)

    def select(self, c: _Value, a: _Value, b: _Value) -> _Value:
        return self.op("arith.select", c, a, b, elt=a.elt)

    def approximate_tanh(self, x: _Value) -> _Value:
        return self._folded("math.tanh", (x, ), x.elt) or self._emit(f"approximate_tanh({x.name})", x.elt, x)

    def extract(self, closure: Closure, indices: list, clamped: list) -> _Value:
        """closure[indices...]: a load from its pointer, 0 where an index not `clamped` into its
        dimension is outside it."""
        terms, checks, stride = [], [], 1
        for idx, n, inside in reversed(list(zip(indices, closure.shape, clamped))):
            terms.append(idx.name if stride == 1 else f"{idx.name} * {stride}")
            if not inside:
                checks.append(f"({idx.name} >= 0) & ({idx.name} < {n})")
            stride *= n
        offset = " + ".join(reversed(terms)) or "0"
        zero = "False" if closure.elt == "i1" else "0"
        masked = f", mask={' & '.join(checks)}, other={zero}" if checks else ""
        return self._emit(f"gl.load(closures[{closure.index}] + ({offset}){masked})", closure.elt, *indices)


def _clamped_reads(mod_op) -> dict:
    """{op index: [whether each index is proven inside its dimension]} of the tensor.extract ops
    in `mod_op`'s region, by index_bounds: the clamps the tracer writes prove them; the positions
    stay unbounded, since the kernels' tiles run past the sequences' ends."""
    from mlir import ir

    bounds = IndexBounds()
    found = {}
    for index, op in enumerate(mod_op.regions[0].blocks[0].operations):
        op = op.operation
        if op.name == "tensor.extract":
            shape = ir.RankedTensorType(op.operands[0].type).shape
            found[index] = [bounds.within(v, 0, n - 1) for v, n in zip(list(op.operands)[1:], shape)]
    return found


def _predicate(op) -> int:
    return int(op.attr("predicate").split(":")[0])


def _body(program: ScalarProgram, writer: _Writer, tiles: int, fast_tanh: bool, closures: dict,
          clamped: dict) -> list[_Value]:
    """The program's statements; its first `tiles` arguments are tiles, the others scalars or
    broadcast positions; `closures` the function's closure parameters by argument number,
    `clamped` its reads' indices proven inside them (`_clamped_reads`). Returns the yielded values."""
    values = {f"arg{i}": _Value(f"a{i}", "i32" if t == "index" else t, i < tiles)
              for i, t in enumerate(program.arg_types)}
    tensors = {}
    for i, source in enumerate(program.sources):
        if source[0] == "constant":
            values[f"ext{i}"] = writer.const(constant_value(source[1], source[2]).item(), source[2])
        elif source[0] == "operand" and source[1] in closures:
            tensors[f"ext{i}"] = closures[source[1]]
        else:
            raise _Unsupported(-1, "reads a value from outside the region that is neither a constant nor a "
                                   "closure tensor")
    for index, op in enumerate(program.ops):
        elt = "i32" if op.result_types[0] == "index" else op.result_types[0]
        if op.name == "tensor.extract" and op.operands[0] in tensors:
            closure = tensors[op.operands[0]]
            keys = op.operands[1:]
            if len(keys) != len(closure.shape) or any(key not in values for key in keys):
                raise _Unsupported(index, "reads a closure tensor at indices the Gluon kernels do not take")
            if math.prod(closure.shape) >= 2**31:
                raise _Unsupported(index, "reads a closure tensor of 2^31 elements or more, past the kernels' "
                                          "32-bit offsets")
            values[f"v{index}_0"] = writer.extract(closure, [values[key] for key in keys], clamped[index])
            continue
        if any(key not in values for key in op.operands):
            raise _Unsupported(index, "reads a value the Gluon kernels do not take")
        operands = [values[key] for key in op.operands]
        if op.name == "arith.constant":
            out = writer.const(constant_value(op.attr("value"), op.result_types[0]).item(), elt)
        elif op.name == "arith.cmpi" and _predicate(op) in _CMPI:
            out = writer.cmpi(_predicate(op), *operands)
        elif op.name == "arith.cmpf" and _predicate(op) in _CMPF:
            out = writer.cmpf(_predicate(op), *operands)
        elif op.name == "math.tanh" and fast_tanh and elt == "f32":
            out = writer.approximate_tanh(operands[0])
        else:
            try:
                out = writer.op(op.name, *operands, elt=elt)
            except KeyError:
                raise _Unsupported(index, "is not lowered to Gluon") from None
            except (ScalarEvalError, RuntimeError, ValueError) as error:
                raise _Unsupported(index, f"cannot be folded on its constants ({error})") from None
        values[f"v{index}_0"] = out
    return [values[key] for key in program.results or (program.result,)]


def _decides(program: ScalarProgram) -> bool:
    """Whether a tanh's value flows, through float ops, into a comparison or a float-to-integer
    op: the approximation could flip that decision (the Triton IR lowering's `_reaches_decision`
    keeps the exact formula there)."""
    from ..triton.elementwise import DECISIONS

    users: dict[str, list[int]] = {}
    for index, op in enumerate(program.ops):
        for key in op.operands:
            users.setdefault(key, []).append(index)
    todo = [f"v{index}_0" for index, op in enumerate(program.ops) if op.name == "math.tanh"]
    seen = set()
    while todo:
        for user in users.get(todo.pop(), ()):
            user_op = program.ops[user]
            if user_op.name in DECISIONS:
                return True
            if user_op.result_types[0] in ("f32", "f16", "bf16") and user not in seen:
                seen.add(user)
                todo.append(f"v{user}_0")
    return False


def _function(name: str, program: ScalarProgram, params: int, tiles: int, writer: _Writer, fast_tanh: bool,
              closures: dict, clamped: dict) -> str:
    results = _body(program, writer, tiles, fast_tanh, closures, clamped)
    result = results[0]
    # A value that does not depend on the tile (a constant, a bias of the positions alone) is
    # broadcast to it: the kernel adds it to a tile.
    value = result.name if result.tile else f"{result.name} + gl.zeros_like(a0)"
    args = ", ".join([f"a{i}" for i in range(params)] + ["closures"])
    return "\n".join([f"@gluon.jit\ndef {name}({args}):", *writer.lines, f"    return {value}", ""])


class ScoreMod(NamedTuple):
    """A score_mod and its derivative as Gluon functions: `score_mod(x, b, h, q, kv, closures)` and
    `score_mod_grad(x, g, b, h, q, kv, closures)`, x the scaled score, g the gradient of the
    modified one and `closures` the kernels' tuple of the function's closure tensors (`closures`:
    each one's Closure, in order); `source` is their module's text; `unit_grad` whether the
    derivative hands g back as it is (the mod adds a bias to the score), so that the kernels need
    not apply it."""

    score_mod: object
    score_mod_grad: object
    source: str
    closures: tuple = ()
    unit_grad: bool = False


# By source text: a process compiling the same mod again (autotuning, a new shape) reuses its
# functions, its linecache entry and its kernels' copies.
_GENERATED: dict[str, ScoreMod] = {}
_INSTANCES: dict[str, dict] = {}


def lower_score_mod(mod_op, grad_op, fast_tanh: bool, mod_closures: dict, grad_closures: dict) -> ScoreMod:
    """The attn.score_mod and attn.score_mod_grad ops' regions as Gluon functions, each reading
    its function's closure parameters (`closures_of`); a CompileError located at the first op
    neither can hold."""
    constants: dict = {}
    closures = tuple(sorted(mod_closures.values()))
    # The element types are not in the functions' text, but in the kernels' signatures.
    texts = ["".join(f"# c{c.index}: {c.elt}{list(c.shape)}\n" for c in closures)]
    regions = ((mod_op, "score_mod", 5, 1, mod_closures), (grad_op, "score_mod_grad", 6, 2, grad_closures))
    programs = [from_region(op.regions[0]) for op, *_ in regions]
    # One decision for both functions, so that P and its derivative take the same tanh.
    fast_tanh = fast_tanh and not any(_decides(p) for p in programs)
    for (op, name, params, tiles, reads), program in zip(regions, programs):
        try:
            texts.append(_function(name, program, params, tiles, _Writer(constants), fast_tanh, reads,
                                   _clamped_reads(op)))
        except _Unsupported as error:
            raise _located(op, error) from None
    header = ["from triton.experimental import gluon", "from triton.experimental.gluon import language as gl",
              "from triton.language import PropagateNan",
              "from ae_mlir.passes.gluon.score_mod import approximate_tanh, divsi, remf, remsi",
              "PROPAGATE_ALL = gl.constexpr(PropagateNan.ALL)"]
    header += [f"{name} = gl.constexpr({literal})" for (literal, _), name in constants.items()]
    source = "\n".join(header) + "\n\n\n" + "\n\n".join(texts)
    if source in _GENERATED:
        return _GENERATED[source]
    filename = f"<ae-mlir score_mod {len(_GENERATED)}>"
    # Gluon's frontend reads a jit function's source through inspect, which reads linecache.
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    scope: dict = {"__name__": "ae_mlir.passes.gluon.generated_score_mod"}
    exec(compile(source, filename, "exec"), scope)
    grad = programs[1]
    unit_grad = (grad.results or (grad.result, ))[0] == "arg1"
    _GENERATED[source] = ScoreMod(scope["score_mod"], scope["score_mod_grad"], source, closures, unit_grad)
    return _GENERATED[source]


def check(mod_op, extents: tuple[int, ...], closures: dict) -> None:
    """A CompileError located at the first op of the score_mod region this module does not lower,
    `extents` the sizes of the batch, heads, queries and keys, `closures` the function's closure
    parameters (`closures_of`). Its derivative holds the ops the
    chain rule writes for these (products, selects, cmpf, cos, sin, exp, log, pow and constants),
    all in the table, and recomputes the same index arithmetic; test_gluon_score_mods writes the
    derivative of every entry of the tracer's table."""
    try:
        _body(from_region(mod_op.regions[0]), _Writer({}), 1, False, closures, _clamped_reads(mod_op))
    except _Unsupported as error:
        raise _located(mod_op, error) from None
    _check_index_widths(mod_op, extents)


def _check_index_widths(mod_op, extents: tuple[int, ...]) -> None:
    # The kernels' positions are i32, and so is the arithmetic on them; the reference's is int64.
    # An index op whose exact values can leave i32 at these shapes (q_idx * kv_idx past L = 46341)
    # is an error here, where the Triton IR kernels compute it in 64 bits.
    block = mod_op.regions[0].blocks[0]
    positions = {block.arguments[i + 1]: (0, n - 1) if n > 0 else UNKNOWN for i, n in enumerate(extents)}
    bounds = IndexBounds(bits=64, arguments=positions)
    for op in block.operations:
        for result in op.results:
            if str(result.type) == "index" and bounds.leaves(result, *I32):
                lo, hi = bounds.bounds(result)
                raise fail(op.operation, f"computes an index in [{lo}, {hi}] at these shapes, past the 32-bit "
                                         "positions of attn-lower-to-gluon's kernels (the Triton IR kernels "
                                         "compute it in 64 bits)")


def _located(op, error: _Unsupported):
    """The CompileError of `error`, at the op of `op`'s region it names (or at `op`)."""
    where = op if error.index < 0 else list(op.regions[0].blocks[0].operations)[error.index].operation
    return fail(where, f"{error} (attn-lower-to-gluon's score_mod)")


def closure_pointees(mod: ScoreMod | None) -> tuple:
    """Triton's names of the element types of the closure tensors a score mod's kernels take."""
    return tuple(POINTEE[c.elt] for c in mod.closures) if mod is not None else ()


def applying(fn, mod: ScoreMod | None):
    """A backward kernel's jit function `fn` as it applies `mod`: `fn` where there is none, else its
    copy that binds it (the delta and conversion kernels' copies call nothing of it)."""
    return fn if mod is None else instantiate(mod)[id(fn)]


def instantiate(mod: ScoreMod) -> dict:
    """Copies of the backward kernels' jit functions (both forms'), by the id of the original,
    whose globals bind the score mod: each copy's globals are its own module's, with the other
    copies in place of the originals."""
    from . import attention_backward, attention_backward_fused

    if mod.source in _INSTANCES:
        return _INSTANCES[mod.source]
    modules = (attention_backward, attention_backward_fused)
    bindings = {"MODDED": gl.constexpr(True), "UNIT_GRAD": gl.constexpr(mod.unit_grad), "score_mod": mod.score_mod,
                "score_mod_grad": mod.score_mod_grad}
    scopes = {m.__name__: dict(vars(m), **bindings) for m in modules}
    copies = {}
    for m in modules:
        for value in vars(m).values():
            if isinstance(value, GluonJITFunction) and value.fn.__module__ in scopes and id(value) not in copies:
                fn = value.fn
                copies[id(value)] = gluon.jit(types.FunctionType(fn.__code__, scopes[fn.__module__], fn.__name__,
                                                                 fn.__defaults__, fn.__closure__))
    for scope in scopes.values():
        for name, value in list(scope.items()):
            if id(value) in copies:
                scope[name] = copies[id(value)]
    _INSTANCES[mod.source] = copies
    return copies
