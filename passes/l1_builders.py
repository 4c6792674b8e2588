"""Builder helpers for L1 kernels: ops built with the MLIR bindings' builders at the current
insertion point and location.

A pass that builds its kernel this way gives every op a real location (the op it lowers, which
the caller enters with `with op.location:`), and `KernelBuilder.inline` clones a mod region's ops,
so they keep theirs: the kernel points at the user's source. The vocabulary is the one both
backends lower: tensor (empty, extract, extract_slice, pad, insert_slice), linalg (fill, generic,
reduce, matmul, transpose), arith/math scalars, scf.for and `attn.program_id`.
"""
from __future__ import annotations

from ..core import abi
from .l1_ops import constant_op, fail


def index(n: int):
    from mlir import ir
    from mlir.dialects import arith

    return arith.constant(ir.IndexType.get(), n)


def index_value(n):
    """An index value: `n` itself, or a constant when `n` is an int."""
    return index(n) if isinstance(n, int) else n


def f32(x: float):
    from mlir import ir
    from mlir.dialects import arith

    return arith.constant(ir.F32Type.get(), x)


def tensor_type(shape: list[int], element_type=None):
    """A ranked tensor type; f32 elements unless told."""
    from mlir import ir

    return ir.RankedTensorType.get(list(shape), element_type or ir.F32Type.get())


def element_type(value):
    from mlir import ir

    return ir.RankedTensorType(value.type).element_type


def convert(value, dst_type):
    """A float scalar converted between f16/bf16/f32 (extf or truncf)."""
    from mlir.dialects import arith

    src = value.type
    if src == dst_type:
        return value
    widen = src.width < dst_type.width
    return (arith.extf if widen else arith.truncf)(dst_type, value)


def empty(of_type):
    """A tensor.empty of the ranked tensor type `of_type`."""
    from mlir.dialects import tensor

    return tensor.EmptyOp(list(of_type.shape), of_type.element_type).result


def fill(value, init):
    """`init` filled with the scalar `value`."""
    from mlir.dialects import linalg

    return linalg.fill(value, outs=[init])


def zeros(shape: list[int]):
    """An f32 tensor of zeros."""
    return fill(f32(0.0), empty(tensor_type(shape)))


def matmul(a, b, acc, precision: str | None = None):
    """acc + a @ b. The default indexing maps are spelled out, as the parser of the text form
    records them, so the op is the same whichever way it was made. With `precision`, an f32 x f32
    product carries it for Triton's dot, which runs such products as tf32 unless told ("ieee":
    exact f32 products; "tf32x3": three tf32 tensor-core products, about 21 bits)."""
    from mlir import ir
    from mlir.dialects import linalg

    maps = [_map(3, dims) for dims in ((0, 2), (2, 1), (0, 1))]
    result = linalg.matmul(a, b, outs=[acc], indexing_maps=maps)
    if precision is not None and element_type(a) == element_type(b) == ir.F32Type.get():
        result.owner.attributes[abi.PRECISION] = ir.StringAttr.get(precision)
    return result


def transpose(value):
    """A 2-D tile transposed."""
    from mlir.dialects import linalg

    rows, cols = value.type.shape
    out = empty(tensor_type([cols, rows], element_type(value)))
    return linalg.transpose(value, outs=[out], permutation=[1, 0]).results[0]


def program_id(axis: int):
    from mlir import ir

    i64 = ir.IntegerType.get_signless(64)
    return ir.Operation.create("attn.program_id", results=[ir.IndexType.get()],
                               attributes={"axis": ir.IntegerAttr.get(i64, axis)}).result


def _mixed(values: list) -> tuple[list, list[int]]:
    """(dynamic values, static entries) of offsets or sizes given as ints or index values."""
    from mlir import ir

    dynamic = ir.ShapedType.get_dynamic_size()
    return [v for v in values if not isinstance(v, int)], [v if isinstance(v, int) else dynamic for v in values]


