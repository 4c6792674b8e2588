"""Turn traced expressions into MLIR region bodies and whole L0 modules (text, generic form)."""
from __future__ import annotations

import functools

from ..core.regions import TextEmitter, float_literal, strip_locations
from .locations import SourceLoc
from .trace import F32, I1, INDEX, Expr

_FLOAT_OPS = {"add": "arith.addf", "sub": "arith.subf", "mul": "arith.mulf", "div": "arith.divf",
              "max": "arith.maximumf", "min": "arith.minimumf", "pow": "math.powf"}
_INT_OPS = {"add": "arith.addi", "sub": "arith.subi", "mul": "arith.muli", "floordiv": "arith.floordivsi",
            "max": "arith.maxsi", "min": "arith.minsi", "and": "arith.andi", "or": "arith.ori",
            "xor": "arith.xori"}
_MATH = {"exp": "math.exp", "exp2": "math.exp2", "log": "math.log", "log2": "math.log2",
         "sqrt": "math.sqrt", "rsqrt": "math.rsqrt", "tanh": "math.tanh", "sin": "math.sin",
         "cos": "math.cos", "floor": "math.floor", "ceil": "math.ceil", "round": "math.roundeven",
         "erf": "math.erf", "log1p": "math.log1p", "expm1": "math.expm1"}
# arith.cmpi / arith.cmpf predicates; unordered-not-equal keeps NaN != x true, as in torch.
_CMPI = {"lt": "slt", "le": "sle", "gt": "sgt", "ge": "sge", "eq": "eq", "ne": "ne"}
_CMPF = {"lt": "olt", "le": "ole", "gt": "ogt", "ge": "oge", "eq": "oeq", "ne": "une"}


def mlir_elt(dtype) -> str:
    """MLIR element type of a torch dtype."""
    import torch

    table = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.float64: "f64",
             torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8",
             torch.bool: "i1"}
    if dtype not in table:
        raise ValueError(f"dtype {dtype} has no MLIR element type here")
    return table[dtype]


def tensor_type(shape, elt: str) -> str:
    """The MLIR tensor type of `shape` (None: a dimension of any size) and element type `elt`."""
    return _tensor_type(tuple(shape), elt)


# Cached: every call writes its module's types anew, and a call's Python path is part of what a
# short CPU kernel call costs.
@functools.lru_cache(maxsize=1024)
def _tensor_type(shape: tuple, elt: str) -> str:
    dims = "x".join("?" if d is None else str(int(d)) for d in shape)
    return f"tensor<{dims}x{elt}>" if dims else f"tensor<{elt}>"


def loc_suffix(loc: SourceLoc | None) -> str:
    """` loc("file":line:col)` to end an op's text with, or nothing for an unknown location."""
    if loc is None:
        return ""
    file = loc.file.replace("\\", "\\\\").replace('"', '\\"')
    return f' loc("{file}":{loc.line}:{loc.col})'



