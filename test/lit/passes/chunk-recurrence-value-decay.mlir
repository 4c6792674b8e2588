// The "token_value_dim" decay (g [B, H, L, Dv]) decays the state's columns: what the gradients of
// GLA with respect to q and k compute. The decay leaves the scores and acts on the values: the
// chunk's A @ v becomes exp(G) * (A @ (v exp(-G))), or a 3-D generic over (t, s, j) reducing s
// in a chunk that decays more than 40 nats, the state's product is decayed by column, and the
// state update decays v rather than k.
// RUN: ae-opt %s --split-input-file --pass-pipeline='builtin.module(attn-chunk-recurrence,cse)' --no-mlir-print-op-generic | FileCheck %s
// RUN: ae-opt %s --split-input-file --pass-pipeline='builtin.module(attn-chunk-recurrence{split=1},cse)' --no-mlir-print-op-generic | FileCheck %s --check-prefix=SPLIT

// One kernel: L = 40 in chunks of 32, Dk = 16, Dv = 8.
// CHECK-DAG: #[[TS:.*]] = affine_map<(d0, d1, d2) -> (d0, d1)>
// CHECK-DAG: #[[SJ:.*]] = affine_map<(d0, d1, d2) -> (d1, d2)>
// CHECK-DAG: #[[TJ:.*]] = affine_map<(d0, d1, d2) -> (d0, d2)>
// CHECK-DAG: #[[COLS:.*]] = affine_map<(d0, d1) -> (d1)>
// CHECK-LABEL: func.func @value_decay
// CHECK-SAME: attn.grid = array<i64: 1, 2, 1>
// CHECK: scf.for {{.*}} iter_args(%[[S:.*]] = %{{.*}}, %{{.*}} = %{{.*}}) -> (tensor<16x8xf32>, tensor<1x2x40x8xf32>)
// G [32, 8]: tril(ones) @ g over the values' columns.
// CHECK: %[[G:.*]] = linalg.matmul {attn.precision = "tf32x3"} ins(%{{.*}}, %{{.*}} : tensor<32x32xf32>, tensor<32x8xf32>)
// CHECK: %[[GEND:.*]] = linalg.reduce
// The scores: q k^T, scaled and causal, with no decay.
// CHECK: %[[QK:.*]] = linalg.matmul {attn.precision = "ieee"} ins(%[[Q:.*]], %[[KT:.*]] : tensor<32x16xf32>, tensor<16x32xf32>)
// CHECK: %[[A:.*]] = linalg.generic {{.*}} ins(%[[QK]] : tensor<32x32xf32>)
// CHECK-NOT: math.exp
// CHECK: arith.select
// sum_s A[t,s] v[s,j] exp(G[t,j] - G[s,j]) for s <= t: exp(G) * (A @ (v * exp(-G))) while |G|
// stays under 40 nats in the chunk, else (one trip) the 3-D generic.
// CHECK: %[[VF:.*]] = linalg.generic {{.*}} ins(%[[V:.*]], %[[G]] : tensor<32x8xf32>, tensor<32x8xf32>)
// CHECK: arith.negf
// CHECK: %[[AVF:.*]] = linalg.matmul {attn.precision = "ieee"} ins(%[[A]], %[[VF]] : tensor<32x32xf32>, tensor<32x8xf32>)
// CHECK: %[[FAST:.*]] = linalg.generic {{.*}} ins(%[[AVF]], %[[G]] :
// CHECK: math.absf
// CHECK: linalg.reduce ins(%{{.*}} : tensor<32xf32>) outs(%{{.*}} : tensor<f32>) dimensions = [0]
// CHECK: %[[TRIPS:.*]] = arith.select %{{.*}}, %c1, %c0 : index
// CHECK: %[[AV:.*]] = scf.for %{{.*}} = %c0 to %[[TRIPS]] step %c1 iter_args(%{{.*}} = %[[FAST]])
// CHECK: linalg.generic {indexing_maps = [#[[TS]], #[[SJ]], #[[TJ]], #[[SJ]], #[[TJ]]], iterator_types = ["parallel", "reduction", "parallel"]} ins(%[[A]], %[[V]], %[[G]], %[[G]] :
// CHECK: arith.cmpi sle
// CHECK: math.exp
// The state's part: scale * (q @ S) * exp(G).
// CHECK: %[[QS:.*]] = linalg.matmul {attn.precision = "ieee"} ins(%[[Q]], %[[S]] : tensor<32x16xf32>, tensor<16x8xf32>)
// CHECK: %[[O:.*]] = linalg.generic {{.*}} ins(%[[AV]], %[[QS]], %[[G]] :
// CHECK: math.exp
// CHECK: tensor.insert_slice
// S * exp(G_end) by column, plus k^T @ (v * exp(G_end - G)).
// CHECK: %[[VD:.*]] = linalg.generic {{.*}} ins(%[[V]], %[[G]], %[[GEND]] : tensor<32x8xf32>, tensor<32x8xf32>, tensor<8xf32>)
// CHECK: %[[SD:.*]] = linalg.generic {indexing_maps = [#[[COLS]], {{.*}}]{{.*}} ins(%[[GEND]] : tensor<8xf32>) outs(%[[S]] : tensor<16x8xf32>)
// CHECK: linalg.matmul {attn.precision = "ieee"} ins(%[[KT]], %[[VD]] : tensor<16x32xf32>, tensor<32x8xf32>) outs(%[[SD]] : tensor<16x8xf32>)