def extract_slice(src, offsets: list, sizes: list, rank: int):
    """src[offsets : offsets + sizes] (unit strides), ints static and values dynamic, as a tensor
    of the last `rank` sizes (the leading unit dimensions dropped)."""
    from mlir.dialects import tensor

    dyn_offsets, static_offsets = _mixed(offsets)
    dyn_sizes, static_sizes = _mixed(sizes)
    result = tensor_type(static_sizes[len(sizes) - rank:], element_type(src))
    return tensor.ExtractSliceOp(result, src, dyn_offsets, dyn_sizes, [], static_offsets, static_sizes,
                                 [1] * len(sizes)).result


def insert_slice(piece, dest, offsets: list, sizes: list):
    """dest with `piece` written at offsets (unit strides); ints static, values dynamic."""
    from mlir.dialects import tensor

    dyn_offsets, static_offsets = _mixed(offsets)
    dyn_sizes, static_sizes = _mixed(sizes)
    return tensor.InsertSliceOp(piece, dest, dyn_offsets, dyn_sizes, [], static_offsets, static_sizes,
                                [1] * len(sizes)).result


def scatter_add(dest, values, indices: list):
    """dest with each element of the tile `values` added at the positions the index tiles
    `indices` (i32, one per dimension of dest) give (attn.scatter_add)."""
    from mlir import ir

    return ir.Operation.create("attn.scatter_add", results=[dest.type],
                               operands=[dest, values, *indices]).result


def reduce_dim(value, init, combine, dim: int):
    """Combine an f32 tile along dimension `dim` into `init` with `combine(x, acc)` (linalg.reduce;
    a 1-D tile into a 0-D one)."""
    from mlir import ir
    from mlir.dialects import linalg

    op = linalg.ReduceOp([init.type], [value], [init], [dim])
    f32_type = ir.F32Type.get()
    block = _block(op.regions[0], [f32_type, f32_type])
    with ir.InsertionPoint(block):
        linalg.YieldOp([combine(*block.arguments)])
    return op.result


def for_loop(count, carried: list, step) -> list:
    """scf.for over [0, count) (an int or an index value) carrying `carried`; `step(iv, values)`
    builds one iteration in the loop body and returns the new values. Returns the loop's results."""
    from mlir import ir
    from mlir.dialects import scf

    loop = scf.ForOp(index(0), index_value(count), index(1), carried)
    with ir.InsertionPoint(loop.body):
        scf.YieldOp(step(loop.induction_variable, list(loop.inner_iter_args)))
    return list(loop.results)


def identity_maps(rank: int, count: int):
    """The indexing maps of an element-wise op over `count` operands of rank `rank`."""
    from mlir import ir

    return ir.ArrayAttr.get([ir.AffineMapAttr.get(ir.AffineMap.get_identity(rank))] * count)


def _map(rank: int, dims: tuple[int, ...]):
    from mlir import ir

    return ir.AffineMap.get(rank, 0, [ir.AffineDimExpr.get(d) for d in dims])


def _block(region, types: list):
    """A new block of `region` with arguments of `types` at the current location."""
    from mlir import ir

    loc = ir.Location.current
    return region.blocks.append(*types, arg_locs=[loc] * len(types))



def _whole_blocks(length, rows: int, aligned: bool, past_end: bool) -> bool:
    """Whether a block of `rows` starting at a multiple of `rows` below `length` (`aligned`) is
    always whole: a static length that is a multiple of `rows`."""
    return aligned and not past_end and isinstance(length, int) and length % rows == 0

