"""`attn-lower-to-triton`: an L1 kernel function becomes a Triton IR kernel (`tt.func`, level L2).

The L1 function (from `attn-tile`, or `attn-chunk-recurrence` for linear attention) is rewritten
op by op into tt/arith/math/scf ops on tensors:

* Each tensor argument becomes a `!tt.ptr<elt>` plus its strides; the program coordinates come
  from `tt.get_program_id`, with the query block on axis x (fastest, so the programs that share
  K/V run together) walked from the last block down (causal rows are longest at the end, so the
  longest programs start first). The launch grid is `attn.grid` on the tt.func, in x, y, z order.
* A tile load (`tensor.extract_slice` [+ `tensor.pad`]) is one `tt.load` over a pointer tensor
  built from `tt.make_range`/`tt.expand_dims`/`tt.broadcast`/`tt.addptr`, masked where the slice is
  ragged and filled with zeros. Tile dimensions that are not powers of two (head dims like 80) are
  padded to the next power of two (at least 16, what `tt.dot` needs) and masked, so inputs are
  never copied. `tensor.insert_slice` into a destination argument is a masked `tt.store`.
* `linalg.matmul` is `tt.dot` (f32 accumulator), `linalg.transpose` is `tt.trans`, `linalg.fill` a
  `tt.splat`, `linalg.reduce` a `tt.reduce` (then combined with its init), and `linalg.generic` is
  its body applied to whole tensors: a value that depends only on rows stays [M, 1], only on
  columns [1, N], and is broadcast where it meets a full tile, so `doc[q_idx]` gathers M values,
  not M*N. `linalg.index` is a `tt.make_range`; `tensor.extract` from a closure tensor is a masked
  gather `tt.load` (an out-of-range index reads 0). Math ops Triton cannot lower on both targets
  (negf, tanh, log1p, expm1, powf, floordivsi) are expanded into ones it can. A generic with
  reduction iterators whose body ends in `out + value` (a contraction that is not a matmul) is
  computed over its whole iteration domain and then `tt.reduce`d.
* `scf.for` stays `scf.for` with an i32 induction variable; `index` values become i32 (positions
  and their arithmetic in mods are 32-bit on the GPU). A destination threaded through a loop and
  stored inside it is memory, not an iter_arg.
* The block tables (`arith.constant` tensors indexed by the query block) are folded into
  arithmetic where they are affine in the block id (causal masks, unmasked attention), otherwise
  they become extra `!tt.ptr<i32>` arguments read with scalar loads; their contents are in
  `attn.tables` on the tt.func.

`assume-aligned` (default) specializes for the common layout of q/k/v/out/lse: unit stride in the
last dimension (no argument for it), 16-byte aligned base pointers and q/k/v/out strides that are
multiples of 16 elements (`tt.divisibility` hints, which vectorized loads need), i32 strides and
32-bit offsets inside a tile; the offset of a tile's origin is always computed in i64. Without
it every stride is an i64 argument and every offset 64-bit, for any layout. The runtime checks a
call against the aligned variant's assumptions and falls back to the general one.

`attn.kernel_args` on the tt.func names each kernel argument (`q`, `q.stride0`, ..., `c0`,
`out`, `lse`, `table0`), from the L1 function's `attn.arg_roles` where it has them (`w0`,
`state`, ...); `attn.block_m`/`attn.block_n` are kept. A module of several kernels (the split
chunked recurrence) keeps them in order, the order they run in. Inside ae-mlir the kernel body
and reduce combiners end with `gpu.yield` (IRDL cannot declare terminators, see
dialects/tt.irdl.mlir); `triton_text` prints the module as Triton parses it.
"""
from __future__ import annotations

import contextlib
import math
import re
from dataclasses import dataclass, replace
from typing import ClassVar, Literal

from ..core.context import CompileError, Diagnostic, location_parts, parse_module
from ..core.regions import float_literal
from . import ModulePass, option

MIN_DIM = 16
# The arguments the aligned variant specializes (workspaces "w<i>" too): the attention operands and
# outputs, which the caller or the runtime lays out.
STREAMS = ("q", "k", "v", "out", "lse", "state")
_DYNAMIC = -(1 << 63)
_PRECISION = {"tf32": 0, "tf32x3": 1, "ieee": 2}
_LOG2E = 1.4426950408889634
_CMPI = {"eq": 0, "ne": 1, "slt": 2, "sle": 3, "sgt": 4, "sge": 5}
_CMPF = {"oeq": 1, "ogt": 2, "oge": 3, "olt": 4, "ole": 5, "une": 13}
# Ops copied as they are (operands broadcast to a common shape); everything else has a rule below.
_ELEMENTWISE = re.compile(r"(arith|math)\.\w+")
_CASTS = ("arith.index_cast", "arith.index_castui")
# Associative, commutative ops a contraction may accumulate with.
_COMBINERS = ("arith.addf", "arith.mulf", "arith.maximumf", "arith.minimumf", "arith.addi", "arith.maxsi",
              "arith.minsi")


def _fail(op, message: str) -> CompileError:
    filename, line, col = location_parts(op.location)
    return CompileError(message, [Diagnostic("error", f"'{op.name}' op {message}", filename, line, col)])


def _pad(n: int) -> int:
    return max(MIN_DIM, 1 << (n - 1).bit_length())


def _ty(shape: tuple, elt: str) -> str:
    return f"tensor<{'x'.join(map(str, shape))}x{elt}>" if shape else elt


def _elt(mlir_type) -> str:
    text = str(getattr(mlir_type, "element_type", mlir_type))
    return "i32" if text == "index" else text


def _width(elt: str) -> int:
    return 1 if elt == "i1" else int(elt[1:])


def _float(elt: str) -> bool:
    return elt in ("f16", "bf16", "f32", "f64")


def triton_text(module, kernel=None) -> str:
    """The module as Triton parses it: generic form, kernel and combiner terminators renamed.
    With `kernel` (one of its tt.func ops), a module holding only that kernel: Triton compiles
    one kernel per module."""
    from mlir import ir

    op = getattr(module, "operation", module)
    kernels = [k for k in op.regions[0].blocks[0].operations if k.operation.name == "tt.func"]
    if not kernels:
        raise CompileError("the module holds no tt.func kernel; run attn-lower-to-triton first")
    if kernel is not None:
        with op.context, op.location:
            single = ir.Module.create()
            kernel.clone(ip=ir.InsertionPoint(single.body))
        op = single.operation
    text = op.get_asm(print_generic_op_form=True)
    text = text.replace('"gpu.yield"() : () -> ()', '"tt.return"() : () -> ()')
    return text.replace('"gpu.yield"(', '"tt.reduce.return"(')


@dataclass(frozen=True)
class _V:
    """A lowered value: SSA name, shape (() for scalars; 1 for a dimension not yet broadcast),
    element type; for tiles the L1 shape, and whether padding past it holds zeros."""

    name: str
    shape: tuple
    elt: str
    logical: tuple | None = None
    zero_pad: bool = False
    const: bool = False

    @property
    def type(self) -> str:
        return _ty(self.shape, self.elt)


@dataclass
class _Arg:
    label: str
    shape: tuple
    elt: str
    ptr: _V
    strides: list  # per dimension: a scalar _V, or the int 1 when the layout fixes it
    offset_elt: str = "i64"  # integer type of offsets inside a tile
    bool_bytes: bool = False


