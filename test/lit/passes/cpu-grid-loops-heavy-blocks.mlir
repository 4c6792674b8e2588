// attn-cpu-grid-loops decodes each program's ids from its flat id, the last axis (the block)
// fastest. Where the tiling marked the last blocks the heaviest (attn.heavy_blocks = "last", a
// causal mask's query blocks), the block is counted from the last, so that the threads, which
// claim ranges of programs in order, run the long programs first and the short ones last; the
// attribute goes with attn.grid. "first" (the backward's dK/dV blocks) keeps the order.
// RUN: ae-opt %s --split-input-file --pass-pipeline='builtin.module(attn-cpu-grid-loops,canonicalize,cse)' --no-mlir-print-op-generic | FileCheck %s

// CHECK-LABEL: func.func @heavy_last
// CHECK-SAME: attributes {llvm.emit_c_interface} {
// CHECK: scf.for %[[P:.*]] = %{{.*}} to %{{.*}} step %c1
// CHECK-NEXT: %[[ID:.*]] = arith.remui %[[P]], %c4
// CHECK: %[[M:.*]] = arith.subi %c3, %[[ID]]
// CHECK: arith.muli %[[M]], %c8
func.func @heavy_last(%q: tensor<1x2x32x16xf32>, %out: tensor<1x2x32x16xf32>) -> tensor<1x2x32x16xf32>
    attributes {attn.grid = array<i64: 1, 2, 4>, attn.heavy_blocks = "last"} {
  %b = "attn.program_id"() {axis = 0 : i64} : () -> index
  %h = "attn.program_id"() {axis = 1 : i64} : () -> index
  %m = "attn.program_id"() {axis = 2 : i64} : () -> index
  %c8 = arith.constant 8 : index
  %m0 = arith.muli %m, %c8 : index
  %tile = tensor.extract_slice %q[%b, %h, %m0, 0] [1, 1, 8, 16] [1, 1, 1, 1] : tensor<1x2x32x16xf32> to tensor<8x16xf32>
  %r = tensor.insert_slice %tile into %out[%b, %h, %m0, 0] [1, 1, 8, 16] [1, 1, 1, 1] : tensor<8x16xf32> into tensor<1x2x32x16xf32>
  return %r : tensor<1x2x32x16xf32>
}

// -----

// CHECK-LABEL: func.func @heavy_first
// CHECK-SAME: attributes {llvm.emit_c_interface} {
// CHECK: scf.for %[[P:.*]] = %{{.*}} to %{{.*}} step %c1
// CHECK-NEXT: %[[M:.*]] = arith.remui %[[P]], %c4
// CHECK-NOT: arith.subi
// CHECK: arith.muli %[[M]], %c8
func.func @heavy_first(%q: tensor<1x2x32x16xf32>, %out: tensor<1x2x32x16xf32>) -> tensor<1x2x32x16xf32>
    attributes {attn.grid = array<i64: 1, 2, 4>, attn.heavy_blocks = "first"} {
  %b = "attn.program_id"() {axis = 0 : i64} : () -> index
  %h = "attn.program_id"() {axis = 1 : i64} : () -> index
  %m = "attn.program_id"() {axis = 2 : i64} : () -> index
  %c8 = arith.constant 8 : index
  %m0 = arith.muli %m, %c8 : index
  %tile = tensor.extract_slice %q[%b, %h, %m0, 0] [1, 1, 8, 16] [1, 1, 1, 1] : tensor<1x2x32x16xf32> to tensor<8x16xf32>
  %r = tensor.insert_slice %tile into %out[%b, %h, %m0, 0] [1, 1, 8, 16] [1, 1, 1, 1] : tensor<8x16xf32> into tensor<1x2x32x16xf32>
  return %r : tensor<1x2x32x16xf32>
}
