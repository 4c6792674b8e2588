// attn-cpu-lower-vectors writes a vector.gather from a memref as one scalar load per lane; where
// the memref (or the one a memref.cast made it from) has a unit innermost stride and no lane is
// masked off, behind a run-time check: positions that are consecutive and inside one row take one
// vector load instead. A relative-position read at a query's position in a cache (q_idx +
// offset[b] - kv_idx) is clamped into the table at run time, so the vectorizer keeps it a gather
// though its row's window is whole but at the table's ends.
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-cpu-lower-vectors)' --no-mlir-print-op-generic | FileCheck %s

// CHECK-LABEL: func.func @reads
// CHECK-SAME: (%[[TABLE:[a-z0-9]+]]: memref<4x127xf32, strided<[?, 1], offset: ?>>, %[[STRIDED:[a-z0-9]+]]: memref<4x127xf32, strided<[?, ?], offset: ?>>, %[[IDX:[a-z0-9]+]]: vector<1x64xindex>)
// CHECK: %[[CAST:.*]] = memref.cast %[[TABLE]]
// CHECK: %[[FIRST:.*]] = vector.extract %[[IDX]][0, 0] : index from vector<1x64xindex>
// CHECK: %[[SPLAT:.*]] = vector.broadcast %[[FIRST]] : index to vector<1x64xindex>
// CHECK: %[[EXPECTED:.*]] = arith.addi %[[SPLAT]], %{{.*}} : vector<1x64xindex>
// CHECK: %[[EQUAL:.*]] = arith.cmpi eq, %[[IDX]], %[[EXPECTED]] : vector<1x64xindex>
// CHECK: %[[ALL:.*]] = vector.reduction <and>, %{{.*}} : vector<64xi1> into i1
// CHECK: %[[IN_ROW:.*]] = arith.cmpi ule, %{{.*}}, %{{.*}} : index
// CHECK: %[[BOTH:.*]] = arith.andi %[[ALL]], %[[IN_ROW]] : i1
// CHECK: %[[A:.*]] = scf.if %[[BOTH]] -> (vector<1x64xf32>) {
// CHECK-NEXT: %[[ROW:.*]] = vector.load %[[TABLE]][%{{.*}}, %{{.*}}] : memref<4x127xf32, strided<[?, 1], offset: ?>>, vector<64xf32>
// CHECK-NEXT: %[[SHAPED:.*]] = vector.shape_cast %[[ROW]] : vector<64xf32> to vector<1x64xf32>
// CHECK-NEXT: scf.yield %[[SHAPED]]
// CHECK-NEXT: } else {
// CHECK-COUNT-64: memref.load %[[CAST]]
// CHECK: vector.from_elements
// CHECK: }
// CHECK-NOT: scf.if
// CHECK-NOT: vector.load
// CHECK-COUNT-64: memref.load %[[STRIDED]]
// CHECK: %[[B:.*]] = vector.from_elements
// CHECK: return %[[A]], %[[B]]
func.func @reads(%table: memref<4x127xf32, strided<[?, 1], offset: ?>>, %strided: memref<4x127xf32, strided<[?, ?], offset: ?>>, %idx: vector<1x64xindex>) -> (vector<1x64xf32>, vector<1x64xf32>) {
  %c0 = arith.constant 0 : index
  %mask = arith.constant dense<true> : vector<1x64xi1>
  %pass = arith.constant dense<0.0> : vector<1x64xf32>
  %cast = memref.cast %table : memref<4x127xf32, strided<[?, 1], offset: ?>> to memref<4x127xf32, strided<[?, ?], offset: ?>>
  %a = vector.gather %cast[%c0, %c0] [%idx], %mask, %pass : memref<4x127xf32, strided<[?, ?], offset: ?>>, vector<1x64xindex>, vector<1x64xi1>, vector<1x64xf32> into vector<1x64xf32>
  %b = vector.gather %strided[%c0, %c0] [%idx], %mask, %pass : memref<4x127xf32, strided<[?, ?], offset: ?>>, vector<1x64xindex>, vector<1x64xi1>, vector<1x64xf32> into vector<1x64xf32>
  return %a, %b : vector<1x64xf32>, vector<1x64xf32>
}
