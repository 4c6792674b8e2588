// attn-cpu-legalize-for-llvm marks max and min reductions `nsz`: a row max of scores may be
// either zero where both signs are among them (exp2(s - m) is the same), which spares LLVM's x86
// lowering a sign-bit blend per step; NaN still propagates. Additions, elementwise maxima (a
// score_mod's torch.maximum) and integer reductions keep their flags.
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-cpu-legalize-for-llvm)' --no-mlir-print-op-generic | FileCheck %s

// CHECK-LABEL: func.func @row_state
// CHECK: vector.reduction <maximumf>, %{{.*}}, %{{.*}} fastmath<nsz> : vector<64xf32> into f32
// CHECK: vector.reduction <minimumf>, %{{.*}} fastmath<nsz> : vector<64xf32> into f32
// CHECK: vector.reduction <add>, %{{.*}} : vector<64xf32> into f32
// CHECK-NOT: fastmath
// CHECK: arith.maximumf %{{.*}}, %{{.*}} : vector<64xf32>
// CHECK: vector.reduction <maxsi>, %{{.*}} : vector<64xi32> into i32
func.func @row_state(%s: vector<64xf32>, %m: f32, %i: vector<64xi32>) -> (f32, f32, f32, vector<64xf32>, i32) {
  %max = vector.reduction <maximumf>, %s, %m : vector<64xf32> into f32
  %min = vector.reduction <minimumf>, %s : vector<64xf32> into f32
  %sum = vector.reduction <add>, %s : vector<64xf32> into f32
  %elt = arith.maximumf %s, %s : vector<64xf32>
  %imax = vector.reduction <maxsi>, %i : vector<64xi32> into i32
  return %max, %min, %sum, %elt, %imax : f32, f32, f32, vector<64xf32>, i32
}
