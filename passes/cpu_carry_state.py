"""`attn-cpu-carry-state-in-place`: each iteration of a kernel's own loop (tagged
`ae.cpu_state_loop` by `attn-cpu-grid-loops`) ends by copying its new loop-carried tensors into
the ones it received, so that bufferization updates one buffer per state tensor.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from . import ModulePass
from .cpu_support import STATE_LOOP_ATTR, ops, walk


@dataclass(frozen=True)
class CarryStateInPlace(ModulePass):
    name: ClassVar[str] = "attn-cpu-carry-state-in-place"
    summary: ClassVar[str] = ("CPU lowering: copy the new loop-carried tensors of each kernel loop into its "
                              "iter_args (after vectorization), so bufferization keeps one buffer per state")

    def apply(self, module_op) -> None:
        carry_loop_state_in_place(module_op)


def carry_loop_state_in_place(module_op) -> None:
    """End each iteration of a tagged loop by copying its new loop-carried tensors into the ones
    the iteration received (a `linalg.copy` into the iter_arg, yielded instead).

    The online-softmax state is computed out of place (the new row max is needed next to the old
    one), so one-shot bufferization would yield a fresh buffer from each iteration and chain the
    buffers across loops; their deallocation then needs ownership flags at run time, which
    `bufferization-lower-deallocations` keeps in i1 memrefs that the LLVM conversion cannot store.
    With the copy, every yield is equivalent to its iter_arg: the loop updates one buffer per state
    tensor and every other buffer is a temporary, hoisted out of the loop. A value stored into its
    iter_arg by insert_slice (an output carried through the loop) is in place already. Runs after
    vectorization, whose folds would remove a copy that overwrites a whole tensor.
    """
    from mlir import ir
    from mlir.dialects import linalg

    for loop in walk(module_op, "scf.for"):
        if STATE_LOOP_ATTR not in loop.attributes:
            continue
        del loop.attributes[STATE_LOOP_ATTR]
        body = loop.regions[0].blocks[0]
        terminator = ops(body)[-1]
        carried = list(body.arguments)[1:]
        for i, (arg, value) in enumerate(zip(carried, terminator.operands)):
            if not isinstance(arg.type, ir.RankedTensorType) or _stored_into(value, arg):
                continue
            with loop.context, loop.location, ir.InsertionPoint(terminator):
                terminator.operands[i] = linalg.copy(value, outs=[arg])


def _stored_into(value, arg) -> bool:
    """Whether `value` is `arg` updated in place: through tensor.insert_slice / tensor.insert
    chains, and the loops and branches around them that carry it (attn-cpu-lower-scatter's)."""
    base = _in_place_base(value)
    return base is not None and base == arg


def _in_place_base(value):
    """The tensor an in-place update chain ending in `value` starts from (`value` itself where it
    is not such an update), or None where the chain's branches or loop disagree."""
    from mlir import ir

    owner = value.owner
    if not isinstance(owner, ir.OpView):
        return value
    op = owner.operation
    if op.name in ("tensor.insert_slice", "tensor.insert"):
        return _in_place_base(op.operands[1])
    if op.name not in ("scf.for", "scf.if"):
        return value
    n = ir.OpResult(value).result_number
    if op.name == "scf.for":
        body = op.regions[0].blocks[0]
        inner = _in_place_base(ops(body)[-1].operands[n])
        if inner is None or inner != body.arguments[n + 1]:
            return None
        return _in_place_base(op.operands[3 + n])
    bases = [_in_place_base(ops(region.blocks[0])[-1].operands[n]) for region in op.regions]
    if any(b is None for b in bases) or any(b != bases[0] for b in bases):
        return None
    return bases[0]
