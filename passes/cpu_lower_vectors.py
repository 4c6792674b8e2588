"""`attn-cpu-lower-vectors`: on the bufferized kernels, accumulators are hoisted out of reduction
loops into registers, contractions become outer products, transfers 1-D loads and stores, and
gathers scalar loads: the vector forms the LLVM conversion takes.
"""
from __future__ import annotations

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
    """Replace each `vector.gather` from a memref by one scalar load per lane.

    The vectorizer turns a closure-tensor read inside a linalg body (`doc[kv_idx]`) into a gather.
    Upstream lowers gathers to LLVM only from memrefs of static unit innermost stride, and its
    scalarizing pattern (Gather1DToConditionalLoads) is neither a pass nor a transform op; a
    closure tensor has dynamic strides. `memref.load` takes any strides; masked-off lanes load
    nothing.
    """
    from mlir import ir
    from mlir.dialects import arith, memref, scf, vector

    for op in walk(module_op, "vector.gather"):
        gather = op.opview
        base = gather.base
        if not isinstance(base.type, ir.MemRefType):
            continue
        shape = list(base.type.shape)
        if any(ir.ShapedType.is_dynamic_size(d) for d in shape):
            raise fail(op, "a gather from a dynamically shaped memref is not supported")
        result_type = op.results[0].type
        elt = result_type.element_type
        lanes = _lane_positions(list(result_type.shape))
        all_true = _is_true_splat(gather.mask)
        with op.context, op.location, ir.InsertionPoint(op):
            index = ir.IndexType.get()

            def idx(n):
                return arith.constant(index, n)

            flat = None
            for d, offset in enumerate(gather.offsets):
                stride = 1
                for extent in shape[d + 1:]:
                    stride *= extent
                term = arith.muli(offset, idx(stride)) if stride != 1 else offset
                flat = term if flat is None else arith.addi(flat, term)
            elements = []
            for lane in lanes:
                lane_index = vector.extract(gather.indices, [], lane)
                if lane_index.type != index:
                    lane_index = arith.index_cast(index, lane_index)
                position = arith.addi(flat, lane_index)
                coords = []
                for d in reversed(range(len(shape))):
                    coords.append(arith.remui(position, idx(shape[d])) if d else position)
                    if d:
                        position = arith.divui(position, idx(shape[d]))
                coords.reverse()
                if all_true:
                    elements.append(memref.load(base, coords))
                    continue
                keep = vector.extract(gather.mask, [], lane)
                branch = scf.IfOp(keep, [elt], has_else=True)
                with ir.InsertionPoint(branch.then_block):
                    scf.YieldOp([memref.load(base, coords)])
                with ir.InsertionPoint(branch.else_block):
                    scf.YieldOp([vector.extract(gather.pass_thru, [], lane)])
                elements.append(branch.results[0])
            result = vector.from_elements(result_type, elements)
        op.results[0].replace_all_uses_with(result)
        op.erase()


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
