// attn-split-position-casts converts the terms of a position sum, not the sum: arith.sitofp of an
// addi/subi tree whose leaves each vary along fewer of the generic's dimensions than the tree
// (a query row along d0, a key along d1) becomes the same tree of addf/subf over the converted
// leaves, which Triton's lowering computes once per row and once per column. It applies only
// where index bounds prove every node of the tree an exact integer of the float type.
// RUN: ae-opt %s --split-input-file --attn-split-position-casts --no-mlir-print-op-generic | FileCheck %s

// ALiBi's slope * (kv - q) with q = q0 + i, kv = k0 + j, L = 2048 in 16 query blocks of 128 and
// 32 KV tiles of 64: the difference's two terms are converted, then subtracted in f32.
// CHECK-LABEL: func.func @alibi
// CHECK: %[[Q:.*]] = arith.addi %{{.*}}, %{{.*}} : index
// CHECK: %[[K:.*]] = arith.addi %{{.*}}, %{{.*}} : index
// CHECK-NOT: arith.subi
// CHECK: %[[KW:.*]] = arith.index_cast %[[K]] : index to i64
// CHECK: %[[KF:.*]] = arith.sitofp %[[KW]] : i64 to f32
// CHECK: %[[QW:.*]] = arith.index_cast %[[Q]] : index to i64
// CHECK: %[[QF:.*]] = arith.sitofp %[[QW]] : i64 to f32
// CHECK: %[[D:.*]] = arith.subf %[[KF]], %[[QF]] : f32
// CHECK: arith.mulf %{{.*}}, %[[D]] : f32
func.func @alibi(%slope: f32, %init: tensor<128x64xf32>) -> tensor<128x64xf32>
    attributes {attn.grid = array<i64: 1, 16, 16>} {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c32 = arith.constant 32 : index
  %c64 = arith.constant 64 : index
  %c128 = arith.constant 128 : index
  %block = "attn.program_id"() {axis = 2 : i64} : () -> index
  %q0 = arith.muli %block, %c128 : index
  %r = scf.for %t = %c0 to %c32 step %c1 iter_args(%acc = %init) -> (tensor<128x64xf32>) {
    %k0 = arith.muli %t, %c64 : index
    %g = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>], iterator_types = ["parallel", "parallel"]}
        outs(%acc : tensor<128x64xf32>) {
    ^bb0(%out: f32):
      %i = linalg.index 0 : index
      %j = linalg.index 1 : index
      %q = arith.addi %q0, %i : index
      %k = arith.addi %k0, %j : index
      %d = arith.subi %k, %q : index
      %w = arith.index_cast %d : index to i64
      %f = arith.sitofp %w : i64 to f32
      %b = arith.mulf %slope, %f : f32
      %s = arith.addf %out, %b : f32
      linalg.yield %s : f32
    } -> tensor<128x64xf32>
    scf.yield %g : tensor<128x64xf32>
  }
  return %r : tensor<128x64xf32>
}

// -----

// A tree of three terms, (q - kv) + 7, converts each leaf (the constant along no dimension)
// and keeps the tree's shape. A sum whose terms both vary along both dimensions (q * kv + q) is
// left alone: no term is cheaper to convert than the sum.
// CHECK-LABEL: func.func @tree
// CHECK: %[[QF:.*]] = arith.sitofp %{{.*}} : i64 to f32
// CHECK: %[[KF:.*]] = arith.sitofp %{{.*}} : i64 to f32
// CHECK: %[[D:.*]] = arith.subf %[[QF]], %[[KF]] : f32
// CHECK: %[[CF:.*]] = arith.sitofp %{{.*}} : i64 to f32
// CHECK: arith.addf %[[D]], %[[CF]] : f32
// CHECK: %[[P:.*]] = arith.muli %{{.*}}, %{{.*}} : index
// CHECK: %[[PQ:.*]] = arith.addi %[[P]], %{{.*}} : index
// CHECK: %[[PW:.*]] = arith.index_cast %[[PQ]] : index to i64
// CHECK: arith.sitofp %[[PW]] : i64 to f32
func.func @tree(%init: tensor<64x64xf32>) -> tensor<64x64xf32> attributes {attn.grid = array<i64: 1, 1, 1>} {
  %c7 = arith.constant 7 : index
  %g = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>], iterator_types = ["parallel", "parallel"]}
      outs(%init : tensor<64x64xf32>) {
  ^bb0(%out: f32):
    %i = linalg.index 0 : index
    %j = linalg.index 1 : index
    %d = arith.subi %i, %j : index
    %e = arith.addi %d, %c7 : index
    %w = arith.index_cast %e : index to i64
    %f = arith.sitofp %w : i64 to f32
    %p = arith.muli %i, %j : index
    %pq = arith.addi %p, %i : index
    %pw = arith.index_cast %pq : index to i64
    %pf = arith.sitofp %pw : i64 to f32
    %s = arith.addf %f, %pf : f32
    linalg.yield %s : f32
  } -> tensor<64x64xf32>
  return %g : tensor<64x64xf32>
}

// -----

// Not provably exact: a key position from a function argument (no bounds), and an f16 result
// whose positions reach 4096 (f16's exact integers stop at 2^11). Both keep their conversion.
// CHECK-LABEL: func.func @inexact
// CHECK-NOT: arith.subf
// CHECK: %[[D:.*]] = arith.subi %{{.*}}, %{{.*}} : index
// CHECK: arith.sitofp %{{.*}} : i64 to f32
// CHECK: %[[E:.*]] = arith.subi %{{.*}}, %{{.*}} : index
// CHECK: arith.sitofp %{{.*}} : i64 to f16
func.func @inexact(%k0: index, %init: tensor<64x64xf32>) -> tensor<64x64xf32> attributes {attn.grid = array<i64: 1, 1, 64>} {
  %c64 = arith.constant 64 : index
  %block = "attn.program_id"() {axis = 2 : i64} : () -> index
  %q0 = arith.muli %block, %c64 : index
  %g = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>], iterator_types = ["parallel", "parallel"]}
      outs(%init : tensor<64x64xf32>) {
  ^bb0(%out: f32):
    %i = linalg.index 0 : index
    %j = linalg.index 1 : index
    %q = arith.addi %q0, %i : index
    %k = arith.addi %k0, %j : index
    %d = arith.subi %k, %q : index
    %w = arith.index_cast %d : index to i64
    %f = arith.sitofp %w : i64 to f32
    %e = arith.subi %j, %q : index
    %ew = arith.index_cast %e : index to i64
    %h = arith.sitofp %ew : i64 to f16
    %he = arith.extf %h : f16 to f32
    %s = arith.addf %f, %he : f32
    linalg.yield %s : f32
  } -> tensor<64x64xf32>
  return %g : tensor<64x64xf32>
}
