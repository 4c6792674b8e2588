// attn-tile and attn-tile-backward fold constant factors into the score's scale where they
// inline a score_mod (passes/scaled_mods.py). An additive bias (ALiBi: s + slope[h] * (j - i)):
// the softmax's log2(e) goes to the score's scale (0.25 * 1.4427 = 0.360674) and to the slope,
// read once per program, so the sum feeds the row max with no multiply after it. A soft cap
// (30 * tanh(s / 30)): s / 30 becomes one multiply of the raw score by 0.25 / 30 = 0.00833 and
// log2(e) joins the cap (30 * 1.4427 = 43.28); the backward's gradient reads the score the same
// way, and divides by no constant: it multiplies by the reciprocal.
// RUN: ae-opt %s --split-input-file --pass-pipeline='builtin.module(attn-fuse-online-softmax,attn-tile{block-m=32 block-n=32})' --no-mlir-print-op-generic | FileCheck %s
// RUN: ae-opt %s --split-input-file --pass-pipeline='builtin.module(attn-differentiate,attn-tile-backward{block-m=32 block-n=32})' --no-mlir-print-op-generic | FileCheck %s --check-prefix=BWD

// The ALiBi tile: the slope times log2(e), the raw score times scale * log2(e), their sum.
// CHECK-LABEL: func.func @attention(
// CHECK: scf.for
// CHECK: %[[S:.*]] = linalg.matmul
// CHECK: linalg.generic {{.*}} ins(%[[S]] : tensor<32x32xf32>)
// CHECK-NEXT: ^bb0(%[[RAW:[a-z0-9_]+]]: f32, %{{.*}}: f32):
// CHECK-NOT: arith.constant 2.500000e-01
// CHECK: %[[SLOPE:.*]] = tensor.extract
// CHECK: %[[D:.*]] = arith.sitofp
// CHECK-DAG: %[[L2E:.*]] = arith.constant 1.44269502 : f32
// CHECK-DAG: %[[SCALE:.*]] = arith.constant 0.360673755 : f32
// CHECK-DAG: %[[X:.*]] = arith.mulf %[[RAW]], %[[SCALE]] : f32
// CHECK-DAG: %[[K:.*]] = arith.mulf %[[SLOPE]], %[[L2E]] : f32
// CHECK-DAG: %[[B:.*]] = arith.mulf %[[K]], %[[D]] : f32
// CHECK: %[[SUM:.*]] = arith.addf %[[X]], %[[B]] : f32
// CHECK-NEXT: linalg.yield %[[SUM]] : f32
// The backward kernels recompute P the same way.
// BWD-LABEL: func.func @attention_bwd_dq(
// BWD: arith.constant 0.360673755 : f32
// BWD: math.exp2
// BWD-LABEL: func.func @attention_bwd_dkdv(
// BWD: arith.constant 0.360673755 : f32
// BWD: math.exp2
func.func @attention(%q: tensor<1x2x64x16xf32>, %k: tensor<1x2x64x16xf32>, %v: tensor<1x2x64x16xf32>, %slopes: tensor<2xf32>) -> (tensor<1x2x64x16xf32>, tensor<1x2x64xf32>) {
  %s = "attn.score"(%q, %k) {scale = 0.25 : f32} : (tensor<1x2x64x16xf32>, tensor<1x2x64x16xf32>) -> tensor<1x2x64x64xf32>
  %sm = "attn.score_mod"(%s) ({
  ^bb0(%x: f32, %b: index, %h: index, %i: index, %j: index):
    %e = tensor.extract %slopes[%h] : tensor<2xf32>
    %d = arith.subi %j, %i : index
    %di = arith.index_cast %d : index to i64
    %df = arith.sitofp %di : i64 to f32
    %bias = arith.mulf %e, %df : f32
    %y = arith.addf %x, %bias : f32
    "gpu.yield"(%y) : (f32) -> ()
  }) : (tensor<1x2x64x64xf32>) -> tensor<1x2x64x64xf32>
  %p, %lse = "attn.normalize"(%sm) ({}, {}, {}) {kind = "softmax", operandSegmentSizes = array<i32: 1, 0>, resultSegmentSizes = array<i32: 1, 1>} : (tensor<1x2x64x64xf32>) -> (tensor<1x2x64x64xf32>, tensor<1x2x64xf32>)
  %o = "attn.aggregate"(%p, %v) : (tensor<1x2x64x64xf32>, tensor<1x2x64x16xf32>) -> tensor<1x2x64x16xf32>
  return %o, %lse : tensor<1x2x64x16xf32>, tensor<1x2x64xf32>
}

