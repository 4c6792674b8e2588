"""`attn-cpu-lower-scatter`: each attn.scatter_add becomes a loop nest that reads every value and
index and adds the value into the destination element (tensor.extract / tensor.insert, which
bufferization turns into a load and a store in place). Where no index varies along a tile axis
(it depends on the head, or on the query row alone: learnable ALiBi slopes, a per-row table)
the values are summed along that axis first (linalg.reduce, which vectorizes) and the loops
cover the remaining axes only: one add per tile for the slopes instead of one per score. Which
axes an index tile varies along is read from the linalg.generic that computes it.

Hand-written: upstream's tensor.scatter has no lowering, and no upstream op adds into a tensor at
computed indices. The adds are plain, not atomic: the CPU backend gives each thread its own copy
of a scatter destination and sums the copies after the call (`ae_mlir.backends.cpu`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from . import ModulePass
from .cpu_support import walk


@dataclass(frozen=True)
class LowerScatter(ModulePass):
    name: ClassVar[str] = "attn-cpu-lower-scatter"
    summary: ClassVar[str] = ("CPU lowering: attn.scatter_add to a loop nest of element reads and in-place adds "
                              "(indices outside the destination add nothing), the values summed first along the "
                              "tile axes no index varies on")

    def apply(self, module_op) -> None:
        for op in walk(module_op, "attn.scatter_add"):
            _lower(op)


def _lower(op) -> None:
    from mlir import ir
    from mlir.dialects import arith, scf, tensor

    from .l1_builders import for_loop, index, reduce_dim, zeros

    dest, values, *indices = op.operands
    rank = len(values.type.shape)
    varying = sorted(set().union(*(varying_axes(i) for i in indices)))
    bounds = list(dest.type.shape)
    with op.location, ir.InsertionPoint(op):
        for axis in reversed(range(rank)):
            if axis not in varying:
                kept = [n for d, n in enumerate(values.type.shape) if d != axis]
                values = reduce_dim(values, zeros(kept), arith.addf, axis)

        def add(at: list, current):
            # `at`: the position along the varying axes; the indices are read at 0 on the others.
            tile_at = [at[varying.index(d)] if d in varying else index(0) for d in range(rank)]
            where = [arith.index_cast(ir.IndexType.get(), tensor.extract(i, tile_at)) for i in indices]
            inside = None
            for position, bound in zip(where, bounds):
                ok = arith.andi(arith.cmpi(arith.CmpIPredicate.sge, position, index(0)),
                                arith.cmpi(arith.CmpIPredicate.slt, position, index(bound)))
                inside = ok if inside is None else arith.andi(inside, ok)
            if inside is None:
                inside = arith.constant(ir.IntegerType.get_signless(1), 1)
            branch = scf.IfOp(inside, [dest.type], has_else=True)
            with ir.InsertionPoint(branch.then_block):
                total = arith.addf(tensor.extract(current, where), tensor.extract(values, at))
                scf.YieldOp([tensor.insert(total, current, where)])
            with ir.InsertionPoint(branch.else_block):
                scf.YieldOp([current])
            return branch.results[0]

        def nest(at: list, current):
            if len(at) == len(varying):
                return add(at, current)
            extent = values.type.shape[len(at)]
            return for_loop(extent, [current], lambda iv, carried: [nest(at + [iv], carried[0])])[0]

        result = nest([], dest)
    op.result.replace_all_uses_with(result)
    op.erase()


def varying_axes(tile) -> set[int]:
    """The axes along which `tile` may vary: where a linalg.generic computes it, those of the
    linalg.index ops and of the inputs (through their indexing maps) that reach its yielded
    value; every axis where anything else made it."""
    from mlir import ir

    every = set(range(len(tile.type.shape)))
    if isinstance(tile.owner, ir.Block) or tile.owner.name != "linalg.generic":
        return every
    generic = tile.owner.opview
    body = generic.regions[0].blocks[0]
    inputs = list(generic.inputs)
    maps = [ir.AffineMapAttr(m).value for m in generic.attributes["indexing_maps"]]
    axes: set[int] = set()
    todo = [body.operations[len(body.operations) - 1].operands[ir.OpResult(tile).result_number]]
    seen: set = set()
    while todo:
        value = todo.pop()
        if value in seen:
            continue
        seen.add(value)
        if isinstance(value.owner, ir.Block):
            arg = ir.BlockArgument(value)
            if arg.owner != body:
                continue  # an enclosing loop's: the same over the whole tile
            if arg.arg_number >= len(inputs):
                return every  # the output's own element
            results = list(maps[arg.arg_number].results)
            for axis in varying_axes(inputs[arg.arg_number]):
                if not ir.AffineDimExpr.isinstance(results[axis]):
                    return every
                axes.add(ir.AffineDimExpr(results[axis]).position)
            continue
        producer = value.owner
        if not _inside(producer, generic):
            continue  # defined before the generic: the same over the whole tile
        if len(producer.regions):
            return every
        if producer.name == "linalg.index":
            axes.add(ir.IntegerAttr(producer.attributes["dim"]).value)
        todo.extend(producer.operands)
    return axes


def _inside(op, ancestor) -> bool:
    parent = op.parent
    while parent is not None:
        if parent == ancestor.operation:
            return True
        parent = parent.parent
    return False
