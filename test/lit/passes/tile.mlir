// attn-tile turns attn.online_attention into an L1 kernel: one program per (b, h, query block),
// the Q tile loaded once, then two scf.for loops over KV tiles carrying (row max, row sum, acc):
// partial tiles evaluate the mask, full tiles do not, and tiles the mask hides are never visited.
// RUN: ae-opt %s --split-input-file --pass-pipeline='builtin.module(attn-fuse-online-softmax,attn-tile{block-m=32 block-n=32},cse)' --no-mlir-print-op-generic | FileCheck %s
// RUN: ae-opt %s --split-input-file --pass-pipeline='builtin.module(attn-fuse-online-softmax,attn-tile{block-m=32 block-n=32 whole-tiles=false},cse)' --no-mlir-print-op-generic | FileCheck %s --check-prefix=PADDED

// Causal, L = 100, 32x32 tiles: query block i sees KV blocks 0..i; block i itself is partial
// (the diagonal), blocks below it are full, blocks above are skipped. The last KV block (rows
// 96..99) is ragged, so it is always partial.
// CHECK-LABEL: func.func @causal
// CHECK-SAME: %[[OUT:[a-z0-9]+]]: tensor<1x2x100x16xbf16>, %[[LSE:[a-z0-9]+]]: tensor<1x2x100xf32>)
// CHECK-SAME: attn.block_m = 32 : i64, attn.block_n = 32 : i64, attn.grid = array<i64: 1, 2, 4>
// CHECK-DAG: %[[PB:.*]] = "attn.program_id"() {axis = 0 : i64}
// CHECK-DAG: %[[PH:.*]] = "attn.program_id"() {axis = 1 : i64}
// CHECK-DAG: %[[PM:.*]] = "attn.program_id"() {axis = 2 : i64}
// The Q tile: a slice of the program's rows, zero-padded to the block.
// CHECK: %[[QS:.*]] = tensor.extract_slice %arg0[%[[PB]], %[[PH]], %{{.*}}, 0] [1, 1, %{{.*}}, 16]
// CHECK: %[[QT:.*]] = tensor.pad %[[QS]]
// Partial tiles (one per query block: the diagonal) evaluate the mask (kv < Lk and q >= kv).
// CHECK: dense<1> : tensor<4xi32>
// CHECK: dense<{{\[}}[0], [1], [2], [3]]> : tensor<4x1xi32>
// CHECK: %[[P:.*]]:3 = scf.for {{.*}} iter_args(%{{.*}} = %{{.*}}, %{{.*}} = %{{.*}}, %{{.*}} = %{{.*}}) -> (tensor<32xf32>, tensor<32xf32>, tensor<32x16xf32>)
// CHECK: linalg.matmul ins(%[[QT]], %{{.*}} : tensor<32x16xbf16>, tensor<16x32xbf16>) outs(%{{.*}} : tensor<32x32xf32>)
// CHECK: linalg.generic
// CHECK: arith.cmpi slt
// CHECK: arith.cmpi sge
// CHECK: arith.select
// CHECK: linalg.reduce
// CHECK: arith.maximumf
// CHECK: math.exp2
// CHECK: linalg.reduce
// CHECK: arith.addf
// P goes back to bf16 before the second matmul.
// CHECK: arith.truncf {{.*}} : f32 to bf16
// CHECK: linalg.matmul ins(%{{.*}}, %{{.*}} : tensor<32x32xbf16>, tensor<32x16xbf16>) outs(%{{.*}} : tensor<32x16xf32>)
// CHECK: scf.yield
// Full tiles (the blocks below the diagonal) skip the mask entirely.
// CHECK: dense<[0, 1, 2, 3]> : tensor<4xi32>
// CHECK: dense<{{\[}}[0, 0, 0], [0, 0, 0], [0, 1, 0], [0, 1, 2]]> : tensor<4x3xi32>
// CHECK: %[[F:.*]]:3 = scf.for {{.*}} iter_args(%{{.*}} = %[[P]]#0, %{{.*}} = %[[P]]#1, %{{.*}} = %[[P]]#2)
// CHECK-NOT: arith.cmpi
// CHECK: scf.yield
// Finalize once, store the valid rows of O and lse into the destinations.
// CHECK: arith.divf
// CHECK: tensor.insert_slice %{{.*}} into %[[OUT]][%[[PB]], %[[PH]], %{{.*}}, 0]
// CHECK: math.log2
// CHECK: tensor.insert_slice %{{.*}} into %[[LSE]][%[[PB]], %[[PH]], %{{.*}}]
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