@dataclass
class _Slice:
    """A slice of a tensor argument whose size is dynamic: loaded by the tensor.pad that follows."""

    arg: _Arg
    offsets: list
    sizes: list


@dataclass
class _Table:
    values: object  # numpy int64 array
    attr: str
    param: _V | None = None


class _Empty:
    """A tensor.empty: only ever the `outs` of a linalg op, never read."""


@dataclass
class _Dest:
    arg: _Arg


class _Emitter:
    def __init__(self):
        self.count = 0
        self.lines: list[str] = []
        self.prologue: list[str] = []

    def fresh(self, hint: str = "v") -> str:
        self.count += 1
        return f"%{hint}{self.count}"

    def __call__(self, text: str, hoist: bool = False) -> str:
        name = self.fresh()
        (self.prologue if hoist else self.lines).append(f"{name} = {text}")
        return name

    def raw(self, text: str) -> None:
        self.lines.append(text)

    @contextlib.contextmanager
    def capture(self):
        saved, self.lines = self.lines, []
        try:
            yield self.lines
        finally:
            self.lines = saved


class _Kernel:
    def __init__(self, func, aligned: bool, precision: str):
        self.func = func
        self.aligned = aligned
        self.precision = _PRECISION[precision]
        self.em = _Emitter()
        self.values: dict = {}
        self.params: list[tuple[str, str, str, str]] = []  # name, type, arg attrs, label
        self.tables: list[_Table] = []
        self.cache: dict = {}
        self.generic_shape: tuple | None = None
        self.dest_of: dict[str, _Dest] = {}
        self.grid = [int(x) for x in func.attributes["attn.grid"]]

    # --- values ----------------------------------------------------------------------------
    def get(self, value, user):
        if value not in self.values:
            raise _fail(user, "reads a value the Triton lowering has not seen (unsupported L1 structure)")
        return self.values[value]

    def scalar(self, value, user) -> _V:
        v = self.get(value, user)
        if not isinstance(v, _V) or v.shape:
            raise _fail(user, "expects a scalar operand here")
        return v

    def tile(self, value, user) -> _V:
        v = self.get(value, user)
        if isinstance(v, _V) and v.shape:
            return self.full(v)
        what = {_Slice: "a dynamically sized slice (tensor.pad it to a static tile first)",
                _Empty: "an uninitialized tensor.empty", _Table: "a constant table", _Arg: "a whole argument",
                _Dest: "a destination"}.get(type(v), "a scalar")
        raise _fail(user, f"expects a tile operand, got {what}")

    def full(self, v: _V) -> _V:
        """A tile with every dimension materialized (a generic's lazy [M, 1] included)."""
        if v.logical is None or len(v.logical) != len(v.shape):
            return v
        return self.to_shape(v, tuple(_pad(n) for n in v.logical))

    # --- emission helpers ------------------------------------------------------------------
    def const(self, value, elt: str, shape: tuple = ()) -> _V:
        key = ("const", repr(value), elt, shape)
        if key not in self.cache:
            if isinstance(value, bool) or elt == "i1":
                lit = "true" if value else "false"
            elif _float(elt):
                # Strings are MLIR spellings already (as MLIR printed them, or "-0.0"), except the
                # names "inf" and "nan" used by the expansions.
                lit = value if isinstance(value, str) and value not in ("inf", "nan") else float_literal(float(value))
            else:
                lit = str(int(value))
            if shape:
                text = f"arith.constant dense<{lit}> : {_ty(shape, elt)}"
            elif elt == "i1":
                text = f"arith.constant {lit}"  # a bool constant's custom form has no type
            else:
                text = f"arith.constant {lit} : {elt}"
            self.cache[key] = _V(self.em(text, hoist=True), shape, elt, const=True)
        return self.cache[key]

    def generic(self, name: str, operands: list[_V], shape: tuple, elt: str, attrs: str = "") -> _V:
        types = ", ".join(o.type for o in operands)
        attr = f" {{{attrs}}}" if attrs else ""
        hoist = bool(operands) and all(o.const for o in operands)
        text = f'"{name}"({", ".join(o.name for o in operands)}){attr} : ({types}) -> {_ty(shape, elt)}'
        if hoist:
            key = ("op", text)
            if key not in self.cache:
                self.cache[key] = _V(self.em(text, hoist=True), shape, elt, const=True)
            return self.cache[key]
        return _V(self.em(text), shape, elt)

    def join(self, operands: list[_V]) -> tuple:
        shapes = [o.shape for o in operands if o.shape]
        if not shapes:
            return ()
        rank = len(shapes[0])
        if any(len(s) != rank for s in shapes):
            raise CompileError(f"cannot combine values of shapes {shapes} (internal rank mismatch)")
        return tuple(max(s[i] for s in shapes) for i in range(rank))

    def to_shape(self, v: _V, shape: tuple) -> _V:
        if v.shape == shape:
            return v
        if not v.shape:
            return replace(self.generic("tt.splat", [v], shape, v.elt), logical=None)
        if len(v.shape) != len(shape) or any(a not in (1, b) for a, b in zip(v.shape, shape)):
            raise CompileError(f"cannot broadcast {v.type} to shape {shape}")
        out = self.generic("tt.broadcast", [v], shape, v.elt)
        return replace(out, logical=v.logical if v.logical and len(v.logical) == len(shape) else None)

    def expand(self, v: _V, axis: int) -> _V:
        shape = v.shape[:axis] + (1,) + v.shape[axis:]
        return self.generic("tt.expand_dims", [v], shape, v.elt, f"axis = {axis} : i32")

    def op(self, name: str, *operands: _V, elt: str | None = None, attrs: str = "") -> _V:
        shape = self.join(list(operands))
        ops = [self.to_shape(o, shape) for o in operands]
        return self.generic(name, ops, shape, elt or operands[0].elt, attrs)

    def cmpi(self, pred: str, a: _V, b: _V) -> _V:
        return self.op("arith.cmpi", a, b, elt="i1", attrs=f"predicate = {_CMPI[pred]} : i64")

    def cmpf(self, pred: str, a: _V, b: _V) -> _V:
        return self.op("arith.cmpf", a, b, elt="i1", attrs=f"predicate = {_CMPF[pred]} : i64")

    def select(self, c: _V, a: _V, b: _V) -> _V:
        return self.op("arith.select", c, a, b, elt=a.elt)

    def cast_int(self, v: _V, elt: str, signed: bool = True) -> _V:
        if v.elt == elt:
            return v
        if _width(elt) > _width(v.elt):
            return self.generic("arith.extsi" if signed else "arith.extui", [v], v.shape, elt)
        return self.generic("arith.trunci", [v], v.shape, elt)

    def neutral_beyond(self, v: _V, axis: int, extent: int, combine: str, op) -> _V:
        """v with the lanes of `axis` from `extent` on (padding) set to the identity of the
        reduction `combine`, so reducing the padded tile reduces the logical one."""
        identity = {"arith.addf": 0.0, "arith.addi": 0, "arith.mulf": 1.0, "arith.maximumf": "-inf",
                    "arith.minimumf": "inf"}.get(combine)
        if identity is None:
            raise _fail(op, f"reduces a dimension of size {extent}, padded to {v.shape[axis]}, with '{combine}', "
                            "which has no identity the lowering knows")
        inside = self.cmpi("slt", self.arange(v.shape[axis], axis, len(v.shape)), self.const(extent, "i32"))
        if identity in ("-inf", "inf"):
            fill = self.const(float(identity), v.elt, v.shape)
        else:
            fill = self.const(identity, v.elt, v.shape)
        return replace(self.select(self.to_shape(inside, v.shape), v, fill), logical=v.logical)

    def zero_beyond(self, v: _V, axis: int) -> _V:
        """The 2-D tile v with the padding lanes of `axis` (past its logical extent) set to 0."""
        inside = self.cmpi("slt", self.arange(v.shape[axis], axis, 2), self.const(v.logical[axis], "i32"))
        zero = self.const(0.0, v.elt, v.shape)
        return replace(self.select(self.to_shape(inside, v.shape), v, zero), logical=v.logical, zero_pad=True)

    def arange(self, size: int, axis: int, rank: int) -> _V:
        """[0, size) along `axis` of a rank-`rank` tensor whose other dimensions are 1."""
        v = self.make_range(size)
        for i in range(rank):
            if i != axis:
                v = self.expand(v, i)
        return v

    def make_range(self, size: int) -> _V:
        key = ("range", size)
        if key not in self.cache:
            text = f'"tt.make_range"() {{start = 0 : i32, end = {size} : i32}} : () -> tensor<{size}xi32>'
            self.cache[key] = _V(self.em(text, hoist=True), (size,), "i32", const=True)
        return self.cache[key]

    def load(self, ptrs: _V, mask: _V | None, elt: str) -> _V:
        shape = ptrs.shape
        operands = [ptrs]
        if mask is not None:
            operands += [self.to_shape(mask, shape), self.const(0, elt, shape)]
        seg = "1, 1, 1" if mask is not None else "1, 0, 0"
        attrs = f"cache = 1 : i32, evict = 1 : i32, isVolatile = false, operandSegmentSizes = array<i32: {seg}>"
        types = ", ".join(o.type for o in operands)
        name = self.em(f'"tt.load"({", ".join(o.name for o in operands)}) {{{attrs}}} : ({types}) -> {_ty(shape, elt)}')
        return _V(name, shape, elt)

    def store(self, ptrs: _V, value: _V, mask: _V | None) -> None:
        operands = [ptrs, value] + ([self.to_shape(mask, ptrs.shape)] if mask is not None else [])
        types = ", ".join(o.type for o in operands)
        self.em.raw(f'"tt.store"({", ".join(o.name for o in operands)}) {{cache = 1 : i32, evict = 1 : i32}} '
                    f": ({types}) -> ()")

    def addptr(self, ptr: _V, offset: _V) -> _V:
        if offset.shape and not ptr.shape:
            ptr = self.to_shape(ptr, offset.shape)
        return self.generic("tt.addptr", [ptr, self.to_shape(offset, ptr.shape)], ptr.shape, ptr.elt)

    # --- arguments -------------------------------------------------------------------------
    def add_param(self, hint: str, ty: str, label: str, attrs: str = "") -> _V:
        name = f"%{hint}"
        self.params.append((name, ty, attrs, label))
        return _V(name, (), ty)

    def setup_args(self):
        from mlir import ir

        args = list(self.func.regions[0].blocks[0].arguments)
        n_out = len(self.func.attributes["function_type"].value.results)
        n_cap = len(args) - 3 - n_out
        if n_cap < 0:
            raise _fail(self.func, "is not an L1 kernel: it needs q, k, v, captures and destination arguments")
        labels = ["q", "k", "v"] + [f"c{i}" for i in range(n_cap)] + ["out", "lse"][:n_out]
        if "attn.arg_roles" in self.func.attributes:
            labels = [ir.StringAttr(r).value for r in self.func.attributes["attn.arg_roles"]]
            if len(labels) != len(args):
                raise _fail(self.func, f"names {len(labels)} argument roles for {len(args)} arguments")
        for i, (arg, label) in enumerate(zip(args, labels)):
            ty = arg.type
            if not hasattr(ty, "shape") or not ty.has_static_shape:
                raise _fail(self.func, f"argument {i} ({label}) must be a statically shaped tensor, got {ty}")
            shape = tuple(ty.shape)
            elt = _elt(ty)
            stream = label in STREAMS or label.startswith("w")
            aligned = self.aligned and stream
            stored = "i8" if elt == "i1" else elt
            ptr_attrs = "tt.divisibility = 16 : i32" if aligned else ""
            ptr = self.add_param(label, f"!tt.ptr<{stored}>", label, ptr_attrs)
            strides = []
            for d in range(len(shape)):
                if aligned and d == len(shape) - 1:
                    strides.append(1)
                    continue
                hint = "tt.divisibility = 16 : i32" if aligned and label != "lse" else ""
                strides.append(self.add_param(f"{label}_stride{d}", "i32" if aligned else "i64",
                                              f"{label}.stride{d}", hint))
            self.values[arg] = _Arg(label, shape, stored, ptr, strides, "i32" if aligned else "i64", elt == "i1")
        self.dests = args[len(args) - n_out:]
        self.dest_labels = labels[len(args) - n_out:]

    def table_param(self, table: _Table) -> _V:
        if table.param is None:
            j = len(self.tables)
            table.param = self.add_param(f"table{j}", "!tt.ptr<i32>", f"table{j}")
            self.tables.append(table)
        return table.param

    # --- memory ----------------------------------------------------------------------------
    def origin(self, arg: _Arg, offsets: list) -> _V:
        """Scalar pointer to arg[offsets...]; the offset is computed in i64."""
        total = None
        for d, o in enumerate(offsets):
            if isinstance(o, int) and o == 0:
                continue
            o64 = self.const(o, "i64") if isinstance(o, int) else self.cast_int(o, "i64")
            stride = arg.strides[d]
            term = o64 if stride == 1 else self.op("arith.muli", o64, self.cast_int(stride, "i64"))
            total = term if total is None else self.op("arith.addi", total, term)
        return arg.ptr if total is None else self.addptr(arg.ptr, total)

    def tile_pointers(self, arg: _Arg, origin: _V, padded: tuple, extents: list):
        """Pointers to a tile over the last len(padded) dims of `arg`, with the mask of lanes
        inside `extents` (ints or scalar _V per tile dimension)."""
        rank, t = len(arg.shape), len(padded)
        offs, mask = None, None
        off_elt = arg.offset_elt
        for k in range(t):
            r = self.arange(padded[k], k, t)
            stride = arg.strides[rank - t + k]
            term = self.cast_int(r, off_elt)
            if stride != 1:
                term = self.op("arith.muli", term, self.cast_int(stride, off_elt))
            offs = term if offs is None else self.op("arith.addi", offs, term)
            ext = extents[k]
            if isinstance(ext, int) and ext >= padded[k]:
                continue
            bound = self.const(ext, "i32") if isinstance(ext, int) else ext
            inside = self.cmpi("slt", r, bound)
            mask = inside if mask is None else self.op("arith.andi", mask, inside)
        offs = self.to_shape(offs, padded)
        return self.addptr(self.to_shape(origin, padded), offs), mask

    def load_slice(self, sl: _Slice, shape: tuple, user) -> _V:
        arg, rank, t = sl.arg, len(sl.arg.shape), len(shape)
        if t == 0 or t > 2:
            raise _fail(user, f"loads tiles of rank 1 or 2 only, not {t}")
        lead = sl.sizes[: rank - t]
        if any(s != 1 for s in lead):
            raise _fail(user, "must slice a tile out of the trailing dimensions (leading sizes must be 1)")
        padded = tuple(_pad(n) for n in shape)
        extents = [s if isinstance(s, _V) else min(s, n) for s, n in zip(sl.sizes[rank - t:], shape)]
        ptrs, mask = self.tile_pointers(arg, self.origin(arg, sl.offsets), padded, extents)
        value = self.load(ptrs, mask, arg.elt)
        return replace(value, logical=shape, zero_pad=True)

    def gather(self, arg: _Arg, indices: list[_V], user) -> _V:
        """arg[indices...] for index values of any (lazily broadcast) shape; out of range reads 0."""
        if len(indices) != len(arg.shape):
            raise _fail(user, f"indexes a rank-{len(arg.shape)} tensor with {len(indices)} indices")
        offset, mask = None, None
        for d, idx in enumerate(indices):
            i64 = self.cast_int(idx, "i64")
            stride = arg.strides[d]
            term = i64 if stride == 1 else self.op("arith.muli", i64, self.cast_int(stride, "i64"))
            offset = term if offset is None else self.op("arith.addi", offset, term)
            ok = self.op("arith.andi", self.cmpi("sge", idx, self.const(0, idx.elt)),
                         self.cmpi("slt", idx, self.const(arg.shape[d], idx.elt)))
            mask = ok if mask is None else self.op("arith.andi", mask, ok)
        if offset is None:
            # A 0-d closure tensor (e.g. `bias[0]` taken in Python) is one scalar at offset 0.
            offset, mask = self.const(0, "i64"), self.const(1, "i1")
        shape = self.join([offset, mask])
        value = self.load(self.addptr(self.to_shape(arg.ptr, shape), offset), mask, arg.elt)
        if arg.bool_bytes:
            value = self.cmpi("ne", value, self.const(0, "i8"))
        return value

    # --- block tables ------------------------------------------------------------------------
    def table_lookup(self, table: _Table, index_values: list, op) -> _V:
        import numpy as np

        vals = table.values
        idx = [self.scalar(v, op) for v in index_values]
        consts = [_constant_int(v) for v in index_values]
        if vals.ndim == 1:
            fit = _affine(vals, np.ones(len(vals), bool))
            if fit is not None:
                return self.affine(idx[0], *fit)
        elif vals.ndim == 2 and consts[1] is not None:
            fit = _affine(vals[:, consts[1]], np.ones(vals.shape[0], bool))
            if fit is not None:
                return self.affine(idx[0], *fit)
        elif vals.ndim == 2:
            counts = _loop_counts(index_values[1], index_values[0], vals.shape[0])
            if counts is not None and counts.shape[0] == vals.shape[0]:
                width = vals.shape[1]
                live = counts > 0
                starts = vals[:, 0]
                steps_ok = all(
                    (vals[m, : min(counts[m], width)] == starts[m] + np.arange(min(counts[m], width))).all()
                    for m in range(vals.shape[0]) if live[m])
                fit = _affine(starts, live) if steps_ok else None
                if fit is not None:
                    start = self.affine(idx[0], *fit)
                    return idx[1] if fit == (0, 0) else self.op("arith.addi", start, idx[1])
        ptr = self.table_param(table)
        linear, stride = None, 1
        for d in reversed(range(vals.ndim)):
            term = idx[d] if stride == 1 else self.op("arith.muli", idx[d], self.const(stride, "i32"))
            linear = term if linear is None else self.op("arith.addi", linear, term)
            stride *= vals.shape[d]
        return self.load(self.addptr(ptr, linear), None, "i32")

    def affine(self, x: _V, a: int, b: int) -> _V:
        if a == 0:
            return self.const(b, "i32")
        v = x if a == 1 else self.op("arith.muli", x, self.const(a, "i32"))
        return v if b == 0 else self.op("arith.addi", v, self.const(b, "i32"))

    # --- ops -------------------------------------------------------------------------------
    def lower_block(self, block):
        """Lower every op of `block` but its terminator, which is returned."""
        ops = [o.operation for o in block.operations]
        for op in ops[:-1]:
            self.lower_op(op)
        return ops[-1]

    def lower_op(self, op) -> None:
        name = op.name
        handler = _HANDLERS.get(name)
        if handler is not None:
            handler(self, op)
        elif _ELEMENTWISE.fullmatch(name):
            self.elementwise(op)
        else:
            raise _fail(op, "is not supported by the Triton lowering (expected L1 from attn-tile or "
                            "attn-chunk-recurrence)")

    def constant(self, op) -> None:
        from mlir import ir

        attr = op.attributes["value"]
        result = op.results[0]
        if isinstance(attr, ir.DenseElementsAttr):
            if isinstance(attr, ir.DenseIntElementsAttr) and not attr.is_splat:
                import numpy as np

                self.values[result] = _Table(np.array(attr).astype(np.int64), str(attr))
                return
            if not attr.is_splat:
                raise _fail(op, "non-splat float tensor constants are not supported by the Triton lowering")
            shape = tuple(result.type.shape)
            scalar = _scalar_literal(attr.get_splat_value())
            if isinstance(attr, ir.DenseIntElementsAttr) and len(shape) <= 2:
                import numpy as np

                self.values[result] = _Table(np.full(shape, int(scalar), np.int64), str(attr))
                return
            v = self.const(scalar, _elt(result.type), tuple(_pad(n) for n in shape))
            zero = isinstance(attr.get_splat_value(), ir.FloatAttr) and attr.get_splat_value().value == 0
            self.values[result] = replace(v, logical=shape, zero_pad=zero)
            return
        self.values[result] = self.const(_scalar_literal(attr), _elt(result.type))

    def program_id(self, op) -> None:
        axis = int(op.attributes["axis"].value)
        if axis not in (0, 1, 2):
            raise _fail(op, f"has axis {axis}; L1 kernels have axes 0 (batch), 1 (head), 2 (query block)")
        triton_axis = 2 - axis
        pid = _V(self.em(f'"tt.get_program_id"() {{axis = {triton_axis} : i32}} : () -> i32'), (), "i32")
        if axis == 2 and self.grid[2] > 1:
            pid = self.op("arith.subi", self.const(self.grid[2] - 1, "i32"), pid)
        self.values[op.results[0]] = pid

    def empty(self, op) -> None:
        self.values[op.results[0]] = _Empty()

    def extract_slice(self, op) -> None:
        src = self.get(op.operands[0], op)
        offsets, sizes, strides = _mixed(self, op, 1)
        if any(s != 1 for s in strides):
            raise _fail(op, "must have unit strides")
        rtype = op.results[0].type
        if isinstance(src, _Arg):
            sl = _Slice(src, offsets, sizes)
            if rtype.has_static_shape:
                self.values[op.results[0]] = self.load_slice(sl, tuple(rtype.shape), op)
            else:
                self.values[op.results[0]] = sl
            return
        if isinstance(src, _V) and src.shape and all(isinstance(o, int) and o == 0 for o in offsets):
            src = self.full(src)
            rank = len(src.shape)
            dims = tuple(n if n != _DYNAMIC else src.logical[i] for i, n in enumerate(rtype.shape))
            if len(dims) != rank or tuple(_pad(n) for n in dims) != src.shape:
                raise _fail(op, "may only trim a computed tile within its padded power-of-two shape")
            self.values[op.results[0]] = replace(src, logical=dims, zero_pad=False)
            return
        raise _fail(op, "slices a function argument or the origin of a computed tile only")

    def pad(self, op) -> None:
        src = self.get(op.operands[0], op)
        low = list(op.attributes["static_low"])
        if any(x != 0 for x in low):
            raise _fail(op, "pads at the high end only")
        terminator = list(op.regions[0].blocks[0].operations)[-1].operation
        if _constant_value(terminator.operands[0]) not in (0, 0.0):
            raise _fail(op, "must pad with zeros (the tile load fills masked lanes with 0)")
        shape = tuple(op.results[0].type.shape)
        if isinstance(src, _Slice):
            self.values[op.results[0]] = self.load_slice(src, shape, op)
            return
        if isinstance(src, _V) and src.zero_pad and src.shape == tuple(_pad(n) for n in shape):
            self.values[op.results[0]] = replace(src, logical=shape)
            return
        raise _fail(op, "pads a slice of a function argument only")

    def insert_slice(self, op) -> None:
        value = self.tile(op.operands[0], op)
        dest = self.destination(self.get(op.operands[1], op))
        if dest is None:
            raise _fail(op, "inserts into a destination argument only")
        arg = dest.arg
        offsets, sizes, strides = _mixed(self, op, 2)
        if any(s != 1 for s in strides):
            raise _fail(op, "must have unit strides")
        rank, t = len(arg.shape), len(value.shape)
        if any(s != 1 for s in sizes[: rank - t]):
            raise _fail(op, "must write a tile into the trailing dimensions (leading sizes must be 1)")
        if value.elt != arg.elt:
            raise _fail(op, f"stores {value.elt} into a {arg.elt} tensor")
        ptrs, mask = self.tile_pointers(arg, self.origin(arg, offsets), value.shape, sizes[rank - t:])
        self.store(ptrs, value, mask)
        self.values[op.results[0]] = dest

    def extract(self, op) -> None:
        src = self.get(op.operands[0], op)
        indices = list(op.operands[1:])
        lowered = [self.get(i, op) for i in indices]
        if not all(isinstance(v, _V) for v in lowered):
            raise _fail(op, "has an index that is not an integer value")
        if isinstance(src, _Table) and not any(v.shape for v in lowered):
            self.values[op.results[0]] = self.table_lookup(src, indices, op)
            return
        if isinstance(src, _Table):
            src = self.table_arg(src)
        if not isinstance(src, _Arg):
            raise _fail(op, "reads elements of closure tensors or block tables only")
        self.values[op.results[0]] = self.gather(src, lowered, op)

    def table_arg(self, table: _Table) -> _Arg:
        ptr = self.table_param(table)
        shape = tuple(table.values.shape)
        strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
        return _Arg("table", shape, "i32", ptr, [s if s == 1 else self.const(s, "i64") for s in strides])

    def fill(self, op) -> None:
        value = self.scalar(op.operands[0], op)
        shape = _logical(op.results[0].type)
        v = self.to_shape(value, tuple(_pad(n) for n in shape))
        zero = _constant_value(op.operands[0]) in (0, 0.0)
        self.values[op.results[0]] = replace(v, logical=shape, zero_pad=zero)

    def transpose(self, op) -> None:
        perm = list(op.attributes["permutation"])
        if perm != [1, 0]:
            raise _fail(op, f"transposes 2-D tiles only (permutation [1, 0]), not {perm}")
        x = self.tile(op.operands[0], op)
        shape = (x.shape[1], x.shape[0])
        out = self.generic("tt.trans", [x], shape, x.elt, "order = array<i32: 1, 0>")
        self.values[op.results[0]] = replace(out, logical=(x.logical[1], x.logical[0]), zero_pad=x.zero_pad)

    def matmul(self, op) -> None:
        if "indexing_maps" in op.attributes:
            maps = [str(m) for m in op.attributes["indexing_maps"]]
            if maps != ["affine_map<(d0, d1, d2) -> (d0, d2)>", "affine_map<(d0, d1, d2) -> (d2, d1)>",
                        "affine_map<(d0, d1, d2) -> (d0, d1)>"]:
                raise _fail(op, "with transposed or broadcast indexing maps is not supported")
        a, b = self.tile(op.operands[0], op), self.tile(op.operands[1], op)
        c = self.tile(op.operands[2], op)
        if len(a.shape) != 2 or a.shape[1] != b.shape[0] or c.shape != (a.shape[0], b.shape[1]):
            raise _fail(op, f"has mismatched tile shapes {a.type} x {b.type} -> {c.type}")
        if a.elt != b.elt:
            raise _fail(op, f"multiplies {a.elt} by {b.elt}; tt.dot needs one input type")
        if a.logical[1] != a.shape[1]:
            # Padding lanes of computed tiles hold whatever the computation gave them there.
            a = a if a.zero_pad else self.zero_beyond(a, 1)
            b = b if b.zero_pad else self.zero_beyond(b, 0)
        precision = self.precision
        if "attn.precision" in op.attributes:
            chosen = op.attributes["attn.precision"].value
            if chosen not in _PRECISION:
                raise _fail(op, f"has attn.precision '{chosen}' (expected one of {', '.join(_PRECISION)})")
            precision = _PRECISION[chosen]
        attrs = f"inputPrecision = {precision} : i32, maxNumImpreciseAcc = 0 : i32"
        out = self.generic("tt.dot", [a, b, c], c.shape, c.elt, attrs)
        self.values[op.results[0]] = replace(out, logical=c.logical)

    def linalg_generic(self, op) -> None:
        """An elementwise generic, or a contraction whose body ends in `out <combine> value`
        (e.g. a sum over d2 of an expression of q[d0, d2], k[d1, d2]): the value is computed
        over the whole iteration domain, then reduced over the reduction dimensions."""
        from mlir import ir

        n_in, n_out = list(op.attributes["operandSegmentSizes"])
        if n_out != 1:
            raise _fail(op, "must have exactly one output for the Triton lowering")
        iters = ["reduction" in str(t) for t in op.attributes["iterator_types"]]
        out_type = op.results[0].type
        logical = _logical(out_type)
        maps = [m.value for m in op.attributes["indexing_maps"]]
        out_dims = [e.position for e in maps[n_in].results if isinstance(e, ir.AffineDimExpr)]
        if out_dims != [d for d, red in enumerate(iters) if not red]:
            raise _fail(op, f"has an output map the Triton lowering does not support: {maps[n_in]}")
        domain = [None] * len(iters)
        for value, amap in zip(op.operands, maps):
            for axis, e in enumerate(amap.results):
                if isinstance(e, ir.AffineDimExpr) and hasattr(value.type, "shape"):
                    domain[e.position] = value.type.shape[axis]
        if any(n is None for n in domain):
            raise _fail(op, "has an iteration dimension no operand spans")
        padded = tuple(_pad(n) for n in domain)
        block = op.regions[0].blocks[0]
        for k in range(n_in):
            self.values[block.arguments[k]] = self.map_input(op.operands[k], maps[k], len(padded), op)
        out_arg = block.arguments[n_in]
        ops = [o.operation for o in block.operations]
        combiner = None
        if any(iters):
            combiner = getattr(ops[-1].operands[0].owner, "operation", None)
            if (combiner is None or combiner.name not in _COMBINERS or out_arg not in list(combiner.operands)
                    or sum(1 for _ in out_arg.uses) != 1):
                raise _fail(op, "with reduction iterators must yield `out <op> value` with <op> one of "
                                + ", ".join(_COMBINERS))
        elif any(True for _ in out_arg.uses):
            # The body reads the output's old value (an in-place update of a carried tile).
            self.values[out_arg] = self.map_input(op.operands[n_in], maps[n_in], len(padded), op)
        saved, self.generic_shape = self.generic_shape, padded
        try:
            for body_op in ops[:-1]:
                if combiner is None or body_op != combiner:
                    self.lower_op(body_op)
        finally:
            self.generic_shape = saved
        if combiner is None:
            result = self.get(ops[-1].operands[0], op)
        else:
            other = [v for v in combiner.operands if v != out_arg][0]
            result = self.to_shape(self.get(other, op), padded)
            for axis in reversed([d for d, red in enumerate(iters) if red]):
                if padded[axis] != domain[axis]:
                    result = self.neutral_beyond(result, axis, domain[axis], combiner.name, op)
                result = self.tt_reduce(result, axis, combiner.name)
            init = self.tile(op.operands[n_in], op)
            result = self.op(combiner.name, self.to_shape(result, init.shape), init)
        if result.elt != _elt(out_type):
            raise _fail(op, f"yields {result.elt} for a {_elt(out_type)} tensor")
        result = self.to_shape(result, tuple(_pad(n) for n in logical))
        self.values[op.results[0]] = replace(result, logical=logical, zero_pad=False, const=False)

    def tt_reduce(self, x: _V, axis: int, combine: str) -> _V:
        a, b = self.em.fresh("r"), self.em.fresh("r")
        c = self.em.fresh("r")
        shape = tuple(n for i, n in enumerate(x.shape) if i != axis)
        name = self.em(f'"tt.reduce"({x.name}) ({{\n^bb0({a}: {x.elt}, {b}: {x.elt}):\n'
                       f'{c} = "{combine}"({a}, {b}) : ({x.elt}, {x.elt}) -> {x.elt}\n'
                       f'"gpu.yield"({c}) : ({x.elt}) -> ()\n}}) {{axis = {axis} : i32}} : ({x.type}) -> {_ty(shape, x.elt)}')
        return _V(name, shape, x.elt)

    def map_input(self, value, amap, rank: int, op) -> _V:
        from mlir import ir

        x = self.get(value, op)
        if isinstance(x, _V) and not x.shape:
            return x
        x = self.tile(value, op)
        dims = []
        for e in amap.results:
            if not isinstance(e, ir.AffineDimExpr):
                raise _fail(op, f"has an indexing map that is not a projection: {amap}")
            dims.append(e.position)
        if dims != sorted(dims) or len(dims) != len(x.shape):
            raise _fail(op, f"has an indexing map the Triton lowering does not support: {amap}")
        for axis in range(rank):
            if axis not in dims:
                x = self.expand(x, axis)
        return replace(x, logical=None)

    def linalg_index(self, op) -> None:
        if self.generic_shape is None:
            raise _fail(op, "appears outside a linalg.generic body")
        dim = int(op.attributes["dim"].value)
        self.values[op.results[0]] = self.arange(self.generic_shape[dim], dim, len(self.generic_shape))

    def reduce(self, op) -> None:
        if len(op.results) != 1:
            raise _fail(op, "must reduce one tensor")
        x = self.tile(op.operands[0], op)
        init = self.tile(op.operands[1], op)
        dims = list(op.attributes["dimensions"])
        if len(dims) != 1 or len(x.shape) != 2:
            raise _fail(op, "reduces one dimension of a 2-D tile only")
        axis = dims[0]
        block = op.regions[0].blocks[0]
        if x.logical[axis] != x.shape[axis]:
            combine = [o.operation.name for o in block.operations][0]
            x = self.neutral_beyond(x, axis, x.logical[axis], combine, op)
        a, b = self.em.fresh("r"), self.em.fresh("r")
        self.values[block.arguments[0]] = _V(a, (), x.elt)
        self.values[block.arguments[1]] = _V(b, (), x.elt)
        with self.em.capture() as lines:
            terminator = self.lower_block(block)
            combined = self.get(terminator.operands[0], op)
            self.em.raw(f'"gpu.yield"({combined.name}) : ({combined.elt}) -> ()')
        rshape = tuple(n for i, n in enumerate(x.shape) if i != axis)
        body = "\n".join(lines)
        name = self.em(f'"tt.reduce"({x.name}) ({{\n^bb0({a}: {x.elt}, {b}: {x.elt}):\n{body}\n}}) '
                       f"{{axis = {axis} : i32}} : ({x.type}) -> {_ty(rshape, x.elt)}")
        reduced = _V(name, rshape, x.elt)
        self.values[block.arguments[0]] = reduced
        self.values[block.arguments[1]] = init
        terminator = self.lower_block(block)
        out = self.get(terminator.operands[0], op)
        self.values[op.results[0]] = replace(out, logical=init.logical, zero_pad=False, const=False)

    def scf_for(self, op) -> None:
        lb, ub, step = (self.scalar(v, op) for v in list(op.operands)[:3])
        block = op.regions[0].blocks[0]
        iv = self.em.fresh("iv")
        self.values[block.arguments[0]] = _V(iv, (), "i32")
        # A destination tensor threaded through the loop (stores inside it) is memory, not a
        # loop-carried value: only tiles and scalars become iter_args.
        carried = []
        for k, value in enumerate(list(op.operands)[3:]):
            init = self.get(value, op)
            dest = self.destination(init)
            if dest is not None:
                self.values[block.arguments[k + 1]] = dest
                self.values[op.results[k]] = dest
            else:
                carried.append(k)
        inits = [self.carried(self.get(op.operands[3 + k], op), op) for k in carried]
        names = [self.em.fresh("it") for _ in inits]
        for k, init, name in zip(carried, inits, names):
            self.values[block.arguments[k + 1]] = replace(init, name=name, const=False)
        with self.em.capture() as lines:
            terminator = self.lower_block(block)
            for k, value in enumerate(terminator.operands):
                if k not in carried and self.destination(self.get(value, op)) is not self.values[op.results[k]]:
                    raise _fail(op, "must yield the destination it carries, updated by tensor.insert_slice")
            yields = [self.carried(self.get(terminator.operands[k], op), op) for k in carried]
            for y, init in zip(yields, inits):
                if y.type != init.type:
                    raise _fail(op, f"carries {init.type} into the loop but yields {y.type}")
            if yields:
                self.em.raw(f"scf.yield {', '.join(y.name for y in yields)} : {', '.join(y.type for y in yields)}")
        types = ", ".join(i.type for i in inits)
        head = f"scf.for {iv} = {lb.name} to {ub.name} step {step.name}"
        if inits:
            result = self.em.fresh("for")
            bindings = ", ".join(f"{n} = {i.name}" for n, i in zip(names, inits))
            self.em.raw(f"{result}:{len(inits)} = {head} iter_args({bindings}) -> ({types}) : i32 {{")
        else:
            self.em.raw(f"{head} : i32 {{")
        self.em.lines.extend(lines)
        self.em.raw("}")
        for j, (k, init) in enumerate(zip(carried, inits)):
            self.values[op.results[k]] = replace(init, name=f"{result}#{j}", const=False)

    def destination(self, v) -> _Dest | None:
        """The destination a value stands for (a trailing destination argument or an update of
        one), or None."""
        if isinstance(v, _Dest):
            return v
        if isinstance(v, _Arg) and v.label in self.dest_labels:
            return self.dest_of.setdefault(v.label, _Dest(v))
        return None

    def carried(self, v, op) -> _V:
        if not isinstance(v, _V):
            raise _fail(op, "carries a value that is neither a scalar nor a tile through the loop")
        return self.full(v)

    def func_return(self, op) -> None:
        for k, value in enumerate(op.operands):
            dest = self.destination(self.get(value, op))
            if dest is None:
                raise _fail(op, "must return the destination arguments, updated by tensor.insert_slice")
            if dest.arg is not self.values[self.dests[k]]:
                raise _fail(op, f"returns result {k} from the wrong destination")

    def elementwise(self, op) -> None:
        name = op.name
        operands = []
        for v in op.operands:
            x = self.get(v, op)
            if not isinstance(x, _V):
                raise _fail(op, "operates on a tensor the Triton lowering cannot express elementwise")
            operands.append(self.full(x) if x.logical is not None and self.generic_shape is None else x)
        if len(op.results) != 1:
            raise _fail(op, "must have one result")
        rtype = op.results[0].type
        elt = _elt(rtype)
        expand = _EXPANSIONS.get(name)
        if expand is not None:
            out = expand(self, *operands)
        elif name in _CASTS:
            out = self.cast_int(operands[0], elt, signed=name == "arith.index_cast")
        else:
            attrs = ", ".join(f"{k} = {op.attributes[k]}" for k in op.attributes)
            out = self.op(name, *operands, elt=elt, attrs=attrs)
        logical = _logical(rtype) if hasattr(rtype, "shape") else None
        self.values[op.results[0]] = replace(out, logical=logical)

    # --- expansions of ops Triton does not lower on every target -----------------------------
    def negf(self, x: _V) -> _V:
        # -0.0 - x flips the sign of zeros too, as negation does.
        return self.op("arith.subf", self.const("-0.0", x.elt), x)

    def floordivsi(self, a: _V, b: _V) -> _V:
        q = self.op("arith.divsi", a, b)
        r = self.op("arith.remsi", a, b)
        zero = self.const(0, a.elt)
        differ = self.op("arith.xori", self.cmpi("slt", r, zero), self.cmpi("slt", b, zero))
        fix = self.op("arith.andi", self.cmpi("ne", r, zero), differ)
        return self.select(fix, self.op("arith.subi", q, self.const(1, a.elt)), q)

    def tanh(self, x: _V) -> _V:
        # tanh|x| = (1 - e^-2|x|) / (1 + e^-2|x|); its cancellation near 0 is replaced by the
        # series x - x^3/3 + 2x^5/15, whose error below 0.05 is under 1e-10 relative.
        c = lambda v: self.const(v, x.elt)  # noqa: E731
        ax = self.op("math.absf", x)
        t = self.op("math.exp2", self.op("arith.mulf", ax, c(-2.0 * _LOG2E)))
        big = self.op("arith.divf", self.op("arith.subf", c(1.0), t), self.op("arith.addf", c(1.0), t))
        x2 = self.op("arith.mulf", ax, ax)
        series = self.op("arith.addf", c(-1.0 / 3.0), self.op("arith.mulf", x2, c(2.0 / 15.0)))
        small = self.op("arith.mulf", ax, self.op("arith.addf", c(1.0), self.op("arith.mulf", x2, series)))
        r = self.select(self.cmpf("olt", ax, c(0.05)), small, big)
        return self.select(self.cmpf("olt", x, c(0.0)), self.negf(r), r)

    def log1p(self, x: _V) -> _V:
        # log(u) * x / (u - 1) with u = 1 + x cancels u's rounding error (Goldberg).
        c = lambda v: self.const(v, x.elt)  # noqa: E731
        u = self.op("arith.addf", x, c(1.0))
        d = self.op("arith.subf", u, c(1.0))
        r = self.op("arith.mulf", self.op("math.log", u), self.op("arith.divf", x, d))
        r = self.select(self.cmpf("oeq", d, c(0.0)), x, r)
        return self.select(self.cmpf("oeq", x, c("inf")), x, r)

    def expm1(self, x: _V) -> _V:
        # (u - 1) * x / log(u) with u = e^x (Kahan).
        c = lambda v: self.const(v, x.elt)  # noqa: E731
        u = self.op("math.exp", x)
        d = self.op("arith.subf", u, c(1.0))
        r = self.op("arith.divf", self.op("arith.mulf", d, x), self.op("math.log", u))
        r = self.select(self.cmpf("oeq", d, c(-1.0)), c(-1.0), r)
        r = self.select(self.cmpf("oeq", d, c(0.0)), x, r)
        return self.select(self.cmpf("oeq", u, c("inf")), u, r)

    def powf(self, x: _V, y: _V) -> _V:
        # exp2(y log2|x|), with torch.pow's signs: a negative base needs an integer exponent
        # (odd exponents keep the sign), and x^0 = 1^y = 1 even for NaN.
        c = lambda v: self.const(v, x.elt)  # noqa: E731
        r = self.op("math.exp2", self.op("arith.mulf", y, self.op("math.log2", self.op("math.absf", x))))
        integral = self.cmpf("oeq", self.op("math.floor", y), y)
        odd = self.cmpf("oeq", self.op("math.absf", self.op("arith.remf", y, c(2.0))), c(1.0))
        negative = self.select(integral, self.select(odd, self.negf(r), r), c("nan"))
        r = self.select(self.cmpf("olt", x, c(0.0)), negative, r)
        one = self.op("arith.ori", self.cmpf("oeq", y, c(0.0)), self.cmpf("oeq", x, c(1.0)))
        return self.select(one, c(1.0), r)

    # --- the kernel ------------------------------------------------------------------------
    def build(self) -> str:
        self.setup_args()
        terminator = self.lower_block(self.func.regions[0].blocks[0])
        if terminator.name != "func.return":
            raise _fail(terminator, "must end the kernel function")
        self.func_return(terminator)
        b, h, nm = self.grid
        params = ", ".join(f"{n}: {t}" for n, t, _, _ in self.params)
        types = ", ".join(t for _, t, _, _ in self.params)
        arg_attrs = ", ".join(f"{{{a}}}" for _, _, a, _ in self.params)
        labels = ", ".join(f'"{label}"' for _, _, _, label in self.params)
        tables = ", ".join(t.attr for t in self.tables)
        name = self.func.attributes["sym_name"].value
        attrs = [f"function_type = ({types}) -> ()", f'sym_name = "{name}"', 'sym_visibility = "public"',
                 "noinline = false", f"arg_attrs = [{arg_attrs}]", f"attn.grid = array<i64: {nm}, {h}, {b}>",
                 f"attn.kernel_args = [{labels}]", f"attn.tables = [{tables}]",
                 f"attn.assume_aligned = {str(self.aligned).lower()}"]
        for key in ("attn.block_m", "attn.block_n"):
            if key in self.func.attributes:
                attrs.append(f"{key} = {self.func.attributes[key]}")
        body = "\n".join(self.em.prologue + self.em.lines)
        return (f'"tt.func"() ({{\n^bb0({params}):\n{body}\n"gpu.yield"() : () -> ()\n}}) '
                f"{{{', '.join(attrs)}}} : () -> ()\n")


