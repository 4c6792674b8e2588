// Every L0 attn op parses, verifies and prints back in generic form (mod regions read the
// function's closure tensors directly); ae-opt's output parses again,
// and upstream mlir-opt accepts the same module with the IRDL file alone.
// RUN: ae-opt %s | FileCheck %s
// RUN: ae-opt %s | ae-opt | FileCheck %s
// RUN: mlir-opt --irdl-file=%attn_irdl --mlir-print-op-generic %s | FileCheck %s
// RUN: ae-opt %s | mlir-opt --irdl-file=%attn_irdl --mlir-print-op-generic | FileCheck %s

func.func @attention(%q: tensor<2x4x8x16xf32>, %k: tensor<2x2x8x16xf32>, %v: tensor<2x2x8x32xf32>, %slopes: tensor<4xf32>) -> (tensor<2x4x8x32xf32>, tensor<2x4x8xf32>) {
  %s = "attn.score"(%q, %k) {scale = 0.25 : f32} : (tensor<2x4x8x16xf32>, tensor<2x2x8x16xf32>) -> tensor<2x4x8x8xf32>
  %sm = "attn.score_mod"(%s) ({
  ^bb0(%x: f32, %b: index, %h: index, %i: index, %j: index):
    %e = tensor.extract %slopes[%h] : tensor<4xf32>
    %y = arith.addf %x, %e : f32
    "gpu.yield"(%y) : (f32) -> ()
  }) : (tensor<2x4x8x8xf32>) -> tensor<2x4x8x8xf32>
  %m = "attn.mask"() ({
  ^bb0(%b: index, %h: index, %i: index, %j: index):
    %c = arith.cmpi sge, %i, %j : index
    "gpu.yield"(%c) : (i1) -> ()
  }) : () -> tensor<2x4x8x8xi1>
  %p, %lse = "attn.normalize"(%sm, %m) ({}, {}, {}) {kind = "softmax", operandSegmentSizes = array<i32: 1, 1>, resultSegmentSizes = array<i32: 1, 1>} : (tensor<2x4x8x8xf32>, tensor<2x4x8x8xi1>) -> (tensor<2x4x8x8xf32>, tensor<2x4x8xf32>)
  %o = "attn.aggregate"(%p, %v) : (tensor<2x4x8x8xf32>, tensor<2x2x8x32xf32>) -> tensor<2x4x8x32xf32>
  return %o, %lse : tensor<2x4x8x32xf32>, tensor<2x4x8xf32>
}

// CHECK-LABEL: sym_name = "attention"
// CHECK:       ^bb0(%[[Q:.+]]: tensor<2x4x8x16xf32>, %[[K:.+]]: tensor<2x2x8x16xf32>, %[[V:.+]]: tensor<2x2x8x32xf32>, %[[SLOPES:.+]]: tensor<4xf32>):
// CHECK:       %[[S:.+]] = "attn.score"(%[[Q]], %[[K]]) {scale = 2.500000e-01 : f32} : (tensor<2x4x8x16xf32>, tensor<2x2x8x16xf32>) -> tensor<2x4x8x8xf32>
// CHECK:       %[[SM:.+]] = "attn.score_mod"(%[[S]]) ({
// CHECK-NEXT:  ^bb0(%[[X:.+]]: f32, %{{.+}}: index, %[[H:.+]]: index, %{{.+}}: index, %{{.+}}: index):
// CHECK-NEXT:    %[[E:.+]] = "tensor.extract"(%[[SLOPES]], %[[H]]) : (tensor<4xf32>, index) -> f32
// CHECK-NEXT:    %[[Y:.+]] = "arith.addf"(%[[X]], %[[E]])
// CHECK-NEXT:    "gpu.yield"(%[[Y]]) : (f32) -> ()
// CHECK-NEXT:  }) : (tensor<2x4x8x8xf32>) -> tensor<2x4x8x8xf32>
// CHECK:       %[[M:.+]] = "attn.mask"() ({
// CHECK-NEXT:  ^bb0(%{{.+}}: index, %{{.+}}: index, %[[I:.+]]: index, %[[J:.+]]: index):
// CHECK-NEXT:    %[[C:.+]] = "arith.cmpi"(%[[I]], %[[J]]) <{predicate = 5 : i64}> : (index, index) -> i1
// CHECK-NEXT:    "gpu.yield"(%[[C]]) : (i1) -> ()
// CHECK-NEXT:  }) : () -> tensor<2x4x8x8xi1>
// CHECK:       %[[N:.+]]:2 = "attn.normalize"(%[[SM]], %[[M]]) ({
// CHECK:       {kind = "softmax", operandSegmentSizes = array<i32: 1, 1>, resultSegmentSizes = array<i32: 1, 1>} : (tensor<2x4x8x8xf32>, tensor<2x4x8x8xi1>) -> (tensor<2x4x8x8xf32>, tensor<2x4x8xf32>)
// CHECK:       %[[O:.+]] = "attn.aggregate"(%[[N]]#0, %[[V]]) : (tensor<2x4x8x8xf32>, tensor<2x2x8x32xf32>) -> tensor<2x4x8x32xf32>
// CHECK:       "func.return"(%[[O]], %[[N]]#1) : (tensor<2x4x8x32xf32>, tensor<2x4x8xf32>) -> ()

