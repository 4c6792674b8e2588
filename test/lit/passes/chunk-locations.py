# A q_mod traced from this file keeps its source line through attn-chunk-recurrence, in the
# one-kernel form and in the split form's output kernel: the op it becomes inside the chunk kernel
# points here, and so does a pass's diagnostic about it. The kernels' own ops are where the user
# called the linear attention; none is left without a location.
# RUN: %PYTHON %s | FileCheck %s
import torch

import ae_mlir as ae
from ae_mlir.core.context import CompileError, location_parts, new_context, parse_module
from ae_mlir.passes import build_pass_manager
from ae_mlir.passes.l1_ops import fail, ops_named


def feature(x, b, h, t, d):
    # CHECK: one kernel: math.tanh at chunk-locations.py:[[#TANH:@LINE+1]]:{{[0-9]+}} in linalg.generic in scf.for
    return torch.tanh(x) + 1.0


q = torch.randn(1, 2, 40, 16)
g = -torch.rand(1, 2, 40)
# CHECK: one kernel: linalg.matmul at chunk-locations.py:[[#CALL:@LINE+1]]
text = ae.linear_attention(q_mod=feature, decay="token", chunk_size=16).mlir(q, q, q, g=g, debug_info=True)


def where(op) -> str:
    filename, line, col = location_parts(op.location)
    return f"{filename.rsplit('/', 1)[-1]}:{line}:{col}"


def unlocated(module) -> int:
    """Ops without a location, but for the bodies of named linalg ops (linalg.fill, matmul and
    transpose): the op's name implies them, they are never printed."""
    from mlir import ir

    count = 0

    def visit(op):
        nonlocal count
        implied = op.parent is not None and op.parent.name in ("linalg.fill", "linalg.matmul", "linalg.transpose")
        count += op.name != "builtin.module" and not implied and str(op.location) == "loc(unknown)"
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return count


# CHECK: one kernel: 0 ops without a location
# CHECK: split: math.tanh at chunk-locations.py:[[#TANH]]:{{[0-9]+}} in linalg.generic in func.func
# CHECK: split: linalg.matmul at chunk-locations.py:[[#CALL]]
# CHECK: split: 0 ops without a location
for form, split in (("one kernel", "false"), ("split", "true")):
    module = parse_module(text, new_context())
    build_pass_manager(f"builtin.module(attn-chunk-recurrence{{split={split}}})", module.context).run(module.operation)
    tanh = ops_named(module.operation, "math.tanh")[0]
    print(f"{form}: math.tanh at {where(tanh)} in {tanh.parent.name} in {tanh.parent.parent.name}")
    print(f"{form}: linalg.matmul at {where(ops_named(module.operation, 'linalg.matmul')[0])}")
    print(f"{form}: {unlocated(module)} ops without a location")

# A pass that rejects an op of the kernel reports it where the user wrote it.
# CHECK: chunk-locations.py:[[#TANH]]:{{[0-9]+}}: error: 'math.tanh' op is not available on this target
try:
    raise fail(tanh, "is not available on this target")
except CompileError as err:
    print(err.render())