_HANDLERS = {
    "arith.constant": _Kernel.constant,
    "attn.program_id": _Kernel.program_id,
    "tensor.empty": _Kernel.empty,
    "tensor.extract_slice": _Kernel.extract_slice,
    "tensor.pad": _Kernel.pad,
    "tensor.insert_slice": _Kernel.insert_slice,
    "tensor.extract": _Kernel.extract,
    "linalg.fill": _Kernel.fill,
    "linalg.transpose": _Kernel.transpose,
    "linalg.matmul": _Kernel.matmul,
    "linalg.generic": _Kernel.linalg_generic,
    "linalg.index": _Kernel.linalg_index,
    "linalg.reduce": _Kernel.reduce,
    "scf.for": _Kernel.scf_for,
}

_EXPANSIONS = {
    "arith.negf": _Kernel.negf,
    "arith.floordivsi": _Kernel.floordivsi,
    "math.tanh": _Kernel.tanh,
    "math.log1p": _Kernel.log1p,
    "math.expm1": _Kernel.expm1,
    "math.powf": _Kernel.powf,
}


def _logical(mlir_type) -> tuple:
    shape = tuple(mlir_type.shape)
    if any(n == _DYNAMIC for n in shape):
        raise CompileError(f"a dynamically shaped tile {mlir_type} reaches compute ops")
    return shape


