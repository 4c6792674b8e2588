// Packed variable-length batches: q, k and v are attn.unpack_sequences views of packed
// [1, H, T, D] tensors (4 sequences in 100 rows, cu_seqlens %cu), and the results go back
// through attn.pack_sequences. attn-tile runs a program per (sequence, head, query block) of the
// longest sequence (64 rows: 2 blocks of 32); it reads its sequence's rows [lo, hi) from the
// offsets (clamped into the 100 rows and cut at 64), loads q rows lo + m0 .. from the packed
// tensor in place, visits no KV tile when lo + m0 >= hi, and stores its valid rows straight into
// the packed results at lo + m0. The kv_len operand (each sequence's keys) bounds the KV loops.
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-fuse-online-softmax,attn-tile{block-m=32 block-n=32},cse)' --no-mlir-print-op-generic | FileCheck %s

// CHECK-LABEL: func.func @packed(
// CHECK-SAME: %[[Q:[a-z0-9]+]]: tensor<1x2x100x16xbf16>, %[[K:[a-z0-9]+]]: tensor<1x2x100x16xbf16>, %{{.*}}: tensor<1x2x100x16xbf16>, %[[N:[a-z0-9]+]]: tensor<4xi32>, %[[CU:[a-z0-9]+]]: tensor<5xi32>, %[[OUT:[a-z0-9]+]]: tensor<1x2x100x16xbf16>, %[[LSE:[a-z0-9]+]]: tensor<1x2x100xf32>)
// CHECK-SAME: attn.grid = array<i64: 4, 2, 2>
// CHECK-NOT: attn.unpack_sequences
// CHECK: %[[S:.*]] = "attn.program_id"() {axis = 0 : i64}
// CHECK: %[[H:.*]] = "attn.program_id"() {axis = 1 : i64}
// CHECK: %[[LO_RAW:.*]] = tensor.extract %[[CU]][%[[S]]] : tensor<5xi32>
// CHECK: %[[LO_I:.*]] = arith.index_cast %[[LO_RAW]]
// CHECK: %[[LO_POS:.*]] = arith.maxsi %[[LO_I]], %c0
// CHECK: %[[LO:.*]] = arith.minsi %[[LO_POS]], %c100
// CHECK: %[[NEXT:.*]] = arith.addi %[[S]], %c1
// CHECK: tensor.extract %[[CU]][%[[NEXT]]] : tensor<5xi32>
// The end is cut at the longest sequence the view holds (64 rows).
// CHECK: %[[CAP:.*]] = arith.addi %[[LO]], %c64 : index
// CHECK: %[[HI:.*]] = arith.minsi %{{.*}}, %[[CAP]] : index
// CHECK: %[[ROW0:.*]] = arith.addi %[[LO]], %{{.*}} : index
// CHECK: tensor.extract_slice %[[Q]][%c0, %[[H]], %{{.*}}, 0] [1, 1, %{{.*}}, 16]
// CHECK: tensor.extract %[[N]][%[[S]]] : tensor<4xi32>
// A query block past the sequence's end visits no KV tile.
// CHECK: %[[INSIDE:.*]] = arith.cmpi slt, %[[ROW0]], %[[HI]] : index
// CHECK: arith.select %[[INSIDE]], %{{.*}}, %c0 : index
// CHECK: scf.for
// CHECK: tensor.extract_slice %[[K]][%c0, %[[H]], %{{.*}}, 0] [1, 1, %{{.*}}, 16]
// CHECK: tensor.insert_slice %{{.*}} into %[[OUT]][%c0, %[[H]], %[[ROW0]], 0] [1, 1, %{{.*}}, 16]
// CHECK: tensor.insert_slice %{{.*}} into %[[LSE]][%c0, %[[H]], %[[ROW0]]] [1, 1, %{{.*}}]
func.func @packed(%q: tensor<1x2x100x16xbf16>, %k: tensor<1x2x100x16xbf16>, %v: tensor<1x2x100x16xbf16>, %n: tensor<4xi32>, %cu: tensor<5xi32>) -> (tensor<1x2x100x16xbf16>, tensor<1x2x100xf32>) {
  %ql = "attn.unpack_sequences"(%q, %cu) : (tensor<1x2x100x16xbf16>, tensor<5xi32>) -> tensor<4x2x64x16xbf16>
  %kl = "attn.unpack_sequences"(%k, %cu) : (tensor<1x2x100x16xbf16>, tensor<5xi32>) -> tensor<4x2x64x16xbf16>
  %vl = "attn.unpack_sequences"(%v, %cu) : (tensor<1x2x100x16xbf16>, tensor<5xi32>) -> tensor<4x2x64x16xbf16>
  %s = "attn.score"(%ql, %kl) {scale = 0.25 : f32} : (tensor<4x2x64x16xbf16>, tensor<4x2x64x16xbf16>) -> tensor<4x2x64x64xf32>
  %keep = "attn.mask"(%n) ({
  ^bb0(%b: index, %h: index, %i: index, %j: index):
    %c = arith.cmpi sge, %i, %j : index
    "gpu.yield"(%c) : (i1) -> ()
  }) : (tensor<4xi32>) -> tensor<4x2x64x64xi1>
  %p, %lse = "attn.normalize"(%s, %keep) ({}, {}, {}) {kind = "softmax", operandSegmentSizes = array<i32: 1, 1>, resultSegmentSizes = array<i32: 1, 1>} : (tensor<4x2x64x64xf32>, tensor<4x2x64x64xi1>) -> (tensor<4x2x64x64xf32>, tensor<4x2x64xf32>)
  %o = "attn.aggregate"(%p, %vl) : (tensor<4x2x64x64xf32>, tensor<4x2x64x16xbf16>) -> tensor<4x2x64x16xbf16>
  %op = "attn.pack_sequences"(%o, %cu) : (tensor<4x2x64x16xbf16>, tensor<5xi32>) -> tensor<1x2x100x16xbf16>
  %lp = "attn.pack_sequences"(%lse, %cu) : (tensor<4x2x64xf32>, tensor<5xi32>) -> tensor<1x2x100xf32>
  return %op, %lp : tensor<1x2x100x16xbf16>, tensor<1x2x100xf32>
}
