// attn-cpu-legalize-for-llvm writes f32 tanh (soft-capping's) as x P(x^2) near 0 and as
// copysign((1 - e) / (1 + e), x) with e = exp(-2|x|) beyond 0.55, one of the two selected per
// lane; the exp then becomes expand_exponentials' polynomial (no math op is left for the LLVM
// conversion, which would call libm's tanhf once per lane). f64 tanh is left as it is.
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-cpu-legalize-for-llvm)' --no-mlir-print-op-generic | FileCheck %s

// CHECK-LABEL: func.func @softcap
// CHECK-SAME: (%[[X:.*]]: vector<64xf32>, %[[D:.*]]: f64)
// CHECK-NOT: math.tanh %[[X]]
// CHECK-DAG: %[[ABS:.*]] = math.absf %[[X]] : vector<64xf32>
// CHECK-DAG: %[[SQ:.*]] = arith.mulf %[[X]], %[[X]] : vector<64xf32>
// CHECK: %[[NEAR:.*]] = arith.mulf %[[X]], %{{.*}} : vector<64xf32>
// CHECK: %[[MINUS2:.*]] = arith.mulf %[[ABS]], %{{.*}} : vector<64xf32>
// CHECK-NOT: math.exp
// CHECK: %[[RATIO:.*]] = arith.divf
// CHECK: %[[BEYOND:.*]] = math.copysign %[[RATIO]], %[[X]] : vector<64xf32>
// CHECK: %[[SMALL:.*]] = arith.cmpf olt, %[[ABS]], %{{.*}} : vector<64xf32>
// CHECK: %[[T:.*]] = arith.select %[[SMALL]], %[[NEAR]], %[[BEYOND]] : vector<64xi1>, vector<64xf32>
// CHECK: %[[TD:.*]] = math.tanh %[[D]] : f64
// CHECK: return %[[T]], %[[TD]]
func.func @softcap(%x: vector<64xf32>, %d: f64) -> (vector<64xf32>, f64) {
  %t = math.tanh %x : vector<64xf32>
  %td = math.tanh %d : f64
  return %t, %td : vector<64xf32>, f64
}
