"""`attn-cpu-lower-vectors`: on the bufferized kernels, accumulators are hoisted out of reduction
loops into registers, contractions become outer products, transfers 1-D loads and stores, and
gathers scalar loads: the vector forms the LLVM conversion takes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from . import ModulePass
from .cpu_support import fail, rows_padded_in_memory, run_transform, walk

# After bufferization: accumulators stay in registers across the reduction loop, and vector ops
# are lowered to the 1-D forms the LLVM conversion takes. Each pattern set is applied on its own,
# in this order (the order upstream's former `lower_vectors` transform used); applied together,
# some of them undo each other forever.
VECTOR_LOWERING = (
    'vector.lower_contraction lowering_strategy = "outerproduct"',
    "vector.transfer_permutation_patterns",
    'vector.lower_multi_reduction lowering_strategy = "innerreduction"',
    'vector.split_transfer_full_partial split_transfer_strategy = "vector-transfer"',
    "vector.transfer_to_scf max_transfer_rank = 1 full_unroll = true",
    "vector.lower_transfer max_transfer_rank = 1",
    "vector.lower_shape_cast",
    'vector.lower_transpose lowering_strategy = "shuffle_1d"',
    "vector.lower_outerproduct",
    "vector.lower_broadcast",
    "canonicalization",
)
VECTOR_LOWERING_SCRIPT = """
module attributes {{transform.with_named_sequence}} {{
  transform.named_sequence @__transform_main(%root: !transform.any_op {{transform.readonly}}) {{
    %func = transform.structured.match ops{{["func.func"]}} in %root : (!transform.any_op) -> !transform.any_op
    %hoisted = transform.structured.hoist_redundant_vector_transfers %func : (!transform.any_op) -> !transform.any_op
{steps}
    transform.yield
  }}
}}
""".format(steps="\n".join(f"    transform.apply_patterns to %hoisted {{ transform.apply_patterns.{p} }} : !transform.any_op"
                           for p in VECTOR_LOWERING))


@dataclass(frozen=True)
class LowerVectors(ModulePass):
    name: ClassVar[str] = "attn-cpu-lower-vectors"
    summary: ClassVar[str] = ("CPU lowering: keep accumulators in registers across reduction loops and "
                              "lower contractions, transfers and gathers to 1-D vector ops and loads")

    def apply(self, module_op) -> None:
        run_transform(module_op, VECTOR_LOWERING_SCRIPT)
        store_padded_rows(module_op)
        lower_gathers(module_op)


def store_padded_rows(module_op) -> None:
    """Store a vector whose rows are not a power of two long into a staging buffer one row at a time.

    `split_transfer_full_partial` stages a partial tile (the last chunk of a linear recurrence,
    Dk = 5 or 12) by storing the whole vector through a `vector.type_cast` of the buffer; LLVM pads
    a row of 5 floats to 8 in memory, so that store would overrun the buffer. Upstream's split has
    no per-row form, so the stores of such views are rewritten here into one `vector.store` per
    row; the buffer keeps its scalar layout, which the tile's later row loads read.
    """
    import itertools

    from mlir import ir
    from mlir.dialects import arith, vector

    for op in walk(module_op, "vector.type_cast"):
        view = ir.MemRefType(op.results[0].type)
        rows = ir.VectorType(view.element_type) if isinstance(view.element_type, ir.VectorType) else None
        if rows is None or rows.rank < 2 or not rows_padded_in_memory(rows):
            continue
        users = [use.owner for use in op.results[0].uses]
        if not all(u.name == "memref.store" and u.operands[1] == op.results[0] and len(u.operands) == 2
                   for u in users):
            continue  # attn-cpu-legalize-for-llvm reports a view used otherwise
        buffer = op.operands[0]
        index = ir.IndexType.get(op.context)
        for store in users:
            with op.context, store.location, ir.InsertionPoint(store):
                zero = arith.constant(index, 0)
                for position in itertools.product(*(range(n) for n in rows.shape[:-1])):
                    row = vector.extract(store.operands[0], [], list(position))
                    vector.store(row, buffer, [arith.constant(index, i) for i in position] + [zero])
            store.erase()
        op.erase()


def lower_gathers(module_op) -> None:
    """Replace each `vector.gather` from a memref by one scalar load per lane, behind a check for
    positions that turn out consecutive (`_consecutive_or`).

    The vectorizer turns a closure-tensor read inside a linalg body (`doc[kv_idx]`) into a gather.
    Upstream lowers gathers to LLVM only from memrefs of static unit innermost stride, and its
    scalarizing pattern (Gather1DToConditionalLoads) is neither a pass nor a transform op; a
    closure tensor has dynamic strides. `memref.load` takes any strides; masked-off lanes load
    nothing.
    """
    from mlir import ir

    for op in walk(module_op, "vector.gather"):
        gather = op.opview
        base = gather.base
        if not isinstance(base.type, ir.MemRefType):
            continue
        shape = list(base.type.shape)
        if any(ir.ShapedType.is_dynamic_size(d) for d in shape):
            raise fail(op, "a gather from a dynamically shaped memref is not supported")
        with op.context, op.location, ir.InsertionPoint(op):
            flat = _linear_offset(gather.offsets, shape)
            source = _unit_stride_source(base) if _is_true_splat(gather.mask) else None
            if source is not None and math.prod(op.results[0].type.shape) <= shape[-1]:
                result = _consecutive_or(gather, source, shape, flat)
            else:
                result = _lane_loads(gather, base, shape, flat)
        op.results[0].replace_all_uses_with(result)
        op.erase()


def _index(n: int):
    from mlir import ir
    from mlir.dialects import arith

    return arith.constant(ir.IndexType.get(), n)


def _linear_offset(offsets, shape: list[int]):
    """The row-major position of the gather's base offsets in a memref of `shape`."""
    from mlir.dialects import arith

    flat = None
    for d, offset in enumerate(offsets):
        stride = math.prod(shape[d + 1:])
        term = arith.muli(offset, _index(stride)) if stride != 1 else offset
        flat = term if flat is None else arith.addi(flat, term)
    return flat


