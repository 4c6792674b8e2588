// attn-tabulate-index-terms: an integer term of one bounded index that costs more than a load
// (a log, a division) is computed at compile time for every value of that index and read from a
// constant i32 table. L = 64 in 32x32 tiles: q and k lie in [0, 63], kv_idx - q_idx in [-63, 63],
// so the table has 127 entries, read at d + 63.
// RUN: ae-opt %s --split-input-file --pass-pipeline='builtin.module(attn-fuse-online-softmax,attn-tile{block-m=32 block-n=32},attn-fold-index-clamps,attn-tabulate-index-terms)' --no-mlir-print-op-generic | FileCheck %s

// T5's bucket of kv_idx - q_idx: the log, the divisions, the conversions and the clamps into the
// 32 buckets all become one read of the table; the bias table is then read at that bucket.
// CHECK-LABEL: func.func @buckets
// CHECK: %[[TABLE:.*]] = arith.constant dense<{{.*}}> : tensor<127xi32>
// CHECK: linalg.generic
// CHECK: %[[D:.*]] = arith.subi %{{.*}}, %{{.*}} : index
// CHECK: %[[AT:.*]] = arith.addi %[[D]], %{{.*}} : index
// CHECK: %[[B32:.*]] = tensor.extract %[[TABLE]][%[[AT]]] : tensor<127xi32>
// CHECK: %[[B:.*]] = arith.index_cast %[[B32]] : i32 to index
// CHECK: tensor.extract %{{.*}}[%{{.*}}, %[[B]]] : tensor<2x32xf32>
// CHECK-NOT: math.log
// CHECK-NOT: arith.divf
// CHECK: linalg.yield
func.func @buckets(%q: tensor<1x2x64x64xf16>, %k: tensor<1x2x64x64xf16>, %v: tensor<1x2x64x64xf16>, %table: tensor<2x32xf32>) -> (tensor<1x2x64x64xf16>, tensor<1x2x64xf32>) {
  %s = "attn.score"(%q, %k) {scale = 0.125 : f32} : (tensor<1x2x64x64xf16>, tensor<1x2x64x64xf16>) -> tensor<1x2x64x64xf32>
  %m = "attn.score_mod"(%s) ({
  ^bb0(%x: f32, %b: index, %h: index, %i: index, %j: index):
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %c16 = arith.constant 16 : index
    %c31 = arith.constant 31 : index
    %c8 = arith.constant 8.0 : f32
    %c3 = arith.constant 3.0 : f32
    %d = arith.subi %j, %i : index
    %pos = arith.cmpi sgt, %d, %c0 : index
    %side = arith.select %pos, %c16, %c0 : index
    %d64 = arith.index_cast %d : index to i64
    %n64 = math.absi %d64 : i64
    %n = arith.index_cast %n64 : i64 to index
    %n1 = arith.maxsi %n, %c1 : index
    %n1i = arith.index_cast %n1 : index to i64
    %nf = arith.sitofp %n1i : i64 to f32
    %e = arith.divf %nf, %c8 : f32
    %l = math.log %e : f32
    %t = arith.divf %l, %c3 : f32
    %ti = arith.fptosi %t : f32 to i64
    %tn = arith.index_cast %ti : i64 to index
    %sum = arith.addi %side, %tn : index
    %lo = arith.maxsi %sum, %c0 : index
    %idx = arith.minsi %lo, %c31 : index
    %bias = tensor.extract %table[%h, %idx] : tensor<2x32xf32>
    %y = arith.addf %x, %bias : f32
    "gpu.yield"(%y) : (f32) -> ()
  }) : (tensor<1x2x64x64xf32>) -> tensor<1x2x64x64xf32>
  %p, %lse = "attn.normalize"(%m) ({}, {}, {}) {kind = "softmax", operandSegmentSizes = array<i32: 1, 0>, resultSegmentSizes = array<i32: 1, 1>} : (tensor<1x2x64x64xf32>) -> (tensor<1x2x64x64xf32>, tensor<1x2x64xf32>)
  %o = "attn.aggregate"(%p, %v) : (tensor<1x2x64x64xf32>, tensor<1x2x64x64xf16>) -> tensor<1x2x64x64xf16>
  return %o, %lse : tensor<1x2x64x64xf16>, tensor<1x2x64xf32>
}

// -----

// A term of the query position alone (a row bias bucketed by q_idx / 3) is tabulated over q's
// values, [0, 63], clamp included (13 from q = 39 on). The relative bucket without a division or a transcendental (min(|d|, 31)) is two
// integer ops, cheaper than a load: it stays.
// CHECK-LABEL: func.func @row_and_cheap
// CHECK: %[[ROWS:.*]] = arith.constant dense<[0, 0, 0, 1, 1, 1, 2, {{.*}}, 12, 12, 12, 13, 13, {{.*}}, 13]> : tensor<64xi32>
// CHECK: linalg.generic
// CHECK-NOT: arith.divsi
// CHECK: tensor.extract %[[ROWS]][%{{.*}}] : tensor<64xi32>
// CHECK-NOT: arith.divsi
// CHECK: math.absi
// CHECK: arith.minsi
// CHECK: linalg.yield
func.func @row_and_cheap(%q: tensor<1x2x64x64xf16>, %k: tensor<1x2x64x64xf16>, %v: tensor<1x2x64x64xf16>, %rows: tensor<14xf32>, %rel: tensor<32xf32>) -> (tensor<1x2x64x64xf16>, tensor<1x2x64xf32>) {
  %s = "attn.score"(%q, %k) {scale = 0.125 : f32} : (tensor<1x2x64x64xf16>, tensor<1x2x64x64xf16>) -> tensor<1x2x64x64xf32>
  %m = "attn.score_mod"(%s) ({
  ^bb0(%x: f32, %b: index, %h: index, %i: index, %j: index):
    %c3 = arith.constant 3 : index
    %c13 = arith.constant 13 : index
    %c31 = arith.constant 31 : index
    %r = arith.divsi %i, %c3 : index
    %rc = arith.minsi %r, %c13 : index
    %rb = tensor.extract %rows[%rc] : tensor<14xf32>
    %d = arith.subi %i, %j : index
    %d64 = arith.index_cast %d : index to i64
    %n64 = math.absi %d64 : i64
    %n = arith.index_cast %n64 : i64 to index
    %nc = arith.minsi %n, %c31 : index
    %db = tensor.extract %rel[%nc] : tensor<32xf32>
    %y = arith.addf %x, %rb : f32
    %z = arith.addf %y, %db : f32
    "gpu.yield"(%z) : (f32) -> ()
  }) : (tensor<1x2x64x64xf32>) -> tensor<1x2x64x64xf32>
  %p, %lse = "attn.normalize"(%m) ({}, {}, {}) {kind = "softmax", operandSegmentSizes = array<i32: 1, 0>, resultSegmentSizes = array<i32: 1, 1>} : (tensor<1x2x64x64xf32>) -> (tensor<1x2x64x64xf32>, tensor<1x2x64xf32>)
  %o = "attn.aggregate"(%p, %v) : (tensor<1x2x64x64xf32>, tensor<1x2x64x64xf16>) -> tensor<1x2x64x64xf16>
  return %o, %lse : tensor<1x2x64x64xf16>, tensor<1x2x64xf32>
}
