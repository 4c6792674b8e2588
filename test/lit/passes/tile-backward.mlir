// attn-tile-backward (after attn-differentiate) replaces the forward @f and its @f_grad with the
// softmax backward as two L1 kernels, FlashAttention-2's split, launched in this order:
//   @f_bwd_dq:   one program per (b, head, query block), the last query block first; it loads its
//                Q, dO, O rows once, writes delta = rowsum(dO O) - dlse, and loops over its KV
//                blocks accumulating dQ += dS K;
//   @f_bwd_dkdv: one program per (b, KV head, KV block); K and V tiles loaded once, then loops over
//                the query blocks that see the block (the forward's tile tables, transposed),
//                accumulating dV += P^T dO and dK += dS^T Q; GQA heads of the group looped inside.
// Both recompute P = exp2(scale log2(e) QK^T - lse log2(e)) and dS = P * (dO V^T - delta) per tile; partial tiles
// (the mask, ragged edges) select, full tiles do not; dK and dQ take the scale once at the end.
// Element-wise normalizers (the sigmoid case) get the same kernels without lse and delta; a
// user normalizer without a running max (RetNet's) gets a dQ kernel that sums each row's l and
// rowsum(p dP) with two dQ accumulators and writes the rows' delta and rscale for dK/dV; one with
// a running max (softmax written by hand) walks its KV tiles three times and also writes the
// rows' max, the key that attains it and the max's gradient. The forward and @f_grad are gone
// afterwards (the implicit check-nots). The errors are checked with --verify-diagnostics;
// split-file gives each part its own pipeline.
// RUN: split-file %s %t
// RUN: ae-opt %t/kernels.mlir --split-input-file --pass-pipeline='builtin.module(attn-differentiate,attn-tile-backward{block-m=32 block-n=32},cse)' --no-mlir-print-op-generic | FileCheck %t/kernels.mlir --implicit-check-not=_grad --implicit-check-not='@causal(' --implicit-check-not='@gqa(' --implicit-check-not='@sigmoid(' --implicit-check-not='@bias(' --implicit-check-not='@retnet(' --implicit-check-not='@by_hand(' --implicit-check-not=attn.score --implicit-check-not=attn.aggregate
// RUN: ae-opt %t/kernels.mlir --split-input-file --pass-pipeline='builtin.module(attn-differentiate,attn-tile-backward{block-m=32 block-n=32},cse)' | mlir-opt --split-input-file --irdl-file=%attn_irdl > /dev/null
// RUN: ae-opt %t/no-derivative.mlir --pass-pipeline='builtin.module(attn-tile-backward)' --verify-diagnostics

//--- kernels.mlir