func.func @gated_linear(%q: tensor<1x2x64x16xf32>, %k: tensor<1x2x64x16xf32>, %v: tensor<1x2x64x8xf32>, %g: tensor<1x2x64xf32>, %qscale: tensor<16xf32>) -> (tensor<1x2x64x8xf32>, tensor<1x2x16x8xf32>) {
  %o, %st = "attn.linear_recurrence"(%q, %k, %v, %g) ({
  ^bb0(%x: f32, %b: index, %h: index, %t: index, %d: index):
    %w = tensor.extract %qscale[%d] : tensor<16xf32>
    %y = arith.mulf %x, %w : f32
    "gpu.yield"(%y) : (f32) -> ()
  }, {}, {}) {decay = "token", scale = 0.25 : f32, normalize = false, chunk_size = 64 : i64, operandSegmentSizes = array<i32: 1, 1, 1, 1, 0, 0>} : (tensor<1x2x64x16xf32>, tensor<1x2x64x16xf32>, tensor<1x2x64x8xf32>, tensor<1x2x64xf32>) -> (tensor<1x2x64x8xf32>, tensor<1x2x16x8xf32>)
  return %o, %st : tensor<1x2x64x8xf32>, tensor<1x2x16x8xf32>
}

// CHECK-LABEL: sym_name = "gated_linear"
// CHECK:       ^bb0(%[[LQ:.+]]: tensor<1x2x64x16xf32>, %[[LK:.+]]: tensor<1x2x64x16xf32>, %[[LV:.+]]: tensor<1x2x64x8xf32>, %[[G:.+]]: tensor<1x2x64xf32>, %[[QS:.+]]: tensor<16xf32>):
// CHECK:       %[[R:.+]]:2 = "attn.linear_recurrence"(%[[LQ]], %[[LK]], %[[LV]], %[[G]]) ({
// CHECK-NEXT:  ^bb0(%[[LX:.+]]: f32, %{{.+}}: index, %{{.+}}: index, %{{.+}}: index, %[[D:.+]]: index):
// CHECK-NEXT:    %[[W:.+]] = "tensor.extract"(%[[QS]], %[[D]]) : (tensor<16xf32>, index) -> f32
// CHECK-NEXT:    %[[LY:.+]] = "arith.mulf"(%[[LX]], %[[W]])
// CHECK-NEXT:    "gpu.yield"(%[[LY]]) : (f32) -> ()
// CHECK-NEXT:  }, {
// CHECK-NEXT:  }, {
// CHECK-NEXT:  })
// CHECK-SAME:  chunk_size = 64 : i64, decay = "token", normalize = false, operandSegmentSizes = array<i32: 1, 1, 1, 1, 0, 0>, scale = 2.500000e-01 : f32
// CHECK-SAME:  -> (tensor<1x2x64x8xf32>, tensor<1x2x16x8xf32>)
// CHECK:       "func.return"(%[[R]]#0, %[[R]]#1) : (tensor<1x2x64x8xf32>, tensor<1x2x16x8xf32>) -> ()

// float64 q/k/v, g, initial state and output (the reference executor's gradcheck oracle); the
// mod regions and the final state stay f32.
func.func @linear_f64(%q: tensor<1x2x8x4xf64>, %k: tensor<1x2x8x4xf64>, %v: tensor<1x2x8x3xf64>, %g: tensor<2xf64>, %s0: tensor<1x2x4x3xf64>) -> (tensor<1x2x8x3xf64>, tensor<1x2x4x3xf32>) {
  %o, %st = "attn.linear_recurrence"(%q, %k, %v, %g, %s0) ({
  ^bb0(%x: f32, %b: index, %h: index, %t: index, %d: index):
    %y = math.exp %x : f32
    "gpu.yield"(%y) : (f32) -> ()
  }, {}, {}) {decay = "head", scale = 0.5 : f32, normalize = true, chunk_size = 16 : i64, operandSegmentSizes = array<i32: 1, 1, 1, 1, 1, 0>} : (tensor<1x2x8x4xf64>, tensor<1x2x8x4xf64>, tensor<1x2x8x3xf64>, tensor<2xf64>, tensor<1x2x4x3xf64>) -> (tensor<1x2x8x3xf64>, tensor<1x2x4x3xf32>)
  return %o, %st : tensor<1x2x8x3xf64>, tensor<1x2x4x3xf32>
}

// CHECK-LABEL: sym_name = "linear_f64"
// CHECK:       ^bb0(%[[FQ:.+]]: tensor<1x2x8x4xf64>, %[[FK:.+]]: tensor<1x2x8x4xf64>, %[[FV:.+]]: tensor<1x2x8x3xf64>, %[[FG:.+]]: tensor<2xf64>, %[[FS:.+]]: tensor<1x2x4x3xf64>):
// CHECK:       %[[F:.+]]:2 = "attn.linear_recurrence"(%[[FQ]], %[[FK]], %[[FV]], %[[FG]], %[[FS]]) ({
// CHECK-NEXT:  ^bb0(%[[FX:.+]]: f32, %{{.+}}: index, %{{.+}}: index, %{{.+}}: index, %{{.+}}: index):
// CHECK-NEXT:    %[[FY:.+]] = "math.exp"(%[[FX]])
// CHECK-NEXT:    "gpu.yield"(%[[FY]]) : (f32) -> ()
// CHECK:       chunk_size = 16 : i64, decay = "head", normalize = true, operandSegmentSizes = array<i32: 1, 1, 1, 1, 1, 0>, scale = 5.000000e-01 : f32
// CHECK-SAME:  : (tensor<1x2x8x4xf64>, tensor<1x2x8x4xf64>, tensor<1x2x8x3xf64>, tensor<2xf64>, tensor<1x2x4x3xf64>) -> (tensor<1x2x8x3xf64>, tensor<1x2x4x3xf32>)
// CHECK:       "func.return"(%[[F]]#0, %[[F]]#1) : (tensor<1x2x8x3xf64>, tensor<1x2x4x3xf32>) -> ()