class RegionEmitter(TextEmitter):
    """Emits the body of one region in SSA form; each Expr node is emitted once."""

    def __init__(self, arg_names: list[str], capture_names: list[str], capture_types: list[str], prefix: str,
                 clamp: bool = True):
        super().__init__(prefix)
        self.clamp = clamp
        self.arg_names = arg_names
        self.capture_names = capture_names
        self.capture_types = capture_types
        self.names: dict[int, str] = {}
        self.loc: SourceLoc | None = None  # of the expression whose ops are being written

    def op(self, text: str) -> str:
        return self(text + loc_suffix(self.loc))

    def const(self, value, ty: str) -> str:
        if ty == I1:
            return self.op(f"arith.constant {'true' if value else 'false'}")
        if ty == INDEX:
            return self.op(f"arith.constant {int(value)} : index")
        return self.op(f"arith.constant {float_literal(float(value))} : f32")

    def emit(self, e: Expr) -> str:
        key = id(e)
        if key in self.names:
            return self.names[key]
        for x in e.args:  # operands first, so that every op written below is e's own
            self.emit(x)
        self.loc = e.loc
        name = self._emit(e)
        self.names[key] = name
        return name

    def _emit(self, e: Expr) -> str:
        if e.op == "arg":
            return self.arg_names[e.value]
        if e.op == "const":
            return self.const(e.value, e.type)
        a = [self.emit(x) for x in e.args]
        t = e.type
        if e.op == "cast":
            return self._cast(a[0], e.args[0].type, t)
        if e.op == "trunc":
            i = self.op(f"arith.fptosi {a[0]} : f32 to i64")
            return self.op(f"arith.index_cast {i} : i64 to index")
        if e.op == "extract":
            cap = e.value
            tname = self.capture_names[cap.position]
            ttype = self.capture_types[cap.position]
            elt = ttype[ttype.rindex("x") + 1 : -1] if "x" in ttype else ttype[len("tensor<") : -1]
            if self.clamp:
                a = [self._clamp(i, x, n) for i, x, n in zip(a, e.args, cap.tensor.shape)]
            raw = self.op(f"tensor.extract {tname}[{', '.join(a)}] : {ttype}")
            return self._from_storage(raw, elt, t)
        if e.op == "cmp":
            ty0 = e.args[0].type
            if ty0 == F32:
                return self.op(f"arith.cmpf {_CMPF[e.value]}, {a[0]}, {a[1]} : f32")
            return self.op(f"arith.cmpi {_CMPI[e.value]}, {a[0]}, {a[1]} : {ty0}")
        if e.op == "select":
            return self.op(f"arith.select {a[0]}, {a[1]}, {a[2]} : {t}")
        if e.op == "not":
            true = self.const(True, I1)
            return self.op(f"arith.xori {a[0]}, {true} : i1")
        if e.op == "neg":
            if t == F32:
                return self.op(f"arith.negf {a[0]} : f32")
            zero = self.const(0, INDEX)
            return self.op(f"arith.subi {zero}, {a[0]} : index")
        if e.op == "abs":
            if t == F32:
                return self.op(f"math.absf {a[0]} : f32")
            i = self.op(f"arith.index_cast {a[0]} : index to i64")
            r = self.op(f"math.absi {i} : i64")
            return self.op(f"arith.index_cast {r} : i64 to index")
        if e.op == "sigmoid":
            neg = self.op(f"arith.negf {a[0]} : f32")
            ex = self.op(f"math.exp {neg} : f32")
            one = self.const(1.0, F32)
            den = self.op(f"arith.addf {one}, {ex} : f32")
            return self.op(f"arith.divf {one}, {den} : f32")
        if e.op == "mod":
            # Python's % takes the divisor's sign: fix up C-style remsi where signs differ.
            r = self.op(f"arith.remsi {a[0]}, {a[1]} : index")
            zero = self.const(0, INDEX)
            nz = self.op(f"arith.cmpi ne, {r}, {zero} : index")
            rneg = self.op(f"arith.cmpi slt, {r}, {zero} : index")
            bneg = self.op(f"arith.cmpi slt, {a[1]}, {zero} : index")
            differ = self.op(f"arith.xori {rneg}, {bneg} : i1")
            fix = self.op(f"arith.andi {nz}, {differ} : i1")
            shifted = self.op(f"arith.addi {r}, {a[1]} : index")
            return self.op(f"arith.select {fix}, {shifted}, {r} : index")
        if e.op in _MATH:
            return self.op(f"{_MATH[e.op]} {a[0]} : f32")
        if e.op == "floordiv" and t == F32:
            q = self.op(f"arith.divf {a[0]}, {a[1]} : f32")
            return self.op(f"math.floor {q} : f32")
        table = _FLOAT_OPS if t == F32 else _INT_OPS
        if e.op in table:
            return self.op(f"{table[e.op]} {a[0]}, {a[1]} : {t}")
        raise ValueError(f"cannot emit expression op '{e.op}' of type {t}")

    def _clamp(self, index: str, expr: Expr, size: int) -> str:
        """`index` clamped into [0, size - 1]: closure reads stay inside the tensor on every backend
        (compiled FlexAttention leaves an out-of-range read undefined). A constant in range needs
        no clamp."""
        if expr.op == "const" and 0 <= expr.value < size:
            return index
        low = self.op(f"arith.maxsi {index}, {self.const(0, INDEX)} : index")
        return self.op(f"arith.minsi {low}, {self.const(max(int(size) - 1, 0), INDEX)} : index")

    def _cast(self, v: str, src: str, dst: str) -> str:
        if src == dst:
            return v
        if dst == F32:
            if src == INDEX:
                i = self.op(f"arith.index_cast {v} : index to i64")
                return self.op(f"arith.sitofp {i} : i64 to f32")
            return self.op(f"arith.uitofp {v} : i1 to f32")
        if dst == INDEX:
            if src == I1:
                i = self.op(f"arith.extui {v} : i1 to i64")
                return self.op(f"arith.index_cast {i} : i64 to index")
            i = self.op(f"arith.fptosi {v} : f32 to i64")
            return self.op(f"arith.index_cast {i} : i64 to index")
        zero = self.const(0, src)
        pred = "une, " if src == F32 else "ne, "
        return self.op(f"arith.cmp{'f' if src == F32 else 'i'} {pred}{v}, {zero} : {src}")

    def _from_storage(self, v: str, elt: str, ty: str) -> str:
        if ty == F32:
            if elt == "f32":
                return v
            if elt == "f64":
                return self.op(f"arith.truncf {v} : f64 to f32")
            return self.op(f"arith.extf {v} : {elt} to f32")
        if ty == INDEX:
            return self.op(f"arith.index_cast {v} : {elt} to index")
        return v


def emit_region(root: Expr, arg_decls: list[tuple[str, str]], capture_names: list[str],
                capture_types: list[str], prefix: str, indent: str = "    ", clamp: bool = True) -> str:
    """Return the text of a one-block region `{ ^bb0(args): ... gpu.yield }`.

    `capture_names` are the enclosing function's arguments holding the closure tensors; with
    `clamp`, every index into them is clamped into the tensor's bounds.
    """
    arg_names = [n for n, _ in arg_decls]
    em = RegionEmitter(arg_names, capture_names, capture_types, prefix, clamp)
    result = em.emit(root)
    decls = ", ".join(f"{n}: {t}" for n, t in arg_decls)
    body = "\n".join(f"{indent}  {line}" for line in em.lines)
    lines = [f"{indent}^bb0({decls}):"]
    if body:
        lines.append(body)
    lines.append(f'{indent}  "gpu.yield"({result}) : ({root.type}) -> (){loc_suffix(root.loc)}')
    return "{\n" + "\n".join(lines) + f"\n{indent}}}"