// Causal, L = 100, bf16, 32x32 tiles (4 blocks; the last, rows 96..99, is ragged, so its tiles
// are always partial). The forward's lists, by query block: partial [0] [1] [2] [0 1 2 3], full
// [] [0] [0 1] []. The dK/dV kernel reads them transposed, by KV block: partial [0 3] [1 3]
// [2 3] [3], full [1 2] [2] [] [].
// CHECK-LABEL: func.func @causal_bwd_dq(
// CHECK-SAME: %[[Q:[a-z0-9]+]]: tensor<1x2x100x16xbf16>, %[[K:[a-z0-9]+]]: tensor<1x2x100x16xbf16>, %{{[a-z0-9]+}}: tensor<1x2x100x16xbf16>,
// CHECK-SAME: %[[O:[a-z0-9]+]]: tensor<1x2x100x16xbf16>, %[[DO:[a-z0-9]+]]: tensor<1x2x100x16xbf16>, %[[LSE:[a-z0-9]+]]: tensor<1x2x100xf32>, %[[DLSE:[a-z0-9]+]]: tensor<1x2x100xf32>,
// CHECK-SAME: %[[DQ:[a-z0-9]+]]: tensor<1x2x100x16xbf16>, %[[DELTA:[a-z0-9]+]]: tensor<1x2x100xf32>)
// CHECK-SAME: -> (tensor<1x2x100x16xbf16>, tensor<1x2x100xf32>)
// CHECK-SAME: attn.arg_roles = ["q", "k", "v", "out", "do", "lse", "dlse", "dq", "delta"]
// The last query blocks visit the most KV blocks (1, 2, 3, 4), which a GPU lowering starts first.
// CHECK-SAME: attn.block_m = 32 : i64, attn.block_n = 32 : i64, attn.grid = array<i64: 1, 2, 4>, attn.heavy_blocks = "last"
// CHECK-DAG: %[[PB:.*]] = "attn.program_id"() {axis = 0 : i64}
// CHECK-DAG: %[[PH:.*]] = "attn.program_id"() {axis = 1 : i64}
// CHECK-DAG: %[[PM:.*]] = "attn.program_id"() {axis = 2 : i64}
// CHECK: %[[QT:.*]] = tensor.pad
// CHECK: tensor.extract_slice %[[DO]][%[[PB]], %[[PH]], %{{.*}}, 0] [1, 1, %{{.*}}, 16]
// CHECK: %[[DOT:.*]] = tensor.pad
// CHECK: tensor.extract_slice %[[LSE]][%[[PB]], %[[PH]], %{{.*}}] [1, 1, %{{.*}}]
// CHECK: %[[L:.*]] = linalg.generic {{.*}} ins(%{{.*}} : tensor<32xf32>)
// CHECK: arith.cmpf oeq
// CHECK: arith.constant -1.44269502 : f32
// CHECK: arith.mulf
// CHECK: arith.select
// delta = rowsum(dO * O) - dlse, in f32.
// CHECK: tensor.extract_slice %[[O]][%[[PB]], %[[PH]], %{{.*}}, 0] [1, 1, %{{.*}}, 16]
// CHECK: linalg.generic {{.*}} ins(%[[DOT]], %{{.*}} : tensor<32x16xbf16>, tensor<32x16xbf16>) outs(%{{.*}} : tensor<32x16xf32>)
// CHECK: arith.extf
// CHECK: arith.mulf
// CHECK: tensor.extract_slice %[[DLSE]]
// CHECK: linalg.reduce
// CHECK: arith.addf
// CHECK: %[[D:.*]] = linalg.generic
// CHECK: arith.subf
// Partial KV blocks of this query block, then its full ones.
// CHECK: %[[PCOUNT:.*]] = arith.constant dense<[1, 1, 1, 4]> : tensor<4xi32>
// CHECK: %[[PINDEX:.*]] = arith.constant dense<{{\[}}[0, 0, 0, 0], [1, 0, 0, 0], [2, 0, 0, 0], [0, 1, 2, 3]]> : tensor<4x4xi32>
// CHECK: tensor.extract %[[PCOUNT]][%[[PM]]]
// CHECK: %[[P:.*]] = scf.for {{.*}} -> (tensor<32x16xf32>)
// CHECK: tensor.extract %[[PINDEX]][%[[PM]], %{{.*}}]
// CHECK: tensor.extract_slice %[[K]][%[[PB]], %[[PH]], %{{.*}}, 0] [1, 1, %{{.*}}, 16]
// CHECK: %[[KT:.*]] = tensor.pad
// CHECK: %[[S:.*]] = linalg.matmul ins(%[[QT]], %{{.*}} : tensor<32x16xbf16>, tensor<16x32xbf16>) outs(%{{.*}} : tensor<32x32xf32>)
// CHECK: %[[DP:.*]] = linalg.matmul ins(%[[DOT]], %{{.*}} : tensor<32x16xbf16>, tensor<16x32xbf16>) outs(%{{.*}} : tensor<32x32xf32>)
// P = exp2(s * scale log2(e) + L), selected by the mask (q < Lq, kv < Lk, q >= kv), where
// L = -lse log2(e) per row, 0 where lse = -inf (computed once, before the loop).
// CHECK: %[[PROBS:.*]] = linalg.generic {{.*}} ins(%[[S]], %[[L]] : tensor<32x32xf32>, tensor<32xf32>)
// CHECK: arith.constant 0.360673755 : f32
// CHECK: arith.mulf
// CHECK: arith.addf
// CHECK: math.exp2
// CHECK: arith.cmpi slt
// CHECK: arith.cmpi slt
// CHECK: arith.cmpi sge
// CHECK: arith.select
// dS = P * (dP - delta), to bf16 for dQ += dS K.
// CHECK: linalg.generic {{.*}} ins(%[[S]], %[[PROBS]], %[[DP]], %[[D]] :
// CHECK: arith.subf
// CHECK: arith.mulf
// CHECK: arith.truncf {{.*}} : f32 to bf16
// CHECK: linalg.matmul ins(%{{.*}}, %[[KT]] : tensor<32x32xbf16>, tensor<32x16xbf16>) outs(%{{.*}} : tensor<32x16xf32>)
// CHECK: scf.yield
// CHECK: arith.constant dense<[0, 1, 2, 0]> : tensor<4xi32>
// CHECK: arith.constant dense<{{\[}}[0, 0], [0, 0], [0, 1], [0, 0]]> : tensor<4x2xi32>
// CHECK: scf.for {{.*}} iter_args(%{{.*}} = %[[P]])
// CHECK: math.exp2
// CHECK-NOT: arith.cmpi
// CHECK: scf.yield
// dQ takes the scale; the valid rows of dQ and delta are stored.
// CHECK: arith.constant 2.500000e-01 : f32
// CHECK: %[[DQS:.*]] = tensor.insert_slice %{{.*}} into %[[DQ]][%[[PB]], %[[PH]], %{{.*}}, 0] [1, 1, %{{.*}}, 16]
// CHECK: tensor.extract_slice %[[D]][0] [%{{.*}}] [1]
// CHECK: %[[DELTAS:.*]] = tensor.insert_slice %{{.*}} into %[[DELTA]][%[[PB]], %[[PH]], %{{.*}}] [1, 1, %{{.*}}]
// CHECK: return %[[DQS]], %[[DELTAS]]

