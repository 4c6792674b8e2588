// attn-tile's decoding forms. kv-splits=3 deals each query block's KV tiles to three programs
// (@<name>_partial) that write their unnormalized accumulator, row max and row sum to workspaces
// w0..w2 ([B, splits, H, ...]); @<name>_combine merges the three with the rescale region.
// pack-gqa=true puts a KV head's query heads in one tile: 4 query heads on 2 KV heads, so each
// program's 16 rows are 8 rows of each of 2 heads, loaded as a [2, 8, 16] slice of q collapsed to
// [16, 16], and stored back through the inverse expand_shape.
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-fuse-online-softmax,attn-tile{block-m=16 block-n=32 kv-splits=3 pack-gqa=true},cse)' --no-mlir-print-op-generic | FileCheck %s

// CHECK-LABEL: func.func @decode_partial(
// CHECK-SAME: %[[Q:[a-z0-9]+]]: tensor<1x4x1x16xbf16>, %{{.*}}: tensor<1x2x200x16xbf16>, %{{.*}}: tensor<1x2x200x16xbf16>,
// CHECK-SAME: %[[W0:[a-z0-9]+]]: tensor<1x3x4x1x16xf32>, %[[W1:[a-z0-9]+]]: tensor<1x3x4x16xf32>, %[[W2:[a-z0-9]+]]: tensor<1x3x4x16xf32>)
// CHECK-SAME: attn.arg_roles = ["q", "k", "v", "w0", "w1", "w2"]
// The grid: batch, KV heads (packed), one query block times three splits.
// CHECK-SAME: attn.grid = array<i64: 1, 2, 3>
// Program p takes query block p / 3 and split p % 3.
// CHECK: %[[P:.*]] = "attn.program_id"() {axis = 2 : i64}
// CHECK: %[[BLOCK:.*]] = arith.divui %[[P]], %c3
// CHECK: %[[SPLIT:.*]] = arith.subi %[[P]]
// The packed Q tile: rows of heads 2 hk and 2 hk + 1.
// CHECK: %[[QS:.*]] = tensor.extract_slice %[[Q]][%{{.*}}, %{{.*}}, %{{.*}}, 0] [1, 2, %{{.*}}, 16] [1, 1, 1, 1] : tensor<1x4x1x16xbf16> to tensor<2x?x16xbf16>
// CHECK: %[[QP:.*]] = tensor.pad %[[QS]] low[0, 0, 0] high[0, %{{.*}}, 0]
// CHECK: %[[QT:.*]] = tensor.collapse_shape %[[QP]] {{\[}}[0, 1], [2]] : tensor<2x8x16xbf16> into tensor<16x16xbf16>
// Each split's tile lists: 7 KV tiles of 32 keys, three a split; the last (keys 192..199) is
// ragged, so it is the one partial tile (split 2).
// CHECK: dense<[0, 0, 1]> : tensor<3xi32>
// CHECK: dense<{{\[}}[0], [0], [6]]> : tensor<3x1xi32>
// CHECK: scf.for
// CHECK: linalg.matmul ins(%[[QT]], %{{.*}} : tensor<16x16xbf16>, tensor<16x32xbf16>)
// Inside the score computation a row's head is 2 hk + row / 8.
// CHECK: arith.divui %{{.*}}, %c8
// CHECK: dense<[3, 3, 0]> : tensor<3xi32>
// CHECK: dense<{{\[}}[0, 1, 2], [3, 4, 5], [0, 0, 0]]> : tensor<3x3xi32>
// CHECK: scf.for
// The partial results go to the workspaces at [b, split, 2 hk, m0].
// CHECK: tensor.expand_shape %{{.*}} {{\[}}[0, 1], [2]] output_shape [2, 8, 16] : tensor<16x16xf32> into tensor<2x8x16xf32>
// CHECK: tensor.insert_slice %{{.*}} into %[[W0]][%{{.*}}, %[[SPLIT]], %{{.*}}, %{{.*}}, 0] [1, 1, 2, %{{.*}}, 16]
// CHECK: tensor.insert_slice %{{.*}} into %[[W1]][%{{.*}}, %[[SPLIT]], %{{.*}}, %{{.*}}] [1, 1, 2, %{{.*}}]
// CHECK: tensor.insert_slice %{{.*}} into %[[W2]][%{{.*}}, %[[SPLIT]], %{{.*}}, %{{.*}}] [1, 1, 2, %{{.*}}]

// CHECK-LABEL: func.func @decode_combine(
// CHECK-SAME: %[[A0:[a-z0-9]+]]: tensor<1x3x4x1x16xf32>, %[[A1:[a-z0-9]+]]: tensor<1x3x4x16xf32>, %[[A2:[a-z0-9]+]]: tensor<1x3x4x16xf32>, %[[OUT:[a-z0-9]+]]: tensor<1x4x1x16xbf16>, %[[LSE:[a-z0-9]+]]: tensor<1x4x1xf32>)
// CHECK-SAME: attn.arg_roles = ["w0", "w1", "w2", "out", "lse"]
// CHECK-SAME: attn.grid = array<i64: 1, 2, 1>
// One loop over the three splits, merging (max, sum, acc) as the online softmax merges tiles.
// CHECK: scf.for %[[S:.*]] = %c0 to %c3 step %c1
// CHECK: tensor.extract_slice %[[A0]][%{{.*}}, %[[S]], %{{.*}}, %{{.*}}, 0] [1, 1, 2, %{{.*}}, 16]
// CHECK: tensor.collapse_shape
// CHECK: arith.maximumf
// CHECK: math.exp2
// CHECK: scf.yield
// Finalize (divide by the sum) once, then store both heads' rows of out and lse.
// CHECK: arith.divf
// CHECK: tensor.insert_slice %{{.*}} into %[[OUT]][%{{.*}}, %{{.*}}, %{{.*}}, 0] [1, 2, %{{.*}}, 16]
// CHECK: math.log2
// CHECK: tensor.insert_slice %{{.*}} into %[[LSE]][%{{.*}}, %{{.*}}, %{{.*}}] [1, 2, %{{.*}}]
func.func @decode(%q: tensor<1x4x1x16xbf16>, %k: tensor<1x2x200x16xbf16>, %v: tensor<1x2x200x16xbf16>) -> (tensor<1x4x1x16xbf16>, tensor<1x4x1xf32>) {
  %s = "attn.score"(%q, %k) {scale = 0.25 : f32} : (tensor<1x4x1x16xbf16>, tensor<1x2x200x16xbf16>) -> tensor<1x4x1x200xf32>
  %p, %lse = "attn.normalize"(%s) ({}, {}, {}) {kind = "softmax", operandSegmentSizes = array<i32: 1, 0>, resultSegmentSizes = array<i32: 1, 1>} : (tensor<1x4x1x200xf32>) -> (tensor<1x4x1x200xf32>, tensor<1x4x1xf32>)
  %o = "attn.aggregate"(%p, %v) : (tensor<1x4x1x200xf32>, tensor<1x2x200x16xbf16>) -> tensor<1x4x1x16xbf16>
  return %o, %lse : tensor<1x4x1x16xbf16>, tensor<1x4x1xf32>
}
