"""What the presets read of a score_mod region to pick kernels and tiles, on its ScalarProgram
(`regions.from_region`): argument 0 is the score, 1-4 the batch, head, query and key positions."""
from __future__ import annotations

from typing import NamedTuple

from .regions import ScalarProgram


class ModTraits(NamedTuple):
    reads_closures: bool = False  # a closure tensor is read (tensor.extract)
    reads_by_position: bool = False  # ... at an index computed from the query or key position
    adds_bias: bool = False  # the score plus (or minus) a value that does not depend on it
    tanh: bool = False  # a tanh (soft-capping)


def _depends(program: ScalarProgram, roots: set) -> set:
    """The keys of the program's values computed from any of `roots`, the roots included."""
    found = set(roots)
    for index, op in enumerate(program.ops):
        if any(key in found for key in op.operands):
            found.add(f"v{index}_0")
    return found


def mod_traits(program: ScalarProgram | None) -> ModTraits:
    if program is None:
        return ModTraits()
    extracts = [op for op in program.ops if op.name == "tensor.extract"]
    positions = _depends(program, {"arg3", "arg4"})
    by_position = any(key in positions for op in extracts for key in op.operands[1:])
    on_score = _depends(program, {"arg0"})
    producer = {f"v{index}_0": op for index, op in enumerate(program.ops)}.get(program.result)
    adds = False
    if producer is not None and producer.name in ("arith.addf", "arith.subf"):
        # score + b, b + score or score - b, with b free of the score: a derivative of 1.
        lhs, rhs = producer.operands
        bias = rhs if lhs == "arg0" else lhs if rhs == "arg0" and producer.name == "arith.addf" else None
        adds = bias is not None and bias not in on_score
    return ModTraits(bool(extracts), by_position, adds, any(op.name == "math.tanh" for op in program.ops))
