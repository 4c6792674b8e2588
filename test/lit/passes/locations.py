# A mod traced from this file keeps its source line through attn-fuse-online-softmax and attn-tile:
# the op it becomes inside the tiled kernel points here, and so does a pass's diagnostic about it.
# RUN: %PYTHON %s | FileCheck %s
import torch

import ae_mlir as ae
from ae_mlir.core.context import CompileError, location_parts, new_context, parse_module
from ae_mlir.passes import build_pass_manager
from ae_mlir.passes.l1_ops import fail, ops_named


def softcap(score, b, h, q_idx, kv_idx):
    # CHECK: math.tanh at locations.py:[[#TANH:@LINE+1]]:{{[0-9]+}} in linalg.generic in scf.for
    return 30.0 * torch.tanh(score / 30.0)


def causal(b, h, q_idx, kv_idx):
    # CHECK: arith.cmpi at locations.py:[[@LINE+1]]
    return q_idx >= kv_idx


q = torch.randn(1, 2, 100, 16)
# CHECK: linalg.matmul at locations.py:[[#@LINE+1]]
text = ae.attention(score_mod=softcap, mask_mod=causal).mlir(q, q, q, debug_info=True)
ctx = new_context()
module = parse_module(text, ctx)
build_pass_manager("builtin.module(attn-fuse-online-softmax,attn-tile{block-m=32 block-n=32})", ctx).run(module.operation)


def where(op) -> str:
    filename, line, col = location_parts(op.location)
    return f"{filename.rsplit('/', 1)[-1]}:{line}:{col}"


# The ops sit in linalg.generic bodies inside the KV loops of the kernel.
tanh = ops_named(module.operation, "math.tanh")[0]
print(f"math.tanh at {where(tanh)} in {tanh.parent.name} in {tanh.parent.parent.name}")
mask_cmp = next(op for op in ops_named(module.operation, "arith.cmpi") if "arith.cmpi sge" in str(op))
print(f"arith.cmpi at {where(mask_cmp)}")
# The kernel's own ops are where the user called the attention.
print(f"linalg.matmul at {where(ops_named(module.operation, 'linalg.matmul')[0])}")

# A pass that rejects an op reports it where the user wrote it.
# CHECK: locations.py:[[#TANH]]:{{[0-9]+}}: error: 'math.tanh' op is not available on this target
try:
    raise fail(tanh, "is not available on this target")
except CompileError as err:
    print(err.render())
