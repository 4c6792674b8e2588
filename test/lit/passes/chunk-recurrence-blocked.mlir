// The split form's GLA ("token_dim") output kernel: a program computes one block of 16 rows of a
// chunk (grid [B, H, NC * C / 16 * Dv / BV]); the earlier blocks of its chunk are an scf.for whose
// products factorize at the block's boundary on tensor cores, then the diagonal block is an
// scf.for over its 16 key rows: each row's column of scores (a row sum over Dk of q * k_s *
// exp(G - G_s)) times the row v_s, k_s, v_s and G_s gathered element by element.
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-chunk-recurrence{split=1 block-v=64},cse)' --no-mlir-print-op-generic | FileCheck %s

// CHECK-LABEL: func.func @gla_decays
// CHECK-LABEL: func.func @gla_states
// CHECK-LABEL: func.func @gla(
// CHECK-SAME: %[[Q:[a-z0-9]+]]: tensor<1x2x128x64xf32>, %[[K:[a-z0-9]+]]: tensor<1x2x128x64xf32>, %[[V:[a-z0-9]+]]: tensor<1x2x128x64xf32>, %{{.*}}: tensor<1x2x128x64xf32>, %[[G:[a-z0-9]+]]: tensor<1x2x128x64xf32>
// CHECK-SAME: attn.block_v = 64 : i64, attn.chunk_size = 64 : i64, attn.grid = array<i64: 1, 2, 8>
// CHECK: %[[REST:.*]] = "attn.program_id"() {axis = 2 : i64}
// CHECK: %[[BLOCK:.*]] = arith.remsi %[[REST]], %c4
// The state's part, then the earlier blocks.
// CHECK: linalg.matmul {{.*}} : tensor<16x64xf32>, tensor<64x64xf32>) outs(%{{.*}} : tensor<16x64xf32>)
// CHECK: scf.for %{{.*}} = %c0 to %[[BLOCK]] step %c1 iter_args({{.*}}) -> (tensor<16x64xf32>)
// CHECK: linalg.matmul {{.*}} : tensor<16x64xf32>, tensor<64x16xf32>) outs(%{{.*}} : tensor<16x16xf32>)
// CHECK: linalg.matmul {{.*}} : tensor<16x16xf32>, tensor<16x64xf32>)
// CHECK: scf.yield
// The diagonal block, one key row at a time.
// CHECK: scf.for %{{.*}} = %c0 to %c16 step %c1 iter_args(%[[O:.*]] = %{{.*}}) -> (tensor<16x64xf32>)
// CHECK: tensor.extract %[[K]]
// CHECK: tensor.extract %[[G]]
// CHECK: math.exp
// CHECK: %[[COLUMN:.*]] = linalg.reduce ins(%{{.*}} : tensor<16x64xf32>) outs(%{{.*}} : tensor<16xf32>) dimensions = [1]
// CHECK: tensor.extract %[[V]]
// CHECK: linalg.generic {{.*}} ins(%[[COLUMN]], %{{.*}} : tensor<16xf32>, tensor<64xf32>) outs(%[[O]] : tensor<16x64xf32>)
// CHECK: arith.cmpi sge
// CHECK: scf.yield
// CHECK: tensor.insert_slice

func.func @gla(%q: tensor<1x2x128x64xf32>, %k: tensor<1x2x128x64xf32>, %v: tensor<1x2x128x64xf32>, %g: tensor<1x2x128x64xf32>) -> (tensor<1x2x128x64xf32>, tensor<1x2x64x64xf32>) {
  %o, %st = "attn.linear_recurrence"(%q, %k, %v, %g) ({}, {}, {}) {decay = "token_dim", scale = 0.125 : f32, normalize = false, chunk_size = 64 : i64, operandSegmentSizes = array<i32: 1, 1, 1, 1, 0, 0>} : (tensor<1x2x128x64xf32>, tensor<1x2x128x64xf32>, tensor<1x2x128x64xf32>, tensor<1x2x128x64xf32>) -> (tensor<1x2x128x64xf32>, tensor<1x2x64x64xf32>)
  return %o, %st : tensor<1x2x128x64xf32>, tensor<1x2x64x64xf32>
}
