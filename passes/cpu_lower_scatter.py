"""`attn-cpu-lower-scatter`: each attn.scatter_add becomes a loop nest over its tile that reads
every value and index and adds the value into the destination element (tensor.extract /
tensor.insert, which bufferization turns into a load and a store in place).

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
                              "(indices outside the destination add nothing)")

    def apply(self, module_op) -> None:
        for op in walk(module_op, "attn.scatter_add"):
            _lower(op)


def _lower(op) -> None:
    from mlir import ir
    from mlir.dialects import arith, scf, tensor

    from .l1_builders import index

    dest, values, *indices = op.operands
    rows, cols = values.type.shape
    bounds = list(dest.type.shape)
    with op.location, ir.InsertionPoint(op):
        outer = scf.ForOp(index(0), index(rows), index(1), [dest])
        with ir.InsertionPoint(outer.body):
            inner = scf.ForOp(index(0), index(cols), index(1), list(outer.inner_iter_args))
            with ir.InsertionPoint(inner.body):
                at = [outer.induction_variable, inner.induction_variable]
                current = inner.inner_iter_args[0]
                where = [arith.index_cast(ir.IndexType.get(), tensor.extract(i, at)) for i in indices]
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
                scf.YieldOp(list(branch.results))
            scf.YieldOp(list(inner.results))
    op.results[0].replace_all_uses_with(outer.results[0])
    op.erase()
