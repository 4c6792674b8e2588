"""`attn-cpu-vectorize`: tile the linalg ops of each kernel to register-sized blocks and turn them
into vector ops, still on tensors; a tile load (`tensor.pad` of a slice) becomes a masked transfer.
An op that reads a tensor's elements (a closure table) runs a row at a time, its index
subtractions written as additions where that lets upstream's vectorizer read a row's elements
with one contiguous load (`_subtractions_as_additions`, hand-written: no upstream pattern
rewrites an index for the vectorizer's contiguity check).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from . import ModulePass, option
from .cpu_support import lowered_kernels, run_transform, walk

# Register tiles by vector width in bits: a matmul runs as (rows x columns) outer products, one
# reduction step at a time, so its accumulator stays in vector registers. At 512 bits 4x64 takes 16
# of the 32 zmm registers with one broadcast per four multiply-adds (8x32 needs two: on the 2-core
# AMD EPYC with AVX-512 the causal demo's full attention ran 3% faster with 4x64 and 2x64 than with
# 8x32). With 16 registers (AVX2's ymm, SSE's and NEON's 128-bit ones) 8x32
# spilled most accumulators to the stack in every step; 8 accumulators leave room for the row's
# vectors and the broadcast (2x32 on AVX2 measured fastest of 8x8, 4x16, 2x32, 8x16, 4x32).
MATMUL_TILES = {128: (2, 16), 256: (2, 32), 512: (4, 64)}
# Elementwise and row-reduction ops run ROW_TILES rows at a time, at most ROW_LENGTH elements of a
# row at once (ops over more than two loops, one row at a time). At 512 bits 4 rows of a 64-key
# tile are 16 zmm registers per value: with 8 rows exp2's temporaries spilled, and the demo's full
# attention ran 3-4% slower (rows 1, 2 and 4 ran level). The narrower widths keep the 8 rows they
# were measured with.
ROW_TILES = {128: 8, 256: 8, 512: 4}
ROW_LENGTH = 256
TRANSPOSE_TILE = 8
TILE_ATTR = "ae.cpu_tile"

# Tile and vectorize, through the transform dialect (upstream has no pass that tiles linalg ops).
VECTORIZE_SCRIPT = """
module attributes {{transform.with_named_sequence}} {{
  transform.named_sequence @__transform_main(%root: !transform.any_op {{transform.readonly}}) {{
{tiling}
    %func = transform.structured.match ops{{["func.func"]}} in %root : (!transform.any_op) -> !transform.any_op
    %vectorized = transform.structured.vectorize_children_and_apply_patterns %func
        {{vectorize_padding, vectorize_nd_extract}} : (!transform.any_op) -> !transform.any_op
    transform.yield
  }}
}}
"""

TILE_STEP = """    %t{n} = transform.structured.match attributes{{{attr} = {n} : i64}} in %root : (!transform.any_op) -> !transform.any_op
    %tiled{n}, %loops{n}:{loops} = transform.structured.tile_using_for %t{n} tile_sizes [{sizes}]
        : (!transform.any_op) -> ({results})"""


@dataclass(frozen=True)
class Vectorize(ModulePass):
    name: ClassVar[str] = "attn-cpu-vectorize"
    summary: ClassVar[str] = ("CPU lowering: tile matmuls to register tiles and elementwise ops and row "
                              "reductions to row blocks (ops that read a tensor's elements to single rows, their "
                              "reads contiguous where the index allows), then vectorize every linalg op (on "
                              "tensors)")

    vector_bits: int = option(512, "the target's vector register width in bits (128, 256 or 512), which "
                                   "sizes the matmuls' register tiles; the cpu preset passes the host's")

    def __post_init__(self):
        if self.vector_bits not in MATMUL_TILES:
            raise ValueError(f"vector-bits must be one of {', '.join(map(str, MATMUL_TILES))}, "
                             f"got {self.vector_bits}")

    def apply(self, module_op) -> None:
        kernels = lowered_kernels(module_op)
        for kernel in kernels:
            for generic in walk(kernel, "linalg.generic"):
                if _reads_elements(generic):
                    _subtractions_as_additions(generic)
        run_transform(module_op, _vectorize_script(kernels, MATMUL_TILES[self.vector_bits], ROW_TILES[self.vector_bits]))


def _tile_sizes(op, matmul_tile: tuple[int, int], row_tile: int) -> list[int] | None:
    """Tile sizes for one linalg op of a kernel (0: untiled), or None to vectorize it whole.

    Vectors stay near register size (LLVM unrolls a long vector into one instruction per
    register, so an op vectorized whole over thousands of elements takes seconds to compile, and
    the [C, C, Dk] scores of the GLA chunk, whole, take minutes and gigabytes), and every tile
    extent is a power of two: the vector lowering stages partial tiles in a buffer of scalars
    viewed as a vector (`vector.type_cast`), and LLVM pads a vector of 24 floats to 32 in memory,
    so a tile row of 24 would overrun that buffer.
    """
    from mlir import ir

    def fit(extent: int, cap: int) -> int:
        """The largest power of two that divides `extent` and is at most `cap`."""
        return min(extent & -extent, cap)

    def tile(extent: int, cap: int) -> int:
        size = fit(extent, cap)
        return 0 if size == extent else size

    shapes = [ir.ShapedType(v.type).shape for v in op.operands if isinstance(v.type, ir.ShapedType)]
    if op.name == "linalg.matmul":
        (m, _), (_, n) = shapes[0], shapes[1]
        return [fit(m, matmul_tile[0]), fit(n, matmul_tile[1]), 1]
    if op.name == "linalg.transpose":
        rows, cols = shapes[0]
        return [fit(rows, TRANSPOSE_TILE), fit(cols, TRANSPOSE_TILE)]
    if op.name not in ("linalg.generic", "linalg.reduce", "linalg.fill", "linalg.copy"):
        return None
    domain = _loop_extents(op) if op.name == "linalg.generic" else max(shapes, key=len)
    if not domain:
        return None
    if len(domain) == 1:
        size = tile(domain[0], ROW_LENGTH)
        return [size] if size else None
    if len(domain) == 2:
        # An op that reads a tensor's elements (a closure table, ALiBi's slope) runs a row at a
        # time: upstream's vectorizer makes every such read on a vector of several rows a gather,
        # and on one row a contiguous load or a broadcast where the index allows.
        rows = 1 if _reads_elements(op) else row_tile
        return [fit(domain[0], rows), tile(domain[1], ROW_LENGTH)]
    # Over more loops (the GLA chunk's scores, [C, C, Dk] with the sum over Dk innermost), one
    # row at a time: it runs as fast as 8 rows (measured) in a smaller loop body, and LLVM's
    # instruction scheduling takes time superlinear in a block's length.
    return [tile(n, 1) for n in domain[:-1]] + [tile(domain[-1], ROW_LENGTH)]


def _reads_elements(op) -> bool:
    """Whether `op`'s body reads a tensor's elements (tensor.extract)."""
    return bool(len(op.regions)) and any(inner.name == "tensor.extract"
                                         for inner in op.regions[0].blocks[0].operations)


def _subtractions_as_additions(generic) -> None:
    """Write each index subtraction `a - b` in `generic`'s body whose `b` does not read the
    innermost loop's index as `a + (0 - b)`: upstream's vectorizer takes a read as contiguous
    only where its index is built from that loop's index by additions (of constants and values
    the loop does not change), so a relative-position table read at kv_idx - q_idx + c was a
    gather, one element per lane."""
    from mlir import ir
    from mlir.dialects import arith

    body = generic.regions[0].blocks[0]
    innermost = len(ir.ArrayAttr(generic.attributes["iterator_types"])) - 1
    for op in list(body.operations):
        if op.name != "arith.subi" or not isinstance(op.results[0].type, ir.IndexType):
            continue
        a, b = op.operands
        if _reads_loop_index(b, innermost, body):
            continue
        with op.location, ir.InsertionPoint(op):
            total = arith.addi(a, arith.subi(arith.constant(ir.IndexType.get(), 0), b))
        op.results[0].replace_all_uses_with(total)
        op.erase()


def _reads_loop_index(value, dim: int, body) -> bool:
    """Whether `value` depends on `linalg.index dim` or on an element of the body's operands."""
    from mlir import ir

    if isinstance(value.owner, ir.Block):
        return value.owner == body
    op = value.owner
    if op.name == "linalg.index":
        return ir.IntegerAttr(op.attributes["dim"]).value == dim
    return op.parent == body.owner and any(_reads_loop_index(v, dim, body) for v in op.operands)


