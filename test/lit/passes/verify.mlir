// attn-verify runs in a pipeline next to upstream passes, given as --pass-pipeline or as flags,
// and leaves a valid module unchanged.
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-verify,canonicalize,func.func(cse),attn-verify{max-errors=1})' | FileCheck %s
// RUN: ae-opt %s --attn-verify --canonicalize --cse | FileCheck %s
// RUN: ae-opt %s --no-mlir-print-op-generic --attn-verify | FileCheck %s --check-prefix=CUSTOM

// CHECK-LABEL: sym_name = "causal"
// CHECK: "attn.score"
// CHECK: "attn.mask"
// CHECK-COUNT-1: "arith.cmpi"
// CHECK-NOT: "arith.cmpi"
// CHECK: "attn.normalize"
// CHECK: "attn.aggregate"

// CUSTOM: func.func @causal
// CUSTOM: "attn.score"
func.func @causal(%q: tensor<1x2x8x16xf32>, %k: tensor<1x2x8x16xf32>, %v: tensor<1x2x8x16xf32>) -> tensor<1x2x8x16xf32> {
  %s = "attn.score"(%q, %k) {scale = 0.25 : f32} : (tensor<1x2x8x16xf32>, tensor<1x2x8x16xf32>) -> tensor<1x2x8x8xf32>
  %m = "attn.mask"() ({
  ^bb0(%b: index, %h: index, %i: index, %j: index):
    %c = arith.cmpi sge, %i, %j : index
    %dup = arith.cmpi sge, %i, %j : index
    %both = arith.andi %c, %dup : i1
    "gpu.yield"(%both) : (i1) -> ()
  }) : () -> tensor<1x2x8x8xi1>
  %p = "attn.normalize"(%s, %m) ({}, {}, {}) {kind = "softmax", operandSegmentSizes = array<i32: 1, 1>, resultSegmentSizes = array<i32: 1, 0>} : (tensor<1x2x8x8xf32>, tensor<1x2x8x8xi1>) -> tensor<1x2x8x8xf32>
  %o = "attn.aggregate"(%p, %v) : (tensor<1x2x8x8xf32>, tensor<1x2x8x16xf32>) -> tensor<1x2x8x16xf32>
  return %o : tensor<1x2x8x16xf32>
}