def _coordinates(position, shape: list[int]) -> list:
    """The indices into a memref of `shape` of the row-major `position`."""
    from mlir.dialects import arith

    coords = []
    for d in reversed(range(len(shape))):
        coords.append(arith.remui(position, _index(shape[d])) if d else position)
        if d:
            position = arith.divui(position, _index(shape[d]))
    return coords[::-1]


def _lane_index(gather, lane: list[int]):
    from mlir import ir
    from mlir.dialects import arith, vector

    value = vector.extract(gather.indices, [], lane)
    return value if value.type == ir.IndexType.get() else arith.index_cast(ir.IndexType.get(), value)


def _lane_loads(gather, base, shape: list[int], flat):
    """The gather as one scalar load per lane (masked-off lanes take the pass-through value)."""
    from mlir import ir
    from mlir.dialects import arith, memref, scf, vector

    result_type = gather.result.type
    all_true = _is_true_splat(gather.mask)
    elements = []
    for lane in _lane_positions(list(result_type.shape)):
        coords = _coordinates(arith.addi(flat, _lane_index(gather, lane)), shape)
        if all_true:
            elements.append(memref.load(base, coords))
            continue
        branch = scf.IfOp(vector.extract(gather.mask, [], lane), [result_type.element_type], has_else=True)
        with ir.InsertionPoint(branch.then_block):
            scf.YieldOp([memref.load(base, coords)])
        with ir.InsertionPoint(branch.else_block):
            scf.YieldOp([vector.extract(gather.pass_thru, [], lane)])
        elements.append(branch.results[0])
    return vector.from_elements(result_type, elements)


def _unit_stride_source(base):
    """`base`, or the memref a `memref.cast` made it from, if its innermost stride is 1 (static);
    else None. Bufferization casts a closure tensor's [?, 1] strides to [?, ?] for the gather."""
    from mlir import ir

    owner = getattr(base.owner, "operation", None)
    cast_from = owner.operands[0] if owner is not None and owner.name == "memref.cast" else None
    for candidate in (base, cast_from):
        if candidate is not None and ir.MemRefType(candidate.type).get_strides_and_offset()[0][-1] == 1:
            return candidate
    return None


def _consecutive_or(gather, source, shape: list[int], flat):
    """The gather as one vector load from `source` (`base` with a unit innermost stride) where, at
    run time, its positions are consecutive and inside one row, else lane by lane (an scf.if).

    A read whose index ascends by one along the keys but is clamped into the table at run time (a
    relative-position table read at a query's position in a cache, q_idx + offset[b] - kv_idx,
    mirrored) stays a gather for the vectorizer, which cannot see that the clamp leaves a row's
    window whole; the check costs a compare and a reduction per vector."""
    import numpy as np
    from mlir import ir
    from mlir.dialects import arith, scf, vector

    result_type = gather.result.type
    lanes = math.prod(result_type.shape)
    index_type = ir.VectorType.get(result_type.shape, ir.IndexType.get())
    indices = gather.indices
    if indices.type != index_type:
        indices = arith.index_cast(index_type, indices)
    first = vector.extract(indices, [], [0] * len(result_type.shape))
    steps = ir.DenseElementsAttr.get(np.arange(lanes, dtype=np.int64).reshape(result_type.shape), type=index_type)
    equal = arith.cmpi(arith.CmpIPredicate.eq, indices, arith.addi(vector.broadcast(index_type, first),
                                                                    arith.constant(index_type, steps)))
    flat_equal = vector.shape_cast(ir.VectorType.get([lanes], ir.IntegerType.get_signless(1)), equal)
    consecutive = vector.reduction(ir.IntegerType.get_signless(1), vector.CombiningKind.AND, flat_equal)
    coords = _coordinates(arith.addi(flat, first), shape)
    in_row = arith.cmpi(arith.CmpIPredicate.ule, arith.addi(coords[-1], _index(lanes)), _index(shape[-1]))
    branch = scf.IfOp(arith.andi(consecutive, in_row), [result_type], has_else=True)
    with ir.InsertionPoint(branch.then_block):
        row = vector.load(ir.VectorType.get([lanes], result_type.element_type), source, coords)
        scf.YieldOp([vector.shape_cast(result_type, row)])
    with ir.InsertionPoint(branch.else_block):
        scf.YieldOp([_lane_loads(gather, gather.base, shape, flat)])
    return branch.results[0]


def _lane_positions(shape: list[int]) -> list[list[int]]:
    positions = [[]]
    for extent in shape:
        positions = [p + [i] for p in positions for i in range(extent)]
    return positions


def _is_true_splat(value) -> bool:
    from mlir import ir

    owner = value.owner
    if not isinstance(owner, ir.OpView) or owner.operation.name != "arith.constant":
        return False
    attr = owner.operation.attributes["value"]
    return isinstance(attr, ir.DenseIntElementsAttr) and attr.is_splat and bool(attr.get_splat_value())
