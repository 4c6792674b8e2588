"""What L1 values lower to, the text emitter, and small helpers on MLIR types and constants."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from ...core.context import CompileError, Diagnostic, location_parts

MIN_DIM = 16
DYNAMIC = -(1 << 63)
PRECISION = {"tf32": 0, "tf32x3": 1, "ieee": 2}


def fail(op, message: str) -> CompileError:
    filename, line, col = location_parts(op.location)
    return CompileError(message, [Diagnostic("error", f"'{op.name}' op {message}", filename, line, col)])


def padded_size(n: int) -> int:
    return max(MIN_DIM, 1 << (n - 1).bit_length())


def reshaped_padding(shape: tuple, reassociation: list[list[int]]) -> tuple:
    """The padded shape of a tile that a tensor.collapse_shape merges (or an expand_shape splits
    into) by `reassociation`: dimensions in a group of several are padded only to a power of two,
    so the group's product stays the merged dimension's size (a packed GQA tile's [group, rows]
    with rows < 16); the others as every tile is."""
    padded = list(shape)
    for group in reassociation:
        for d in group:
            padded[d] = 1 << (shape[d] - 1).bit_length() if len(group) > 1 else padded_size(shape[d])
    return tuple(padded)


def reassociation_of(op) -> list[list[int]]:
    return [[int(d) for d in group] for group in op.attributes["reassociation"]]


def tensor_type(shape: tuple, elt: str) -> str:
    return f"tensor<{'x'.join(map(str, shape))}x{elt}>" if shape else elt


def element_type(mlir_type) -> str:
    text = str(getattr(mlir_type, "element_type", mlir_type))
    return "i32" if text == "index" else text


def is_index(mlir_type) -> bool:
    return str(getattr(mlir_type, "element_type", mlir_type)) == "index"


def bit_width(elt: str) -> int:
    return 1 if elt == "i1" else int(elt[1:])


def is_float(elt: str) -> bool:
    return elt in ("f16", "bf16", "f32", "f64")


def logical_shape(mlir_type) -> tuple:
    shape = tuple(mlir_type.shape)
    if any(n == DYNAMIC for n in shape):
        raise CompileError(f"a dynamically shaped tile {mlir_type} reaches compute ops")
    return shape


def scalar_literal(attr):
    from mlir import ir

    if isinstance(attr, ir.BoolAttr):
        return bool(attr.value)
    if isinstance(attr, ir.IntegerAttr):
        return int(attr.value)
    if isinstance(attr, ir.FloatAttr):
        return str(attr).rsplit(" : ", 1)[0]
    raise CompileError(f"unsupported constant {attr}")


def constant_value(value):
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


def constant_int(value):
    c = constant_value(value)
    return c if isinstance(c, int) else None


@dataclass(frozen=True)
class Value:
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
        return tensor_type(self.shape, self.elt)


@dataclass
class Arg:
    label: str
    shape: tuple
    elt: str
    ptr: Value
    strides: list  # per dimension: a scalar Value, or the int 1 when the layout fixes it
    offset_elt: str = "i64"  # integer type of offsets inside a tile
    bool_bytes: bool = False
    aligned: bool = False  # abi.ALIGNED in the aligned variant: 16-byte aligned base and strides
    sizes: dict = field(default_factory=dict)  # dimension -> its size (a scalar Value) where dynamic


@dataclass
class Slice:
    """A slice of a tensor argument whose size is dynamic, or that only tensor.pad ops read: loaded
    by the pad, at the padded shape."""

    arg: Arg
    offsets: list
    sizes: list
    # What a tensor descriptor may load it through (`Memory.descriptor_load`): per trailing
    # dimension the C for which the slice is [offset, min(offset + C, size)) (None: it reaches the
    # tensor's end); None where the slice has another form or its leading offsets vary in a loop.
    spans: tuple | None = None


@dataclass
class Table:
    values: object  # numpy int64 array
    attr: str
    param: Value | None = None


class Empty:
    """A tensor.empty: only ever the `outs` of a linalg op, never read."""


@dataclass
class Dest:
    arg: Arg


class Emitter:
    def __init__(self):
        self.count = 0
        self.lines: list[str] = []
        self.prologue: list[str] = []
        # The lines of the regions being captured around the current one, outermost first.
        self.enclosing: list[list[str]] = []

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
        self.enclosing.append(saved)
        try:
            yield self.lines
        finally:
            self.enclosing.pop()
            self.lines = saved

    @contextlib.contextmanager
    def at_function_level(self):
        """Emit into the function's own block, just before the outermost region being captured
        (where values defined at function level dominate every use inside it)."""
        saved = self.lines
        self.lines = self.enclosing[0] if self.enclosing else saved
        try:
            yield
        finally:
            self.lines = saved
