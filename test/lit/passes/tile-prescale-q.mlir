// attn-tile{prescale-q}: the Q tile is multiplied by the score scale (here 1/sqrt(16) times
// log2(e), softmax's exp2 domain) once per program, before the loop over KV tiles, and a full
// tile's scores are the Q K^T product itself: the row max reads it with no pass in between (the
// cpu preset sets it: there each pass over a tile is a loop through memory). 16-bit queries keep
// the per-score multiply, since a scaled bf16 Q tile would round twice.
// RUN: ae-opt %s --split-input-file --pass-pipeline='builtin.module(attn-fuse-online-softmax,attn-tile{block-m=32 block-n=32 prescale-q=true},cse)' --no-mlir-print-op-generic | FileCheck %s

// CHECK-LABEL: func.func @attention(%arg0: tensor<1x1x64x16xf32>
// CHECK: %[[Q:.*]] = tensor.extract_slice %arg0
// CHECK: %[[QS:.*]] = linalg.generic {{.*}} ins(%[[Q]] : tensor<32x16xf32>)
// CHECK-NEXT: ^bb0
// CHECK-NEXT: %[[C:.*]] = arith.constant 0.360673755 : f32
// CHECK-NEXT: arith.mulf %{{.*}}, %[[C]] : f32
// CHECK: scf.for
// CHECK: %[[S:.*]] = linalg.matmul ins(%[[QS]], %{{.*}} : tensor<32x16xf32>, tensor<16x32xf32>)
// CHECK-NEXT: linalg.reduce ins(%[[S]] : tensor<32x32xf32>)

// CHECK-LABEL: func.func @attention(%arg0: tensor<1x1x64x16xbf16>
// CHECK-NOT: linalg.generic
// CHECK: scf.for
// CHECK: %[[S16:.*]] = linalg.matmul ins(%{{.*}}, %{{.*}} : tensor<32x16xbf16>, tensor<16x32xbf16>)
// CHECK-NEXT: %[[SCALED:.*]] = linalg.generic {{.*}} ins(%[[S16]] : tensor<32x32xf32>)
// CHECK: arith.mulf %{{.*}}, %{{.*}} : f32
// CHECK: linalg.reduce ins(%[[SCALED]] : tensor<32x32xf32>)

module {
  func.func @attention(%q: tensor<1x1x64x16xf32>, %k: tensor<1x1x64x16xf32>, %v: tensor<1x1x64x16xf32>) -> (tensor<1x1x64x16xf32>, tensor<1x1x64xf32>) {
    %scores = "attn.score"(%q, %k) {scale = 0.25 : f32} : (tensor<1x1x64x16xf32>, tensor<1x1x64x16xf32>) -> tensor<1x1x64x64xf32>
    %probs, %lse = "attn.normalize"(%scores) ({}, {}, {}) {kind = "softmax", operandSegmentSizes = array<i32: 1, 0>, resultSegmentSizes = array<i32: 1, 1>} : (tensor<1x1x64x64xf32>) -> (tensor<1x1x64x64xf32>, tensor<1x1x64xf32>)
    %out = "attn.aggregate"(%probs, %v) : (tensor<1x1x64x64xf32>, tensor<1x1x64x16xf32>) -> tensor<1x1x64x16xf32>
    return %out, %lse : tensor<1x1x64x16xf32>, tensor<1x1x64xf32>
  }
}

// -----
module {
  func.func @attention(%q: tensor<1x1x64x16xbf16>, %k: tensor<1x1x64x16xbf16>, %v: tensor<1x1x64x16xbf16>) -> (tensor<1x1x64x16xbf16>, tensor<1x1x64xf32>) {
    %scores = "attn.score"(%q, %k) {scale = 0.25 : f32} : (tensor<1x1x64x16xbf16>, tensor<1x1x64x16xbf16>) -> tensor<1x1x64x64xf32>
    %probs, %lse = "attn.normalize"(%scores) ({}, {}, {}) {kind = "softmax", operandSegmentSizes = array<i32: 1, 0>, resultSegmentSizes = array<i32: 1, 1>} : (tensor<1x1x64x64xf32>) -> (tensor<1x1x64x64xf32>, tensor<1x1x64xf32>)
    %out = "attn.aggregate"(%probs, %v) : (tensor<1x1x64x64xf32>, tensor<1x1x64x16xbf16>) -> tensor<1x1x64x16xbf16>
    return %out, %lse : tensor<1x1x64x16xbf16>, tensor<1x1x64xf32>
  }
}