// No mask and L a multiple of the block: every tile is full, so there is a single loop, with
// log2(e) folded into the scale (0.25 * 1.4427 = 0.3607), and every tile whole: Q, K and V tiles
// are static slices, never padded (the lowerings read them without row masks).
// With whole-tiles=false (the Triton preset's) they are padded slices like the ragged ones.
// CHECK-LABEL: func.func @full
// CHECK-SAME: attn.grid = array<i64: 2, 4, 2>
// PADDED-LABEL: func.func @full
// PADDED: tensor.extract_slice %arg0[%{{.*}}, %{{.*}}, %{{.*}}, 0] [1, 1, %{{.*}}, 16]
// PADDED: tensor.pad
// PADDED: scf.for
// PADDED: tensor.extract_slice %arg1[%{{.*}}, %{{.*}}, %{{.*}}, 0] [1, 1, %{{.*}}, 16]
// PADDED: tensor.pad
// CHECK: tensor.extract_slice %arg0[%{{.*}}, %{{.*}}, %{{.*}}, 0] [1, 1, 32, 16] [1, 1, 1, 1] : tensor<2x4x64x16xf32> to tensor<32x16xf32>
// CHECK-NOT: tensor.pad
// CHECK: dense<{{\[}}[0, 1], [0, 1]]> : tensor<2x2xi32>
// CHECK: scf.for
// CHECK: tensor.extract_slice %arg1[%{{.*}}, %{{.*}}, %{{.*}}, 0] [1, 1, 32, 16] [1, 1, 1, 1] : tensor<2x4x64x16xf32> to tensor<32x16xf32>
// CHECK: tensor.extract_slice %arg2[%{{.*}}, %{{.*}}, %{{.*}}, 0] [1, 1, 32, 16] [1, 1, 1, 1] : tensor<2x4x64x16xf32> to tensor<32x16xf32>
// CHECK-NOT: arith.cmpi slt
// CHECK: arith.constant 0.360673755 : f32
// CHECK-NOT: scf.for
// CHECK: return
func.func @full(%q: tensor<2x4x64x16xf32>, %k: tensor<2x4x64x16xf32>, %v: tensor<2x4x64x16xf32>) -> (tensor<2x4x64x16xf32>, tensor<2x4x64xf32>) {
  %s = "attn.score"(%q, %k) {scale = 0.25 : f32} : (tensor<2x4x64x16xf32>, tensor<2x4x64x16xf32>) -> tensor<2x4x64x64xf32>
  %p, %lse = "attn.normalize"(%s) ({}, {}, {}) {kind = "softmax", operandSegmentSizes = array<i32: 1, 0>, resultSegmentSizes = array<i32: 1, 1>} : (tensor<2x4x64x64xf32>) -> (tensor<2x4x64x64xf32>, tensor<2x4x64xf32>)
  %o = "attn.aggregate"(%p, %v) : (tensor<2x4x64x64xf32>, tensor<2x4x64x16xf32>) -> tensor<2x4x64x16xf32>
  return %o, %lse : tensor<2x4x64x16xf32>, tensor<2x4x64xf32>
}

// -----

// A mask that reads a closure tensor cannot be classified at compile time: every tile is partial,
// and the mask body reads the document ids from the function argument inside the tile loop.
// GQA: 4 query heads share 2 KV heads, so the program's KV head is h / 2.
// CHECK-LABEL: func.func @document
// CHECK-SAME: (%{{.*}}: tensor<1x4x64x16xf32>, %[[K:[a-z0-9]+]]: tensor<1x2x64x16xf32>, %{{.*}}: tensor<1x2x64x16xf32>, %[[DOC:[a-z0-9]+]]: tensor<64xi64>
// CHECK: %[[PH:.*]] = "attn.program_id"() {axis = 1 : i64}
// CHECK: %[[HK:.*]] = arith.divui %[[PH]], %{{.*}}
// CHECK: dense<{{\[}}[0, 1], [0, 1]]> : tensor<2x2xi32>
// CHECK: scf.for
// CHECK: tensor.extract_slice %[[K]][%{{.*}}, %[[HK]],
// CHECK: linalg.generic
// CHECK: tensor.extract %[[DOC]]
// CHECK: tensor.extract %[[DOC]]
// CHECK: arith.select
// CHECK-NOT: scf.for
// CHECK: return
func.func @document(%q: tensor<1x4x64x16xf32>, %k: tensor<1x2x64x16xf32>, %v: tensor<1x2x64x16xf32>, %doc: tensor<64xi64>) -> tensor<1x4x64x16xf32> {
  %s = "attn.score"(%q, %k) {scale = 0.25 : f32} : (tensor<1x4x64x16xf32>, tensor<1x2x64x16xf32>) -> tensor<1x4x64x64xf32>
  %m = "attn.mask"() ({
  ^bb0(%b: index, %h: index, %i: index, %j: index):
    %di = tensor.extract %doc[%i] : tensor<64xi64>
    %dj = tensor.extract %doc[%j] : tensor<64xi64>
    %c = arith.cmpi eq, %di, %dj : i64
    "gpu.yield"(%c) : (i1) -> ()
  }) : () -> tensor<1x4x64x64xi1>
  %p = "attn.normalize"(%s, %m) ({}, {}, {}) {kind = "softmax", operandSegmentSizes = array<i32: 1, 1>, resultSegmentSizes = array<i32: 1, 0>} : (tensor<1x4x64x64xf32>, tensor<1x4x64x64xi1>) -> tensor<1x4x64x64xf32>
  %o = "attn.aggregate"(%p, %v) : (tensor<1x4x64x64xf32>, tensor<1x2x64x16xf32>) -> tensor<1x4x64x16xf32>
  return %o : tensor<1x4x64x16xf32>
}
