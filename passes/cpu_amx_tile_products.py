"""`attn-cpu-amx-tile-products`: bf16 tile products on the host's AMX units (Intel's tile matrix
multiply: TDPBF16PS multiplies a 16x32 bf16 tile by a 32x16 one into a 16x16 f32 tile).

    %p = linalg.matmul ins(%a, %b : tensor<64x64xbf16>, tensor<64x128xbf16>) outs(%acc : tensor<64x128xf32>)
  becomes, on the buffers of the same tensors,
    %bv = B with its rows interleaved in pairs (AMX's layout of the right operand: row r holds
          B[2r, j] and B[2r + 1, j] side by side, for every column j)
    call @ae_amx_product_64x128x64(A, %bv, %result): for each 16x16 tile of the result, zero
          or the accumulator's tile, then per 32 steps of the sum amx.tile_load A's 16x32 tile
          and %bv's, amx.tile_mulf; amx.tile_store
    %p = the result buffer as a tensor

Why: the L1 kernels keep 16-bit operands on their products and the CPU otherwise computes them
in f32 (`attn-cpu-widen-matmul-operands`), 16 multiply-adds per FMA instruction; one AMX
instruction does 8192. Products are exact and summed in f32, as on GPUs' tensor cores; AMX reads
subnormal bf16 operands as zero.

Runs on tensors, before the vectorizer (which leaves the AMX and bufferization ops alone); the
operands are read through `bufferization.to_buffer` and the result made a tensor again with
`bufferization.to_tensor`, so one-shot bufferization places the buffers. K's transposed tile is
made from K itself (16 x 16 blocks of 32-bit pairs transposed by shuffles). A product whose rows
or columns are not a multiple of 16, whose sum is not a multiple of 32, or whose operand is a
padded tile load keeps the f32 path.
Hand-written: upstream has the AMX ops and their LLVM lowering but no pattern from linalg to them.
The kernel needs the process's permission for the tile registers (`arch_prctl`), which the CPU
backend requests before its first call (`ae_mlir.backends.cpu_cache.request_amx`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..core import abi
from . import ModulePass
from .cpu_support import walk

TILE_ROWS = 16       # rows of every AMX tile
TILE_SUM = 32        # bf16 elements a tile row of A holds: the sum's step


@dataclass(frozen=True)
class AmxTileProducts(ModulePass):
    name: ClassVar[str] = "attn-cpu-amx-tile-products"
    summary: ClassVar[str] = ("CPU lowering: bf16 x bf16 -> f32 tile products as AMX tile multiplies "
                              "(16x16 result tiles, the right operand's rows interleaved in pairs)")

    def apply(self, module_op) -> None:
        with module_op.context:
            for op in walk(module_op, "linalg.matmul"):
                if takes_amx(op):
                    _rewrite(op, module_op)


def takes_amx(op) -> bool:
    """Whether a linalg.matmul multiplies bf16 tiles into f32 ones at AMX's tile multiples, with
    the default indexing maps (row-major A and B), from tiles that are not padded loads."""
    from mlir import ir

    a, b, acc = (v.type for v in op.operands)
    if not all(isinstance(t, ir.RankedTensorType) and t.has_static_shape for t in (a, b, acc)):
        return False
    bf16, f32 = ir.BF16Type.get(), ir.F32Type.get()
    if (a.element_type, b.element_type, acc.element_type) != (bf16, bf16, f32):
        return False
    if "indexing_maps" in op.attributes and str(op.attributes["indexing_maps"]) != _DEFAULT_MAPS:
        return False
    (m, k), (_, n) = a.shape, b.shape
    if m % TILE_ROWS or n % TILE_ROWS or k % TILE_SUM:
        return False
    b_source = _transposed_operand(op.operands[1])
    return not any(_padded(v) for v in (op.operands[0], op.operands[1], b_source) if v is not None)


def _padded(value) -> bool:
    """Whether a tile is a padded load (tensor.pad: a tile past the sequence's end, lengths, pages,
    packed sequences). Such a tile, made a buffer of bf16, is read through a masked bf16 vector
    that lowers to a loop carrying the whole tile, which LLVM's x86 backend promotes element by
    element to f32: compiling one such kernel took minutes. Their products stay in f32."""
    from mlir import ir

    owner = value.owner
    return not isinstance(owner, ir.Block) and owner.name == "tensor.pad"


_DEFAULT_MAPS = ("[affine_map<(d0, d1, d2) -> (d0, d2)>, affine_map<(d0, d1, d2) -> (d2, d1)>, "
                 "affine_map<(d0, d1, d2) -> (d0, d1)>]")


def _strided(shape, element):
    """A memref type of `shape` with any offset and row stride and a unit inner stride (AMX loads
    rows of contiguous elements)."""
    from mlir import ir

    layout = ir.StridedLayoutAttr.get(ir.ShapedType.get_dynamic_stride_or_offset(),
                                      [ir.ShapedType.get_dynamic_stride_or_offset(), 1])
    return ir.MemRefType.get(shape, element, layout)


def _alloc(shape, element):
    """A buffer aligned for tile loads and stores."""
    from mlir import ir
    from mlir.dialects import memref

    return memref.AllocOp(ir.MemRefType.get(shape, element), [], [],
                          alignment=ir.IntegerAttr.get(ir.IntegerType.get_signless(64), 64)).result


def _buffer(value):
    """The buffer of a tensor operand, read only, with a unit inner stride."""
    from mlir import ir
    from mlir.dialects import bufferization, memref

    shape = list(value.type.shape)
    element = value.type.element_type
    dynamic = ir.ShapedType.get_dynamic_stride_or_offset()
    any_layout = ir.MemRefType.get(shape, element, ir.StridedLayoutAttr.get(dynamic, [dynamic, dynamic]))
    raw = bufferization.ToBufferOp(any_layout, value, read_only=True).result
    return memref.CastOp(_strided(shape, element), raw).result


def _interleaved_rows(b_buf, k: int, n: int):
    """B [k, n] as AMX's right operand [k / 2, 2 n]: row r is B's rows 2r and 2r + 1 interleaved."""
    from mlir import ir
    from mlir.dialects import arith, scf, vector

    bf16 = ir.BF16Type.get()
    packed = _alloc([k // 2, 2 * n], bf16)
    row = ir.VectorType.get([n], bf16)
    # LLVM's x86 backend without AVX512-BF16 moves bf16 vectors through f32 lane by lane: the rows
    # are interleaved as i16.
    row16 = ir.VectorType.get([n], ir.IntegerType.get_signless(16))
    index = ir.IndexType.get()
    c0, c1, c2 = (arith.constant(index, v) for v in (0, 1, 2))
    padding = arith.constant(bf16, 0.0)
    loop = scf.ForOp(c0, arith.constant(index, k // 2), c1)
    with ir.InsertionPoint(loop.body):
        r = loop.induction_variable
        even = arith.muli(r, c2)
        odd = arith.addi(even, c1)
        halves = [vector.bitcast(row16, _read_row(row, b_buf, at, c0, padding)) for at in (even, odd)]
        pair = vector.bitcast(ir.VectorType.get([2 * n], bf16), vector.InterleaveOp(*halves).result)
        vector.store(pair, packed, [r, c0])
        scf.YieldOp([])
    return packed


def _round_in_integers(a) -> None:
    """Where the left operand is made by an element-wise generic that truncates f32 to bf16 (P),
    write the truncation as integer rounding on 32-bit lanes: `arith-expand` picks a NaN's bits
    after narrowing to 16 bits, which LLVM's x86 backend lowers by splitting the compare masks of
    the f32 lanes into quarters; here the select stays on the f32 lanes' width."""
    from mlir import ir
    from mlir.dialects import arith

    owner = a.owner
    if isinstance(owner, ir.Block) or owner.name != "linalg.generic":
        return
    for inner in list(owner.regions[0].blocks[0].operations):
        if inner.name != "arith.truncf" or inner.results[0].type != ir.BF16Type.get():
            continue
        x = inner.operands[0]
        i32, i16 = ir.IntegerType.get_signless(32), ir.IntegerType.get_signless(16)
        with inner.location, ir.InsertionPoint(inner):
            bits = arith.bitcast(i32, x)
            odd = arith.andi(arith.shrui(bits, arith.constant(i32, 16)), arith.constant(i32, 1))
            rounded = arith.shrui(arith.addi(bits, arith.addi(odd, arith.constant(i32, 0x7FFF))),
                                  arith.constant(i32, 16))
            nan = arith.cmpf(arith.CmpFPredicate.UNO, x, x)
            picked = arith.select(nan, arith.constant(i32, 0x7FC0), rounded)
            narrow = arith.bitcast(ir.BF16Type.get(), arith.trunci(i16, picked))
        inner.results[0].replace_all_uses_with(narrow)
        inner.erase()


