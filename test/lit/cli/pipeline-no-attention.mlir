// A preset pipeline reads the problem of the module's attention function; a module without one
// is a located error (exit 1, nothing written), where the passes would have left it as it is
// (cpu) or reported a missing L1 kernel at the last pass (triton). Split chunks are judged one
// by one: the second holds an attention function and compiles.
// RUN: not ae-opt %s --split-input-file --pipeline=triton 2>&1 | FileCheck %s --implicit-check-not=Traceback
// RUN: rm -f %t
// RUN: not ae-opt %s --split-input-file --pipeline=cpu -o %t 2>&1 | FileCheck %s --check-prefix=CPU --implicit-check-not=Traceback
// RUN: test ! -e %t

// CHECK: pipeline-no-attention.mlir:[[# @LINE + 3]]:1: error: 'func.func' op the module has no attention function for --pipeline=triton (a func.func whose first three arguments are the [B, H, L, D] q, k and v
// CHECK-NOT: error
// CPU: pipeline-no-attention.mlir:[[# @LINE + 1]]:1: error: 'func.func' op the module has no attention function for --pipeline=cpu
func.func @f(%q: tensor<1x1x4x8xbf16>) {
  return
}

// -----

func.func @full(%q: tensor<1x1x16x16xbf16>, %k: tensor<1x1x16x16xbf16>, %v: tensor<1x1x16x16xbf16>) -> (tensor<1x1x16x16xbf16>, tensor<1x1x16xf32>) {
  %s = "attn.score"(%q, %k) {scale = 0.25 : f32} : (tensor<1x1x16x16xbf16>, tensor<1x1x16x16xbf16>) -> tensor<1x1x16x16xf32>
  %p, %lse = "attn.normalize"(%s) ({}, {}, {}) {kind = "softmax", operandSegmentSizes = array<i32: 1, 0>, resultSegmentSizes = array<i32: 1, 1>} : (tensor<1x1x16x16xf32>) -> (tensor<1x1x16x16xf32>, tensor<1x1x16xf32>)
  %o = "attn.aggregate"(%p, %v) : (tensor<1x1x16x16xf32>, tensor<1x1x16x16xbf16>) -> tensor<1x1x16x16xbf16>
  return %o, %lse : tensor<1x1x16x16xbf16>, tensor<1x1x16xf32>
}
