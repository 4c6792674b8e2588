"""`TileBuilder`: the map from L1 values to lowered ones, and the emission of tt/arith ops on
scalars and power-of-two tiles (constants hoisted and shared, operands broadcast to one shape)."""
from __future__ import annotations

from dataclasses import replace

from ...core.context import CompileError
from ...core.regions import float_literal
from .values import (Arg, Dest, Emitter, Empty, Slice, Table, Value, bit_width, fail, is_float, padded_size,
                     tensor_type)

CMPI = {"eq": 0, "ne": 1, "slt": 2, "sle": 3, "sgt": 4, "sge": 5}
CMPF = {"oeq": 1, "ogt": 2, "oge": 3, "olt": 4, "ole": 5, "une": 13}


class TileBuilder:
    def __init__(self):
        self.em = Emitter()
        self.values: dict = {}
        self.cache: dict = {}
        # The padded iteration domain while a linalg.generic body is lowered, else None.
        self.generic_shape: tuple | None = None
        # Generic results as computed, before the broadcast to their tile shape (`lazy_value`).
        self.lazy: dict = {}

    def lower_op(self, op) -> None:
        """Lower one L1 op (the kernel dispatches on its name)."""
        raise NotImplementedError

    def lower_block(self, block):
        """Lower every op of `block` but its terminator, which is returned."""
        ops = [o.operation for o in block.operations]
        for op in ops[:-1]:
            self.lower_op(op)
        return ops[-1]

    # --- values ----------------------------------------------------------------------------
    def get(self, value, user):
        if value not in self.values:
            raise fail(user, "reads a value the Triton lowering has not seen (unsupported L1 structure)")
        return self.values[value]

    def lazy_value(self, value, user) -> Value:
        """A tile as its generic computed it: [M, 1], [1, N] or a scalar where it varies along
        fewer axes; other tiles as they are."""
        if value in self.lazy:
            return self.lazy[value]
        return self.tile(value, user)

    def scalar(self, value, user) -> Value:
        v = self.get(value, user)
        if not isinstance(v, Value) or v.shape:
            raise fail(user, "expects a scalar operand here")
        return v

    def tile(self, value, user) -> Value:
        v = self.get(value, user)
        if isinstance(v, Value) and v.shape:
            return self.full(v)
        what = {Slice: "a dynamically sized slice (tensor.pad it to a static tile first)",
                Empty: "an uninitialized tensor.empty", Table: "a constant table", Arg: "a whole argument",
                Dest: "a destination"}.get(type(v), "a scalar")
        raise fail(user, f"expects a tile operand, got {what}")

    def full(self, v: Value) -> Value:
        """A tile with every dimension materialized (a generic's lazy [M, 1] included)."""
        if v.logical is None or len(v.logical) != len(v.shape):
            return v
        if 1 not in v.shape and v.shape == tuple(1 << (n - 1).bit_length() for n in v.logical):
            return v  # padded to powers of two only (a packed GQA tile's [group, rows])
        return self.to_shape(v, tuple(padded_size(n) for n in v.logical))

    # --- emission --------------------------------------------------------------------------
    def const(self, value, elt: str, shape: tuple = ()) -> Value:
        key = ("const", repr(value), elt, shape)
        if key not in self.cache:
            if isinstance(value, bool) or elt == "i1":
                lit = "true" if value else "false"
            elif is_float(elt):
                # Strings are MLIR spellings already (as MLIR printed them, or "-0.0"), except the
                # names "inf" and "nan" used by the expansions.
                lit = value if isinstance(value, str) and value not in ("inf", "nan") else float_literal(float(value))
            else:
                lit = str(int(value))
            if shape:
                text = f"arith.constant dense<{lit}> : {tensor_type(shape, elt)}"
            elif elt == "i1":
                text = f"arith.constant {lit}"  # a bool constant's custom form has no type
            else:
                text = f"arith.constant {lit} : {elt}"
            self.cache[key] = Value(self.em(text, hoist=True), shape, elt, const=True)
        return self.cache[key]

    def generic(self, name: str, operands: list[Value], shape: tuple, elt: str, attrs: str = "") -> Value:
        types = ", ".join(o.type for o in operands)
        attr = f" {{{attrs}}}" if attrs else ""
        hoist = bool(operands) and all(o.const for o in operands)
        text = f'"{name}"({", ".join(o.name for o in operands)}){attr} : ({types}) -> {tensor_type(shape, elt)}'
        if hoist:
            key = ("op", text)
            if key not in self.cache:
                self.cache[key] = Value(self.em(text, hoist=True), shape, elt, const=True)
            return self.cache[key]
        return Value(self.em(text), shape, elt)

    def join(self, operands: list[Value]) -> tuple:
        shapes = [o.shape for o in operands if o.shape]
        if not shapes:
            return ()
        rank = len(shapes[0])
        if any(len(s) != rank for s in shapes):
            raise CompileError(f"cannot combine values of shapes {shapes} (internal rank mismatch)")
        return tuple(max(s[i] for s in shapes) for i in range(rank))

    def to_shape(self, v: Value, shape: tuple) -> Value:
        if v.shape == shape:
            return v
        if not v.shape:
            return replace(self.generic("tt.splat", [v], shape, v.elt), logical=None)
        if len(v.shape) != len(shape) or any(a not in (1, b) for a, b in zip(v.shape, shape)):
            raise CompileError(f"cannot broadcast {v.type} to shape {shape}")
        out = self.generic("tt.broadcast", [v], shape, v.elt)
        return replace(out, logical=v.logical if v.logical and len(v.logical) == len(shape) else None)

    def expand(self, v: Value, axis: int) -> Value:
        shape = v.shape[:axis] + (1,) + v.shape[axis:]
        return self.generic("tt.expand_dims", [v], shape, v.elt, f"axis = {axis} : i32")

    def op(self, name: str, *operands: Value, elt: str | None = None, attrs: str = "") -> Value:
        shape = self.join(list(operands))
        ops = [self.to_shape(o, shape) for o in operands]
        return self.generic(name, ops, shape, elt or operands[0].elt, attrs)

    def cmpi(self, pred: str, a: Value, b: Value) -> Value:
        return self.op("arith.cmpi", a, b, elt="i1", attrs=f"predicate = {CMPI[pred]} : i64")

    def cmpf(self, pred: str, a: Value, b: Value) -> Value:
        return self.op("arith.cmpf", a, b, elt="i1", attrs=f"predicate = {CMPF[pred]} : i64")

    def select(self, c: Value, a: Value, b: Value) -> Value:
        return self.op("arith.select", c, a, b, elt=a.elt)

    def cast_int(self, v: Value, elt: str, signed: bool = True) -> Value:
        if v.elt == elt:
            return v
        if bit_width(elt) > bit_width(v.elt):
            return self.generic("arith.extsi" if signed else "arith.extui", [v], v.shape, elt)
        return self.generic("arith.trunci", [v], v.shape, elt)

    def neutral_beyond(self, v: Value, axis: int, extent: int, combine: str, op) -> Value:
        """v with the lanes of `axis` from `extent` on (padding) set to the identity of the
        reduction `combine`, so reducing the padded tile reduces the logical one."""
        identity = {"arith.addf": 0.0, "arith.addi": 0, "arith.mulf": 1.0, "arith.maximumf": "-inf",
                    "arith.minimumf": "inf"}.get(combine)
        if identity is None:
            raise fail(op, f"reduces a dimension of size {extent}, padded to {v.shape[axis]}, with '{combine}', "
                           "which has no identity the lowering knows")
        inside = self.cmpi("slt", self.arange(v.shape[axis], axis, len(v.shape)), self.const(extent, "i32"))
        if identity in ("-inf", "inf"):
            fill = self.const(float(identity), v.elt, v.shape)
        else:
            fill = self.const(identity, v.elt, v.shape)
        return replace(self.select(self.to_shape(inside, v.shape), v, fill), logical=v.logical)

    def zero_beyond(self, v: Value, axis: int) -> Value:
        """The 2-D tile v with the padding lanes of `axis` (past its logical extent) set to 0."""
        inside = self.cmpi("slt", self.arange(v.shape[axis], axis, 2), self.const(v.logical[axis], "i32"))
        zero = self.const(0.0, v.elt, v.shape)
        return replace(self.select(self.to_shape(inside, v.shape), v, zero), logical=v.logical, zero_pad=True)

    def arange(self, size: int, axis: int, rank: int) -> Value:
        """[0, size) along `axis` of a rank-`rank` tensor whose other dimensions are 1."""
        v = self.make_range(size)
        for i in range(rank):
            if i != axis:
                v = self.expand(v, i)
        return v

    def make_range(self, size: int) -> Value:
        key = ("range", size)
        if key not in self.cache:
            text = f'"tt.make_range"() {{start = 0 : i32, end = {size} : i32}} : () -> tensor<{size}xi32>'
            self.cache[key] = Value(self.em(text, hoist=True), (size,), "i32", const=True)
        return self.cache[key]

    def load(self, ptrs: Value, mask: Value | None, elt: str) -> Value:
        shape = ptrs.shape
        operands = [ptrs]
        if mask is not None:
            operands += [self.to_shape(mask, shape), self.const(0, elt, shape)]
        seg = "1, 1, 1" if mask is not None else "1, 0, 0"
        attrs = f"cache = 1 : i32, evict = 1 : i32, isVolatile = false, operandSegmentSizes = array<i32: {seg}>"
        types = ", ".join(o.type for o in operands)
        name = self.em(f'"tt.load"({", ".join(o.name for o in operands)}) {{{attrs}}} : ({types}) -> '
                       f"{tensor_type(shape, elt)}")
        return Value(name, shape, elt)

    def store(self, ptrs: Value, value: Value, mask: Value | None) -> None:
        operands = [ptrs, value] + ([self.to_shape(mask, ptrs.shape)] if mask is not None else [])
        types = ", ".join(o.type for o in operands)
        self.em.raw(f'"tt.store"({", ".join(o.name for o in operands)}) {{cache = 1 : i32, evict = 1 : i32}} '
                    f": ({types}) -> ()")

    def addptr(self, ptr: Value, offset: Value) -> Value:
        if offset.shape and not ptr.shape:
            ptr = self.to_shape(ptr, offset.shape)
        return self.generic("tt.addptr", [ptr, self.to_shape(offset, ptr.shape)], ptr.shape, ptr.elt)

    def tt_reduce(self, x: Value, axis: int, combine: str) -> Value:
        a, b = self.em.fresh("r"), self.em.fresh("r")
        c = self.em.fresh("r")
        shape = tuple(n for i, n in enumerate(x.shape) if i != axis)
        name = self.em(f'"tt.reduce"({x.name}) ({{\n^bb0({a}: {x.elt}, {b}: {x.elt}):\n'
                       f'{c} = "{combine}"({a}, {b}) : ({x.elt}, {x.elt}) -> {x.elt}\n'
                       f'"gpu.yield"({c}) : ({x.elt}) -> ()\n}}) {{axis = {axis} : i32}} : ({x.type}) -> '
                       f"{tensor_type(shape, x.elt)}")
        return Value(name, shape, x.elt)