// -----

// The soft-capping tile: tanh of the raw score times scale / 30, times 30 * log2(e).
// CHECK-LABEL: func.func @attention(
// CHECK: scf.for
// CHECK: linalg.generic
// CHECK-NEXT: ^bb0(%[[RAW2:[a-z0-9_]+]]: f32, %{{.*}}: f32):
// CHECK-NOT: arith.divf
// CHECK: %[[C1:.*]] = arith.constant 0.00833333377 : f32
// CHECK: %[[Y:.*]] = arith.mulf %[[RAW2]], %[[C1]] : f32
// CHECK: %[[T:.*]] = math.tanh %[[Y]] : f32
// CHECK: %[[C2:.*]] = arith.constant 43.2808495 : f32
// CHECK: %[[Z:.*]] = arith.mulf %{{.*}}, %{{.*}} : f32
// CHECK-NEXT: linalg.yield %[[Z]] : f32
// The backward's dS reads tanh(s / 30) through one multiply as well; its chain rule's product
// with 30 and division by 30 only scale the gradient, and their factors cancel: dS is
// dP-term * (1 - t^2), with no divide and no multiply by 30 or 1 / 30 in either kernel.
// BWD-LABEL: func.func @attention_bwd_dq(
// BWD-NOT: arith.divf
// BWD: math.tanh
// BWD-NOT: arith.divf
// BWD-NOT: arith.constant 0.0333333351 : f32
// BWD-NOT: arith.constant 3.000000e+01 : f32
// BWD: %[[T:.*]] = math.tanh
// BWD: %[[SQ:.*]] = arith.mulf %[[T]], %[[T]] : f32
// BWD: %[[SECH2:.*]] = arith.subf %{{.*}}, %[[SQ]] : f32
// BWD: %[[DS:.*]] = arith.mulf %{{.*}}, %[[SECH2]] : f32
// BWD-NEXT: linalg.yield %[[DS]] : f32
// BWD-LABEL: func.func @attention_bwd_dkdv(
// BWD-NOT: arith.divf
// BWD: math.tanh
// BWD-NOT: arith.divf
// BWD-NOT: arith.constant 0.0333333351 : f32
// BWD-NOT: arith.constant 3.000000e+01 : f32
// BWD: %[[T2:.*]] = math.tanh
// BWD: %[[SQ2:.*]] = arith.mulf %[[T2]], %[[T2]] : f32
// BWD: %[[SECH22:.*]] = arith.subf %{{.*}}, %[[SQ2]] : f32
// BWD: %[[DS2:.*]] = arith.mulf %{{.*}}, %[[SECH22]] : f32
// BWD-NEXT: linalg.yield %[[DS2]] : f32
// BWD: return
func.func @attention(%q: tensor<1x1x64x16xf32>, %k: tensor<1x1x64x16xf32>, %v: tensor<1x1x64x16xf32>) -> (tensor<1x1x64x16xf32>, tensor<1x1x64xf32>) {
  %s = "attn.score"(%q, %k) {scale = 0.25 : f32} : (tensor<1x1x64x16xf32>, tensor<1x1x64x16xf32>) -> tensor<1x1x64x64xf32>
  %sm = "attn.score_mod"(%s) ({
  ^bb0(%x: f32, %b: index, %h: index, %i: index, %j: index):
    %c = arith.constant 30.0 : f32
    %r = arith.divf %x, %c : f32
    %t = math.tanh %r : f32
    %y = arith.mulf %c, %t : f32
    "gpu.yield"(%y) : (f32) -> ()
  }) : (tensor<1x1x64x64xf32>) -> tensor<1x1x64x64xf32>
  %p, %lse = "attn.normalize"(%sm) ({}, {}, {}) {kind = "softmax", operandSegmentSizes = array<i32: 1, 0>, resultSegmentSizes = array<i32: 1, 1>} : (tensor<1x1x64x64xf32>) -> (tensor<1x1x64x64xf32>, tensor<1x1x64xf32>)
  %o = "attn.aggregate"(%p, %v) : (tensor<1x1x64x64xf32>, tensor<1x1x64x16xf32>) -> tensor<1x1x64x16xf32>
  return %o, %lse : tensor<1x1x64x16xf32>, tensor<1x1x64xf32>
}