// The dK/dV kernel reads delta.
// CHECK-LABEL: func.func @causal_bwd_dkdv(
// CHECK-SAME: %[[Q:[a-z0-9]+]]: tensor<1x2x100x16xbf16>, %[[K:[a-z0-9]+]]: tensor<1x2x100x16xbf16>, %[[V:[a-z0-9]+]]: tensor<1x2x100x16xbf16>,
// CHECK-SAME: %[[DO:[a-z0-9]+]]: tensor<1x2x100x16xbf16>, %[[LSE:[a-z0-9]+]]: tensor<1x2x100xf32>, %[[DELTA:[a-z0-9]+]]: tensor<1x2x100xf32>,
// CHECK-SAME: %[[DK:[a-z0-9]+]]: tensor<1x2x100x16xbf16>, %[[DV:[a-z0-9]+]]: tensor<1x2x100x16xbf16>)
// CHECK-SAME: -> (tensor<1x2x100x16xbf16>, tensor<1x2x100x16xbf16>)
// CHECK-SAME: attn.arg_roles = ["q", "k", "v", "do", "lse", "delta", "dk", "dv"]
// The first KV blocks are visited by the most query blocks (4, 3, 2, 1).
// CHECK-SAME: attn.block_m = 32 : i64, attn.block_n = 32 : i64, attn.grid = array<i64: 1, 2, 4>, attn.heavy_blocks = "first"
// CHECK-DAG: %[[PB:.*]] = "attn.program_id"() {axis = 0 : i64}
// CHECK-DAG: %[[PH:.*]] = "attn.program_id"() {axis = 1 : i64}
// CHECK-DAG: %[[PN:.*]] = "attn.program_id"() {axis = 2 : i64}
// The program's K and V tiles, loaded once. Its tiles are computed transposed, [KV, query]:
// S^T = K Q^T and dP^T = V dO^T, so P^T and dS^T are the left operands of dV += P^T dO and
// dK += dS^T Q as they come (no transpose of a computed tile).
// CHECK: %[[KTILE:.*]] = tensor.pad
// CHECK: tensor.extract_slice %[[V]][%[[PB]], %[[PH]], %{{.*}}, 0] [1, 1, %{{.*}}, 16]
// CHECK: %[[VTILE:.*]] = tensor.pad
// CHECK-NOT: linalg.transpose
// Partial query blocks, from the transposed table.
// CHECK: %[[PCOUNT:.*]] = arith.constant dense<[2, 2, 2, 1]> : tensor<4xi32>
// CHECK: %[[PINDEX:.*]] = arith.constant dense<{{\[}}[0, 3], [1, 3], [2, 3], [3, 0]]> : tensor<4x2xi32>
// CHECK: tensor.extract %[[PCOUNT]][%[[PN]]]
// CHECK: %[[P:.*]]:2 = scf.for {{.*}} -> (tensor<32x16xf32>, tensor<32x16xf32>)
// CHECK: tensor.extract %[[PINDEX]][%[[PN]], %{{.*}}]
// CHECK: %[[QT:.*]] = tensor.pad
// CHECK: %[[DOT:.*]] = tensor.pad
// CHECK: tensor.extract_slice %[[LSE]]
// CHECK: %[[L:.*]] = linalg.generic {{.*}} ins(%{{.*}} : tensor<32xf32>)
// CHECK: tensor.extract_slice %[[DELTA]]
// CHECK: %[[QTT:.*]] = linalg.transpose ins(%[[QT]]
// CHECK: %[[S:.*]] = linalg.matmul ins(%[[KTILE]], %[[QTT]] : tensor<32x16xbf16>, tensor<16x32xbf16>) outs(%{{.*}} : tensor<32x32xf32>)
// CHECK: %[[DOTT:.*]] = linalg.transpose ins(%[[DOT]]
// CHECK: %[[DP:.*]] = linalg.matmul ins(%[[VTILE]], %[[DOTT]] : tensor<32x16xbf16>, tensor<16x32xbf16>) outs(%{{.*}} : tensor<32x32xf32>)
// lse and delta are indexed by the column (the query row), the keys by the row.
// CHECK: %[[PROBS:.*]] = linalg.generic {indexing_maps = [#[[TILE:map[0-9]*]], #[[COL:map[0-9]*]], #[[TILE]]], {{.*}} ins(%[[S]], %[[L]] : tensor<32x32xf32>, tensor<32xf32>)
// CHECK: %[[QI:.*]] = linalg.index 1 : index
// CHECK: %[[KJ:.*]] = linalg.index 0 : index
// CHECK: arith.constant 0.360673755 : f32
// CHECK: math.exp2
// CHECK: arith.cmpi slt
// CHECK: arith.cmpi slt
// CHECK: arith.cmpi sge
// CHECK: arith.select
// CHECK: %[[DS:.*]] = linalg.generic {indexing_maps = [#[[TILE]], #[[TILE]], #[[TILE]], #[[COL]], #[[TILE]]], {{.*}} ins(%[[S]], %[[PROBS]], %[[DP]], %{{.*}} :
// CHECK: arith.subf
// CHECK: arith.mulf
// P^T and dS^T go to bf16 for the products with dO and Q.
// CHECK: arith.truncf {{.*}} : f32 to bf16
// CHECK-NOT: linalg.transpose
// CHECK: linalg.matmul ins(%{{.*}}, %[[DOT]] : tensor<32x32xbf16>, tensor<32x16xbf16>) outs(%{{.*}} : tensor<32x16xf32>)
// CHECK: arith.truncf {{.*}} : f32 to bf16
// CHECK-NOT: linalg.transpose
// CHECK: linalg.matmul ins(%{{.*}}, %[[QT]] : tensor<32x32xbf16>, tensor<32x16xbf16>) outs(%{{.*}} : tensor<32x16xf32>)
// CHECK: scf.yield
// Full query blocks: no mask.
// CHECK: arith.constant dense<[2, 1, 0, 0]> : tensor<4xi32>
// CHECK: arith.constant dense<{{\[}}[1, 2], [2, 0], [0, 0], [0, 0]]> : tensor<4x2xi32>
// CHECK: %[[F:.*]]:2 = scf.for {{.*}} iter_args(%{{.*}} = %[[P]]#0, %{{.*}} = %[[P]]#1)
// CHECK: math.exp2
// CHECK-NOT: arith.cmpi
// CHECK: scf.yield
// dK takes the scale, dV does not; the valid rows are stored.
// CHECK: arith.constant 2.500000e-01 : f32
// CHECK: arith.truncf
// CHECK: arith.constant 1.000000e+00 : f32
// CHECK: %[[DKS:.*]] = tensor.insert_slice %{{.*}} into %[[DK]][%[[PB]], %[[PH]], %{{.*}}, 0] [1, 1, %{{.*}}, 16]
// CHECK: %[[DVS:.*]] = tensor.insert_slice %{{.*}} into %[[DV]][%[[PB]], %[[PH]], %{{.*}}, 0] [1, 1, %{{.*}}, 16]
// CHECK: return %[[DKS]], %[[DVS]]
func.func @causal(%q: tensor<1x2x100x16xbf16>, %k: tensor<1x2x100x16xbf16>, %v: tensor<1x2x100x16xbf16>) -> (tensor<1x2x100x16xbf16>, tensor<1x2x100xf32>) {
  %s = "attn.score"(%q, %k) {scale = 0.25 : f32} : (tensor<1x2x100x16xbf16>, tensor<1x2x100x16xbf16>) -> tensor<1x2x100x100xf32>
  %m = "attn.mask"() ({
  ^bb0(%b: index, %h: index, %i: index, %j: index):
    %c = arith.cmpi sge, %i, %j : index
    "gpu.yield"(%c) : (i1) -> ()
  }) : () -> tensor<1x2x100x100xi1>
  %p, %lse = "attn.normalize"(%s, %m) ({}, {}, {}) {kind = "softmax", operandSegmentSizes = array<i32: 1, 1>, resultSegmentSizes = array<i32: 1, 1>} : (tensor<1x2x100x100xf32>, tensor<1x2x100x100xi1>) -> (tensor<1x2x100x100xf32>, tensor<1x2x100xf32>)
  %o = "attn.aggregate"(%p, %v) : (tensor<1x2x100x100xf32>, tensor<1x2x100x16xbf16>) -> tensor<1x2x100x16xbf16>
  return %o, %lse : tensor<1x2x100x16xbf16>, tensor<1x2x100xf32>
}

