// --verify-diagnostics fails on a diagnostic nobody expected and on an expectation nothing met,
// reporting both at lines of the whole file.
// RUN: not ae-opt %s --split-input-file --verify-diagnostics 2>&1 | FileCheck %s --implicit-check-not=Traceback

func.func @wrong_text(%q: tensor<2x4x8x16xf32>, %k: tensor<3x4x8x16xf32>) {
  // expected-error @+1 {{head dims differ}}
  %s = "attn.score"(%q, %k) {scale = 0.25 : f32} : (tensor<2x4x8x16xf32>, tensor<3x4x8x16xf32>) -> tensor<2x4x8x8xf32>
  return
}
// CHECK: verify-diagnostics.mlir:[[@LINE-3]]:8: error: unexpected error: 'attn.score' op q and k batch sizes differ (2 vs 3)
// CHECK: verify-diagnostics.mlir:[[@LINE-5]]:6: error: expected error "head dims differ" was not produced

// -----

func.func @nothing_wrong(%q: tensor<2x4x8x16xf32>, %k: tensor<2x4x8x16xf32>) {
  %s = "attn.score"(%q, %k) {scale = 0.25 : f32} : (tensor<2x4x8x16xf32>, tensor<2x4x8x16xf32>) -> tensor<2x4x8x8xf32>
  // expected-error @above {{batch sizes differ}}
  return
}
// CHECK: verify-diagnostics.mlir:[[@LINE-3]]:6: error: expected error "batch sizes differ" was not produced

// -----

func.func @wrong_line(%q: tensor<2x4x8x16xf32>, %k: tensor<2x3x8x16xf32>) {
  // expected-error @+2 {{must be a multiple of k heads}}
  %s = "attn.score"(%q, %k) {scale = 0.25 : f32} : (tensor<2x4x8x16xf32>, tensor<2x3x8x16xf32>) -> tensor<2x4x8x8xf32>
  return
}
// CHECK: verify-diagnostics.mlir:[[@LINE-3]]:8: error: unexpected error: 'attn.score' op query heads (4) must be a multiple of k heads (3)
// CHECK: verify-diagnostics.mlir:[[@LINE-5]]:6: error: expected error "must be a multiple of k heads" was not produced
