// Closure-tensor gathers in the Triton lowering. L = 40 in 32x32 tiles (a ragged tail), H = 2.
// The relative-position table [H, 2L - 1] read at q - k + L - 1: after attn-tile's tail clamps the
// index is provably inside, so the load has no bounds mask; the head offsets the base pointer
// once (a scalar i64 offset) and the tile's index is the i32 offset itself. The table of 32 read
// at q cannot be proven inside (q reaches 39): its gather keeps the mask.
// RUN: ae-opt %s --split-input-file --pass-pipeline='builtin.module(attn-fuse-online-softmax,attn-tile{block-m=32 block-n=32},attn-fold-index-clamps,attn-lower-to-triton)' | FileCheck %s
// CHECK-LABEL: "tt.func"
// CHECK: ^bb0({{.*}}, %[[REL:arg[0-9]+]]: !tt.ptr<f32>, %[[REL_S0:arg[0-9]+]]: i64, %[[SHORT:arg[0-9]+]]: !tt.ptr<f32>
// CHECK: "scf.for"
// CHECK: "tt.dot"
// CHECK: %[[ROW:.*]] = "arith.muli"(%{{.*}}, %[[REL_S0]]) {{.*}} : (i64, i64) -> i64
// CHECK: %[[BASE:.*]] = "tt.addptr"(%[[REL]], %[[ROW]]) : (!tt.ptr<f32>, i64) -> !tt.ptr<f32>
// CHECK: %[[SPLAT:.*]] = "tt.splat"(%[[BASE]]) : (!tt.ptr<f32>) -> tensor<32x32x!tt.ptr<f32>>
// CHECK: %[[PTRS:.*]] = "tt.addptr"(%[[SPLAT]], %{{.*}}) : (tensor<32x32x!tt.ptr<f32>>, tensor<32x32xi32>) -> tensor<32x32x!tt.ptr<f32>>
// CHECK: "tt.load"(%[[PTRS]]) {{.*}} : (tensor<32x32x!tt.ptr<f32>>) -> tensor<32x32xf32>
// CHECK: "tt.addptr"(%{{.*}}, %{{.*}}) : (tensor<32x1x!tt.ptr<f32>>, tensor<32x1xi32>) -> tensor<32x1x!tt.ptr<f32>>
// CHECK: "tt.load"({{.*}}) {{.*}} : (tensor<32x1x!tt.ptr<f32>>, tensor<32x1xi1>, tensor<32x1xf32>) -> tensor<32x1xf32>
func.func @relative(%q: tensor<1x2x40x64xf16>, %k: tensor<1x2x40x64xf16>, %v: tensor<1x2x40x64xf16>, %rel: tensor<2x79xf32>, %short: tensor<32xf32>) -> (tensor<1x2x40x64xf16>, tensor<1x2x40xf32>) {
  %s = "attn.score"(%q, %k) {scale = 0.125 : f32} : (tensor<1x2x40x64xf16>, tensor<1x2x40x64xf16>) -> tensor<1x2x40x40xf32>
  %m = "attn.score_mod"(%s) ({
  ^bb0(%x: f32, %b: index, %h: index, %i: index, %j: index):
    %c39 = arith.constant 39 : index
    %d = arith.subi %i, %j : index
    %e = arith.addi %d, %c39 : index
    %bias = tensor.extract %rel[%h, %e] : tensor<2x79xf32>
    %row = tensor.extract %short[%i] : tensor<32xf32>
    %y = arith.addf %x, %bias : f32
    %z = arith.addf %y, %row : f32
    "gpu.yield"(%z) : (f32) -> ()
  }) : (tensor<1x2x40x40xf32>) -> tensor<1x2x40x40xf32>
  %p, %lse = "attn.normalize"(%m) ({}, {}, {}) {kind = "softmax", operandSegmentSizes = array<i32: 1, 0>, resultSegmentSizes = array<i32: 1, 1>} : (tensor<1x2x40x40xf32>) -> (tensor<1x2x40x40xf32>, tensor<1x2x40xf32>)
  %o = "attn.aggregate"(%p, %v) : (tensor<1x2x40x40xf32>, tensor<1x2x40x64xf16>) -> tensor<1x2x40x64xf16>
  return %o, %lse : tensor<1x2x40x64xf16>, tensor<1x2x40xf32>
}