// -----

// GQA, 4 query heads on 2 KV heads, Lq = 64, Lk = 48 (ragged: KV block 1 is always partial), Dk =
// 16, Dv = 8, no mask. The dQ kernel reads KV head h / 2. The dK/dV grid has one program per KV
// head; inside, a loop over the 2 heads of the group (h = hkv * 2 + g) walks the query blocks.
// Lq = 64 holds whole 32-row blocks: q-side tiles are static slices, with no padding; the keys'
// last block is ragged, so K and V tiles are padded slices.
// CHECK-LABEL: func.func @gqa_bwd_dq(
// CHECK-SAME: %{{[a-z0-9]+}}: tensor<1x4x64x16xf32>, %[[K:[a-z0-9]+]]: tensor<1x2x48x16xf32>
// CHECK-SAME: -> (tensor<1x4x64x16xf32>, tensor<1x4x64xf32>)
// CHECK-SAME: attn.grid = array<i64: 1, 4, 2>
// CHECK-DAG: %[[PB:.*]] = "attn.program_id"() {axis = 0 : i64}
// CHECK-DAG: %[[PH:.*]] = "attn.program_id"() {axis = 1 : i64}
// CHECK: %[[HK:.*]] = arith.divui %[[PH]], %{{.*}} : index
// CHECK: scf.for
// CHECK: tensor.extract_slice %[[K]][%[[PB]], %[[HK]], %{{.*}}, 0] [1, 1, %{{.*}}, 16]
// CHECK: scf.yield
// CHECK-LABEL: func.func @gqa_bwd_dkdv(
// CHECK-SAME: %[[Q:[a-z0-9]+]]: tensor<1x4x64x16xf32>, %[[K:[a-z0-9]+]]: tensor<1x2x48x16xf32>, %{{[a-z0-9]+}}: tensor<1x2x48x8xf32>,
// CHECK-SAME: %{{[a-z0-9]+}}: tensor<1x4x64x8xf32>, %{{[a-z0-9]+}}: tensor<1x4x64xf32>, %{{[a-z0-9]+}}: tensor<1x4x64xf32>,
// CHECK-SAME: %[[DK:[a-z0-9]+]]: tensor<1x2x48x16xf32>, %[[DV:[a-z0-9]+]]: tensor<1x2x48x8xf32>)
// CHECK-SAME: attn.grid = array<i64: 1, 2, 2>
// CHECK-DAG: %[[PB:.*]] = "attn.program_id"() {axis = 0 : i64}
// CHECK-DAG: %[[PHK:.*]] = "attn.program_id"() {axis = 1 : i64}
// CHECK: tensor.extract_slice %[[K]][%[[PB]], %[[PHK]], %{{.*}}, 0] [1, 1, %{{.*}}, 16]
// CHECK: %[[C2:.*]] = arith.constant 2 : index
// CHECK: %[[G:.*]]:2 = scf.for %[[GI:[a-z0-9]+]] = %{{.*}} to %[[C2]] step %{{.*}} iter_args({{.*}}) -> (tensor<32x16xf32>, tensor<32x8xf32>) {
// CHECK: %[[H0:.*]] = arith.muli %[[PHK]], %[[C2]] : index
// CHECK: %[[H:.*]] = arith.addi %[[H0]], %[[GI]] : index
// Partial: KV block 1 (ragged) is seen by query blocks 0 and 1; full: KV block 0 by both.
// CHECK: arith.constant dense<[0, 2]> : tensor<2xi32>
// CHECK: arith.constant dense<{{\[}}[0, 0], [0, 1]]> : tensor<2x2xi32>
// CHECK: scf.for
// CHECK: tensor.extract_slice %[[Q]][%[[PB]], %[[H]], %{{.*}}, 0] [1, 1, 32, 16] [1, 1, 1, 1] : tensor<1x4x64x16xf32> to tensor<32x16xf32>
// CHECK-NOT: tensor.pad
// CHECK: linalg.transpose
// CHECK: math.exp2
// CHECK: arith.select
// CHECK: linalg.matmul {{.*}} -> tensor<32x8xf32>
// CHECK: linalg.matmul {{.*}} -> tensor<32x16xf32>
// CHECK: scf.yield
// CHECK: arith.constant dense<[2, 0]> : tensor<2xi32>
// CHECK: arith.constant dense<{{\[}}[0, 1], [0, 0]]> : tensor<2x2xi32>
// Full tiles: the only select left is the guard of rows whose lse is -inf (no mask, no cmpi).
// CHECK: scf.for
// CHECK-NOT: arith.cmpi
// CHECK: arith.cmpf oeq
// CHECK-NOT: arith.cmpi
// CHECK: scf.yield
// CHECK: scf.yield
// CHECK: }
// CHECK: tensor.insert_slice %{{.*}} into %[[DK]][%[[PB]], %[[PHK]], %{{.*}}, 0] [1, 1, %{{.*}}, 16]
// CHECK: tensor.insert_slice %{{.*}} into %[[DV]][%[[PB]], %[[PHK]], %{{.*}}, 0] [1, 1, %{{.*}}, 8]
func.func @gqa(%q: tensor<1x4x64x16xf32>, %k: tensor<1x2x48x16xf32>, %v: tensor<1x2x48x8xf32>) -> (tensor<1x4x64x8xf32>, tensor<1x4x64xf32>) {
  %s = "attn.score"(%q, %k) {scale = 0.25 : f32} : (tensor<1x4x64x16xf32>, tensor<1x2x48x16xf32>) -> tensor<1x4x64x48xf32>
  %p, %lse = "attn.normalize"(%s) ({}, {}, {}) {kind = "softmax", operandSegmentSizes = array<i32: 1, 0>, resultSegmentSizes = array<i32: 1, 1>} : (tensor<1x4x64x48xf32>) -> (tensor<1x4x64x48xf32>, tensor<1x4x64xf32>)
  %o = "attn.aggregate"(%p, %v) : (tensor<1x4x64x48xf32>, tensor<1x2x48x8xf32>) -> tensor<1x4x64x8xf32>
  return %o, %lse : tensor<1x4x64x8xf32>, tensor<1x4x64xf32>
}

