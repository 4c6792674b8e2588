// Errors in split chunks are reported at their lines in the whole file; every chunk is checked,
// and a failed run writes no output.
// RUN: not ae-opt %s --split-input-file -o %t.out 2>&1 | FileCheck %s --implicit-check-not=Traceback
// RUN: not ls %t.out

func.func @fine() {
  return
}

// -----

func.func @bad_batch(%q: tensor<2x4x8x16xf32>, %k: tensor<3x4x8x16xf32>) {
  %s = "attn.score"(%q, %k) {scale = 0.25 : f32} : (tensor<2x4x8x16xf32>, tensor<3x4x8x16xf32>) -> tensor<2x4x8x8xf32>
  return
}
// CHECK: split-errors.mlir:[[@LINE-3]]:8: error: 'attn.score' op q and k batch sizes differ (2 vs 3)

// -----

func.func @unparsable() {
  %x = arith.constant : f32
  return
}
// CHECK: split-errors.mlir:[[@LINE-3]]:{{[0-9]+}}: error:
