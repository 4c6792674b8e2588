// attn-cpu-legalize-for-llvm writes f32 log and log2 as exponent arithmetic (the argument's bits
// split into 2^e and a mantissa in [sqrt(1/2), sqrt(2)), subnormals scaled by 2^23 first) and a
// polynomial in the mantissa, and log1p(x) as log(u) * x / (u - 1) with u = 1 + x (Kahan), whose
// log is then the same expansion: no math op is left for the LLVM conversion, which would call
// libm once per lane. f64 log is left as it is.
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-cpu-legalize-for-llvm)' --no-mlir-print-op-generic | FileCheck %s --implicit-check-not='math.log{{(2|1p)?}} %{{.*}}f32'

// CHECK-LABEL: func.func @buckets
// CHECK-SAME: (%[[X:[a-z0-9]+]]: vector<64xf32>, %[[Y:[a-z0-9]+]]: vector<64xf32>, %[[Z:[a-z0-9]+]]: f32, %[[D:[a-z0-9]+]]: f64)
// CHECK: %[[SUBNORMAL:.*]] = arith.cmpf olt, %[[X]], %{{.*}} : vector<64xf32>
// CHECK: %[[SCALED:.*]] = arith.select %[[SUBNORMAL]], %{{.*}}, %[[X]]
// CHECK: %[[BITS:.*]] = arith.bitcast %[[SCALED]] : vector<64xf32> to vector<64xi32>
// CHECK: %[[FRACTION:.*]] = arith.andi %[[BITS]], %{{.*}} : vector<64xi32>
// CHECK: arith.ori %[[FRACTION]], %{{.*}} : vector<64xi32>
// CHECK: arith.shrui %[[BITS]], %{{.*}} : vector<64xi32>
// CHECK: arith.mulf %{{.*}} fastmath<contract> : vector<64xf32>
// CHECK: arith.sitofp %{{.*}} : vector<64xi32> to vector<64xf32>
// CHECK: arith.cmpf oeq, %[[X]], %{{.*}} : vector<64xf32>
// CHECK: arith.cmpf uno, %[[X]], %[[X]] : vector<64xf32>
// CHECK: arith.bitcast %{{.*}} : vector<64xf32> to vector<64xi32>
// CHECK: arith.cmpf uno, %[[Y]], %[[Y]] : vector<64xf32>
// CHECK: %[[U:.*]] = arith.addf %[[Z]], %{{.*}} : f32
// CHECK: %[[UM1:.*]] = arith.subf %[[U]], %{{.*}} : f32
// CHECK: arith.bitcast %{{.*}} : f32 to i32
// CHECK: arith.divf %[[Z]], %[[UM1]] : f32
// CHECK: %[[LD:.*]] = math.log %[[D]] : f64
// CHECK: return %{{.*}}, %{{.*}}, %{{.*}}, %[[LD]]
func.func @buckets(%x: vector<64xf32>, %y: vector<64xf32>, %z: f32, %d: f64) -> (vector<64xf32>, vector<64xf32>, f32, f64) {
  %l = math.log %x : vector<64xf32>
  %l2 = math.log2 %y : vector<64xf32>
  %l1p = math.log1p %z : f32
  %ld = math.log %d : f64
  return %l, %l2, %l1p, %ld : vector<64xf32>, vector<64xf32>, f32, f64
}
