# Another MLIR stack keeps its own context, module and PassManager and adds ae-mlir's dialects and
# passes to them by name; a failing ae pass reports through MLIRError like any upstream pass.
# RUN: %PYTHON %s | FileCheck %s
import sys

from mlir import ir, passmanager

from ae_mlir.embedding import CompileError, add_pass, add_passes, load_dialects

MODULE = """
func.func @host(%q: tensor<1x2x8x16xf32>, %k: tensor<1x2x8x16xf32>, %v: tensor<1x2x8x16xf32>) -> tensor<1x2x8x16xf32> {
  %unused = arith.constant 0.0 : f32
  %s = "attn.score"(%q, %k) {scale = 0.25 : f32} : (tensor<1x2x8x16xf32>, tensor<1x2x8x16xf32>) -> tensor<1x2x8x8xf32>
  %p = "attn.normalize"(%s) ({}, {}, {}) {kind = "softmax", operandSegmentSizes = array<i32: 1, 0>, resultSegmentSizes = array<i32: 1, 0>} : (tensor<1x2x8x8xf32>) -> tensor<1x2x8x8xf32>
  %o = "attn.aggregate"(%p, %v) : (tensor<1x2x8x8xf32>, tensor<1x2x8x16xf32>) -> tensor<1x2x8x16xf32>
  return %o : tensor<1x2x8x16xf32>
}
"""

ctx = ir.Context()
load_dialects(ctx)
module = ir.Module.parse(MODULE, ctx)
pm = passmanager.PassManager("builtin.module", context=ctx)
pm.add("canonicalize")
add_passes(pm, "attn-verify,func.func(cse)")
add_pass(pm, "attn-verify", max_errors=1)
print(pm)
pm.run(module.operation)
print(module)
# CHECK: builtin.module(canonicalize{{.*}},attn-verify,func.func(cse),attn-verify)
# CHECK-LABEL: func.func @host
# CHECK-NOT: arith.constant
# CHECK: "attn.score"
# CHECK: "attn.normalize"
# CHECK: "attn.aggregate"

# Two broken ops; max_errors=1 keeps the first.
BROKEN = """
func.func @broken(%q: tensor<1x2x8x16xf32>, %k: tensor<3x2x8x16xf32>, %k2: tensor<1x2x8x8xf32>) {
  %s = "attn.score"(%q, %k) {scale = 0.25 : f32} : (tensor<1x2x8x16xf32>, tensor<3x2x8x16xf32>) -> tensor<1x2x8x8xf32>
  %t = "attn.score"(%q, %k2) {scale = 0.25 : f32} : (tensor<1x2x8x16xf32>, tensor<1x2x8x8xf32>) -> tensor<1x2x8x8xf32>
  return
}
"""
broken = ir.Module.parse(BROKEN, ctx)
for options in ({}, {"max_errors": 1}):
    pm = passmanager.PassManager("builtin.module", context=ctx)
    add_pass(pm, "attn-verify", **options)
    try:
        pm.run(broken.operation)
    except ir.MLIRError as err:
        print("failed:", options)
        for diag in err.error_diagnostics:
            print(diag.location, diag.message)
# CHECK: failed: {}
# CHECK-NEXT: loc("-":3:8) 'attn.score' op q and k batch sizes differ (1 vs 3)
# CHECK-NEXT: loc("-":4:8) 'attn.score' op q and k head dims differ (16 vs 8)
# CHECK-NEXT: failed: {'max_errors': 1}
# CHECK-NEXT: loc("-":3:8) 'attn.score' op q and k batch sizes differ (1 vs 3)

for name, options in (("attn-nonsense", {}), ("attn-verify", {"max_errors": "lots"}), ("attn-verify", {"max_errors": 1.5})):
    try:
        add_pass(passmanager.PassManager("builtin.module", context=ctx), name, **options)
    except CompileError as err:
        print(err)
# CHECK: error: unknown pass 'attn-nonsense'
# CHECK: error: option 'max-errors' of pass 'attn-verify' expects an integer, got 'lots'
# CHECK: error: option 'max-errors' of pass 'attn-verify' expects an integer, got 1.5

print("heavy imports:", sorted(m for m in ("torch", "triton") if m in sys.modules))
# CHECK: heavy imports: []
