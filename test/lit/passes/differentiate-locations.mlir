// The derivative of an op sits at that op's location (a line of the user's mod), so a derivative
// op points at the source it differentiates; the grad function and its attn ops are at the
// forward function's and ops' locations.
// RUN: ae-opt %s --attn-differentiate --mlir-print-debuginfo --no-mlir-print-op-generic | FileCheck %s

// The printer puts location aliases first.
// CHECK-DAG: #[[FUNC:loc[0-9]*]] = loc("mods.py":20:7)
// CHECK-DAG: #[[MOD:loc[0-9]*]] = loc("mods.py":4:1)
// CHECK-LABEL: func.func @softcap_grad(
// CHECK: "attn.score_mod_grad"
// CHECK: ^bb0(%{{[^:]*}}: f32 loc({{[^)]*}}), %{{[^:]*}}: f32 loc("mods.py":4:1),
// CHECK: math.tanh %{{.*}} : f32 loc(#[[TANH:loc[0-9]+]])
// The 1 - tanh^2 of tanh's derivative is at the tanh's line; the factor 1/30, multiplied in last
// (constant factors only scale the gradient), at the division's.
// CHECK: arith.subf %{{.*}}, %{{.*}} : f32 loc(#[[TANH]])
// CHECK-NEXT: arith.mulf %{{.*}}, %{{.*}} : f32 loc(#[[TANH]])
// CHECK-NEXT: arith.constant 0.0333333351 : f32 loc(#[[MUL:loc[0-9]+]])
// CHECK-NEXT: arith.mulf %{{.*}}, %{{.*}} : f32 loc(#[[MUL]])
// CHECK: gpu.yield %{{.*}} : f32 loc(#[[YIELD:loc[0-9]+]])
// CHECK: }) : (tensor<1x1x4x4xf32>, tensor<1x1x4x4xf32>) -> tensor<1x1x4x4xf32> loc(#[[MOD]])
// CHECK: } loc(#[[FUNC]])
// CHECK-DAG: #[[TANH]] = loc("mods.py":5:15)
// CHECK-DAG: #[[MUL]] = loc("mods.py":5:30)
// CHECK-DAG: #[[YIELD]] = loc("mods.py":5:8)
func.func @softcap(%q: tensor<1x1x4x8xf32>, %k: tensor<1x1x4x8xf32>, %v: tensor<1x1x4x8xf32>) -> tensor<1x1x4x8xf32> {
  %s = "attn.score"(%q, %k) {scale = 0.125 : f32} : (tensor<1x1x4x8xf32>, tensor<1x1x4x8xf32>) -> tensor<1x1x4x4xf32> loc("mods.py":20:7)
  %sm = "attn.score_mod"(%s) ({
  ^bb0(%x: f32, %b: index, %h: index, %i: index, %j: index):
    %inv = arith.constant 0.0333333351 : f32 loc("mods.py":5:30)
    %y = arith.mulf %x, %inv : f32 loc("mods.py":5:30)
    %t = math.tanh %y : f32 loc("mods.py":5:15)
    "gpu.yield"(%t) : (f32) -> () loc("mods.py":5:8)
  }) : (tensor<1x1x4x4xf32>) -> tensor<1x1x4x4xf32> loc("mods.py":4:1)
  %p = "attn.normalize"(%sm) ({}, {}, {}) {kind = "softmax", operandSegmentSizes = array<i32: 1, 0>, resultSegmentSizes = array<i32: 1, 0>} : (tensor<1x1x4x4xf32>) -> tensor<1x1x4x4xf32> loc("mods.py":20:7)
  %o = "attn.aggregate"(%p, %v) : (tensor<1x1x4x4xf32>, tensor<1x1x4x8xf32>) -> tensor<1x1x4x8xf32> loc("mods.py":20:7)
  return %o : tensor<1x1x4x8xf32> loc("mods.py":20:7)
} loc("mods.py":20:7)