// -----

// T5's bucket arithmetic as the frontend writes it: index -> i64 -> f32 and f32 -> i64 -> index.
// With `index` lowered to i32 both conversions take 32 bits (sitofp of the i32 distance, fptosi to
// i32; a 64-bit conversion runs at a quarter of the rate); the division by 8 is an exact multiply
// by 0.125, the division by 3 stays a division.
// CHECK-LABEL: "tt.func"
// CHECK: "scf.for"
// CHECK: %[[D:.*]] = "arith.subi"({{.*}} : (tensor<32x32xi32>, tensor<32x32xi32>) -> tensor<32x32xi32>
// CHECK: %[[F:.*]] = "arith.sitofp"(%[[D]]) : (tensor<32x32xi32>) -> tensor<32x32xf32>
// CHECK: %[[E:.*]] = "arith.mulf"(%[[F]], %{{.*}}) {{.*}} : (tensor<32x32xf32>, tensor<32x32xf32>) -> tensor<32x32xf32>
// CHECK: %[[T:.*]] = "arith.divf"(%[[E]], %{{.*}}) {{.*}} : (tensor<32x32xf32>, tensor<32x32xf32>) -> tensor<32x32xf32>
// CHECK: "arith.fptosi"(%[[T]]) : (tensor<32x32xf32>) -> tensor<32x32xi32>
func.func @buckets(%q: tensor<1x2x40x64xf16>, %k: tensor<1x2x40x64xf16>, %v: tensor<1x2x40x64xf16>, %table: tensor<2x32xf32>) -> (tensor<1x2x40x64xf16>, tensor<1x2x40xf32>) {
  %s = "attn.score"(%q, %k) {scale = 0.125 : f32} : (tensor<1x2x40x64xf16>, tensor<1x2x40x64xf16>) -> tensor<1x2x40x40xf32>
  %m = "attn.score_mod"(%s) ({
  ^bb0(%x: f32, %b: index, %h: index, %i: index, %j: index):
    %c0 = arith.constant 0 : index
    %c31 = arith.constant 31 : index
    %c8 = arith.constant 8.0 : f32
    %c3 = arith.constant 3.0 : f32
    %d = arith.subi %i, %j : index
    %d64 = arith.index_cast %d : index to i64
    %df = arith.sitofp %d64 : i64 to f32
    %e = arith.divf %df, %c8 : f32
    %t = arith.divf %e, %c3 : f32
    %n64 = arith.fptosi %t : f32 to i64
    %n = arith.index_cast %n64 : i64 to index
    %lo = arith.maxsi %n, %c0 : index
    %idx = arith.minsi %lo, %c31 : index
    %bias = tensor.extract %table[%h, %idx] : tensor<2x32xf32>
    %y = arith.addf %x, %bias : f32
    "gpu.yield"(%y) : (f32) -> ()
  }) : (tensor<1x2x40x40xf32>) -> tensor<1x2x40x40xf32>
  %p, %lse = "attn.normalize"(%m) ({}, {}, {}) {kind = "softmax", operandSegmentSizes = array<i32: 1, 0>, resultSegmentSizes = array<i32: 1, 1>} : (tensor<1x2x40x40xf32>) -> (tensor<1x2x40x40xf32>, tensor<1x2x40xf32>)
  %o = "attn.aggregate"(%p, %v) : (tensor<1x2x40x40xf32>, tensor<1x2x40x64xf16>) -> tensor<1x2x40x64xf16>
  return %o, %lse : tensor<1x2x40x64xf16>, tensor<1x2x40xf32>
}
