// --split-input-file processes each chunk alone and joins the outputs with the marker.
// RUN: ae-opt %s --split-input-file | FileCheck %s

// CHECK: sym_name = "first"
// CHECK-NEXT: "func.return"
// CHECK-NEXT: }) : () -> ()
// CHECK-NEXT: }) : () -> ()
// CHECK-NEXT: // -----
// CHECK-NEXT: "builtin.module"
// CHECK-NEXT: sym_name = "second"
// CHECK: // -----
// CHECK-NEXT: "builtin.module"
// CHECK-NEXT: sym_name = "third"
func.func @first() {
  return
}

// -----

func.func @second(%q: tensor<2x4x8x16xf32>, %k: tensor<2x4x8x16xf32>) -> tensor<2x4x8x8xf32> {
  %s = "attn.score"(%q, %k) {scale = 0.25 : f32} : (tensor<2x4x8x16xf32>, tensor<2x4x8x16xf32>) -> tensor<2x4x8x8xf32>
  return %s : tensor<2x4x8x8xf32>
}

// -----

func.func @third() {
  return
}
