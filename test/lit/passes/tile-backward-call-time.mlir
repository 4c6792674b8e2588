// attn-tile-backward{call-time-tables=true}: a mask that reads a closure tensor (document ids)
// is classified at each call. Each backward kernel takes its own four tile tables as arguments
// (roles dq_* per query block, dkdv_* per KV block, which the runtime classifies from the mask
// program both carry) and walks them: partial tiles with the mask, then full ones. Without the
// option both kernels visit every tile with the mask.
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-verify,attn-differentiate,attn-tile-backward{block-m=16 block-n=16 call-time-tables=true})' --no-mlir-print-op-generic | FileCheck %s
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-verify,attn-differentiate,attn-tile-backward{block-m=16 block-n=16})' --no-mlir-print-op-generic | FileCheck %s --check-prefix=EVERY

// CHECK-LABEL: func.func @attention_bwd_dq(
// CHECK-SAME: %[[PC:[a-z0-9]+]]: tensor<2xi32>, %[[PI:[a-z0-9]+]]: tensor<2x2xi32>, %[[FC:[a-z0-9]+]]: tensor<2xi32>, %[[FI:[a-z0-9]+]]: tensor<2x2xi32>
// CHECK-SAME: attn.arg_roles = [{{.*}}"dq_partial_count", "dq_partial_index", "dq_full_count", "dq_full_index", "dq", "delta"]
// CHECK-SAME: attn.call_time_tables
// CHECK-SAME: attn.mask_program
// CHECK: tensor.extract %[[PC]]
// CHECK: scf.for
// CHECK: tensor.extract %[[PI]]
// CHECK: tensor.extract %[[FC]]
// CHECK: scf.for
// CHECK: tensor.extract %[[FI]]
// CHECK-LABEL: func.func @attention_bwd_dkdv(
// CHECK-SAME: tensor<2xi32>, %{{[a-z0-9]+}}: tensor<2x2xi32>, %{{[a-z0-9]+}}: tensor<2xi32>, %{{[a-z0-9]+}}: tensor<2x2xi32>
// CHECK-SAME: attn.arg_roles = [{{.*}}"dkdv_partial_count", "dkdv_partial_index", "dkdv_full_count", "dkdv_full_index", "dk", "dv"]
// CHECK-SAME: attn.call_time_tables
// EVERY-LABEL: func.func @attention_bwd_dq(
// EVERY-NOT: attn.call_time_tables
// EVERY: return

  func.func @attention(%q: tensor<1x1x32x16xf32>, %k: tensor<1x1x32x16xf32>, %v: tensor<1x1x32x16xf32>, %c0: tensor<32xi64>) -> (tensor<1x1x32x16xf32>, tensor<1x1x32xf32>) {
    %scores = "attn.score"(%q, %k) {scale = 0.25 : f32} : (tensor<1x1x32x16xf32>, tensor<1x1x32x16xf32>) -> tensor<1x1x32x32xf32>
    %keep = "attn.mask"() ({
    ^bb0(%b: index, %h: index, %q_idx: index, %kv_idx: index):
      %m1 = arith.constant 0 : index
      %m2 = arith.maxsi %q_idx, %m1 : index
      %m3 = arith.constant 31 : index
      %m4 = arith.minsi %m2, %m3 : index
      %m5 = tensor.extract %c0[%m4] : tensor<32xi64>
      %m6 = arith.index_cast %m5 : i64 to index
      %m7 = arith.constant 0 : index
      %m8 = arith.maxsi %kv_idx, %m7 : index
      %m9 = arith.constant 31 : index
      %m10 = arith.minsi %m8, %m9 : index
      %m11 = tensor.extract %c0[%m10] : tensor<32xi64>
      %m12 = arith.index_cast %m11 : i64 to index
      %m13 = arith.cmpi eq, %m6, %m12 : index
      "gpu.yield"(%m13) : (i1) -> ()
    }) : () -> tensor<1x1x32x32xi1>
    %probs, %lse = "attn.normalize"(%scores, %keep) ({}, {}, {}) {kind = "softmax", operandSegmentSizes = array<i32: 1, 1>, resultSegmentSizes = array<i32: 1, 1>} : (tensor<1x1x32x32xf32>, tensor<1x1x32x32xi1>) -> (tensor<1x1x32x32xf32>, tensor<1x1x32xf32>)
    %out = "attn.aggregate"(%probs, %v) : (tensor<1x1x32x32xf32>, tensor<1x1x32x16xf32>) -> tensor<1x1x32x16xf32>
    return %out, %lse : tensor<1x1x32x16xf32>, tensor<1x1x32xf32>
  }
