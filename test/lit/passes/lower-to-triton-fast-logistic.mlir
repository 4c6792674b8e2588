// The sigmoid normalizer's 1 / (1 + e^-s): with fast-tanh, 0.5 + 0.5 tanh(s / 2), no division.
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-fuse-online-softmax,attn-tile{block-m=32 block-n=32},attn-lower-to-triton{fast-tanh=true})' | FileCheck %s --check-prefix=SIGMOID
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-fuse-online-softmax,attn-tile{block-m=32 block-n=32},attn-lower-to-triton)' | FileCheck %s --check-prefix=SIGMOID-EXACT
// SIGMOID: "scf.for"
// SIGMOID: %[[T:.*]] = "tt.elementwise_inline_asm"(%{{.*}}) {asm_string = "tanh.approx.f32 $0, $1;"
// SIGMOID: %[[M:.*]] = "arith.mulf"(%[[HALF:.*]], %[[T]])
// SIGMOID: "arith.addf"(%[[HALF]], %[[M]])
// SIGMOID-NOT: "arith.divf"
// SIGMOID: "scf.yield"
// SIGMOID-EXACT: "math.exp"
// SIGMOID-EXACT: "arith.divf"
func.func @sigmoid(%q: tensor<1x2x64x32xbf16>, %k: tensor<1x2x64x32xbf16>, %v: tensor<1x2x64x32xbf16>) -> tensor<1x2x64x32xbf16> {
  %s = "attn.score"(%q, %k) {scale = 0.125 : f32} : (tensor<1x2x64x32xbf16>, tensor<1x2x64x32xbf16>) -> tensor<1x2x64x64xf32>
  %p = "attn.normalize"(%s) ({}, {}, {}) {kind = "sigmoid", operandSegmentSizes = array<i32: 1, 0>, resultSegmentSizes = array<i32: 1, 0>} : (tensor<1x2x64x64xf32>) -> tensor<1x2x64x64xf32>
  %o = "attn.aggregate"(%p, %v) : (tensor<1x2x64x64xf32>, tensor<1x2x64x32xbf16>) -> tensor<1x2x64x32xbf16>
  return %o : tensor<1x2x64x32xbf16>
}