// -----

// Sigmoid, causal, L = 64, 32x32 tiles: an element-wise normalizer, P = sigmoid(scale s), whose
// derivative needs no row statistic. Neither kernel takes the forward's output, lse or delta, and
// the dQ kernel writes dQ alone; dS = dP P (1 - P), zero where the mask made P zero.
// CHECK-LABEL: func.func @sigmoid_bwd_dq(
// CHECK-SAME: -> tensor<1x1x64x16xf32>
// CHECK-SAME: attn.arg_roles = ["q", "k", "v", "do", "dq"]
// CHECK: %[[S:.*]] = linalg.matmul
// CHECK: %[[DP:.*]] = linalg.matmul
// CHECK: %[[PROBS:.*]] = linalg.generic {{.*}} ins(%[[S]] : tensor<32x32xf32>)
// CHECK: arith.constant 2.500000e-01 : f32
// CHECK: arith.negf
// CHECK: math.exp
// CHECK: arith.addf
// CHECK: arith.divf
// CHECK: arith.cmpi sge
// CHECK: arith.select
// CHECK: linalg.generic {{.*}} ins(%[[S]], %[[PROBS]], %[[DP]] : tensor<32x32xf32>, tensor<32x32xf32>, tensor<32x32xf32>)
// CHECK: %[[ONE_MINUS_P:.*]] = arith.subf %{{.*}}, %[[P:.*]] : f32
// CHECK: %[[PP:.*]] = arith.mulf %[[P]], %[[ONE_MINUS_P]] : f32
// CHECK: arith.mulf %{{.*}}, %[[PP]] : f32
// CHECK: linalg.matmul
// CHECK: return %{{.*}} : tensor<1x1x64x16xf32>
// CHECK-LABEL: func.func @sigmoid_bwd_dkdv(
// CHECK-SAME: attn.arg_roles = ["q", "k", "v", "do", "dk", "dv"]
// CHECK-NOT: tensor<1x1x64xf32>
// CHECK: math.exp
// CHECK: return
func.func @sigmoid(%q: tensor<1x1x64x16xf32>, %k: tensor<1x1x64x16xf32>, %v: tensor<1x1x64x16xf32>) -> tensor<1x1x64x16xf32> {
  %s = "attn.score"(%q, %k) {scale = 0.25 : f32} : (tensor<1x1x64x16xf32>, tensor<1x1x64x16xf32>) -> tensor<1x1x64x64xf32>
  %m = "attn.mask"() ({
  ^bb0(%b: index, %h: index, %i: index, %j: index):
    %c = arith.cmpi sge, %i, %j : index
    "gpu.yield"(%c) : (i1) -> ()
  }) : () -> tensor<1x1x64x64xi1>
  %p = "attn.normalize"(%s, %m) ({}, {}, {}) {kind = "sigmoid", operandSegmentSizes = array<i32: 1, 1>, resultSegmentSizes = array<i32: 1, 0>} : (tensor<1x1x64x64xf32>, tensor<1x1x64x64xi1>) -> tensor<1x1x64x64xf32>
  %o = "attn.aggregate"(%p, %v) : (tensor<1x1x64x64xf32>, tensor<1x1x64x16xf32>) -> tensor<1x1x64x16xf32>
  return %o : tensor<1x1x64x16xf32>
}

