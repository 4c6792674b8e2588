// A chain whose probabilities are used twice cannot be fused: the error points at the consumer.
// RUN: ae-opt %s --attn-fuse-online-softmax --verify-diagnostics

func.func @shared(%q: tensor<1x1x4x8xf32>, %k: tensor<1x1x4x8xf32>, %v: tensor<1x1x4x8xf32>) -> (tensor<1x1x4x8xf32>, tensor<1x1x4x8xf32>) {
  %s = "attn.score"(%q, %k) {scale = 0.125 : f32} : (tensor<1x1x4x8xf32>, tensor<1x1x4x8xf32>) -> tensor<1x1x4x4xf32>
  %p = "attn.normalize"(%s) ({}, {}, {}) {kind = "softmax", operandSegmentSizes = array<i32: 1, 0>, resultSegmentSizes = array<i32: 1, 0>} : (tensor<1x1x4x4xf32>) -> tensor<1x1x4x4xf32>
  // expected-error @+1 {{cannot fuse: the result of 'attn.normalize' has 2 uses}}
  %o = "attn.aggregate"(%p, %v) : (tensor<1x1x4x4xf32>, tensor<1x1x4x8xf32>) -> tensor<1x1x4x8xf32>
  %o2 = "attn.aggregate"(%p, %v) : (tensor<1x1x4x4xf32>, tensor<1x1x4x8xf32>) -> tensor<1x1x4x8xf32>
  return %o, %o2 : tensor<1x1x4x8xf32>, tensor<1x1x4x8xf32>
}