class KernelBuilder:
    """Builder helpers for one L1 kernel that replaces the function `func` holding `op`."""

    def __init__(self, op, func):
        self.op = op
        self.func = func
        self.func_block = func.regions[0].blocks[0]
        self.kernel_args: list = []  # the new kernel's arguments, once `function` made it
        # Closure arguments whose reads stepping back along the tile's last axis read their
        # mirrored copies instead (passes/mirror_reads.py): closure arg -> mirrored arg; that axis
        # as a mod region's argument counted from the end (-2: the queries, -1: the keys).
        self.mirrors: dict = {}
        self.mirror_axis = -1

    @staticmethod
    def roles(names: list[str]) -> dict:
        """The kernel attribute naming its arguments' roles (abi.ARG_ROLES)."""
        from mlir import ir

        return {abi.ARG_ROLES: ir.ArrayAttr.get([ir.StringAttr.get(r) for r in names])}

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

    def kernel_arg(self, value, what: str):
        """The kernel's image of the replaced function's argument `value`."""
        from mlir import ir

        if isinstance(value.owner, ir.Block) and value.owner == self.func_block:
            return self.kernel_args[ir.BlockArgument(value).arg_number]
        raise fail(self.op, f"{what} must be an argument of the enclosing function")

    def inline(self, region, args: list, constants_first: bool = False, result: int = 0, created: list | None = None):
        """Clone the ops of a one-block mod region at the insertion point, its block arguments
        bound to `args`; returns the image of the value it yields (of its `result`-th one). Of the outer values it reads,
        the replaced function's arguments become the kernel's and constants are cloned here:
        where first read, or with `constants_first` all before the region's ops, in the order
        they are first read. The clones are appended to `created`, if given."""

        block = region.blocks[0]
        images = dict(zip(block.arguments, args))

        def image(value):
            if value not in images:
                if constant_op(value) is not None:
                    clone = constant_op(value).clone()
                    images[value] = clone.result
                    if created is not None:
                        created.append(clone)
                else:
                    images[value] = self.kernel_arg(value, "a value a region reads (other than a constant)")
            return images[value]

        if constants_first:
            local = set(block.arguments)
            for op in block.operations:
                for value in op.operation.operands:
                    if value not in local and constant_op(value) is not None:
                        image(value)
                local.update(op.operation.results)
        for op in block.operations:
            operation = op.operation
            if operation.name == "gpu.yield":
                return image(operation.operands[result])
            if self.mirrors and operation.name == "tensor.extract":
                mirrored = self._mirrored_read(operation, block, image)
                if mirrored is not None:
                    images[operation.results[0]] = mirrored
                    continue
            operands = [image(v) for v in operation.operands]
            clone = operation.clone()
            for i, value in enumerate(operands):
                clone.operands[i] = value
            images.update(zip(operation.results, clone.results))
            if created is not None:
                created.append(clone)
        raise fail(self.op, "a mod region must end with gpu.yield")

    def _mirrored_read(self, extract, block, image):
        """The image of a mod region's tensor.extract read from its source's mirrored copy, when
        the source has one and the read steps back along the tile's last axis (`mirror_axis`);
        None otherwise."""
        from mlir.dialects import tensor

        from .mirror_reads import emit, mirror_of

        mirrored_arg = self.mirrors.get(image(extract.operands[0]))
        along = block.arguments[len(block.arguments) + self.mirror_axis]
        mirror = mirrored_arg is not None and mirror_of(extract, along)
        if not mirror:
            return None
        with extract.location:  # the user's source line
            indices = [image(v) for v in extract.operands[1:-1]] + [emit(mirror, image)]
            return tensor.ExtractOp(mirrored_arg, indices).result

    def inline_on_score(self, region, raw, scale: float, args: list, factor: float | None = None):
        """The mod `region` (a score_mod, or its gradient) on the score raw * scale, its other
        block arguments bound to `args`, with the mod's products and quotients of the score by
        constants read from `raw` with the constant in the scale (a soft cap's s / c: one
        multiply instead of a multiply and a divide per score); with `factor`, factor times its
        value, the factor distributed through it (`scaled_mods`: the log2-domain softmax's
        log2(e) rides on the score's scale and the mod's constants instead of costing a multiply
        per score)."""
        from mlir.dialects import arith

        from .scaled_mods import rewrite

        created = []
        score = raw
        if scale != 1.0:
            factor_value = f32(scale)
            score = arith.mulf(raw, factor_value)
            created = [factor_value.owner.operation, score.owner.operation]
        value = self.inline(region, [score] + args, created=created)
        floats = [a for a in args if not isinstance(a, (int, float)) and str(a.type) == "f32"]
        return rewrite(value, score, lambda k: arith.mulf(raw, f32(scale * k)), created, factor, floats)

    def generic(self, ins: list[tuple], out_type, body, rank: int = 2, iterators: list[str] | None = None,
                init=None, out_dims: tuple[int, ...] | None = None):
        """A linalg.generic; `ins` are (value, dims of its indexing map) and `body(args)` returns
        the yielded scalar, built inside the body (it may use linalg.index). Without `init` the
        output starts as tensor.empty; with `init` (the accumulator of reduction iterators) the
        body also gets the output element as its last argument. Iterators default to parallel."""
        from mlir import ir
        from mlir.dialects import linalg

        accumulates = init is not None
        if init is None:
            init = empty(out_type)
        maps = [_map(rank, dims) for _, dims in ins] + [_map(rank, out_dims or tuple(range(rank)))]
        kinds = [ir.Attribute.parse(f"#linalg.iterator_type<{it}>") for it in iterators or ["parallel"] * rank]
        op = linalg.GenericOp([out_type], [v for v, _ in ins], [init],
                              ir.ArrayAttr.get([ir.AffineMapAttr.get(m) for m in maps]), ir.ArrayAttr.get(kinds))
        block = _block(op.regions[0], [element_type(v) for v, _ in ins] + [out_type.element_type])
        with ir.InsertionPoint(block):
            args = list(block.arguments)
            linalg.YieldOp([body(args if accumulates else args[:-1])])
        return op.result

    def reduce_rows(self, value, init, combine):
        """Combine a 2-D tile along its rows (dimension 1) into `init` with `combine(x, acc)`."""
        return reduce_dim(value, init, combine, 1)

    def tile_max(self, value, floor: float):
        """The largest element of an f32 2-D tile, or `floor` if that is larger, as a scalar."""
        from mlir.dialects import arith, tensor

        rows = self.reduce_rows(value, fill(f32(floor), empty(tensor_type([value.type.shape[0]]))), arith.maximumf)
        return tensor.extract(reduce_dim(rows, fill(f32(floor), empty(tensor_type([]))), arith.maximumf, 0), [])

    def row_sum(self, value):
        """The row sums of an f32 2-D tile."""
        from mlir.dialects import arith

        return self.reduce_rows(value, zeros([value.type.shape[0]]), arith.addf)

    def rows_left(self, start, length, rows: int, past_end: bool = False, aligned: bool = False):
        """min(length - start, rows), and at least 0 with `past_end`; a constant `rows` where every
        block is whole (`aligned`, see `load_tile`)."""
        from mlir.dialects import arith

        if _whole_blocks(length, rows, aligned, past_end):
            return index(rows)
        valid = arith.minsi(arith.subi(index_value(length), start), index(rows))
        return arith.maxsi(valid, index(0)) if past_end else valid

    def load_tile(self, src, coords: list, start, length, rows: int, width: int | None, col=0,
                  past_end: bool = False, aligned: bool = False):
        """Rows [start, start + rows) of src[coords..., :, col:col + width] (or of the 1-D
        src[coords..., :] when `width` is None), zero-padded past row `length` (an int or an index
        value); `past_end` allows
        a start at or beyond `length` (an all-zero tile). `col` is an int or an index value.
        `aligned`: start is a multiple of `rows` below `length` (a block's first row); then with
        a static length that is a multiple of `rows` every tile is whole, and the load is a plain
        static slice: the lowerings read it without row masks (Triton) or bounds checks (CPU)."""
        from mlir import ir
        from mlir.dialects import arith, tensor

        elt = element_type(src)
        if _whole_blocks(length, rows, aligned, past_end):
            ones = [1] * len(coords)
            if width is None:
                return extract_slice(src, list(coords) + [start], ones + [rows], 1)
            return extract_slice(src, list(coords) + [start, col], ones + [rows, width], 2)
        dynamic = ir.ShapedType.get_dynamic_size()
        valid = self.rows_left(start, length, rows, past_end)
        if past_end:
            # A slice may be empty but must start inside the tensor.
            start = arith.minsi(start, index_value(length))
        pad = arith.subi(index(rows), valid)
        ones = [1] * len(coords)
        if width is None:
            piece = extract_slice(src, list(coords) + [start], ones + [valid], 1)
            padded = tensor.PadOp(tensor_type([rows], elt), piece, [], [pad], [0], [dynamic])
        else:
            piece = extract_slice(src, list(coords) + [start, col], ones + [valid, width], 2)
            padded = tensor.PadOp(tensor_type([rows, width], elt), piece, [], [pad], [0, 0], [dynamic, 0])
        block = _block(padded.regions[0], [ir.IndexType.get()] * (1 if width is None else 2))
        with ir.InsertionPoint(block):
            tensor.YieldOp(arith.constant(elt, 0.0))
        return padded.result
