"""`attn-cpu-split-empty-tensors`: every use of a `tensor.empty` gets its own, so that
bufferization gives unrelated tiles their own buffers."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from . import ModulePass
from .cpu_support import walk


@dataclass(frozen=True)
class SplitEmptyTensors(ModulePass):
    name: ClassVar[str] = "attn-cpu-split-empty-tensors"
    summary: ClassVar[str] = ("CPU lowering: give each use of a tensor.empty its own op (undoes CSE), so "
                              "bufferization allocates separate tile buffers")

    def apply(self, module_op) -> None:
        split_empty_tensors(module_op)


def split_empty_tensors(module_op) -> None:
    """Give each use of a `tensor.empty` its own op.

    CSE merges equal tensor.empty ops; bufferization then allocates one buffer for all of their
    uses, so unrelated tiles (K^T, the accumulator, the output tile) share memory. Sharing costs
    nothing by itself, but the output tile is read through a subview, and a buffer with a view is
    one whose accumulator `hoist_redundant_vector_transfers` will not keep in registers.
    """
    from mlir import ir

    for op in walk(module_op, "tensor.empty"):
        uses = [(use.owner, use.operand_number) for use in op.results[0].uses]
        for owner, number in uses[1:]:
            owner.operation.operands[number] = op.clone(ip=ir.InsertionPoint(op)).results[0]