// Split: the cumulative decays span Dv, then the chunk states, the chunks' scores into w2 and
// the output kernel (below, at chunk 64).
// SPLIT-LABEL: func.func @value_decay_decays
// SPLIT-SAME: -> tensor<1x2x40x8xf32>
// SPLIT-LABEL: func.func @value_decay_states
// SPLIT-LABEL: func.func @value_decay_scores
// SPLIT-SAME: -> tensor<1x2x64x32xf32>
// SPLIT-LABEL: func.func @value_decay(
// SPLIT-SAME: attn.block_v = 8 : i64

func.func @value_decay(%q: tensor<1x2x40x16xf32>, %k: tensor<1x2x40x16xf32>, %v: tensor<1x2x40x8xf32>, %g: tensor<1x2x40x8xf32>) -> (tensor<1x2x40x8xf32>, tensor<1x2x16x8xf32>) {
  %o, %st = "attn.linear_recurrence"(%q, %k, %v, %g) ({}, {}, {}) {decay = "token_value_dim", scale = 0.25 : f32, normalize = false, chunk_size = 32 : i64, operandSegmentSizes = array<i32: 1, 1, 1, 1, 0, 0>} : (tensor<1x2x40x16xf32>, tensor<1x2x40x16xf32>, tensor<1x2x40x8xf32>, tensor<1x2x40x8xf32>) -> (tensor<1x2x40x8xf32>, tensor<1x2x16x8xf32>)
  return %o, %st : tensor<1x2x40x8xf32>, tensor<1x2x16x8xf32>
}

// -----

