// attn-tile-backward{call-time-tables=true} on a packed batch whose mask reads a closure tensor per
// sequence (a prefix-LM's prefix[b]): both kernels take their four tile tables per sequence
// ([S, 1, blocks(, others)]: b is a sequence, the heads share them) and record the grid the
// runtime classifies them over (attn.call_time_grid = [S, longest queries, longest keys]). The
// mask program is the mask, kv_idx < kv_len[b] (the key counts, argument 4) and q_idx <
// offsets[b + 1] - offsets[b] (the query offsets, argument 5): a tile the tables call full holds
// no key or query row of the next sequence. A block past its sequence's end visits no tile (the
// select on each loop's count). Without the option both kernels visit every tile with the mask.
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-differentiate,attn-tile-backward{block-m=32 block-n=32 call-time-tables=true},cse)' --no-mlir-print-op-generic | FileCheck %s
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-differentiate,attn-tile-backward{block-m=32 block-n=32},cse)' --no-mlir-print-op-generic | FileCheck %s --check-prefix=EVERY

// CHECK-LABEL: func.func @attention_bwd_dq(
// CHECK-SAME: %[[PC:[a-z0-9]+]]: tensor<4x1x1xi32>, %[[PI:[a-z0-9]+]]: tensor<4x1x1x1xi32>, %{{.*}}: tensor<4x1x1xi32>, %{{.*}}: tensor<4x1x1x1xi32>
// CHECK-SAME: attn.call_time_grid = array<i64: 4, 32, 32>
// The key bound: kv_idx (arg3) below the key count of sequence b (ext1 = argument 4).
// CHECK-SAME: \22operands\22:[\22ext1\22,\22arg0\22]
// The query bound: q_idx (arg2) below offsets[b + 1] - offsets[b] (ext2 = argument 5).
// CHECK-SAME: \22operands\22:[\22ext2\22,\22arg0\22]
// CHECK-SAME: \22name\22:\22arith.subi\22
// CHECK-SAME: \22operands\22:[\22arg2\22,
// CHECK-SAME: \22sources\22:{{\[\[}}\22operand\22,3],{{\[}}\22operand\22,4],{{\[}}\22operand\22,5]]
// CHECK: %[[S:.*]] = "attn.program_id"() {axis = 0 : i64}
// CHECK: tensor.extract %[[PC]][%[[S]], %c0, %{{.*}}] : tensor<4x1x1xi32>
// CHECK-NEXT: %[[N:.*]] = arith.index_cast
// CHECK-NEXT: %[[INSIDE:.*]] = arith.cmpi sgt
// CHECK-NEXT: %[[TRIPS:.*]] = arith.select %[[INSIDE]], %[[N]], %c0 : index
// CHECK-NEXT: scf.for %{{.*}} = %c0 to %[[TRIPS]] step %c1
// CHECK: tensor.extract %[[PI]][%[[S]], %c0, %{{.*}}, %{{.*}}] {attn.bounds = array<i64: 0, 0>} : tensor<4x1x1x1xi32>
// CHECK-LABEL: func.func @attention_bwd_dkdv(
// CHECK-SAME: %[[KPC:[a-z0-9]+]]: tensor<4x1x1xi32>, %{{.*}}: tensor<4x1x1x1xi32>, %{{.*}}: tensor<4x1x1xi32>, %{{.*}}: tensor<4x1x1x1xi32>
// CHECK-SAME: attn.call_time_grid = array<i64: 4, 32, 32>
// CHECK: %[[KS:.*]] = "attn.program_id"() {axis = 0 : i64}
// CHECK: tensor.extract %[[KPC]][%[[KS]], %c0, %{{.*}}] : tensor<4x1x1xi32>
// CHECK: arith.select %{{.*}}, %{{.*}}, %c0 : index
// CHECK: scf.for

// EVERY-LABEL: func.func @attention_bwd_dq(
// EVERY-NOT: attn.call_time_tables
// EVERY-SAME: {
// EVERY-LABEL: func.func @attention_bwd_dkdv(
// EVERY-NOT: attn.call_time_tables
// EVERY-SAME: {
func.func @attention(%q: tensor<1x2x?x16xbf16>, %k: tensor<1x2x?x16xbf16>, %v: tensor<1x2x?x16xbf16>, %c0: tensor<4xi64>, %c1: tensor<4xi32>, %c2: tensor<5xi32>, %c3: tensor<5xi32>) -> (tensor<1x2x?x16xbf16>, tensor<1x2x?xf32>) {
  %q_logical = "attn.unpack_sequences"(%q, %c2) : (tensor<1x2x?x16xbf16>, tensor<5xi32>) -> tensor<4x2x32x16xbf16>
  %k_logical = "attn.unpack_sequences"(%k, %c3) : (tensor<1x2x?x16xbf16>, tensor<5xi32>) -> tensor<4x2x32x16xbf16>
  %v_logical = "attn.unpack_sequences"(%v, %c3) : (tensor<1x2x?x16xbf16>, tensor<5xi32>) -> tensor<4x2x32x16xbf16>
  %scores = "attn.score"(%q_logical, %k_logical) {scale = 0.25 : f32} : (tensor<4x2x32x16xbf16>, tensor<4x2x32x16xbf16>) -> tensor<4x2x32x32xf32>
  %keep = "attn.mask"(%c1) ({
  ^bb0(%b: index, %h: index, %q_idx: index, %kv_idx: index):
    %m1 = arith.cmpi sle, %kv_idx, %q_idx : index
    %m2 = arith.constant 0 : index
    %m3 = arith.maxsi %b, %m2 : index
    %m4 = arith.constant 3 : index
    %m5 = arith.minsi %m3, %m4 : index
    %m6 = tensor.extract %c0[%m5] : tensor<4xi64>
    %m7 = arith.index_cast %m6 : i64 to index
    %m8 = arith.cmpi slt, %kv_idx, %m7 : index
    %m9 = arith.ori %m1, %m8 : i1
    "gpu.yield"(%m9) : (i1) -> ()
  }) : (tensor<4xi32>) -> tensor<4x2x32x32xi1>
  %probs, %lse = "attn.normalize"(%scores, %keep) ({}, {}, {}) {kind = "softmax", operandSegmentSizes = array<i32: 1, 1>, resultSegmentSizes = array<i32: 1, 1>} : (tensor<4x2x32x32xf32>, tensor<4x2x32x32xi1>) -> (tensor<4x2x32x32xf32>, tensor<4x2x32xf32>)
  %out = "attn.aggregate"(%probs, %v_logical) : (tensor<4x2x32x32xf32>, tensor<4x2x32x16xbf16>) -> tensor<4x2x32x16xbf16>
  %out_packed = "attn.pack_sequences"(%out, %c2) : (tensor<4x2x32x16xbf16>, tensor<5xi32>) -> tensor<1x2x?x16xbf16>
  %lse_packed = "attn.pack_sequences"(%lse, %c2) : (tensor<4x2x32xf32>, tensor<5xi32>) -> tensor<1x2x?xf32>
  return %out_packed, %lse_packed : tensor<1x2x?x16xbf16>, tensor<1x2x?xf32>
}
