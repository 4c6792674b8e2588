// attn-tile{raw-row-max}: on tiles no mask or length cuts, without a score_mod, the online
// softmax's row max reads the unscaled Q K^T product and is scaled once per row, max(c s) =
// c max(s) exactly for c > 0; the scaled scores then feed only the exponent, where Triton fuses
// the multiply into the subtraction. Tiles the mask cuts keep the scaled, masked max. Without the
// option (the CPU's preset) every tile's row max reads the scaled scores.
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-fuse-online-softmax,attn-tile{block-m=32 block-n=32 raw-row-max=true},cse)' --no-mlir-print-op-generic | FileCheck %s --check-prefix=RAW
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-fuse-online-softmax,attn-tile{block-m=32 block-n=32},cse)' --no-mlir-print-op-generic | FileCheck %s --check-prefix=SCALED

// Causal, L = 64 in two query blocks: the partial (diagonal) tiles first, then the whole ones.
// RAW: scf.for
// RAW: %[[S:.*]] = linalg.matmul
// RAW-NEXT: %[[X:.*]] = linalg.generic {{.*}} ins(%[[S]] : tensor<32x32xf32>)
// RAW: arith.mulf
// RAW: arith.select
// RAW: linalg.reduce ins(%[[X]] : tensor<32x32xf32>)
// RAW: scf.for
// RAW: %[[S2:.*]] = linalg.matmul
// RAW-NEXT: %[[SC2:.*]] = linalg.generic {{.*}} ins(%[[S2]] : tensor<32x32xf32>)
// RAW-NEXT: ^bb0
// RAW-NEXT: %[[C:.*]] = arith.constant 0.360673755 : f32
// RAW-NEXT: arith.mulf %in, %[[C]] : f32
// RAW: %[[M:.*]] = linalg.reduce ins(%[[S2]] : tensor<32x32xf32>)
// RAW: linalg.generic {{.*}} ins(%{{.*}}, %[[M]] : tensor<32xf32>, tensor<32xf32>)
// RAW-NEXT: ^bb0(%[[OLD:.*]]: f32, %[[ROW:.*]]: f32, %{{.*}}: f32):
// RAW: %[[MC:.*]] = arith.mulf %[[ROW]], %{{.*}} : f32
// RAW-NEXT: arith.maximumf %[[OLD]], %[[MC]] : f32

// SCALED: scf.for
// SCALED: scf.for
// SCALED: %[[S:.*]] = linalg.matmul
// SCALED-NEXT: %[[X:.*]] = linalg.generic {{.*}} ins(%[[S]] : tensor<32x32xf32>)
// SCALED: arith.mulf
// SCALED: linalg.reduce ins(%[[X]] : tensor<32x32xf32>)
func.func @attention(%q: tensor<1x1x64x16xbf16>, %k: tensor<1x1x64x16xbf16>, %v: tensor<1x1x64x16xbf16>) -> (tensor<1x1x64x16xbf16>, tensor<1x1x64xf32>) {
  %scores = "attn.score"(%q, %k) {scale = 0.25 : f32} : (tensor<1x1x64x16xbf16>, tensor<1x1x64x16xbf16>) -> tensor<1x1x64x64xf32>
  %keep = "attn.mask"() ({
  ^bb0(%b: index, %h: index, %i: index, %j: index):
    %c = arith.cmpi sge, %i, %j : index
    "gpu.yield"(%c) : (i1) -> ()
  }) : () -> tensor<1x1x64x64xi1>
  %probs, %lse = "attn.normalize"(%scores, %keep) ({}, {}, {}) {kind = "softmax", operandSegmentSizes = array<i32: 1, 1>, resultSegmentSizes = array<i32: 1, 1>} : (tensor<1x1x64x64xf32>, tensor<1x1x64x64xi1>) -> (tensor<1x1x64x64xf32>, tensor<1x1x64xf32>)
  %out = "attn.aggregate"(%probs, %v) : (tensor<1x1x64x64xf32>, tensor<1x1x64x16xbf16>) -> tensor<1x1x64x16xbf16>
  return %out, %lse : tensor<1x1x64x16xbf16>, tensor<1x1x64xf32>
}