// SPLIT-LABEL: func.func @wide_values_decays
// SPLIT-SAME: -> tensor<1x2x128x64xf32>
// The chunk's scores, undecayed, into workspace w2 by a kernel of their own (a program per
// chunk): the output kernel loads them rather than feeding its own product to the next one.
// SPLIT-LABEL: func.func @wide_values_scores(
// SPLIT-SAME: attn.arg_roles = ["q", "k", "v", "c0", "w2"]
// SPLIT-SAME: attn.chunk_stage = "scores", attn.grid = array<i64: 1, 2, 2>
// SPLIT: linalg.matmul {{.*}} : tensor<64x16xf32>, tensor<16x64xf32>)
// SPLIT-NOT: math.exp
// SPLIT: tensor.insert_slice %{{.*}} into %{{.*}} [1, 1, 64, 64]
// SPLIT-LABEL: func.func @wide_values(
// SPLIT-SAME: attn.arg_roles = ["q", "k", "v", "c0", "w1", "w2", "w0", "out"]
// SPLIT-SAME: attn.block_v = 32 : i64, attn.chunk_size = 64 : i64, attn.grid = array<i64: 1, 2, 4>
// A program per chunk and 32 V columns: exp(G) * (A @ (v exp(-G))) with A loaded from w2, and the
// state's part, stored (one trip) while the chunk's |G| over the columns stays under 40 nats.
// SPLIT: %[[A:.*]] = tensor.extract_slice %arg5[{{.*}}] [1, 1, 64, 64] {{.*}} to tensor<64x64xf32>
// SPLIT: %[[AV:.*]] = linalg.matmul {{.*}} ins(%[[A]], %{{.*}} : tensor<64x64xf32>, tensor<64x32xf32>)
// SPLIT: %[[QS:.*]] = linalg.matmul {{.*}} : tensor<64x16xf32>, tensor<16x32xf32>)
// SPLIT: math.absf
// SPLIT: linalg.reduce ins(%{{.*}} : tensor<64xf32>) outs(%{{.*}} : tensor<f32>) dimensions = [0]
// SPLIT: %[[WIDE:.*]] = arith.select %{{.*}}, %c1, %c0 : index
// SPLIT: %[[NARROW:.*]] = arith.subi %c1, %[[WIDE]] : index
// SPLIT: %[[STORED:.*]] = scf.for %{{.*}} = %c0 to %[[NARROW]] step %c1 iter_args(%[[OUT:.*]] = %{{.*}})
// SPLIT: tensor.insert_slice %{{.*}} into %[[OUT]]{{.*}} [1, 1, %{{.*}}, 32]
// Past it (one trip), its four blocks of 16 rows, each walking its earlier blocks in an scf.for.
// SPLIT: scf.for %{{.*}} = %c0 to %[[WIDE]] step %c1 iter_args(%{{.*}} = %[[STORED]])
// SPLIT: scf.for %[[BLOCK:.*]] = %c0 to %c4 step %c1
// SPLIT: scf.for %{{.*}} = %c0 to %[[BLOCK]] step %c1 iter_args({{.*}}) -> (tensor<16x32xf32>)
// SPLIT: linalg.matmul {{.*}} : tensor<16x16xf32>, tensor<16x32xf32>)
// SPLIT: scf.yield
// The diagonal block factorized like the earlier ones (v's exponents capped at 40), on tensor
// cores, unless the block's own decay passes 40: then one trip of the exact 3-D form.
// SPLIT: %[[DIAG:.*]] = linalg.matmul {{.*}} : tensor<16x16xf32>, tensor<16x32xf32>)
// SPLIT: %[[FAST:.*]] = linalg.generic {{.*}} ins(%{{.*}}, %[[DIAG]], %{{.*}}, %{{.*}} : tensor<16x32xf32>, tensor<16x32xf32>, tensor<16x32xf32>, tensor<32xf32>)
// SPLIT: %[[SPAN:.*]] = linalg.reduce ins(%{{.*}} : tensor<16xf32>) outs(%{{.*}} : tensor<f32>) dimensions = [0]
// SPLIT: %[[TRIPS:.*]] = arith.select %{{.*}}, %c1, %c0 : index
// SPLIT: scf.for %{{.*}} = %c0 to %[[TRIPS]] step %c1 iter_args(%{{.*}} = %[[FAST]]) -> (tensor<16x32xf32>)
// SPLIT: linalg.generic {{.*}} iterator_types = ["parallel", "reduction", "parallel"]} ins({{.*}} : tensor<16x16xf32>, tensor<16x32xf32>, tensor<16x32xf32>, tensor<16x32xf32>) outs({{.*}} : tensor<16x32xf32>)

func.func @wide_values(%q: tensor<1x2x128x16xf32>, %k: tensor<1x2x128x16xf32>, %v: tensor<1x2x128x64xf32>, %g: tensor<1x2x128x64xf32>) -> (tensor<1x2x128x64xf32>, tensor<1x2x16x64xf32>) {
  %o, %st = "attn.linear_recurrence"(%q, %k, %v, %g) ({}, {}, {}) {decay = "token_value_dim", scale = 0.25 : f32, normalize = false, chunk_size = 64 : i64, operandSegmentSizes = array<i32: 1, 1, 1, 1, 0, 0>} : (tensor<1x2x128x16xf32>, tensor<1x2x128x16xf32>, tensor<1x2x128x64xf32>, tensor<1x2x128x64xf32>) -> (tensor<1x2x128x64xf32>, tensor<1x2x16x64xf32>)
  return %o, %st : tensor<1x2x128x64xf32>, tensor<1x2x16x64xf32>
}
