"""Builder helpers for L1 kernels: the ops `l1_text.KernelText` writes as text, built instead with
the MLIR bindings' builders at the current insertion point and location.

A pass that builds its kernel this way gives every op a real location (the op it lowers, which
the caller enters with `with op.location:`), and `KernelBuilder.inline` clones a mod region's ops,
so they keep theirs: the kernel points at the user's source, not at lines of an intermediate text.
The vocabulary is KernelText's (tensor, linalg, arith/math scalars, scf.for, `attn.program_id`),
so both backends lower what these helpers build.
"""
from __future__ import annotations

from .l1_text import constant_op, fail


def index(n: int):
    from mlir import ir
    from mlir.dialects import arith

    return arith.constant(ir.IndexType.get(), n)


def f32(x: float):
    from mlir import ir
    from mlir.dialects import arith

    return arith.constant(ir.F32Type.get(), x)


def tensor_type(shape: list[int], element_type):
    from mlir import ir

    return ir.RankedTensorType.get(list(shape), element_type)


def convert(value, dst_type):
    """A float scalar converted between f16/bf16/f32 (extf or truncf)."""
    from mlir.dialects import arith

    src = value.type
    if src == dst_type:
        return value
    widen = src.width < dst_type.width
    return (arith.extf if widen else arith.truncf)(dst_type, value)


def fill(value, init):
    """`init` filled with the scalar `value`."""
    from mlir.dialects import linalg

    return linalg.fill(value, outs=[init])


def matmul(a, b, acc):
    """acc + a @ b. The default indexing maps are spelled out, as the parser of the text form
    records them, so the op is the same whichever way it was made."""
    from mlir.dialects import linalg

    maps = [_map(3, dims) for dims in ((0, 2), (2, 1), (0, 1))]
    return linalg.matmul(a, b, outs=[acc], indexing_maps=maps)


def program_id(axis: int):
    from mlir import ir

    i64 = ir.IntegerType.get_signless(64)
    return ir.Operation.create("attn.program_id", results=[ir.IndexType.get()],
                               attributes={"axis": ir.IntegerAttr.get(i64, axis)}).result


def _map(rank: int, dims: tuple[int, ...]):
    from mlir import ir

    return ir.AffineMap.get(rank, 0, [ir.AffineDimExpr.get(d) for d in dims])


def _block(region, types: list):
    """A new block of `region` with arguments of `types` at the current location."""
    from mlir import ir

    loc = ir.Location.current
    return region.blocks.append(*types, arg_locs=[loc] * len(types))


