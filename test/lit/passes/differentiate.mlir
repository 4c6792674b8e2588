// attn-differentiate leaves the forward function as it is and appends @<name>_grad: from the raw
// scores and d(probs) it recomputes the modified scores and the mask, applies the normalizer's
// derivative, then the chain rule through the score_mod (attn.score_mod_grad) and, per float
// closure tensor the gradient reaches, the gradient of the elements read (attn.closure_grad).
// RUN: ae-opt %s --split-input-file --attn-differentiate --no-mlir-print-op-generic | FileCheck %s
// RUN: ae-opt %s --split-input-file --attn-differentiate | ae-opt --split-input-file --attn-verify > /dev/null
// RUN: ae-opt %s --split-input-file --attn-differentiate | mlir-opt --split-input-file --irdl-file=%attn_irdl > /dev/null

// ALiBi + causal: d(score + slopes[h] * (kv - q))/d score = 1, so the score gradient is the
// incoming one; slopes[h] gets grad * (kv - q), added at index h.
// CHECK-LABEL: func.func @alibi_causal(
// CHECK: "attn.aggregate"
// CHECK-LABEL: func.func @alibi_causal_grad(
// CHECK-SAME: %[[S:[^:]+]]: tensor<1x2x8x8xf32>, %[[DP:[^:]+]]: tensor<1x2x8x8xf32>, %[[SLOPES:[^:]+]]: tensor<2xf32>)
// CHECK-SAME: -> (tensor<1x2x8x8xf32>, tensor<2xf32>) attributes {attn.closure_args = array<i64: 3>}
// CHECK: %[[MOD:.*]] = "attn.score_mod"(%[[S]])
// CHECK: tensor.extract %[[SLOPES]]
// CHECK: %[[KEEP:.*]] = "attn.mask"()
// CHECK: arith.cmpi sge
// CHECK: %[[DMOD:.*]] = "attn.normalize_grad"(%[[MOD]], %[[KEEP]], %[[DP]])
// CHECK: {kind = "softmax", operandSegmentSizes = array<i32: 1, 1, 1>, stat = "max"}
// CHECK: %[[DS:.*]] = "attn.score_mod_grad"(%[[S]], %[[DMOD]]) ({
// CHECK-NEXT: ^bb0(%{{.*}}: f32, %[[G:[^:]+]]: f32, %{{.*}}: index, %{{.*}}: index, %{{.*}}: index, %{{.*}}: index):
// CHECK-NEXT: gpu.yield %[[G]] : f32
// CHECK: %[[DSLOPES:.*]] = "attn.closure_grad"(%[[S]], %[[DMOD]], %[[SLOPES]]) ({
// CHECK-NEXT: ^bb0(%{{.*}}: f32, %[[G2:[^:]+]]: f32, %{{.*}}: index, %[[H:[^:]+]]: index, %[[I:[^:]+]]: index, %[[J:[^:]+]]: index):
// CHECK-NEXT: %[[D:.*]] = arith.subi %[[J]], %[[I]] : index
// CHECK: %[[DF:.*]] = arith.sitofp
// CHECK-NEXT: %[[W:.*]] = arith.mulf %[[G2]], %[[DF]] : f32
// CHECK-NEXT: gpu.yield %[[W]], %[[H]] : f32, index
// CHECK: return %[[DS]], %[[DSLOPES]] : tensor<1x2x8x8xf32>, tensor<2xf32>
func.func @alibi_causal(%q: tensor<1x2x8x16xf32>, %k: tensor<1x2x8x16xf32>, %v: tensor<1x2x8x16xf32>, %slopes: tensor<2xf32>) -> (tensor<1x2x8x16xf32>, tensor<1x2x8xf32>) {
  %s = "attn.score"(%q, %k) {scale = 0.25 : f32} : (tensor<1x2x8x16xf32>, tensor<1x2x8x16xf32>) -> tensor<1x2x8x8xf32>
  %sm = "attn.score_mod"(%s) ({
  ^bb0(%x: f32, %b: index, %h: index, %i: index, %j: index):
    %e = tensor.extract %slopes[%h] : tensor<2xf32>
    %d = arith.subi %j, %i : index
    %d64 = arith.index_cast %d : index to i64
    %df = arith.sitofp %d64 : i64 to f32
    %bias = arith.mulf %e, %df : f32
    %y = arith.addf %x, %bias : f32
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

// Soft-capping, cap * tanh(s / cap): the chain rule through mulf, tanh (1 - tanh^2) and mulf,
// with the forward values it needs recomputed first. The products with the constants cap and
// 1 / cap only scale the gradient; their factors meet as 30 * f32(1 / 30), which rounds to 1 in
// f32, so no multiply by either is written. Nothing is read from a closure tensor.
// CHECK-LABEL: func.func @softcap_grad(
// CHECK-SAME: -> tensor<1x1x4x4xf32> attributes {attn.closure_args = array<i64>}
// CHECK: "attn.normalize_grad"
// CHECK: "attn.score_mod_grad"
// CHECK-NEXT: ^bb0(%[[X:[^:]+]]: f32, %[[G:[^:]+]]: f32,
// CHECK: %[[T:.*]] = math.tanh
// CHECK: %[[ONE:.*]] = arith.constant 1.000000e+00 : f32
// CHECK: %[[SQ:.*]] = arith.mulf %[[T]], %[[T]] : f32
// CHECK: %[[SECH2:.*]] = arith.subf %[[ONE]], %[[SQ]] : f32
// CHECK: %[[GX:.*]] = arith.mulf %[[G]], %[[SECH2]] : f32
// CHECK-NEXT: gpu.yield %[[GX]] : f32
// CHECK-NOT: "attn.closure_grad"
func.func @softcap(%q: tensor<1x1x4x8xf32>, %k: tensor<1x1x4x8xf32>, %v: tensor<1x1x4x8xf32>) -> tensor<1x1x4x8xf32> {
  %s = "attn.score"(%q, %k) {scale = 0.125 : f32} : (tensor<1x1x4x8xf32>, tensor<1x1x4x8xf32>) -> tensor<1x1x4x4xf32>
  %sm = "attn.score_mod"(%s) ({
  ^bb0(%x: f32, %b: index, %h: index, %i: index, %j: index):
    %inv = arith.constant 0.0333333351 : f32
    %cap = arith.constant 30.0 : f32
    %y = arith.mulf %x, %inv : f32
    %t = math.tanh %y : f32
    %z = arith.mulf %t, %cap : f32
    "gpu.yield"(%z) : (f32) -> ()
  }) : (tensor<1x1x4x4xf32>) -> tensor<1x1x4x4xf32>
  %p = "attn.normalize"(%sm) ({}, {}, {}) {kind = "softmax", operandSegmentSizes = array<i32: 1, 0>, resultSegmentSizes = array<i32: 1, 0>} : (tensor<1x1x4x4xf32>) -> tensor<1x1x4x4xf32>
  %o = "attn.aggregate"(%p, %v) : (tensor<1x1x4x4xf32>, tensor<1x1x4x8xf32>) -> tensor<1x1x4x8xf32>
  return %o : tensor<1x1x4x8xf32>
}

// -----

// A bias table read twice, and a float closure read only by a comparison: the table's gradient
// has one (value, indices) group per read; the compared tensor gets no closure_grad.
// CHECK-LABEL: func.func @two_reads_grad(
// CHECK-SAME: %{{[^:]+}}: tensor<2x3xf32>, %{{[^:]+}}: tensor<2xbf16>)
// CHECK-SAME: -> (tensor<1x2x4x4xf32>, tensor<2x3xf32>) attributes {attn.closure_args = array<i64: 3, 4>}
// CHECK: "attn.closure_grad"
// CHECK: gpu.yield %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} : f32, index, index, f32, index, index
// CHECK-NOT: "attn.closure_grad"
func.func @two_reads(%q: tensor<1x2x4x8xf32>, %k: tensor<1x2x4x8xf32>, %v: tensor<1x2x4x8xf32>, %table: tensor<2x3xf32>, %gate: tensor<2xbf16>) -> tensor<1x2x4x8xf32> {
  %s = "attn.score"(%q, %k) {scale = 0.125 : f32} : (tensor<1x2x4x8xf32>, tensor<1x2x4x8xf32>) -> tensor<1x2x4x4xf32>
  %sm = "attn.score_mod"(%s) ({
  ^bb0(%x: f32, %b: index, %h: index, %i: index, %j: index):
    %c0 = arith.constant 0 : index
    %c2 = arith.constant 2 : index
    %t0 = tensor.extract %table[%h, %c0] : tensor<2x3xf32>
    %t2 = tensor.extract %table[%h, %c2] : tensor<2x3xf32>
    %gh = tensor.extract %gate[%h] : tensor<2xbf16>
    %g = arith.extf %gh : bf16 to f32
    %zero = arith.constant 0.0 : f32
    %on = arith.cmpf ogt, %g, %zero : f32
    %scaled = arith.mulf %x, %t0 : f32
    %biased = arith.addf %scaled, %t2 : f32
    %y = arith.select %on, %biased, %x : f32
    "gpu.yield"(%y) : (f32) -> ()
  }) : (tensor<1x2x4x4xf32>) -> tensor<1x2x4x4xf32>
  %p = "attn.normalize"(%sm) ({}, {}, {}) {kind = "sigmoid", operandSegmentSizes = array<i32: 1, 0>, resultSegmentSizes = array<i32: 1, 0>} : (tensor<1x2x4x4xf32>) -> tensor<1x2x4x4xf32>
  %o = "attn.aggregate"(%p, %v) : (tensor<1x2x4x4xf32>, tensor<1x2x4x8xf32>) -> tensor<1x2x4x8xf32>
  return %o : tensor<1x2x4x8xf32>
}

// -----

// Without a score_mod the normalizer's derivative is the score gradient.
// CHECK-LABEL: func.func @plain_grad(
// CHECK-NOT: "attn.score_mod"
// CHECK: %[[D:.*]] = "attn.normalize_grad"
// CHECK: kind = "relu"
// CHECK-SAME: stat = "none"
// CHECK-NEXT: return %[[D]]
func.func @plain(%q: tensor<1x1x4x8xf32>, %k: tensor<1x1x4x8xf32>, %v: tensor<1x1x4x8xf32>) -> tensor<1x1x4x8xf32> {
  %s = "attn.score"(%q, %k) {scale = 0.125 : f32} : (tensor<1x1x4x8xf32>, tensor<1x1x4x8xf32>) -> tensor<1x1x4x4xf32>
  %p = "attn.normalize"(%s) ({}, {}, {}) {kind = "relu", operandSegmentSizes = array<i32: 1, 0>, resultSegmentSizes = array<i32: 1, 0>} : (tensor<1x1x4x4xf32>) -> tensor<1x1x4x4xf32>
  %o = "attn.aggregate"(%p, %v) : (tensor<1x1x4x4xf32>, tensor<1x1x4x8xf32>) -> tensor<1x1x4x8xf32>
  return %o : tensor<1x1x4x8xf32>
}

// -----

// A user normalizer with a running max, prob = exp(s - m), finalize = acc / l: its regions are
// copied, and prob_grad / finalize_grad yield both partial derivatives times the incoming g.
// CHECK-LABEL: func.func @online_grad(
// CHECK: "attn.normalize_grad"
// prob
// CHECK: math.exp
// CHECK: gpu.yield
// finalize
// CHECK: arith.divf
// CHECK: gpu.yield
// prob_grad: g * e for s, -(g * e) for m
// CHECK: ^bb0(%{{[^:]+}}: f32, %{{[^:]+}}: f32, %[[G:[^:]+]]: f32):
// CHECK: %[[E:.*]] = math.exp
// CHECK-NEXT: %[[GE:.*]] = arith.mulf %[[G]], %[[E]] : f32
// CHECK-NEXT: %[[NGE:.*]] = arith.negf %[[GE]] : f32
// CHECK-NEXT: gpu.yield %[[GE]], %[[NGE]] : f32, f32
// finalize_grad: g / l for acc, -(g / l) * (acc / l) for l
// CHECK: ^bb0(%[[ACC:[^:]+]]: f32, %[[L:[^:]+]]: f32, %[[G2:[^:]+]]: f32):
// CHECK-NEXT: %[[Q:.*]] = arith.divf %[[ACC]], %[[L]] : f32
// CHECK-NEXT: %[[GL:.*]] = arith.divf %[[G2]], %[[L]] : f32
// CHECK-NEXT: %[[P:.*]] = arith.mulf %[[GL]], %[[Q]] : f32
// CHECK-NEXT: %[[N:.*]] = arith.negf %[[P]] : f32
// CHECK-NEXT: gpu.yield %[[GL]], %[[N]] : f32, f32
// CHECK: kind = "online"
// CHECK-SAME: stat = "max"
func.func @online(%q: tensor<1x1x4x8xf32>, %k: tensor<1x1x4x8xf32>, %v: tensor<1x1x4x8xf32>) -> tensor<1x1x4x8xf32> {
  %s = "attn.score"(%q, %k) {scale = 0.125 : f32} : (tensor<1x1x4x8xf32>, tensor<1x1x4x8xf32>) -> tensor<1x1x4x4xf32>
  %p = "attn.normalize"(%s) ({
  ^bb0(%x: f32, %m: f32):
    %d = arith.subf %x, %m : f32
    %e = math.exp %d : f32
    "gpu.yield"(%e) : (f32) -> ()
  }, {
  ^bb0(%a: f32, %b: f32):
    %d = arith.subf %a, %b : f32
    %e = math.exp %d : f32
    "gpu.yield"(%e) : (f32) -> ()
  }, {
  ^bb0(%acc: f32, %l: f32):
    %r = arith.divf %acc, %l : f32
    "gpu.yield"(%r) : (f32) -> ()
  }) {kind = "online", operandSegmentSizes = array<i32: 1, 0>, resultSegmentSizes = array<i32: 1, 0>} : (tensor<1x1x4x4xf32>) -> tensor<1x1x4x4xf32>
  %o = "attn.aggregate"(%p, %v) : (tensor<1x1x4x4xf32>, tensor<1x1x4x8xf32>) -> tensor<1x1x4x8xf32>
  return %o : tensor<1x1x4x8xf32>
}
