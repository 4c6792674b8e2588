// attn-cpu-vectorize tiles a linalg op over more than two loops one row at a time: here the
// [C, C, Dk] scores of the GLA chunk, t and s each in steps of one and the sum over d in rows of
// at most 256 elements, each a power of two (a head dim of 24 runs in rows of 8). The tile sizes
// come from the loops, not from the operands' shapes: vectorized whole, or with only t tiled, the
// scores were one vector of C * C * Dk elements that LLVM took minutes to compile, and rows of 24
// that the vector lowering could not stage.
// RUN: ae-opt %s --split-input-file --pass-pipeline='builtin.module(attn-cpu-grid-loops,canonicalize,cse,attn-cpu-vectorize)' --no-mlir-print-op-generic | FileCheck %s

// CHECK-LABEL: func.func @scores(
// CHECK-SAME: %[[Q:[a-z0-9]+]]: tensor<16x64xf32>, %[[K:[a-z0-9]+]]: tensor<16x64xf32>
// CHECK: scf.for {{.*}} step %c4
// CHECK: vector.transfer_write %{{.*}} : vector<4x16xf32>, tensor<16x16xf32>
// CHECK: scf.for %[[T:[a-z0-9]+]] = %c0 to %c16 step %c1
// CHECK-NEXT: scf.for %[[S:[a-z0-9]+]] = %c0 to %c16 step %c1 iter_args(%[[ACC:[a-z0-9]+]] =
// CHECK-NEXT: %[[QROW:.*]] = vector.transfer_read %[[Q]][%[[T]], %c0]{{.*}} : tensor<16x64xf32>, vector<1x64xf32>
// CHECK-NEXT: %[[KROW:.*]] = vector.transfer_read %[[K]][%[[S]], %c0]{{.*}} : tensor<16x64xf32>, vector<1x64xf32>
// CHECK-NEXT: %[[OLD:.*]] = vector.transfer_read %[[ACC]][%[[T]], %[[S]]]{{.*}} : tensor<16x16xf32>, vector<1x1xf32>
// CHECK-NEXT: %[[DIFF:.*]] = arith.subf %[[QROW]], %[[KROW]] : vector<1x64xf32>
// CHECK-NEXT: %[[EXP:.*]] = math.exp %[[DIFF]] : vector<1x64xf32>
// CHECK-NEXT: %[[WIDE:.*]] = vector.broadcast %[[EXP]] : vector<1x64xf32> to vector<1x1x64xf32>
// CHECK-NEXT: %[[SUM:.*]] = vector.multi_reduction <add>, %[[WIDE]], %[[OLD]] [2] : vector<1x1x64xf32> to vector<1x1xf32>
// CHECK-NEXT: vector.transfer_write %[[SUM]], %[[ACC]][%[[T]], %[[S]]]
// CHECK-NOT: linalg.generic
#td = affine_map<(t, s, d) -> (t, d)>
#sd = affine_map<(t, s, d) -> (s, d)>
#ts = affine_map<(t, s, d) -> (t, s)>
func.func @scores(%q: tensor<16x64xf32>, %k: tensor<16x64xf32>, %out: tensor<16x16xf32>) -> tensor<16x16xf32> attributes {attn.grid = array<i64: 1>} {
  %zero = arith.constant 0.0 : f32
  %init = linalg.fill ins(%zero : f32) outs(%out : tensor<16x16xf32>) -> tensor<16x16xf32>
  %s = linalg.generic {indexing_maps = [#td, #sd, #ts], iterator_types = ["parallel", "parallel", "reduction"]} ins(%q, %k : tensor<16x64xf32>, tensor<16x64xf32>) outs(%init : tensor<16x16xf32>) {
  ^bb0(%a: f32, %b: f32, %acc: f32):
    %d = arith.subf %a, %b : f32
    %e = math.exp %d : f32
    %r = arith.addf %acc, %e : f32
    linalg.yield %r : f32
  } -> tensor<16x16xf32>
  return %s : tensor<16x16xf32>
}

// -----

// CHECK-LABEL: func.func @scores_head_dim_24(
// CHECK: scf.for %[[T:[a-z0-9]+]] = %c0 to %c16 step %c1
// CHECK-NEXT: scf.for %[[S:[a-z0-9]+]] = %c0 to %c16 step %c1
// CHECK-NEXT: scf.for %[[D:[a-z0-9]+]] = %c0 to %c24 step %c8
// CHECK-NEXT: vector.transfer_read %{{.*}}[%[[T]], %[[D]]]{{.*}} : tensor<16x24xf32>, vector<1x8xf32>
// CHECK-NEXT: vector.transfer_read %{{.*}}[%[[S]], %[[D]]]{{.*}} : tensor<16x24xf32>, vector<1x8xf32>
// CHECK: vector.multi_reduction <add>, %{{.*}} [2] : vector<1x1x8xf32> to vector<1x1xf32>
// CHECK-NOT: linalg.generic
#td = affine_map<(t, s, d) -> (t, d)>
#sd = affine_map<(t, s, d) -> (s, d)>
#ts = affine_map<(t, s, d) -> (t, s)>
func.func @scores_head_dim_24(%q: tensor<16x24xf32>, %k: tensor<16x24xf32>, %out: tensor<16x16xf32>) -> tensor<16x16xf32> attributes {attn.grid = array<i64: 1>} {
  %zero = arith.constant 0.0 : f32
  %init = linalg.fill ins(%zero : f32) outs(%out : tensor<16x16xf32>) -> tensor<16x16xf32>
  %s = linalg.generic {indexing_maps = [#td, #sd, #ts], iterator_types = ["parallel", "parallel", "reduction"]} ins(%q, %k : tensor<16x24xf32>, tensor<16x24xf32>) outs(%init : tensor<16x16xf32>) {
  ^bb0(%a: f32, %b: f32, %acc: f32):
    %d = arith.subf %a, %b : f32
    %e = math.exp %d : f32
    %r = arith.addf %acc, %e : f32
    linalg.yield %r : f32
  } -> tensor<16x16xf32>
  return %s : tensor<16x16xf32>
}
