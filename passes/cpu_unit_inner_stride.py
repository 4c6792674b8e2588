"""`attn-cpu-pin-unit-inner-stride`: the caller of a bufferized kernel promises unit stride in the
innermost dimension of every array, so that tile rows load as vectors."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from . import ModulePass
from .cpu_support import lowered_kernels


@dataclass(frozen=True)
class PinUnitInnerStride(ModulePass):
    name: ClassVar[str] = "attn-cpu-pin-unit-inner-stride"
    summary: ClassVar[str] = ("CPU lowering: give the memref arguments of each bufferized kernel unit "
                              "innermost stride (other strides stay dynamic)")

    def apply(self, module_op) -> None:
        for kernel in lowered_kernels(module_op):
            pin_unit_inner_stride(kernel)


def pin_unit_inner_stride(kernel) -> None:
    """Give every memref argument of `kernel` unit stride in its innermost dimension.

    Fully dynamic layouts let a caller pass any strided tensor, but with an unknown innermost
    stride no tile row is a contiguous vector: loads and gathers would go element by element. The
    caller promises unit innermost strides instead (torch's layouts, [B, L, H, D] transposed to
    [B, H, L, D] included); a memref.cast back to the dynamic layout keeps the body valid, and
    canonicalization folds it into the subviews, transfers and loads.
    """
    from mlir import ir
    from mlir.dialects import memref

    block = kernel.regions[0].blocks[0]
    dynamic = ir.ShapedType.get_dynamic_stride_or_offset()
    with kernel.context, kernel.location:
        entry = ir.InsertionPoint.at_block_begin(block)
        for arg in block.arguments:
            wide = arg.type
            if not isinstance(wide, ir.MemRefType) or wide.rank == 0:
                continue
            layout = ir.StridedLayoutAttr.get(dynamic, [dynamic] * (wide.rank - 1) + [1])
            arg.set_type(ir.MemRefType.get(wide.shape, wide.element_type, layout, wide.memory_space))
            cast = memref.cast(wide, arg, ip=entry)
            arg.replace_all_uses_except(cast, cast.owner.operation)
        results = ir.FunctionType(ir.TypeAttr(kernel.attributes["function_type"]).value).results
        kernel.attributes["function_type"] = ir.TypeAttr.get(
            ir.FunctionType.get([a.type for a in block.arguments], results))
