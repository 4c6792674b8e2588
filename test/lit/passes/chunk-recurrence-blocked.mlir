// The split form's GLA ("token_dim") output kernel: a program computes one block of 16 rows of a
// chunk (grid [B, H, NC * C / 16 * Dv / BV]); the earlier blocks of its chunk are an scf.for whose
// products factorize at the block's boundary on tensor cores, then the diagonal block is the 3-D
// generic over (t, s, d) in slices of 32 columns of Dk.
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-chunk-recurrence{split=1 block-v=64},cse)' --no-mlir-print-op-generic | FileCheck %s

// CHECK-LABEL: func.func @gla_decays
// CHECK-LABEL: func.func @gla_states
// CHECK-LABEL: func.func @gla(
// CHECK-SAME: attn.block_v = 64 : i64, attn.chunk_size = 64 : i64, attn.grid = array<i64: 1, 2, 8>
// CHECK: %[[REST:.*]] = "attn.program_id"() {axis = 2 : i64}
// CHECK: arith.divsi %[[REST]], %c4
// CHECK: arith.remsi %[[REST]], %c4
// The state's part, then the earlier blocks.
// CHECK: linalg.matmul {{.*}} : tensor<16x64xf32>, tensor<64x64xf32>) outs(%{{.*}} : tensor<16x64xf32>)
// CHECK: scf.for {{.*}} -> (tensor<16x64xf32>)
// CHECK: linalg.matmul {{.*}} : tensor<16x64xf32>, tensor<64x16xf32>) outs(%{{.*}} : tensor<16x16xf32>)
// CHECK: linalg.matmul {{.*}} : tensor<16x16xf32>, tensor<16x64xf32>)
// CHECK: scf.yield
// The diagonal block, two slices of 32 columns.
// CHECK: linalg.generic {{.*}} iterator_types = ["parallel", "parallel", "reduction"]} ins({{.*}} : tensor<16x32xf32>, tensor<16x32xf32>, tensor<16x32xf32>, tensor<16x32xf32>) outs(%{{.*}} : tensor<16x16xf32>)
// CHECK: linalg.generic {{.*}} iterator_types = ["parallel", "parallel", "reduction"]} ins({{.*}} : tensor<16x32xf32>, tensor<16x32xf32>, tensor<16x32xf32>, tensor<16x32xf32>) outs(%{{.*}} : tensor<16x16xf32>)
// CHECK: tensor.insert_slice

func.func @gla(%q: tensor<1x2x128x64xf32>, %k: tensor<1x2x128x64xf32>, %v: tensor<1x2x128x64xf32>, %g: tensor<1x2x128x64xf32>) -> (tensor<1x2x128x64xf32>, tensor<1x2x64x64xf32>) {
  %o, %st = "attn.linear_recurrence"(%q, %k, %v, %g) ({}, {}, {}) {decay = "token_dim", scale = 0.125 : f32, normalize = false, chunk_size = 64 : i64, operandSegmentSizes = array<i32: 1, 1, 1, 1, 0, 0>} : (tensor<1x2x128x64xf32>, tensor<1x2x128x64xf32>, tensor<1x2x128x64xf32>, tensor<1x2x128x64xf32>) -> (tensor<1x2x128x64xf32>, tensor<1x2x64x64xf32>)
  return %o, %st : tensor<1x2x128x64xf32>, tensor<1x2x64x64xf32>
}
