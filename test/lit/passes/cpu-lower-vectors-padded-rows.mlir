// attn-cpu-lower-vectors stages a partial tile (rows past the source's end read as zeros) in a
// buffer. With rows of a power-of-two length the whole vector is stored through a vector view of
// the buffer; LLVM pads a row of 5 floats to 8 in memory, so those rows are stored one at a time
// into the buffer's scalar layout instead (the last chunk of a linear recurrence with Dk = 5).
// RUN: ae-opt %s --attn-cpu-lower-vectors --no-mlir-print-op-generic | FileCheck %s

// CHECK-LABEL: func.func @rows_of_five
// CHECK: %[[STAGE:.*]] = memref.alloca() {{.*}} : memref<4x5xf32>
// CHECK-NOT: vector.type_cast
// CHECK: scf.if
// CHECK: vector.insert {{.*}} [3] : vector<5xf32> into vector<4x5xf32>
// CHECK: %[[ROW0:.*]] = vector.extract %[[PARTIAL:.*]][0] : vector<5xf32> from vector<4x5xf32>
// CHECK: vector.store %[[ROW0]], %[[STAGE]][%{{.*}}, %[[C0:.*]]] : memref<4x5xf32>, vector<5xf32>
// CHECK: %[[ROW3:.*]] = vector.extract %[[PARTIAL]][3] : vector<5xf32> from vector<4x5xf32>
// CHECK: vector.store %[[ROW3]], %[[STAGE]][%{{.*}}, %[[C0]]] : memref<4x5xf32>, vector<5xf32>
// CHECK: memref.cast %[[STAGE]]
// CHECK-NOT: vector.type_cast
// CHECK: return
func.func @rows_of_five(%src: memref<?x5xf32, strided<[?, 1], offset: ?>>, %dst: memref<4x5xf32>) {
  %c0 = arith.constant 0 : index
  %pad = arith.constant 0.0 : f32
  %v = vector.transfer_read %src[%c0, %c0], %pad {in_bounds = [false, true]} : memref<?x5xf32, strided<[?, 1], offset: ?>>, vector<4x5xf32>
  vector.transfer_write %v, %dst[%c0, %c0] {in_bounds = [true, true]} : vector<4x5xf32>, memref<4x5xf32>
  return
}

// CHECK-LABEL: func.func @rows_of_eight
// CHECK: %[[STAGE8:.*]] = memref.alloca() {{.*}} : memref<4x8xf32>
// CHECK: %[[VIEW:.*]] = vector.type_cast %[[STAGE8]] : memref<4x8xf32> to memref<vector<4x8xf32>>
// CHECK: memref.store %{{.*}}, %[[VIEW]][] : memref<vector<4x8xf32>>
func.func @rows_of_eight(%src: memref<?x8xf32, strided<[?, 1], offset: ?>>, %dst: memref<4x8xf32>) {
  %c0 = arith.constant 0 : index
  %pad = arith.constant 0.0 : f32
  %v = vector.transfer_read %src[%c0, %c0], %pad {in_bounds = [false, true]} : memref<?x8xf32, strided<[?, 1], offset: ?>>, vector<4x8xf32>
  vector.transfer_write %v, %dst[%c0, %c0] {in_bounds = [true, true]} : vector<4x8xf32>, memref<4x8xf32>
  return
}
