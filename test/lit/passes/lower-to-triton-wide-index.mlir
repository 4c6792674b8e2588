// Index arithmetic in the Triton lowering: `index` is i32, and an op whose exact values can leave
// i32 at the module's shapes runs in 64 bits (the reference computes positions in int64). A
// mask's product of positions stays 32-bit at L = 64; at L = 50000 (49999^2 > 2^31) the
// positions are extended, the product and remainder are 64-bit, and the remainder (0..6) comes
// back to 32 bits for the comparison.
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-fuse-online-softmax,attn-tile{block-m=32 block-n=32},attn-lower-to-triton)' | FileCheck %s
// CHECK-NOT: xi64>
// CHECK: "arith.muli"(%{{.*}}, %{{.*}}) {{.*}} : (tensor<32x32xi32>, tensor<32x32xi32>) -> tensor<32x32xi32>
// CHECK-NEXT: "arith.remsi"({{.*}}) : (tensor<32x32xi32>, tensor<32x32xi32>) -> tensor<32x32xi32>
// CHECK-NEXT: "arith.cmpi"
// CHECK-NOT: xi64>
// CHECK: sym_name = "short"
// CHECK: "arith.extsi"({{.*}}) : (tensor<32x1xi32>) -> tensor<32x1xi64>
// CHECK-NEXT: "arith.extsi"({{.*}}) : (tensor<1x32xi32>) -> tensor<1x32xi64>
// CHECK: "arith.muli"(%{{.*}}, %{{.*}}) {{.*}} : (tensor<32x32xi64>, tensor<32x32xi64>) -> tensor<32x32xi64>
// CHECK-NEXT: "arith.remsi"({{.*}}) : (tensor<32x32xi64>, tensor<32x32xi64>) -> tensor<32x32xi64>
// CHECK-NEXT: "arith.trunci"({{.*}}) {{.*}} : (tensor<32x32xi64>) -> tensor<32x32xi32>
// CHECK-NEXT: "arith.cmpi"({{.*}}) {{.*}} : (tensor<32x32xi32>, tensor<32x32xi32>) -> tensor<32x32xi1>
// CHECK: sym_name = "long"
func.func @short(%q: tensor<1x1x64x32xbf16>, %k: tensor<1x1x64x32xbf16>, %v: tensor<1x1x64x32xbf16>) -> tensor<1x1x64x32xbf16> {
  %s = "attn.score"(%q, %k) {scale = 0.125 : f32} : (tensor<1x1x64x32xbf16>, tensor<1x1x64x32xbf16>) -> tensor<1x1x64x64xf32>
  %keep = "attn.mask"() ({
  ^bb0(%b: index, %h: index, %i: index, %j: index):
    %p = arith.muli %i, %j : index
    %c7 = arith.constant 7 : index
    %r = arith.remsi %p, %c7 : index
    %c3 = arith.constant 3 : index
    %ne = arith.cmpi ne, %r, %c3 : index
    "gpu.yield"(%ne) : (i1) -> ()
  }) : () -> tensor<1x1x64x64xi1>
  %p = "attn.normalize"(%s, %keep) ({}, {}, {}) {kind = "softmax", operandSegmentSizes = array<i32: 1, 1>, resultSegmentSizes = array<i32: 1, 0>} : (tensor<1x1x64x64xf32>, tensor<1x1x64x64xi1>) -> tensor<1x1x64x64xf32>
  %o = "attn.aggregate"(%p, %v) : (tensor<1x1x64x64xf32>, tensor<1x1x64x32xbf16>) -> tensor<1x1x64x32xbf16>
  return %o : tensor<1x1x64x32xbf16>
}
func.func @long(%q: tensor<1x1x50000x32xbf16>, %k: tensor<1x1x50000x32xbf16>, %v: tensor<1x1x50000x32xbf16>) -> tensor<1x1x50000x32xbf16> {
  %s = "attn.score"(%q, %k) {scale = 0.125 : f32} : (tensor<1x1x50000x32xbf16>, tensor<1x1x50000x32xbf16>) -> tensor<1x1x50000x50000xf32>
  %keep = "attn.mask"() ({
  ^bb0(%b: index, %h: index, %i: index, %j: index):
    %p = arith.muli %i, %j : index
    %c7 = arith.constant 7 : index
    %r = arith.remsi %p, %c7 : index
    %c3 = arith.constant 3 : index
    %ne = arith.cmpi ne, %r, %c3 : index
    "gpu.yield"(%ne) : (i1) -> ()
  }) : () -> tensor<1x1x50000x50000xi1>
  %p = "attn.normalize"(%s, %keep) ({}, {}, {}) {kind = "softmax", operandSegmentSizes = array<i32: 1, 1>, resultSegmentSizes = array<i32: 1, 0>} : (tensor<1x1x50000x50000xf32>, tensor<1x1x50000x50000xi1>) -> tensor<1x1x50000x50000xf32>
  %o = "attn.aggregate"(%p, %v) : (tensor<1x1x50000x50000xf32>, tensor<1x1x50000x32xbf16>) -> tensor<1x1x50000x32xbf16>
  return %o : tensor<1x1x50000x32xbf16>
}
