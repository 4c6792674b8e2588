// Staging buffers of partial tiles are read as whole vector rows; a 16-float row needs 64-byte
// alignment (an AVX-512 aligned move), more than the 32 upstream gives them, or the kernel faults
// depending on where the stack happens to sit (attn-cpu-legalize-for-llvm aligns them).
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-fuse-online-softmax,attn-tile{block-m=32 block-n=64},attn-cpu-grid-loops,canonicalize,cse,attn-cpu-split-empty-tensors,attn-cpu-vectorize,attn-cpu-carry-state-in-place,attn-cpu-bufferize,attn-cpu-pin-unit-inner-stride,canonicalize,cse,attn-cpu-lower-vectors,func.func(buffer-loop-hoisting),buffer-deallocation-pipeline,convert-bufferization-to-memref,convert-linalg-to-loops,convert-vector-to-scf,canonicalize,cse,attn-cpu-legalize-for-llvm)' --no-mlir-print-op-generic | FileCheck %s

// CHECK: %[[ROW:.*]] = memref.alloca() {alignment = 64 : i64} : memref<1x16xf32>
// CHECK: vector.type_cast %[[ROW]] : memref<1x16xf32> to memref<vector<1x16xf32>>
func.func @attention(%q: tensor<1x1x20x16xf32>, %k: tensor<1x1x40x16xf32>, %v: tensor<1x1x40x16xf32>) -> (tensor<1x1x20x16xf32>) {
  %scores = "attn.score"(%q, %k) {scale = 0.25 : f32} : (tensor<1x1x20x16xf32>, tensor<1x1x40x16xf32>) -> tensor<1x1x20x40xf32>
  %probs = "attn.normalize"(%scores) ({}, {}, {}) {kind = "relu", operandSegmentSizes = array<i32: 1, 0>, resultSegmentSizes = array<i32: 1, 0>} : (tensor<1x1x20x40xf32>) -> (tensor<1x1x20x40xf32>)
  %out = "attn.aggregate"(%probs, %v) : (tensor<1x1x20x40xf32>, tensor<1x1x40x16xf32>) -> tensor<1x1x20x16xf32>
  return %out : tensor<1x1x20x16xf32>
}