def _scalar_literal(attr):
    from mlir import ir

    if isinstance(attr, ir.BoolAttr):
        return bool(attr.value)
    if isinstance(attr, ir.IntegerAttr):
        return int(attr.value)
    if isinstance(attr, ir.FloatAttr):
        return str(attr).rsplit(" : ", 1)[0]
    raise CompileError(f"unsupported constant {attr}")


def _constant_value(value):
    """The number an arith.constant defines, or None."""
    from mlir import ir

    owner = getattr(value.owner, "operation", None)
    if owner is None or owner.name != "arith.constant":
        return None
    attr = owner.attributes["value"]
    if isinstance(attr, ir.IntegerAttr):
        return int(attr.value)
    if isinstance(attr, ir.FloatAttr):
        return float(attr.value)
    return None


def _constant_int(value):
    c = _constant_value(value)
    return c if isinstance(c, int) else None


def _affine(values, rows) -> tuple[int, int] | None:
    """(a, b) with values[m] == a * m + b for every selected row m, or None."""
    import numpy as np

    ms = np.nonzero(rows)[0]
    if len(ms) == 0:
        return 0, 0
    b0 = int(values[ms[0]])
    if len(ms) == 1:
        return 0, b0
    a = (int(values[ms[1]]) - b0) // int(ms[1] - ms[0])
    b = b0 - a * int(ms[0])
    if (values[ms] == a * ms + b).all():
        return a, b
    return None


