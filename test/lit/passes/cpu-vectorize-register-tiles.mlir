// attn-cpu-vectorize sizes a matmul's register tile by vector-bits: 4x64 f32 accumulators at 512
// bits (16 of the 32 zmm registers, one broadcast per four multiply-adds), 2x32 at 256 (8 of the 16 ymm registers: 8x32 spilled most
// of its 32 accumulators to the stack on every reduction step on AVX2) and 2x16 at 128.
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-cpu-grid-loops,canonicalize,cse,attn-cpu-vectorize{vector-bits=512})' --no-mlir-print-op-generic | FileCheck %s --check-prefix=ZMM
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-cpu-grid-loops,canonicalize,cse,attn-cpu-vectorize{vector-bits=256})' --no-mlir-print-op-generic | FileCheck %s --check-prefix=YMM
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-cpu-grid-loops,canonicalize,cse,attn-cpu-vectorize{vector-bits=128})' --no-mlir-print-op-generic | FileCheck %s --check-prefix=XMM
// RUN: not ae-opt %s --pass-pipeline='builtin.module(attn-cpu-vectorize{vector-bits=384})' 2>&1 | FileCheck %s --check-prefix=BAD

// ZMM-LABEL: func.func @scores(
// ZMM: scf.for {{.*}} step %c4
// ZMM: scf.for {{.*}} step %c64
// ZMM: vector.contract {{.*}} : vector<4x1xf32>, vector<1x64xf32> into vector<4x64xf32>

// YMM-LABEL: func.func @scores(
// YMM: scf.for {{.*}} step %c2
// YMM: scf.for {{.*}} step %c32
// YMM: vector.contract {{.*}} : vector<2x1xf32>, vector<1x32xf32> into vector<2x32xf32>

// XMM-LABEL: func.func @scores(
// XMM: scf.for {{.*}} step %c2
// XMM: scf.for {{.*}} step %c16
// XMM: vector.contract {{.*}} : vector<2x1xf32>, vector<1x16xf32> into vector<2x16xf32>

// BAD: vector-bits must be one of 128, 256, 512, got 384
func.func @scores(%q: tensor<64x64xf32>, %k: tensor<64x64xf32>, %out: tensor<64x64xf32>) -> tensor<64x64xf32> attributes {attn.grid = array<i64: 1>} {
  %zero = arith.constant 0.0 : f32
  %init = linalg.fill ins(%zero : f32) outs(%out : tensor<64x64xf32>) -> tensor<64x64xf32>
  %s = linalg.matmul ins(%q, %k : tensor<64x64xf32>, tensor<64x64xf32>) outs(%init : tensor<64x64xf32>) -> tensor<64x64xf32>
  return %s : tensor<64x64xf32>
}