// -----

// Learnable closure tensors: table[h, i - j + 63] * slopes[h]. The dQ kernel, which visits every
// score once, writes their gradients dc0 and dc1 (starting at zero, the caller's): per tile, the
// gradient with respect to the score_mod's output (dm) times the chain rule of each read, added at
// the read's indices (i32 tiles) with attn.scatter_add, the destinations carried through the KV
// loop. The dK/dV kernel is unchanged.
// CHECK-LABEL: func.func @bias_bwd_dq(
// CHECK-SAME: %[[TABLE:[a-z0-9]+]]: tensor<2x127xf32>, %[[SLOPES:[a-z0-9]+]]: tensor<2xf32>,
// CHECK-SAME: %[[DTABLE:[a-z0-9]+]]: tensor<2x127xf32>, %[[DSLOPES:[a-z0-9]+]]: tensor<2xf32>)
// CHECK-SAME: -> (tensor<1x2x64x16xf32>, tensor<1x2x64xf32>, tensor<2x127xf32>, tensor<2xf32>)
// CHECK-SAME: attn.arg_roles = ["q", "k", "v", "c0", "c1", "out", "do", "lse", "dlse", "dq", "delta", "dc0", "dc1"]
// CHECK: %[[PH:.*]] = "attn.program_id"() {axis = 1 : i64}
// CHECK: scf.for {{.*}} iter_args(%{{.*}} = %{{.*}}, %[[T:.*]] = %[[DTABLE]], %[[M:.*]] = %[[DSLOPES]]) -> (tensor<32x16xf32>, tensor<2x127xf32>, tensor<2xf32>)
// CHECK: %[[P:.*]] = linalg.generic {{.*}} ins(%{{.*}}, %{{.*}} : tensor<32x32xf32>, tensor<32xf32>)
// CHECK: %[[DM:.*]] = linalg.generic {{.*}} ins(%[[P]], %{{.*}}, %{{.*}} : tensor<32x32xf32>, tensor<32x32xf32>, tensor<32xf32>)
// CHECK: %[[DS:.*]] = linalg.generic {{.*}} ins(%{{.*}}, %[[DM]] : tensor<32x32xf32>, tensor<32x32xf32>)
// CHECK: %[[VT:.*]] = linalg.generic {{.*}} ins(%{{.*}}, %[[DM]] : tensor<32x32xf32>, tensor<32x32xf32>) outs(%{{.*}} : tensor<32x32xf32>)
// CHECK: %[[S:.*]] = tensor.extract %[[SLOPES]][%[[PH]]]
// CHECK: arith.mulf %{{.*}}, %[[S]] : f32
// CHECK: %[[HT:.*]] = linalg.generic {{.*}} outs(%{{.*}} : tensor<32x32xi32>)
// CHECK: arith.index_cast %[[PH]] : index to i32
// CHECK: %[[AT:.*]] = linalg.generic {{.*}} outs(%{{.*}} : tensor<32x32xi32>)
// CHECK: %[[NEWT:.*]] = "attn.scatter_add"(%[[T]], %[[VT]], %[[HT]], %[[AT]]) : (tensor<2x127xf32>, tensor<32x32xf32>, tensor<32x32xi32>, tensor<32x32xi32>) -> tensor<2x127xf32>
// CHECK: %[[VM:.*]] = linalg.generic
// CHECK: tensor.extract %[[TABLE]]
// CHECK: %[[HM:.*]] = linalg.generic {{.*}} outs(%{{.*}} : tensor<32x32xi32>)
// CHECK: %[[NEWM:.*]] = "attn.scatter_add"(%[[M]], %[[VM]], %[[HM]]) : (tensor<2xf32>, tensor<32x32xf32>, tensor<32x32xi32>) -> tensor<2xf32>
// CHECK: %[[DQ:.*]] = linalg.matmul ins(%[[DS]],
// CHECK: scf.yield %[[DQ]], %[[NEWT]], %[[NEWM]]
// CHECK-LABEL: func.func @bias_bwd_dkdv(
// CHECK-SAME: attn.arg_roles = ["q", "k", "v", "c0", "c1", "do", "lse", "delta", "dk", "dv"]
// CHECK-NOT: attn.scatter_add
// CHECK: return
func.func @bias(%q: tensor<1x2x64x16xf32>, %k: tensor<1x2x64x16xf32>, %v: tensor<1x2x64x16xf32>, %table: tensor<2x127xf32>, %slopes: tensor<2xf32>) -> (tensor<1x2x64x16xf32>, tensor<1x2x64xf32>) {
  %s = "attn.score"(%q, %k) {scale = 0.25 : f32} : (tensor<1x2x64x16xf32>, tensor<1x2x64x16xf32>) -> tensor<1x2x64x64xf32>
  %modded = "attn.score_mod"(%s) ({
  ^bb0(%x: f32, %b: index, %h: index, %i: index, %j: index):
    %d = arith.subi %i, %j : index
    %c63 = arith.constant 63 : index
    %at = arith.addi %d, %c63 : index
    %t = tensor.extract %table[%h, %at] : tensor<2x127xf32>
    %m = tensor.extract %slopes[%h] : tensor<2xf32>
    %tm = arith.mulf %t, %m : f32
    %y = arith.addf %x, %tm : f32
    "gpu.yield"(%y) : (f32) -> ()
  }) : (tensor<1x2x64x64xf32>) -> tensor<1x2x64x64xf32>
  %p, %lse = "attn.normalize"(%modded) ({}, {}, {}) {kind = "softmax", operandSegmentSizes = array<i32: 1, 0>, resultSegmentSizes = array<i32: 1, 1>} : (tensor<1x2x64x64xf32>) -> (tensor<1x2x64x64xf32>, tensor<1x2x64xf32>)
  %o = "attn.aggregate"(%p, %v) : (tensor<1x2x64x64xf32>, tensor<1x2x64x16xf32>) -> tensor<1x2x64x16xf32>
  return %o, %lse : tensor<1x2x64x16xf32>, tensor<1x2x64xf32>
}

