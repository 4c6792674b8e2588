// attn-fuse-online-softmax folds score -> score_mod -> mask -> normalize -> aggregate into one
// attn.online_attention whose regions hold the mods and the softmax's online update in base 2.
// RUN: ae-opt %s --split-input-file --pass-pipeline='builtin.module(attn-fuse-online-softmax)' --no-mlir-print-op-generic | FileCheck %s

// CHECK-LABEL: func.func @alibi_causal
// CHECK-SAME: (%[[Q:.*]]: tensor<1x2x8x16xf32>, %[[K:.*]]: tensor<1x2x8x16xf32>, %[[V:.*]]: tensor<1x2x8x16xf32>, %[[SLOPES:.*]]: tensor<2xf32>)
// CHECK-NOT: "attn.score"
// CHECK: %[[R:.*]]:2 = "attn.online_attention"(%[[Q]], %[[K]], %[[V]]) ({
// The score_mod region reads the closure tensor straight from the function argument.
// CHECK: ^bb0(%{{.*}}: f32, %{{.*}}: index, %[[H:.*]]: index, %{{.*}}: index, %{{.*}}: index):
// CHECK: tensor.extract %[[SLOPES]][%[[H]]]
// CHECK: gpu.yield
// CHECK: }, {
// CHECK: arith.cmpi sge
// CHECK: gpu.yield
// prob: exp2(s - m)
// CHECK: }, {
// CHECK: ^bb0(%[[S:.*]]: f32, %[[M:.*]]: f32):
// CHECK: %[[D:.*]] = arith.subf %[[S]], %[[M]]
// CHECK: math.exp2 %[[D]]
// rescale: exp2(m_old - m_new)
// CHECK: }, {
// CHECK: math.exp2
// finalize: one division, a row with nothing visible gives 0
// CHECK: }, {
// CHECK: arith.cmpf oeq
// CHECK: arith.divf
// CHECK: arith.select
// lse back in natural log
// CHECK: }, {
// CHECK: math.log2
// CHECK: arith.mulf
// CHECK: }) {log2_domain = true, normalizer = "softmax", resultSegmentSizes = array<i32: 1, 1>, scale = 2.500000e-01 : f32, stat = "max"}
// CHECK-NOT: "attn.normalize"
// CHECK-NOT: "attn.aggregate"
// CHECK: return %[[R]]#0, %[[R]]#1
func.func @alibi_causal(%q: tensor<1x2x8x16xf32>, %k: tensor<1x2x8x16xf32>, %v: tensor<1x2x8x16xf32>, %slopes: tensor<2xf32>) -> (tensor<1x2x8x16xf32>, tensor<1x2x8xf32>) {
  %s = "attn.score"(%q, %k) {scale = 0.25 : f32} : (tensor<1x2x8x16xf32>, tensor<1x2x8x16xf32>) -> tensor<1x2x8x8xf32>
  %sm = "attn.score_mod"(%s) ({
  ^bb0(%x: f32, %b: index, %h: index, %i: index, %j: index):
    %e = tensor.extract %slopes[%h] : tensor<2xf32>
    %y = arith.addf %x, %e : f32
    "gpu.yield"(%y) : (f32) -> ()
  }) : (tensor<1x2x8x8xf32>) -> tensor<1x2x8x8xf32>
  %m = "attn.mask"() ({
  ^bb0(%b: index, %h: index, %i: index, %j: index):
    %c = arith.cmpi sge, %i, %j : index
    "gpu.yield"(%c) : (i1) -> ()
  }) : () -> tensor<1x2x8x8xi1>
  %p, %lse = "attn.normalize"(%sm, %m) ({}, {}, {}) {kind = "softmax", operandSegmentSizes = array<i32: 1, 1>, resultSegmentSizes = array<i32: 1, 1>} : (tensor<1x2x8x8xf32>, tensor<1x2x8x8xi1>) -> (tensor<1x2x8x8xf32>, tensor<1x2x8xf32>)
  %o = "attn.aggregate"(%p, %v) : (tensor<1x2x8x8xf32>, tensor<1x2x8x16xf32>) -> tensor<1x2x8x16xf32>
  return %o, %lse : tensor<1x2x8x16xf32>, tensor<1x2x8xf32>
}

// -----

// Without a row statistic (sigmoid), the op has no rescale region and no lse.
// CHECK-LABEL: func.func @sigmoid
// CHECK: "attn.online_attention"
// CHECK: ({
// CHECK-NEXT: }, {
// CHECK-NEXT: }, {
// CHECK: math.exp
// CHECK: }, {
// CHECK-NEXT: }, {
// CHECK: }, {
// CHECK-NEXT: }) {log2_domain = false, normalizer = "sigmoid", resultSegmentSizes = array<i32: 1, 0>, scale = 1.250000e-01 : f32, stat = "none"}
func.func @sigmoid(%q: tensor<1x1x4x8xbf16>, %k: tensor<1x1x4x8xbf16>, %v: tensor<1x1x4x8xbf16>) -> tensor<1x1x4x8xbf16> {
  %s = "attn.score"(%q, %k) {scale = 0.125 : f32} : (tensor<1x1x4x8xbf16>, tensor<1x1x4x8xbf16>) -> tensor<1x1x4x4xf32>
  %p = "attn.normalize"(%s) ({}, {}, {}) {kind = "sigmoid", operandSegmentSizes = array<i32: 1, 0>, resultSegmentSizes = array<i32: 1, 0>} : (tensor<1x1x4x4xf32>) -> tensor<1x1x4x4xf32>
  %o = "attn.aggregate"(%p, %v) : (tensor<1x1x4x4xf32>, tensor<1x1x4x8xbf16>) -> tensor<1x1x4x8xbf16>
  return %o : tensor<1x1x4x8xbf16>
}
