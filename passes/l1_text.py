"""Text emission of L1 kernel functions: the helpers a pass uses to write tile-level IR.

A pass writes its L1 kernel as MLIR text and parses it once at the end (as `attn-tile` does).
`KernelText` keeps the SSA emitter and knows the enclosing function's arguments, so mod regions
that read closure tensors or constants can be inlined into `linalg.generic` bodies. Every op it
writes is in the L1 vocabulary both backends lower: tensor (empty, extract, extract_slice, pad,
insert_slice), linalg (fill, generic, reduce, matmul, transpose), arith/math scalars, scf.for and
`attn.program_id`. Its `generic` and `load_tile` emit the same IR as attn-tile's methods of
the same names when called the same way.
"""
from __future__ import annotations

from ..core import abi
from ..core.context import CompileError, Diagnostic, location_parts
from ..core.regions import TextEmitter, float_literal

# Triton runs f32 x f32 dots as tf32 unless told otherwise; L1 matmuls whose accuracy matters
# carry this attribute and the Triton lowering passes it on as the dot's input precision.
PRECISION_ATTR = abi.PRECISION


def fail(op, message: str) -> CompileError:
    filename, line, col = location_parts(op.location)
    return CompileError(message, [Diagnostic("error", f"'{op.name}' op {message}", filename, line, col)])


def ops_named(module_op, name: str) -> list:
    """Every op called `name` in the module, collected before any is rewritten."""
    from mlir import ir

    found = []

    def collect(op):
        if op.name == name:
            found.append(op)
        return ir.WalkResult.ADVANCE

    module_op.walk(collect)
    return found


def kernel_function(op, verb: str):
    """The func.func that `op` becomes the kernel of: it must return exactly the op's results
    and hold nothing else but constants, since the whole function turns into the kernel."""
    func = op.parent
    while func is not None and func.operation.name != "func.func":
        func = func.parent
    if func is None:
        raise fail(op, f"must be inside a func.func to be {verb}")
    block = func.regions[0].blocks[0]
    ret = list(block.operations)[-1].operation
    if list(ret.operands) != list(op.results):
        raise fail(op, f"{verb} turns the whole function into a kernel: the function must return "
                       "exactly this op's results, in order")
    for other in block.operations:
        if other.operation not in (op, ret) and other.operation.name != "arith.constant":
            raise fail(other.operation, f"a function to be {verb} must hold only '{op.name}' and constants")
    return func


def replace_function(module_op, func, text: str, source_name: str) -> None:
    """Parse the kernel `text` and put its functions, in order, where `func` was."""
    from mlir import ir

    from ..core.context import parse_module

    parsed = parse_module(text, module_op.context, source_name)
    with module_op.context:
        for op in parsed.body.operations:
            op.operation.clone(ip=ir.InsertionPoint(func))
    func.operation.erase()


def shape(value) -> list[int]:
    return list(value.type.shape)


def elt(value) -> str:
    return str(value.type.element_type)


def scalar_type(tensor_type: str) -> str:
    """The element type of a ranked tensor type written as text (`tensor<4x8xf32>` -> `f32`)."""
    if not tensor_type.startswith("tensor<"):
        return tensor_type
    inner = tensor_type[len("tensor<"):-1]
    return inner[inner.rindex("x") + 1:] if "x" in inner else inner


def constant_op(value):
    owner = getattr(value.owner, "operation", None)
    if owner is not None and owner.name == "arith.constant":
        return owner
    return None


def convert(em: TextEmitter, value: str, src: str, dst: str) -> str:
    """A float scalar converted between f16/bf16/f32 (extf or truncf)."""
    if src == dst:
        return value
    width = {"f16": 16, "bf16": 16, "f32": 32, "f64": 64}
    op = "arith.extf" if width[src] < width[dst] else "arith.truncf"
    return em(f"{op} {value} : {src} to {dst}")