def _loop_extents(generic) -> list[int] | None:
    """The extent of each loop of a `linalg.generic`, read where an operand's indexing map uses the
    loop's index alone as a dimension (its operands' shapes alone do not say which loop is which:
    the [C, C] scores of the GLA chunk run over three loops); None if some loop has no such
    operand dimension."""
    from mlir import ir

    maps = [ir.AffineMapAttr(m).value for m in ir.ArrayAttr(generic.attributes["indexing_maps"])]
    extents: list[int | None] = [None] * maps[0].n_dims
    for value, indexing in zip(generic.operands, maps):
        if not isinstance(value.type, ir.ShapedType):
            continue
        for expr, extent in zip(indexing.results, ir.ShapedType(value.type).shape):
            if isinstance(expr, ir.AffineDimExpr):
                extents[expr.position] = extent
    return None if None in extents else extents


def _vectorize_script(kernels, matmul_tile: tuple[int, int], row_tile: int) -> str:
    """The tile-and-vectorize transform script for `kernels`; tags each op to tile with its group."""
    from mlir import ir

    groups: dict[tuple[int, ...], int] = {}
    for kernel in kernels:
        for op in walk(kernel, "linalg."):
            if any(isinstance(v.type, ir.ShapedType) and not ir.ShapedType(v.type).has_static_shape
                   for v in op.operands):
                continue
            sizes = _tile_sizes(op, matmul_tile, row_tile)
            if sizes is None:
                continue
            group = groups.setdefault(tuple(sizes), len(groups))
            op.attributes[TILE_ATTR] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64, op.context), group)
    steps = []
    for sizes, n in groups.items():
        loops = sum(1 for x in sizes if x)
        results = ", ".join(["!transform.any_op"] * (loops + 1))
        steps.append(TILE_STEP.format(n=n, attr=TILE_ATTR, loops=loops, sizes=", ".join(map(str, sizes)),
                                      results=results))
    return VECTORIZE_SCRIPT.format(tiling="\n".join(steps))