class KernelBuilder:
    """Builder helpers for one L1 kernel that replaces the function `func` holding `op`."""

    def __init__(self, op, func):
        self.op = op
        self.func = func
        self.func_block = func.regions[0].blocks[0]
        self.kernel_args: list = []  # the new kernel's arguments, once `function` made it

    def function(self, name: str, arg_types: list, result_types: list, attributes: dict):
        """The kernel function, before `func`; returns its entry block."""
        from mlir import ir
        from mlir.dialects import func

        kernel = func.FuncOp(name, ir.FunctionType.get(arg_types, result_types), ip=ir.InsertionPoint(self.func))
        for key, value in attributes.items():
            kernel.attributes[key] = value
        entry = kernel.add_entry_block(arg_locs=[ir.Location.current] * len(arg_types))
        self.kernel_args = list(entry.arguments)
        return entry

    def inline(self, region, args: list):
        """Clone the ops of a one-block mod region at the insertion point, its block arguments
        bound to `args`; returns the image of the value it yields. Of the outer values it reads,
        the replaced function's arguments become the kernel's and constants are cloned here."""
        from mlir import ir

        block = region.blocks[0]
        images = dict(zip(block.arguments, args))

        def image(value):
            if value not in images:
                if isinstance(value.owner, ir.Block) and value.owner == self.func_block:
                    images[value] = self.kernel_args[ir.BlockArgument(value).arg_number]
                elif constant_op(value) is not None:
                    images[value] = constant_op(value).clone().result
                else:
                    raise fail(self.op, "a value a region reads (other than a constant) must be an argument "
                                        "of the enclosing function")
            return images[value]

        for op in block.operations:
            operation = op.operation
            if operation.name == "gpu.yield":
                return image(operation.operands[0])
            operands = [image(v) for v in operation.operands]
            clone = operation.clone()
            for i, value in enumerate(operands):
                clone.operands[i] = value
            images.update(zip(operation.results, clone.results))
        raise fail(self.op, "a mod region must end with gpu.yield")

    def generic(self, ins: list[tuple], out_type, body, rank: int = 2, iterators: list[str] | None = None,
                init=None, out_dims: tuple[int, ...] | None = None):
        """A linalg.generic; `ins` are (value, dims of its indexing map) and `body(args)` returns
        the yielded scalar, built inside the body (it may use linalg.index). Without `init` the
        output starts as tensor.empty; with `init` (the accumulator of reduction iterators) the
        body also gets the output element as its last argument. Iterators default to parallel."""
        from mlir import ir
        from mlir.dialects import linalg, tensor

        accumulates = init is not None
        if init is None:
            init = tensor.EmptyOp(list(out_type.shape), out_type.element_type).result
        maps = [_map(rank, dims) for _, dims in ins] + [_map(rank, out_dims or tuple(range(rank)))]
        kinds = [ir.Attribute.parse(f"#linalg.iterator_type<{it}>") for it in iterators or ["parallel"] * rank]
        op = linalg.GenericOp([out_type], [v for v, _ in ins], [init],
                              ir.ArrayAttr.get([ir.AffineMapAttr.get(m) for m in maps]), ir.ArrayAttr.get(kinds))
        block = _block(op.regions[0], [ir.RankedTensorType(v.type).element_type for v, _ in ins]
                       + [out_type.element_type])
        with ir.InsertionPoint(block):
            args = list(block.arguments)
            linalg.YieldOp([body(args if accumulates else args[:-1])])
        return op.result

    def reduce_rows(self, value, init, combine):
        """Combine a 2-D tile along its rows (dimension 1) into `init` with `combine(x, acc)`."""
        from mlir import ir
        from mlir.dialects import linalg

        op = linalg.ReduceOp([init.type], [value], [init], [1])
        f32_type = ir.F32Type.get()
        block = _block(op.regions[0], [f32_type, f32_type])
        with ir.InsertionPoint(block):
            linalg.YieldOp([combine(*block.arguments)])
        return op.result

    def rows_left(self, start, length: int, rows: int):
        """min(length - start, rows)."""
        from mlir.dialects import arith

        return arith.minsi(arith.subi(index(length), start), index(rows))

    def load_tile(self, src, coords: list, start, length: int, rows: int, width: int):
        """Rows [start, start + rows) of src[coords..., :, :width], zero-padded past row `length`."""
        from mlir import ir
        from mlir.dialects import arith, tensor

        element_type = ir.RankedTensorType(src.type).element_type
        dynamic = ir.ShapedType.get_dynamic_size()
        valid = self.rows_left(start, length, rows)
        pad = arith.subi(index(rows), valid)
        lead = len(coords)
        piece = tensor.ExtractSliceOp(
            tensor_type([dynamic, width], element_type), src, list(coords) + [start], [valid], [],
            [dynamic] * (lead + 1) + [0], [1] * lead + [dynamic, width], [1] * (lead + 2)).result
        padded = tensor.PadOp(tensor_type([rows, width], element_type), piece, [], [pad], [0, 0], [dynamic, 0])
        block = _block(padded.regions[0], [ir.IndexType.get()] * 2)
        with ir.InsertionPoint(block):
            tensor.YieldOp(arith.constant(element_type, 0.0))
        return padded.result
