"""`attn-cpu-bufferize`: one-shot bufferization of the vectorized kernels, which then write their
destination arguments in place and return nothing.

Arguments get fully dynamic layouts: a strided torch tensor is passed as is and a tile load from
an argument is a subview, so nothing of size L is copied and every allocation is tile-sized.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from . import ModulePass
from .cpu_support import fail, lowered_kernels, run_pipeline, run_transform

# Bufferize, also through the transform dialect: only the transform op of one-shot bufferization
# exposes `memcpy_op`, and with linalg.copy the copies bufferization adds (tile stores into strided
# outputs) are vectorized like the rest instead of becoming calls to `memrefCopy` in the MLIR
# runner-utils library. Canonicalization first erases the copies that bufferized in place.
BUFFERIZE_SCRIPT = """
module attributes {transform.with_named_sequence} {
  transform.named_sequence @__transform_main(%root: !transform.any_op {transform.consumed}) {
    %0 = transform.bufferization.one_shot_bufferize layout{FullyDynamicLayoutMap} %root
        {bufferize_function_boundaries = true, memcpy_op = "linalg.copy"} : (!transform.any_op) -> !transform.any_op
    %func = transform.structured.match ops{["func.func"]} in %0 : (!transform.any_op) -> !transform.any_op
    transform.apply_patterns to %func { transform.apply_patterns.canonicalization } : !transform.any_op
    %copies = transform.structured.vectorize_children_and_apply_patterns %func : (!transform.any_op) -> !transform.any_op
    transform.yield
  }
}
"""

# `drop-equivalent-buffer-results` leaves public functions alone (their callers are unknown), so
# the kernels are private while it runs; their results are then their destination arguments.
DROP_RESULTS_PIPELINE = "canonicalize,drop-equivalent-buffer-results"


@dataclass(frozen=True)
class Bufferize(ModulePass):
    name: ClassVar[str] = "attn-cpu-bufferize"
    summary: ClassVar[str] = ("CPU lowering: one-shot bufferization with fully dynamic layouts at function "
                              "boundaries; kernels then write their destination arguments and return nothing")

    def apply(self, module_op) -> None:
        _protect_inputs(lowered_kernels(module_op))
        run_transform(module_op, BUFFERIZE_SCRIPT)
        _drop_results(module_op, lowered_kernels(module_op))


def _protect_inputs(kernels) -> None:
    """Mark every tensor argument but the destinations (the trailing tensors, one per result) not
    writable; the program range that follows them is two indices.

    One-shot bufferization takes function arguments as writable by default: a kernel whose loop
    state starts from an input (the linear recurrence's initial state) then updates that input's
    buffer in place, overwriting the caller's tensor, when the grid has a single program and no
    loop keeps the value apart."""
    from mlir import ir

    for kernel in kernels:
        ftype = ir.FunctionType(ir.TypeAttr(kernel.attributes["function_type"]).value)
        tensors = [i for i, t in enumerate(ftype.inputs) if isinstance(t, ir.RankedTensorType)]
        inputs = set(tensors[:len(tensors) - len(ftype.results)])
        with kernel.context:
            old = (list(kernel.attributes["arg_attrs"]) if "arg_attrs" in kernel.attributes
                   else [ir.DictAttr.get({}) for _ in ftype.inputs])
            new = []
            for i, attrs in enumerate(old):
                attrs = ir.DictAttr(attrs)
                entries = {attrs[j].name: attrs[j].attr for j in range(len(attrs))}
                if i in inputs:
                    entries["bufferization.writable"] = ir.BoolAttr.get(False)
                new.append(ir.DictAttr.get(entries))
            kernel.attributes["arg_attrs"] = ir.ArrayAttr.get(new)


def _drop_results(module_op, kernels) -> None:
    from mlir import ir

    with module_op.context:
        for kernel in kernels:
            kernel.attributes["sym_visibility"] = ir.StringAttr.get("private")
        run_pipeline(module_op, DROP_RESULTS_PIPELINE)
        for kernel in kernels:
            del kernel.attributes["sym_visibility"]
            if ir.FunctionType(ir.TypeAttr(kernel.attributes["function_type"]).value).results:
                raise fail(kernel, "a kernel result did not bufferize into its destination argument")