class KernelText:
    """Emission helpers for one L1 kernel that replaces the function `func` holding `op`."""

    def __init__(self, op, func, prefix: str = "t"):
        self.op = op
        self.func = func
        self.em = TextEmitter(prefix)
        self.func_args = list(func.regions[0].blocks[0].arguments)

    def idx(self, n: int) -> str:
        return self.em(f"arith.constant {n} : index")

    def f32(self, x: float | str) -> str:
        lit = x if isinstance(x, str) else float_literal(x)
        return self.em(f"arith.constant {lit} : f32")

    def arg_name(self, value, what: str) -> str:
        for i, arg in enumerate(self.func_args):
            if arg == value:
                return f"%arg{i}"
        raise fail(self.op, f"{what} must be an argument of the enclosing function")

    def externals(self, program, em: TextEmitter) -> list[str]:
        """Names for the outer values a region reads: function arguments or re-emitted constants."""
        names = []
        for value in program.externals:
            const = constant_op(value)
            if const is not None:
                names.append(em(f"arith.constant {const.attributes['value']}"))
            else:
                names.append(self.arg_name(value, "a value a region reads (other than a constant)"))
        return names

    def generic(self, ins: list[tuple[str, str, str]], out_type: str, body, rank: int = 2,
                iterators: list[str] | None = None, init: str | None = None, out_map: str | None = None) -> str:
        """A linalg.generic; `ins` are (value, type, map) and `body(em, args)` returns the yielded
        scalar and may use linalg.index. Without `init` the output starts as tensor.empty; with
        `init` (the accumulator of reduction iterators) the body also gets the output element as
        its last argument. Iterators default to all parallel."""
        dims = ", ".join(f"d{i}" for i in range(rank))
        out_map = out_map or f"({dims})"
        maps = [m for _, _, m in ins] + [out_map]
        out_elt = scalar_type(out_type)
        accumulates = init is not None
        if init is None:
            init = self.em(f"tensor.empty() : {out_type}")
            prefix = f"g{self.em.count}_"
        else:
            prefix = f"g{self.em.fresh()[1:]}_"
        inner = TextEmitter(prefix)
        args = [f"%in{i}" for i in range(len(ins))]
        body_args = args + (["%out"] if accumulates else [])
        result = body(inner, body_args)
        decls = ", ".join(f"{a}: {scalar_type(t)}" for a, (_, t, _) in zip(args, ins))
        decls = (decls + ", " if decls else "") + f"%out: {out_elt}"
        body_text = "\n".join(f"      {line}" for line in inner.lines)
        maps_text = ", ".join(f"affine_map<({dims}) -> {m}>" for m in maps)
        iters = ", ".join(f'"{it}"' for it in (iterators or ["parallel"] * rank))
        operands = ", ".join(v for v, _, _ in ins)
        types = ", ".join(t for _, t, _ in ins)
        ins_text = f"ins({operands} : {types}) " if ins else ""
        return self.em(
            f"linalg.generic {{indexing_maps = [{maps_text}], iterator_types = [{iters}]}} "
            f"{ins_text}outs({init} : {out_type}) {{\n"
            f"    ^bb0({decls}):\n{body_text}\n      linalg.yield {result} : {out_elt}\n    }} -> {out_type}"
        )

    def fill(self, value: str, tensor_type: str) -> str:
        empty = self.em(f"tensor.empty() : {tensor_type}")
        return self.em(f"linalg.fill ins({value} : f32) outs({empty} : {tensor_type}) -> {tensor_type}")

    def zeros(self, tensor_type: str) -> str:
        return self.fill(self.f32(0.0), tensor_type)

    def reduce_rows(self, value: str, tile_type: str, init: str, row_type: str, combine: str) -> str:
        """Combine a 2-D tile along its rows (dimension 1) into `init`."""
        return self.em(
            f"linalg.reduce ins({value} : {tile_type}) outs({init} : {row_type}) dimensions = [1]\n"
            f"      (%x: f32, %acc: f32) {{\n        %r = {combine} %x, %acc : f32\n"
            f"        linalg.yield %r : f32\n      }}"
        )

    def row_sum(self, value: str, rows: int, cols: int) -> str:
        row_type = f"tensor<{rows}xf32>"
        return self.reduce_rows(value, f"tensor<{rows}x{cols}xf32>", self.zeros(row_type), row_type, "arith.addf")

    def rows_left(self, start: str, length: int, rows: int, past_end: bool = False) -> str:
        """min(length - start, rows), and at least 0 with `past_end`."""
        em = self.em
        valid = em(f"arith.minsi {em(f'arith.subi {self.idx(length)}, {start} : index')}, {self.idx(rows)} : index")
        return em(f"arith.maxsi {valid}, {self.idx(0)} : index") if past_end else valid

    def matmul(self, a: str, a_type: str, b: str, b_type: str, acc: str, acc_type: str,
               precision: str = "ieee") -> str:
        """acc + a @ b; f32 x f32 products are marked with `precision` for Triton's dot ("ieee":
        exact f32 products; "tf32x3": three tf32 tensor-core products, about 21 bits)."""
        attr = f' {{{PRECISION_ATTR} = "{precision}"}}' if scalar_type(a_type) == scalar_type(b_type) == "f32" else ""
        return self.em(f"linalg.matmul{attr} ins({a}, {b} : {a_type}, {b_type}) outs({acc} : {acc_type}) -> {acc_type}")

    def transpose(self, value: str, rows: int, cols: int, elt_: str = "f32") -> str:
        out_type = f"tensor<{cols}x{rows}x{elt_}>"
        empty = self.em(f"tensor.empty() : {out_type}")
        return self.em(f"linalg.transpose ins({value} : tensor<{rows}x{cols}x{elt_}>) "
                       f"outs({empty} : {out_type}) permutation = [1, 0]")

    def load_tile(self, src: str, src_type: str, elt_: str, coords: list[str], start: str, length: int,
                  rows: int, width: int | None, col: str = "0", past_end: bool = False) -> str:
        """Rows [start, start + rows) of src[coords..., :, col:col + width] (or of the 1-D
        src[coords..., :] when `width` is None), zero-padded past row `length`; `past_end` allows
        a start at or beyond `length` (an all-zero tile)."""
        em = self.em
        valid = self.rows_left(start, length, rows, past_end)
        if past_end:
            # A slice may be empty but must start inside the tensor.
            start = em(f"arith.minsi {start}, {self.idx(length)} : index")
        pad = em(f"arith.subi {self.idx(rows)}, {valid} : index")
        lead = ", ".join(coords)
        ones = ", ".join(["1"] * len(coords))
        if width is None:
            slice_type, tile_type = f"tensor<?x{elt_}>", f"tensor<{rows}x{elt_}>"
            piece = em(f"tensor.extract_slice {src}[{lead}, {start}] [{ones}, {valid}] [{ones}, 1] "
                       f": {src_type} to {slice_type}")
            low, high, block_args = "[0]", f"[{pad}]", "%pi: index"
        else:
            slice_type, tile_type = f"tensor<?x{width}x{elt_}>", f"tensor<{rows}x{width}x{elt_}>"
            piece = em(f"tensor.extract_slice {src}[{lead}, {start}, {col}] [{ones}, {valid}, {width}] "
                       f"[{ones}, 1, 1] : {src_type} to {slice_type}")
            low, high, block_args = "[0, 0]", f"[{pad}, 0]", "%pi: index, %pj: index"
        return em(f"tensor.pad {piece} low{low} high{high} {{\n    ^bb0({block_args}):\n"
                  f"      %pz = arith.constant 0.0 : {elt_}\n      tensor.yield %pz : {elt_}\n"
                  f"    }} : {slice_type} to {tile_type}")