def _zeros(acc) -> bool:
    """Whether the accumulator is a tensor filled with 0 (the scores' product starts from zero
    tiles instead of loading them)."""
    from mlir import ir

    owner = acc.owner
    if isinstance(owner, ir.Block) or owner.name != "linalg.fill":
        return False
    value = owner.operands[0].owner
    if isinstance(value, ir.Block) or value.name != "arith.constant":
        return False
    return isinstance(value.attributes["value"], ir.FloatAttr) and ir.FloatAttr(value.attributes["value"]).value == 0.0


def _transposed_operand(b):
    """The tile whose transpose `b` is (a linalg.transpose used only by the product), or None."""
    from mlir import ir

    owner = b.owner
    if isinstance(owner, ir.Block) or owner.name != "linalg.transpose" or len(list(b.uses)) != 1:
        return None
    if list(owner.attributes["permutation"]) != [1, 0]:
        return None
    return owner.operands[0]


def _pairs_transposed(t_buf, n: int, k: int):
    """AMX's right operand for the product with T^T, T [n, k]: T's rows as n columns of k / 2
    pairs, transposed to [k / 2, 2 n]. A pair is 32 bits: blocks of 16 x 16 pairs are read as 16
    rows of i32 and transposed by two-row shuffles (`_transpose_16x16`)."""
    from mlir import ir
    from mlir.dialects import arith, vector

    bf16, i32 = ir.BF16Type.get(), ir.IntegerType.get_signless(32)
    packed = _alloc([k // 2, 2 * n], bf16)
    row16 = ir.VectorType.get([TILE_SUM], bf16)
    row32 = ir.VectorType.get([TILE_ROWS], i32)

    consts: dict = {}
    padding = arith.constant(bf16, 0.0)

    def at(v):
        if v not in consts:
            consts[v] = arith.constant(ir.IndexType.get(), v)
        return consts[v]

    for first in range(0, n, TILE_ROWS):
        for col in range(0, k, TILE_SUM):
            rows = [vector.bitcast(row32, _read_row(row16, t_buf, at(first + r), at(col), padding))
                    for r in range(TILE_ROWS)]
            for r, flipped in enumerate(_transpose_16x16(rows)):
                vector.store(vector.bitcast(row16, flipped), packed, [at(col // 2 + r), at(2 * first)])
    return packed


def _transpose_16x16(rows: list) -> list:
    """The transpose of 16 vectors of 16 lanes, in four steps: step b swaps bit b of the row and
    lane positions, so each new row takes its lanes from two old rows (one two-source shuffle,
    one AVX-512 permute instruction each)."""
    from mlir.dialects import vector

    for bit in (1, 2, 4, 8):
        new = []
        for r in range(TILE_ROWS):
            low, high = r & ~bit, r | bit
            mask = [((c & ~bit) | (r & bit)) + (TILE_ROWS if c & bit else 0) for c in range(TILE_ROWS)]
            new.append(vector.shuffle(rows[low], rows[high], mask))
        rows = new
    return rows


def _read_row(row_type, buf, i, j, padding):
    """Row i of a 2-D buffer from column j on (a transfer: the buffer's inner stride is only known
    to be 1 once `attn-cpu-pin-unit-inner-stride` has run)."""
    from mlir import ir
    from mlir.dialects import vector

    identity = ir.AffineMap.get_minor_identity(2, 1)
    return vector.TransferReadOp(row_type, buf, [i, j], ir.AffineMapAttr.get(identity), padding,
                                 ir.ArrayAttr.get([ir.BoolAttr.get(True)])).result


def _rewrite(op, module_op) -> None:
    from mlir import ir
    from mlir.dialects import bufferization, func

    a, b, acc = op.operands
    (m, k), (_, n) = a.type.shape, b.type.shape
    f32 = ir.F32Type.get(op.context)
    with op.context, op.location, ir.InsertionPoint(op):
        transposed = _transposed_operand(b)
        _round_in_integers(a)
        operands = [_buffer(a)]
        if transposed is not None:
            operands.append(_pairs_transposed(_buffer(transposed), n, k))
        else:
            operands.append(_interleaved_rows(_buffer(b), k, n))
        if not _zeros(acc):
            operands.append(_buffer(acc))
        result = _alloc([m, n], f32)
        product = _product_function(module_op, m, n, k, len(operands) == 3)
        func.CallOp(product, operands + [result])
        tensor = bufferization.ToTensorOp(op.results[0].type, result, restrict=True, writable=True).result
    op.results[0].replace_all_uses_with(tensor)
    op.erase()
    if transposed is not None and not list(b.uses):
        b.owner.erase()


def _product_function(module_op, m: int, n: int, k: int, accumulates: bool):
    """The function (one per shape) that multiplies A [m, k] by the repacked B into a result [m, n],
    from the accumulator's tiles or from zero ones. Kept out of the kernel (noinline): LLVM's
    register coalescer ran for minutes on a packed-sequence kernel with the tile code inline
    (under a second without it)."""
    from mlir import ir
    from mlir.dialects import arith, func, scf

    name = abi.amx_product_name(m, n, k, accumulates)
    body = module_op.regions[0].blocks[0]
    for existing in body.operations:
        if existing.operation.name == "func.func" and ir.StringAttr(existing.operation.attributes["sym_name"]).value == name:
            return existing
    bf16, f32, index = ir.BF16Type.get(), ir.F32Type.get(), ir.IndexType.get()
    types = [_strided([m, k], bf16), ir.MemRefType.get([k // 2, 2 * n], bf16)]
    if accumulates:
        types.append(_strided([m, n], f32))
    types.append(ir.MemRefType.get([m, n], f32))
    with ir.Location.unknown(), ir.InsertionPoint.at_block_begin(body):
        function = func.FuncOp(name, ir.FunctionType.get(types, []), visibility="private")
        function.attributes["passthrough"] = ir.ArrayAttr.get([ir.StringAttr.get("noinline")])
    entry = function.add_entry_block()
    a_buf, packed, *acc, result = entry.arguments
    a_tile = ir.Type.parse(f"!amx.tile<{TILE_ROWS}x{TILE_SUM}xbf16>")
    c_tile = ir.Type.parse(f"!amx.tile<{TILE_ROWS}x{TILE_ROWS}xf32>")
    with ir.Location.unknown(), ir.InsertionPoint(entry):
        steps = range(k // TILE_SUM)
        const = {v: arith.constant(index, v) for v in {0, 2, m, n, TILE_ROWS}
                 | {s * TILE_SUM for s in steps} | {s * TILE_SUM // 2 for s in steps}}
        rows = scf.ForOp(const[0], const[m], const[TILE_ROWS])
        with ir.InsertionPoint(rows.body):
            cols = scf.ForOp(const[0], const[n], const[TILE_ROWS])
            with ir.InsertionPoint(cols.body):
                i, j = rows.induction_variable, cols.induction_variable
                tile = (_amx("amx.tile_load", [acc[0], i, j], c_tile) if acc
                        else _amx("amx.tile_zero", [], c_tile))
                j2 = arith.muli(j, const[2])
                # The sum is unrolled: a tile value carried by a loop is something LLVM's AMX
                # lowering may spill through memory.
                for step in steps:
                    lhs = _amx("amx.tile_load", [a_buf, i, const[step * TILE_SUM]], a_tile)
                    rhs = _amx("amx.tile_load", [packed, const[step * TILE_SUM // 2], j2], a_tile)
                    tile = _amx("amx.tile_mulf", [lhs, rhs, tile], c_tile)
                ir.Operation.create("amx.tile_store", operands=[result, i, j, tile],
                                    attributes={"operandSegmentSizes": _segments(1, 2, 1, 0)})
                scf.YieldOp([])
            scf.YieldOp([])
        func.ReturnOp([])
    return function


def _amx(name: str, operands: list, result_type):
    """An AMX op made generically (the bindings have no builders for the dialect); a tile load's
    operands are its buffer and two indices."""
    from mlir import ir

    attributes = {"operandSegmentSizes": _segments(1, 2, 0)} if name == "amx.tile_load" else None
    return ir.Operation.create(name, results=[result_type], operands=operands, attributes=attributes).results[0]


def _segments(*sizes: int):
    from mlir import ir

    return ir.DenseI32ArrayAttr.get(list(sizes))
