// --emit of a GPU artifact needs the pipeline to have produced a Triton kernel; otherwise a clean
// error, exit 1, and nothing written at -o.
// RUN: rm -f %t.ptx
// RUN: not ae-opt %s --emit=ptx -o %t.ptx 2>&1 | FileCheck %s --implicit-check-not=Traceback
// RUN: not ae-opt %s --pipeline=cpu --emit=amdgcn 2>&1 | FileCheck %s --implicit-check-not=Traceback
// RUN: not test -e %t.ptx

// CHECK: error: the module holds no tt.func kernel; run attn-lower-to-triton first
func.func @attention(%q: tensor<1x2x8x16xf32>, %k: tensor<1x2x8x16xf32>, %v: tensor<1x2x8x16xf32>) -> tensor<1x2x8x16xf32> {
  %s = "attn.score"(%q, %k) {scale = 0.25 : f32} : (tensor<1x2x8x16xf32>, tensor<1x2x8x16xf32>) -> tensor<1x2x8x8xf32>
  %p = "attn.normalize"(%s) ({}, {}, {}) {kind = "softmax", operandSegmentSizes = array<i32: 1, 0>, resultSegmentSizes = array<i32: 1, 0>} : (tensor<1x2x8x8xf32>) -> tensor<1x2x8x8xf32>
  %o = "attn.aggregate"(%p, %v) : (tensor<1x2x8x8xf32>, tensor<1x2x8x16xf32>) -> tensor<1x2x8x16xf32>
  return %o : tensor<1x2x8x16xf32>
}
