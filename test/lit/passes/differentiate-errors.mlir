// attn-differentiate reports what it cannot differentiate at the op in question: a scalar op
// without a derivative rule (at its line in the mod), a linear recurrence (no derivative yet),
// and a module that already holds the function it would write.
// RUN: ae-opt %s --split-input-file --attn-differentiate --verify-diagnostics

func.func @atan(%q: tensor<1x1x4x8xf32>, %k: tensor<1x1x4x8xf32>, %v: tensor<1x1x4x8xf32>) -> tensor<1x1x4x8xf32> {
  %s = "attn.score"(%q, %k) {scale = 0.125 : f32} : (tensor<1x1x4x8xf32>, tensor<1x1x4x8xf32>) -> tensor<1x1x4x4xf32>
  %sm = "attn.score_mod"(%s) ({
  ^bb0(%x: f32, %b: index, %h: index, %i: index, %j: index):
    // expected-error @+1 {{'math.atan' op has no derivative rule (in the score_mod region)}}
    %y = math.atan %x : f32
    "gpu.yield"(%y) : (f32) -> ()
  }) : (tensor<1x1x4x4xf32>) -> tensor<1x1x4x4xf32>
  %p = "attn.normalize"(%sm) ({}, {}, {}) {kind = "softmax", operandSegmentSizes = array<i32: 1, 0>, resultSegmentSizes = array<i32: 1, 0>} : (tensor<1x1x4x4xf32>) -> tensor<1x1x4x4xf32>
  %o = "attn.aggregate"(%p, %v) : (tensor<1x1x4x4xf32>, tensor<1x1x4x8xf32>) -> tensor<1x1x4x8xf32>
  return %o : tensor<1x1x4x8xf32>
}

// -----

func.func @linear(%q: tensor<1x2x64x16xf32>, %k: tensor<1x2x64x16xf32>, %v: tensor<1x2x64x8xf32>) -> tensor<1x2x64x8xf32> {
  // expected-error @+1 {{has no derivative yet (attn-differentiate handles the softmax family)}}
  %o, %st = "attn.linear_recurrence"(%q, %k, %v) ({}, {}, {}) {decay = "none", scale = 0.25 : f32, normalize = false, chunk_size = 64 : i64, operandSegmentSizes = array<i32: 1, 1, 1, 0, 0, 0>} : (tensor<1x2x64x16xf32>, tensor<1x2x64x16xf32>, tensor<1x2x64x8xf32>) -> (tensor<1x2x64x8xf32>, tensor<1x2x16x8xf32>)
  return %o : tensor<1x2x64x8xf32>
}

// -----

// expected-error @+1 {{cannot differentiate: the module already has a function named 'plain_grad'}}
func.func @plain(%q: tensor<1x1x4x8xf32>, %k: tensor<1x1x4x8xf32>, %v: tensor<1x1x4x8xf32>) -> tensor<1x1x4x8xf32> {
  %s = "attn.score"(%q, %k) {scale = 0.125 : f32} : (tensor<1x1x4x8xf32>, tensor<1x1x4x8xf32>) -> tensor<1x1x4x4xf32>
  %p = "attn.normalize"(%s) ({}, {}, {}) {kind = "none", operandSegmentSizes = array<i32: 1, 0>, resultSegmentSizes = array<i32: 1, 0>} : (tensor<1x1x4x4xf32>) -> tensor<1x1x4x4xf32>
  %o = "attn.aggregate"(%p, %v) : (tensor<1x1x4x4xf32>, tensor<1x1x4x8xf32>) -> tensor<1x1x4x8xf32>
  return %o : tensor<1x1x4x8xf32>
}

func.func @plain_grad() {
  return
}
