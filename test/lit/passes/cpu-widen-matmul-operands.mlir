// attn-cpu-widen-matmul-operands: the tile products of a bf16 kernel take f32 operands converted
// once. V, a function argument, is converted at the function's start and Q's tile, defined before
// the KV loop, right after it (once per query block, not per KV tile); K's transposed copy and P's
// rounding to bf16, element-wise generics used only by a product, yield f32 themselves (the
// rounding kept: truncf then extf). Before, each product's body converts both operands at every
// multiply-add.
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-cpu-widen-matmul-operands)' --no-mlir-print-op-generic | FileCheck %s

// CHECK-LABEL: func.func @tiles
// CHECK: %[[V32:.*]] = linalg.generic {{.*}} ins(%{{.*}} : tensor<16x8xbf16>) outs(%{{.*}} : tensor<16x8xf32>)
// CHECK: %[[Q32:.*]] = linalg.generic {{.*}} ins(%{{.*}} : tensor<4x8xbf16>) outs(%{{.*}} : tensor<4x8xf32>)
// CHECK-NEXT: ^bb0(%[[QIN:.*]]: bf16, %{{.*}}: f32):
// CHECK-NEXT: arith.extf %[[QIN]] : bf16 to f32
// CHECK: scf.for
// CHECK: %[[KT:.*]] = linalg.generic {{.*}} ins(%{{.*}} : tensor<16x8xbf16>) outs(%{{.*}} : tensor<8x16xf32>)
// CHECK-NEXT: ^bb0(%[[IN:.*]]: bf16, %{{.*}}: f32):
// CHECK-NEXT: %[[W:.*]] = arith.extf %[[IN]] : bf16 to f32
// CHECK-NEXT: linalg.yield %[[W]] : f32
// CHECK: %[[S:.*]] = linalg.matmul ins(%[[Q32]], %[[KT]] : tensor<4x8xf32>, tensor<8x16xf32>)
// CHECK: %[[P:.*]] = linalg.generic {{.*}} ins(%[[S]] : tensor<4x16xf32>) outs(%{{.*}} : tensor<4x16xf32>)
// CHECK-NEXT: ^bb0(%[[X:.*]]: f32, %{{.*}}: f32):
// CHECK-NEXT: %[[R:.*]] = arith.truncf %[[X]] : f32 to bf16
// CHECK-NEXT: %[[E:.*]] = arith.extf %[[R]] : bf16 to f32
// CHECK-NEXT: linalg.yield %[[E]] : f32
// CHECK: linalg.matmul ins(%[[P]], %[[V32]] : tensor<4x16xf32>, tensor<16x8xf32>)
// CHECK-NOT: linalg.matmul
#id = affine_map<(d0, d1) -> (d0, d1)>
#tr = affine_map<(d0, d1) -> (d1, d0)>
func.func @tiles(%q: tensor<4x8xbf16>, %k: tensor<16x8xbf16>, %v: tensor<16x8xbf16>, %acc: tensor<4x8xf32>, %n: index) -> tensor<4x8xf32> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %zero = arith.constant 0.0 : f32
  %r = scf.for %i = %c0 to %n step %c1 iter_args(%o = %acc) -> tensor<4x8xf32> {
    %e = tensor.empty() : tensor<8x16xbf16>
    %kt = linalg.generic {indexing_maps = [#tr, #id], iterator_types = ["parallel", "parallel"]} ins(%k : tensor<16x8xbf16>) outs(%e : tensor<8x16xbf16>) {
    ^bb0(%a: bf16, %b: bf16):
      linalg.yield %a : bf16
    } -> tensor<8x16xbf16>
    %se = tensor.empty() : tensor<4x16xf32>
    %s0 = linalg.fill ins(%zero : f32) outs(%se : tensor<4x16xf32>) -> tensor<4x16xf32>
    %s = linalg.matmul ins(%q, %kt : tensor<4x8xbf16>, tensor<8x16xbf16>) outs(%s0 : tensor<4x16xf32>) -> tensor<4x16xf32>
    %pe = tensor.empty() : tensor<4x16xbf16>
    %p = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]} ins(%s : tensor<4x16xf32>) outs(%pe : tensor<4x16xbf16>) {
    ^bb0(%a: f32, %b: bf16):
      %t = arith.truncf %a : f32 to bf16
      linalg.yield %t : bf16
    } -> tensor<4x16xbf16>
    %pv = linalg.matmul ins(%p, %v : tensor<4x16xbf16>, tensor<16x8xbf16>) outs(%o : tensor<4x8xf32>) -> tensor<4x8xf32>
    scf.yield %pv : tensor<4x8xf32>
  }
  return %r : tensor<4x8xf32>
}
