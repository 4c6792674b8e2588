// A packed batch whose mask reads a closure tensor per sequence (a prefix-LM's prefix[b]): with
// call-time tables the kernel takes the four tile tables per sequence ([S, 1, NM(, NN)]: b is a
// sequence, the heads share them) and says over which grid the runtime classifies them
// (attn.call_time_grid = [S, longest queries, longest keys]: the packed q's shape does not say).
// Its mask program is the mask and kv_idx < kv_len[b], read from the sequences' key counts (the
// function's argument 4, a source of the program), and q_idx < cu[b + 1] - cu[b], read from the
// queries' offsets (argument 5), so the tables list no tile past a sequence's keys, none that
// reads another sequence's queries as full (the backward kernels' tables are bounded alike), and
// the loops take their counts as they are.
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-fuse-online-softmax,attn-tile{block-m=32 block-n=32 call-time-tables=true},cse)' --no-mlir-print-op-generic | FileCheck %s

// CHECK-LABEL: func.func @attention(
// CHECK-SAME: %[[CU:arg5]]: tensor<5xi32>, %{{.*}}: tensor<5xi32>, %[[PC:[a-z0-9]+]]: tensor<4x1x1xi32>, %[[PI:[a-z0-9]+]]: tensor<4x1x1x1xi32>, %{{.*}}: tensor<4x1x1xi32>, %{{.*}}: tensor<4x1x1x1xi32>
// CHECK-SAME: attn.call_time_grid = array<i64: 4, 32, 32>
// CHECK-SAME: \22operands\22:[\22ext1\22,\22arg0\22]
// CHECK-SAME: \22sources\22:{{\[\[}}\22operand\22,3],{{\[}}\22operand\22,4],{{\[}}\22operand\22,5]]
// CHECK: %[[S:.*]] = "attn.program_id"() {axis = 0 : i64}
// CHECK: %[[COUNT:.*]] = tensor.extract %[[PC]][%[[S]], %c0, %{{.*}}] : tensor<4x1x1xi32>
// CHECK: %[[N:.*]] = arith.index_cast %[[COUNT]]
// A query block past its sequence's end visits no tile; the count is not cut at the keys.
// CHECK: %[[TRIPS:.*]] = arith.select %{{.*}}, %[[N]], %c0 : index
// CHECK: scf.for %{{.*}} = %c0 to %[[TRIPS]] step %c1
// CHECK: tensor.extract %[[PI]][%[[S]], %c0, %{{.*}}, %{{.*}}] {attn.bounds = array<i64: 0, 0>} : tensor<4x1x1x1xi32>
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