def _loop_counts(iv, row, rows: int):
    """The per-row trip counts when `iv` is the induction variable of an scf.for from 0 whose upper
    bound is a constant or `counts[row]` read from a constant table; None otherwise."""
    import numpy as np
    from mlir import ir

    iv = iv.maybe_downcast()
    if not isinstance(iv, ir.BlockArgument) or iv.arg_number != 0:
        return None
    loop = iv.owner.owner
    loop = getattr(loop, "operation", loop)
    if loop is None or loop.name != "scf.for":
        return None
    if _constant_int(loop.operands[0]) != 0 or _constant_int(loop.operands[2]) != 1:
        return None
    ub = loop.operands[1]
    if _constant_int(ub) is not None:
        return np.full(rows, _constant_int(ub), np.int64)
    cast = getattr(ub.owner, "operation", None)
    if cast is None or cast.name != "arith.index_cast":
        return None
    extract = getattr(cast.operands[0].owner, "operation", None)
    if extract is None or extract.name != "tensor.extract" or len(extract.operands) != 2:
        return None
    if extract.operands[1] != row:
        return None
    table = getattr(extract.operands[0].owner, "operation", None)
    if table is None or table.name != "arith.constant":
        return None
    attr = table.attributes["value"]
    if not isinstance(attr, ir.DenseIntElementsAttr):
        return None
    counts = np.array(attr).astype(np.int64)
    if attr.is_splat:
        counts = np.full(tuple(table.results[0].type.shape), int(attr.get_splat_value().value), np.int64)
    return counts if counts.ndim == 1 else None


