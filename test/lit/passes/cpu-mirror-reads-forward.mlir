// The table read as written, table[h, q_idx - kv_idx + 63] (`attn.mlir(..., compose=False)`; a
// read at a query's position in a cache, q_idx + offset[b] - kv_idx, alike), steps back along the
// forward's rows of keys: the forward reads it from the mirrored copy
// (cpu-mirror-reads-backward.mlir) and loads it contiguously, not as a 64-lane gather.
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-verify,attn-fuse-online-softmax,attn-tile{block-m=64 block-n=64 mirror-reads=true},attn-fold-index-clamps,attn-cpu-lower-scatter,attn-cpu-grid-loops,canonicalize,cse,attn-cpu-widen-matmul-operands,attn-cpu-split-empty-tensors,attn-cpu-vectorize)' --no-mlir-print-op-generic 2>&1 | FileCheck %s --implicit-check-not=vector.gather
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-verify,attn-fuse-online-softmax,attn-tile{block-m=64 block-n=64 mirror-reads=false},attn-fold-index-clamps,attn-cpu-lower-scatter,attn-cpu-grid-loops,canonicalize,cse,attn-cpu-widen-matmul-operands,attn-cpu-split-empty-tensors,attn-cpu-vectorize)' --no-mlir-print-op-generic 2>&1 | FileCheck %s --check-prefix=GATHERED

// CHECK-LABEL: func.func @attention(
// CHECK-SAME: %[[MIRRORED:arg4]]: tensor<2x127xf32>
// CHECK-SAME: attn.arg_roles = ["q", "k", "v", "c0", "c0_mirrored", "out", "lse"]
// CHECK: vector.transfer_read %[[MIRRORED]][%{{.*}}, %{{.*}}], %{{.*}} {in_bounds = [true, true]} : tensor<2x127xf32>, vector<1x64xf32>
// GATHERED: vector.gather %arg3

module {
  func.func @attention(%q: tensor<1x2x64x16xf32>, %k: tensor<1x2x64x16xf32>, %v: tensor<1x2x64x16xf32>, %c0: tensor<2x127xf32>) -> (tensor<1x2x64x16xf32>, tensor<1x2x64xf32>) {
    %scores = "attn.score"(%q, %k) {scale = 0.25 : f32} : (tensor<1x2x64x16xf32>, tensor<1x2x64x16xf32>) -> tensor<1x2x64x64xf32>
    %modded = "attn.score_mod"(%scores) ({
    ^bb0(%s: f32, %b: index, %h: index, %q_idx: index, %kv_idx: index):
      %s1 = arith.subi %q_idx, %kv_idx : index
      %s2 = arith.constant 64 : index
      %s3 = arith.addi %s1, %s2 : index
      %s4 = arith.constant 1 : index
      %s5 = arith.subi %s3, %s4 : index
      %s6 = arith.constant 0 : index
      %s7 = arith.maxsi %h, %s6 : index
      %s8 = arith.constant 1 : index
      %s9 = arith.minsi %s7, %s8 : index
      %s10 = arith.constant 0 : index
      %s11 = arith.maxsi %s5, %s10 : index
      %s12 = arith.constant 126 : index
      %s13 = arith.minsi %s11, %s12 : index
      %s14 = tensor.extract %c0[%s9, %s13] : tensor<2x127xf32>
      %s15 = arith.addf %s, %s14 : f32
      "gpu.yield"(%s15) : (f32) -> ()
    }) : (tensor<1x2x64x64xf32>) -> tensor<1x2x64x64xf32>
    %probs, %lse = "attn.normalize"(%modded) ({}, {}, {}) {kind = "softmax", operandSegmentSizes = array<i32: 1, 0>, resultSegmentSizes = array<i32: 1, 1>} : (tensor<1x2x64x64xf32>) -> (tensor<1x2x64x64xf32>, tensor<1x2x64xf32>)
    %out = "attn.aggregate"(%probs, %v) : (tensor<1x2x64x64xf32>, tensor<1x2x64x16xf32>) -> tensor<1x2x64x16xf32>
    return %out, %lse : tensor<1x2x64x16xf32>, tensor<1x2x64xf32>
  }
}
