"""What the `attn-cpu-*` stage passes share: the attributes that carry facts from one stage to the
next, finding the kernels and their ops, located errors, and running an upstream pass pipeline or
a transform script from inside a stage.
"""
from __future__ import annotations

from ..core import abi
from ..core.context import CompileError, diagnostic_from_mlir
from .l1_ops import fail  # noqa: F401  (the CPU passes' located errors, as the other passes make them)

# An L1 kernel: a func.func that runs once per program of this grid.
GRID_ATTR = abi.GRID
# A lowered kernel: the grid stage replaces `attn.grid` by this, which the LLVM conversion also
# reads (a C wrapper taking one memref descriptor per array argument); later stages find kernels
# by it.
KERNEL_ATTR = "llvm.emit_c_interface"
# A loop of the L1 kernel itself (not of the grid, nor one that tiling adds), whose loop-carried
# tensors `attn-cpu-carry-state-in-place` updates in place.
STATE_LOOP_ATTR = "ae.cpu_state_loop"


def rows_padded_in_memory(vector_type) -> bool:
    """Whether LLVM lays the rows of this vector type out padded (a row of 5 or 24 floats takes the
    next power of two), so that viewing a dense buffer as it would overrun the buffer."""
    row = vector_type.shape[-1]
    return bool(row & (row - 1))


def ops(block) -> list:
    return [op.operation for op in block.operations]


def walk(op, name: str) -> list:
    """Every op under `op` named `name`, or whose name starts with `name` when it ends in '.'."""
    from mlir import ir

    found = []

    def visit(inner):
        if inner.name == name or (name.endswith(".") and inner.name.startswith(name)):
            found.append(inner)
        return ir.WalkResult.ADVANCE

    op.walk(visit)
    return found


def lowered_kernels(module_op) -> list:
    """The module's kernels after `attn-cpu-grid-loops`, in order."""
    return [op for op in ops(module_op.regions[0].blocks[0])
            if op.name == "func.func" and KERNEL_ATTR in op.attributes]


def _errors(err, what: str) -> CompileError:
    summary = f"the upstream CPU lowering failed in {what}"
    if isinstance(err, ValueError):
        return CompileError(f"{summary}: {err}")
    return CompileError(summary, [diagnostic_from_mlir(d) for d in err.error_diagnostics])


def run_pipeline(module_op, pipeline: str) -> None:
    """Run upstream passes on `module_op` from inside a stage (for steps that need IR changes
    around them that no pass makes)."""
    from mlir import ir, passmanager

    pm = passmanager.PassManager.parse(f"builtin.module({pipeline})", context=module_op.context)
    try:
        pm.run(module_op)
    except ir.MLIRError as err:
        raise _errors(err, pipeline) from None


def run_transform(module_op, script: str) -> None:
    """Apply the `@__transform_main` sequence of a transform-dialect `script` to `module_op`."""
    from mlir import ir
    from mlir.dialects.transform import interpreter

    with module_op.context:
        library = ir.Module.parse(script)
        main = next(op for op in library.body.operations if op.operation.name == "transform.named_sequence")
        try:
            interpreter.apply_named_sequence(module_op, main, library)
        except (ir.MLIRError, ValueError) as err:
            raise _errors(err, "the transform script") from None
