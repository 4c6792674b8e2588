// Per-entry key lengths: attn.mask's optional kv_len operand (tensor<B x i32>). attn-tile reads
// the program's entry's length, clamps it into [0, Lk] and visits only the KV tiles that start
// below it. Here the mask j >= 40 with 32-key tiles makes tiles 1 and 3 partial (not a run of
// consecutive blocks), so the partial loop's trip count comes from a bound table (row t: how
// many listed tiles lie below tile t); the full list [2] is a run, so its count is
// clamp(reach - 2, 0, count). K and V rows past the length load as zeros, and every tile
// compares kv_idx with the length.
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-fuse-online-softmax,attn-tile{block-m=16 block-n=32},cse)' --no-mlir-print-op-generic | FileCheck %s --check-prefix=TILE
// attn-differentiate keeps the forward's operand and folds the lengths into the derivative's mask.
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-differentiate)' --no-mlir-print-op-generic | FileCheck %s --check-prefix=GRAD

// TILE-LABEL: func.func @cache(
// TILE-SAME: %[[K:[a-z0-9]+]]: tensor<2x2x100x16xbf16>, %{{.*}}: tensor<2x2x100x16xbf16>, %[[N:[a-z0-9]+]]: tensor<2xi32>,
// TILE: %[[B:.*]] = "attn.program_id"() {axis = 0 : i64}
// TILE: %[[RAW:.*]] = tensor.extract %[[N]][%[[B]]] : tensor<2xi32>
// TILE: %[[I:.*]] = arith.index_cast %[[RAW]] : i32 to index
// TILE: %[[LO:.*]] = arith.maxsi %[[I]], %c0
// TILE: %[[LEN:.*]] = arith.minsi %[[LO]], %c100
// TILE: %[[UP:.*]] = arith.addi %[[LEN]], %c31
// TILE: %[[REACH:.*]] = arith.divui %[[UP]], %c32
// TILE: %[[PIDX:.*]] = arith.constant dense<{{\[}}[1, 3]]> : tensor<1x2xi32>
// TILE: %[[BOUNDS:.*]] = arith.constant dense<{{\[}}[0, 0, 1, 1, 2]]> : tensor<1x5xi32>
// TILE: %[[TRIP:.*]] = tensor.extract %[[BOUNDS]][%{{.*}}, %[[REACH]]]
// TILE: %[[COUNT:.*]] = arith.index_cast %[[TRIP]] : i32 to index
// TILE: scf.for %{{.*}} = %c0 to %[[COUNT]] step %c1
// TILE: %[[N0:.*]] = arith.muli
// TILE: %[[LEFT:.*]] = arith.subi %[[LEN]], %[[N0]]
// TILE: %[[ROWS:.*]] = arith.minsi %[[LEFT]], %c32
// TILE: tensor.extract_slice %[[K]][%{{.*}}, %{{.*}}, %[[N0]], 0] [1, 1, %[[ROWS]], 16]
// TILE: arith.cmpi slt, %{{.*}}, %[[LEN]] : index
// TILE: arith.cmpi sge, %{{.*}}, %c40 : index
// The full tiles: a run from tile 2, so count = min(count, max(reach - 2, 0)).
// TILE: %[[FIDX:.*]] = arith.constant dense<2> : tensor<1x1xi32>
// TILE: %[[FIRST:.*]] = tensor.extract %[[FIDX]][%{{.*}}, %c0]
// TILE: %[[F:.*]] = arith.index_cast %[[FIRST]]
// TILE: %[[AHEAD:.*]] = arith.subi %[[REACH]], %[[F]]
// TILE: %[[POS:.*]] = arith.maxsi %[[AHEAD]], %c0
// TILE: %[[FCOUNT:.*]] = arith.minsi %{{.*}}, %[[POS]]
// TILE: scf.for %{{.*}} = %c0 to %[[FCOUNT]] step %c1
// Full tiles skip the mask region but not the length.
// TILE: arith.cmpi slt, %{{.*}}, %[[LEN]] : index
// TILE-NOT: arith.cmpi sge
// TILE: return

// GRAD-LABEL: func.func @cache(
// GRAD-SAME: %[[N:[a-z0-9]+]]: tensor<2xi32>)
// GRAD: "attn.mask"(%[[N]]) ({
// GRAD: }) : (tensor<2xi32>) -> tensor<2x2x3x100xi1>
// GRAD-LABEL: func.func @cache_grad(
// GRAD-SAME: %[[GN:[a-z0-9]+]]: tensor<2xi32>) -> tensor<2x2x3x100xf32> attributes {attn.closure_args = array<i64: 3>}
// GRAD: "attn.mask"() ({
// GRAD-NEXT: ^bb0(%[[B:.*]]: index, %{{.*}}: index, %{{.*}}: index, %[[J:.*]]: index):
// GRAD: %[[USER:.*]] = arith.cmpi sge, %[[J]], %c40
// GRAD: %[[RAW:.*]] = tensor.extract %[[GN]][%[[B]]] : tensor<2xi32>
// GRAD: %[[LEN:.*]] = arith.index_cast %[[RAW]]
// GRAD: %[[IN:.*]] = arith.cmpi slt, %[[J]], %[[LEN]]
// GRAD: %[[BOTH:.*]] = arith.andi %[[USER]], %[[IN]]
// GRAD: gpu.yield %[[BOTH]]
// GRAD: }) : () -> tensor<2x2x3x100xi1>

func.func @cache(%q: tensor<2x2x3x16xbf16>, %k: tensor<2x2x100x16xbf16>, %v: tensor<2x2x100x16xbf16>, %n: tensor<2xi32>) -> (tensor<2x2x3x16xbf16>, tensor<2x2x3xf32>) {
  %s = "attn.score"(%q, %k) {scale = 0.25 : f32} : (tensor<2x2x3x16xbf16>, tensor<2x2x100x16xbf16>) -> tensor<2x2x3x100xf32>
  %keep = "attn.mask"(%n) ({
  ^bb0(%b: index, %h: index, %i: index, %j: index):
    %c40 = arith.constant 40 : index
    %lo = arith.cmpi sge, %j, %c40 : index
    "gpu.yield"(%lo) : (i1) -> ()
  }) : (tensor<2xi32>) -> tensor<2x2x3x100xi1>
  %p, %lse = "attn.normalize"(%s, %keep) ({}, {}, {}) {kind = "softmax", operandSegmentSizes = array<i32: 1, 1>, resultSegmentSizes = array<i32: 1, 1>} : (tensor<2x2x3x100xf32>, tensor<2x2x3x100xi1>) -> (tensor<2x2x3x100xf32>, tensor<2x2x3xf32>)
  %o = "attn.aggregate"(%p, %v) : (tensor<2x2x3x100xf32>, tensor<2x2x100x16xbf16>) -> tensor<2x2x3x16xbf16>
  return %o, %lse : tensor<2x2x3x16xbf16>, tensor<2x2x3xf32>
}