// -----

// RetNet's normalizer, out = (P V) / max(|rowsum P|, 1), L = 40 in 32x32 tiles: no forward
// statistic. The dQ kernel carries four accumulators through its KV loops, A = (c dP) K and
// B = c K (c = dp/ds; here 1) and the rows' l and rowsum(p dP): four products per tile, QK^T,
// dO V^T and the two. After them, rscale = finalize(1, l) = 1 / max(|l|, 1) and delta =
// d finalize(1, l)/dl rowsum(p dP); it returns dq, delta and rscale. The dK/dV kernel reads both.
// CHECK-LABEL: func.func @retnet_bwd_dq(
// CHECK-SAME: %{{[a-z0-9]+}}: tensor<1x1x40x16xf32>, %{{[a-z0-9]+}}: tensor<1x1x40x16xf32>, %{{[a-z0-9]+}}: tensor<1x1x40x16xf32>, %[[DO:[a-z0-9]+]]: tensor<1x1x40x16xf32>,
// CHECK-SAME: %[[DQ:[a-z0-9]+]]: tensor<1x1x40x16xf32>, %[[DELTA:[a-z0-9]+]]: tensor<1x1x40xf32>, %[[RSCALE:[a-z0-9]+]]: tensor<1x1x40xf32>)
// CHECK-SAME: -> (tensor<1x1x40x16xf32>, tensor<1x1x40xf32>, tensor<1x1x40xf32>)
// CHECK-SAME: attn.arg_roles = ["q", "k", "v", "do", "dq", "delta", "rscale"]
// CHECK: scf.for {{.*}} -> (tensor<32x16xf32>, tensor<32x16xf32>, tensor<32xf32>, tensor<32xf32>)
// CHECK-COUNT-4: linalg.matmul
// CHECK: scf.yield
// CHECK: math.absf
// CHECK-NEXT: arith.maximumf
// CHECK-NEXT: arith.divf
// CHECK: return %{{.*}}, %{{.*}}, %{{.*}} : tensor<1x1x40x16xf32>, tensor<1x1x40xf32>, tensor<1x1x40xf32>
// CHECK-LABEL: func.func @retnet_bwd_dkdv(
// CHECK-SAME: %[[DO2:[a-z0-9]+]]: tensor<1x1x40x16xf32>, %{{[a-z0-9]+}}: tensor<1x1x40xf32>, %{{[a-z0-9]+}}: tensor<1x1x40xf32>, %{{[a-z0-9]+}}: tensor<1x1x40x16xf32>, %{{[a-z0-9]+}}: tensor<1x1x40x16xf32>)
// CHECK-SAME: attn.arg_roles = ["q", "k", "v", "do", "delta", "rscale", "dk", "dv"]
// CHECK: scf.for {{.*}} -> (tensor<32x16xf32>, tensor<32x16xf32>)
// CHECK-COUNT-4: linalg.matmul
func.func @retnet(%q: tensor<1x1x40x16xf32>, %k: tensor<1x1x40x16xf32>, %v: tensor<1x1x40x16xf32>) -> tensor<1x1x40x16xf32> {
  %s = "attn.score"(%q, %k) {scale = 0.25 : f32} : (tensor<1x1x40x16xf32>, tensor<1x1x40x16xf32>) -> tensor<1x1x40x40xf32>
  %p = "attn.normalize"(%s) ({
  ^bb0(%x: f32, %m: f32):
    "gpu.yield"(%x) : (f32) -> ()
  }, {}, {
  ^bb0(%acc: f32, %l: f32):
    %a = math.absf %l : f32
    %one = arith.constant 1.0 : f32
    %d = arith.maximumf %a, %one : f32
    %r = arith.divf %acc, %d : f32
    "gpu.yield"(%r) : (f32) -> ()
  }) {kind = "online", operandSegmentSizes = array<i32: 1, 0>, resultSegmentSizes = array<i32: 1, 0>} : (tensor<1x1x40x40xf32>) -> tensor<1x1x40x40xf32>
  %o = "attn.aggregate"(%p, %v) : (tensor<1x1x40x40xf32>, tensor<1x1x40x16xf32>) -> tensor<1x1x40x16xf32>
  return %o : tensor<1x1x40x16xf32>
}

// -----