def _mixed(kernel: _Kernel, op, first: int) -> tuple[list, list, list]:
    """Offsets, sizes and strides of a slice op: ints where static, lowered scalars where not."""
    seg = list(op.attributes["operandSegmentSizes"])
    dynamic = list(op.operands)[first:]
    counts = seg[first:]
    groups = []
    pos = 0
    for key, count in zip(("static_offsets", "static_sizes", "static_strides"), counts):
        values = dynamic[pos : pos + count]
        pos += count
        out, it = [], iter(values)
        for s in op.attributes[key]:
            if s == _DYNAMIC:
                v = next(it)
                c = _constant_int(v)
                out.append(c if c is not None else kernel.scalar(v, op))
            else:
                out.append(int(s))
        groups.append(out)
    return groups[0], groups[1], groups[2]


@dataclass(frozen=True)
class LowerToTriton(ModulePass):
    name: ClassVar[str] = "attn-lower-to-triton"
    summary: ClassVar[str] = ("Lower an L1 attention kernel to Triton IR (tt.func in generic form): tile "
                              "loads/stores, tt.dot, tt.reduce, scf.for over KV tiles")

    assume_aligned: bool = option(True, "specialize for unit last-dim strides, 16-byte aligned pointers and "
                                        "16-element-divisible strides of q/k/v/out (32-bit tile offsets)")
    input_precision: Literal["ieee", "tf32", "tf32x3"] = option(
        "ieee", "how tt.dot multiplies f32 tiles (16-bit inputs always use tensor cores)")

    def apply(self, module_op) -> None:
        from mlir import ir

        body = module_op.regions[0].blocks[0]
        kernels = [op.operation for op in body.operations
                   if op.operation.name == "func.func" and "attn.grid" in op.operation.attributes]
        if not kernels:
            raise CompileError("attn-lower-to-triton needs an L1 kernel (a func.func with attn.grid); "
                               "run attn-tile first")
        for func in kernels:
            text = _Kernel(func, self.assume_aligned, self.input_precision).build()
            parsed = parse_module(text, module_op.context, "<attn-lower-to-triton>")
            with module_op.context:
                parsed.body.operations[0].operation.clone(ip=ir.InsertionPoint(func))
            func.erase()
