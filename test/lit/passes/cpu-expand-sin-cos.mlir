// attn-cpu-expand-sin-cos writes f32 sin and cos on vectors as x = k pi/2 + r (k rounded to even,
// r computed in f64 from pi/2 in three parts), sin(r) and cos(r) as f32 polynomials, and k's
// quadrant choosing and signing one; under an scf.if whose other branch keeps the op (libm per
// lane after the LLVM conversion) for a vector with a lane past 2^30 or NaN. An n-D vector's
// lanes are reduced through a 1-D cast; scalars keep the op.
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-cpu-expand-sin-cos)' --no-mlir-print-op-generic | FileCheck %s

// CHECK-LABEL: func.func @rotations
// CHECK-SAME: (%[[X:[a-z0-9]+]]: vector<64xf32>, %[[Y:[a-z0-9]+]]: vector<4x16xf32>, %[[S:[a-z0-9]+]]: f32)
// CHECK: %[[ABS:.*]] = math.absf %[[X]] : vector<64xf32>
// CHECK: %[[BEYOND:.*]] = arith.cmpf ugt, %[[ABS]], %{{.*}} : vector<64xf32>
// CHECK: %[[ANY:.*]] = vector.reduction <or>, %[[BEYOND]] : vector<64xi1> into i1
// CHECK: %[[SIN:.*]] = scf.if %[[ANY]] -> (vector<64xf32>) {
// CHECK-NEXT: %[[LIBM:.*]] = math.sin %[[X]] : vector<64xf32>
// CHECK-NEXT: scf.yield %[[LIBM]]
// CHECK-NEXT: } else {
// CHECK: %[[WIDE:.*]] = arith.extf %[[X]] : vector<64xf32> to vector<64xf64>
// CHECK: %[[K:.*]] = math.roundeven %{{.*}} : vector<64xf64>
// CHECK-COUNT-3: arith.subf %{{.*}}, %{{.*}} : vector<64xf64>
// CHECK: %[[R:.*]] = arith.truncf %{{.*}} : vector<64xf64> to vector<64xf32>
// CHECK: %[[Q:.*]] = arith.fptosi %[[K]] : vector<64xf64> to vector<64xi32>
// CHECK: arith.select
// CHECK: arith.negf
// CHECK: arith.cmpf oeq, %[[X]]
// CHECK: scf.yield
// CHECK: vector.shape_cast %{{.*}} : vector<4x16xi1> to vector<64xi1>
// CHECK: scf.if %{{.*}} -> (vector<4x16xf32>) {
// CHECK-NEXT: math.cos %[[Y]] : vector<4x16xf32>
// CHECK: math.roundeven %{{.*}} : vector<4x16xf64>
// CHECK: %[[SS:.*]] = math.sin %[[S]] : f32
// CHECK: return %[[SIN]], %{{.*}}, %[[SS]]
func.func @rotations(%x: vector<64xf32>, %y: vector<4x16xf32>, %s: f32) -> (vector<64xf32>, vector<4x16xf32>, f32) {
  %a = math.sin %x : vector<64xf32>
  %b = math.cos %y : vector<4x16xf32>
  %c = math.sin %s : f32
  return %a, %b, %c : vector<64xf32>, vector<4x16xf32>, f32
}