// Softmax written by hand as a user normalizer with a running max m: prob exp(x - m), rescale
// exp(m_old - m_new), finalize acc / l. L = 40 in 32x32 tiles, so each walk is two loops (the
// partial tiles, then the full one). The dQ kernel walks its KV tiles three times: the rows' max
// m (QK^T alone); l, rowsum(p dP), rowsum(dp/dm dP), rowsum(dp/dm) and the first key at the max
// (a float index, min-reduced); then dQ += dS K with dS = dp/dx (rscale dP + delta) plus the
// max's gradient at that key. It returns dq and five rows: delta, rscale, rowmax, maxkey, dmax,
// which the dK/dV kernel reads to form P^T and dS^T.
// CHECK-LABEL: func.func @by_hand_bwd_dq(
// CHECK-SAME: -> (tensor<1x1x40x16xf32>, tensor<1x1x40xf32>, tensor<1x1x40xf32>, tensor<1x1x40xf32>, tensor<1x1x40xf32>, tensor<1x1x40xf32>)
// CHECK-SAME: attn.arg_roles = ["q", "k", "v", "do", "dq", "delta", "rscale", "rowmax", "maxkey", "dmax"]
// CHECK: scf.for {{.*}} -> (tensor<32xf32>) {
// CHECK: linalg.matmul
// CHECK-NOT: linalg.matmul
// CHECK: arith.maximumf
// CHECK: scf.for {{.*}} -> (tensor<32xf32>) {
// CHECK: linalg.matmul
// CHECK-NOT: linalg.matmul
// CHECK: arith.maximumf
// CHECK: arith.cmpf oeq
// CHECK: scf.for {{.*}} -> (tensor<32xf32>, tensor<32xf32>, tensor<32xf32>, tensor<32xf32>, tensor<32xf32>) {
// CHECK-COUNT-2: linalg.matmul
// CHECK: arith.sitofp
// CHECK: arith.minimumf
// CHECK: scf.for {{.*}} -> (tensor<32xf32>, tensor<32xf32>, tensor<32xf32>, tensor<32xf32>, tensor<32xf32>) {
// CHECK: scf.for {{.*}} -> (tensor<32x16xf32>) {
// CHECK-COUNT-3: linalg.matmul
// CHECK: scf.yield
// CHECK: scf.for {{.*}} -> (tensor<32x16xf32>) {
// CHECK: return {{.*}} : tensor<1x1x40x16xf32>, tensor<1x1x40xf32>, tensor<1x1x40xf32>, tensor<1x1x40xf32>, tensor<1x1x40xf32>, tensor<1x1x40xf32>
// CHECK-LABEL: func.func @by_hand_bwd_dkdv(
// CHECK-SAME: attn.arg_roles = ["q", "k", "v", "do", "delta", "rscale", "rowmax", "maxkey", "dmax", "dk", "dv"]
// CHECK: scf.for {{.*}} -> (tensor<32x16xf32>, tensor<32x16xf32>)
// CHECK-COUNT-4: linalg.matmul
func.func @by_hand(%q: tensor<1x1x40x16xf32>, %k: tensor<1x1x40x16xf32>, %v: tensor<1x1x40x16xf32>) -> tensor<1x1x40x16xf32> {
  %s = "attn.score"(%q, %k) {scale = 0.25 : f32} : (tensor<1x1x40x16xf32>, tensor<1x1x40x16xf32>) -> tensor<1x1x40x40xf32>
  %p = "attn.normalize"(%s) ({
  ^bb0(%x: f32, %m: f32):
    %d = arith.subf %x, %m : f32
    %e = math.exp %d : f32
    "gpu.yield"(%e) : (f32) -> ()
  }, {
  ^bb0(%old: f32, %new: f32):
    %d = arith.subf %old, %new : f32
    %e = math.exp %d : f32
    "gpu.yield"(%e) : (f32) -> ()
  }, {
  ^bb0(%acc: f32, %l: f32):
    %r = arith.divf %acc, %l : f32
    "gpu.yield"(%r) : (f32) -> ()
  }) {kind = "online", operandSegmentSizes = array<i32: 1, 0>, resultSegmentSizes = array<i32: 1, 0>} : (tensor<1x1x40x40xf32>) -> tensor<1x1x40x40xf32>
  %o = "attn.aggregate"(%p, %v) : (tensor<1x1x40x40xf32>, tensor<1x1x40x16xf32>) -> tensor<1x1x40x16xf32>
  return %o : tensor<1x1x40x16xf32>
}

//--- no-derivative.mlir

// Without attn-differentiate first there is no @plain_grad to take the chain rule from.
func.func @plain(%q: tensor<1x1x8x8xf32>, %k: tensor<1x1x8x8xf32>, %v: tensor<1x1x8x8xf32>) -> (tensor<1x1x8x8xf32>, tensor<1x1x8xf32>) {
  %s = "attn.score"(%q, %k) {scale = 0.125 : f32} : (tensor<1x1x8x8xf32>, tensor<1x1x8x8xf32>) -> tensor<1x1x8x8xf32>
  %p, %lse = "attn.normalize"(%s) ({}, {}, {}) {kind = "softmax", operandSegmentSizes = array<i32: 1, 0>, resultSegmentSizes = array<i32: 1, 1>} : (tensor<1x1x8x8xf32>) -> (tensor<1x1x8x8xf32>, tensor<1x1x8xf32>)
  // expected-error @+1 {{'attn.aggregate' op has no derivative @plain_grad: run attn-differentiate first}}
  %o = "attn.aggregate"(%p, %v) : (tensor<1x1x8x8xf32>, tensor<1x1x8x8xf32>) -> tensor<1x1x8x8xf32>
  return %o, %lse : tensor<1x1x8x8xf32>, tensor<1x1x8xf32>
}
