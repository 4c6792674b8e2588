// attn-tile{call-time-tables=true} and attn-tile-backward on a mask that reads a closure tensor
// and the batch entry (document ids per batch row, c0[b, q]): the four tile tables take a batch
// and a head axis, [B, 1, ..] here (the mask does not read h), and every program reads the row
// of its own entry (attn.program_id 0) and head (0: the axis has one slice). The dK/dV kernel's
// tables are per KV block. A mask of positions and closure tensors alone keeps one table for all
// programs (tile-backward-call-time.mlir). A block number read from a call-time table carries
// attn.bounds, the numbers the table can hold (one per block of the walked axis), for the index
// analysis (passes/index_bounds.py).
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-verify,attn-fuse-online-softmax,attn-tile{block-m=16 block-n=16 call-time-tables=true})' --no-mlir-print-op-generic | FileCheck %s
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-verify,attn-differentiate,attn-tile-backward{block-m=16 block-n=16 call-time-tables=true})' --no-mlir-print-op-generic | FileCheck %s --check-prefix=BWD

// CHECK-LABEL: func.func @attention(
// CHECK-SAME: %[[PC:[a-z0-9]+]]: tensor<2x1x2xi32>, %[[PI:[a-z0-9]+]]: tensor<2x1x2x2xi32>, %[[FC:[a-z0-9]+]]: tensor<2x1x2xi32>, %[[FI:[a-z0-9]+]]: tensor<2x1x2x2xi32>
// CHECK-SAME: attn.call_time_tables
// CHECK: %[[B:[0-9]+]] = "attn.program_id"() {axis = 0 : i64}
// CHECK: %[[M:[0-9]+]] = "attn.program_id"() {axis = 2 : i64}
// CHECK: %[[ZERO:[a-z0-9_]+]] = arith.constant 0 : index
// CHECK: tensor.extract %[[PC]][%[[B]], %[[ZERO]], %[[M]]] : tensor<2x1x2xi32>
// CHECK: scf.for %[[I:[a-z0-9]+]] =
// CHECK: tensor.extract %[[PI]][%[[B]], %[[ZERO]], %[[M]], %[[I]]] {attn.bounds = array<i64: 0, 1>} : tensor<2x1x2x2xi32>
// CHECK: tensor.extract %[[FC]][%[[B]], %{{[a-z0-9_]+}}, %[[M]]] : tensor<2x1x2xi32>

// BWD-LABEL: func.func @attention_bwd_dq(
// BWD-SAME: tensor<2x1x2xi32>, %{{[a-z0-9]+}}: tensor<2x1x2x2xi32>, %{{[a-z0-9]+}}: tensor<2x1x2xi32>, %{{[a-z0-9]+}}: tensor<2x1x2x2xi32>
// BWD-SAME: attn.call_time_tables
// BWD-LABEL: func.func @attention_bwd_dkdv(
// BWD-SAME: %[[PC:[a-z0-9]+]]: tensor<2x1x2xi32>, %{{[a-z0-9]+}}: tensor<2x1x2x2xi32>, %{{[a-z0-9]+}}: tensor<2x1x2xi32>, %{{[a-z0-9]+}}: tensor<2x1x2x2xi32>
// BWD-SAME: "dkdv_partial_count", "dkdv_partial_index", "dkdv_full_count", "dkdv_full_index"
// BWD: %[[B:[0-9]+]] = "attn.program_id"() {axis = 0 : i64}
// BWD: %[[N:[0-9]+]] = "attn.program_id"() {axis = 2 : i64}
// BWD: tensor.extract %[[PC]][%[[B]], %{{[a-z0-9_]+}}, %[[N]]] : tensor<2x1x2xi32>

module {
  func.func @attention(%q: tensor<2x1x32x16xf32>, %k: tensor<2x1x32x16xf32>, %v: tensor<2x1x32x16xf32>, %c0: tensor<2x32xi64>) -> (tensor<2x1x32x16xf32>, tensor<2x1x32xf32>) {
    %scores = "attn.score"(%q, %k) {scale = 0.25 : f32} : (tensor<2x1x32x16xf32>, tensor<2x1x32x16xf32>) -> tensor<2x1x32x32xf32>
    %keep = "attn.mask"() ({
    ^bb0(%b: index, %h: index, %q_idx: index, %kv_idx: index):
      %m1 = arith.constant 0 : index
      %m2 = arith.maxsi %b, %m1 : index
      %m3 = arith.constant 1 : index
      %m4 = arith.minsi %m2, %m3 : index
      %m5 = arith.constant 0 : index
      %m6 = arith.maxsi %q_idx, %m5 : index
      %m7 = arith.constant 31 : index
      %m8 = arith.minsi %m6, %m7 : index
      %m9 = tensor.extract %c0[%m4, %m8] : tensor<2x32xi64>
      %m10 = arith.index_cast %m9 : i64 to index
      %m11 = arith.constant 0 : index
      %m12 = arith.maxsi %b, %m11 : index
      %m13 = arith.constant 1 : index
      %m14 = arith.minsi %m12, %m13 : index
      %m15 = arith.constant 0 : index
      %m16 = arith.maxsi %kv_idx, %m15 : index
      %m17 = arith.constant 31 : index
      %m18 = arith.minsi %m16, %m17 : index
      %m19 = tensor.extract %c0[%m14, %m18] : tensor<2x32xi64>
      %m20 = arith.index_cast %m19 : i64 to index
      %m21 = arith.cmpi eq, %m10, %m20 : index
      "gpu.yield"(%m21) : (i1) -> ()
    }) : () -> tensor<2x1x32x32xi1>
    %probs, %lse = "attn.normalize"(%scores, %keep) ({}, {}, {}) {kind = "softmax", operandSegmentSizes = array<i32: 1, 1>, resultSegmentSizes = array<i32: 1, 1>} : (tensor<2x1x32x32xf32>, tensor<2x1x32x32xi1>) -> (tensor<2x1x32x32xf32>, tensor<2x1x32xf32>)
    %out = "attn.aggregate"(%probs, %v) : (tensor<2x1x32x32xf32>, tensor<2x1x32x16xf32>) -> tensor<2x1x32x16xf32>
    return %out, %lse : tensor<2x1x32x16xf32>, tensor<2x1x32xf32>
  }
}
