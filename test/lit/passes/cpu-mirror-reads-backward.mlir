// With mirror-reads (the cpu preset's default), a closure read that steps back along a tile's
// vectorized axis is read forwards from the table's mirrored copy (passes/mirror_reads.py), an
// input the runtime makes: the composed relative bias table[h, kv_idx - q_idx + 63] steps back
// along the dK/dV kernel's rows of queries (the dQ kernel's rows of keys read it ascending).
// attn-cpu-vectorize then loads 64 scores' table entries contiguously; without the copy they are
// a 64-lane gather, which the LLVM conversion writes as one scalar load per lane.
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-verify,attn-differentiate,attn-tile-backward{block-m=64 block-n=64 mirror-reads=true},attn-fold-index-clamps,attn-cpu-lower-scatter,attn-cpu-grid-loops,canonicalize,cse,attn-cpu-widen-matmul-operands,attn-cpu-split-empty-tensors,attn-cpu-vectorize)' --no-mlir-print-op-generic 2>&1 | FileCheck %s --check-prefix=BACKWARD --implicit-check-not=vector.gather
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-verify,attn-differentiate,attn-tile-backward{block-m=64 block-n=64 mirror-reads=false},attn-fold-index-clamps,attn-cpu-lower-scatter,attn-cpu-grid-loops,canonicalize,cse,attn-cpu-widen-matmul-operands,attn-cpu-split-empty-tensors,attn-cpu-vectorize)' --no-mlir-print-op-generic 2>&1 | FileCheck %s --check-prefix=GATHERED

// BACKWARD-LABEL: func.func @attention_bwd_dq(
// BACKWARD-LABEL: func.func @attention_bwd_dkdv(
// BACKWARD-SAME: %[[TABLE:arg3]]: tensor<2x127xf32>
// BACKWARD-SAME: %[[MIRRORED:arg7]]: tensor<2x127xf32>
// BACKWARD-SAME: attn.arg_roles = [{{.*}}"c0_mirrored"
// BACKWARD: vector.transfer_read %[[MIRRORED]][%{{.*}}, %{{.*}}], %{{.*}} {in_bounds = [true, true]} : tensor<2x127xf32>, vector<1x64xf32>
// GATHERED-LABEL: func.func @attention_bwd_dkdv(
// GATHERED: vector.gather %arg3

module {
  func.func @attention(%q: tensor<1x2x64x16xf32>, %k: tensor<1x2x64x16xf32>, %v: tensor<1x2x64x16xf32>, %c0: tensor<2x127xf32>) -> (tensor<1x2x64x16xf32>, tensor<1x2x64xf32>) {
    %scores = "attn.score"(%q, %k) {scale = 0.25 : f32} : (tensor<1x2x64x16xf32>, tensor<1x2x64x16xf32>) -> tensor<1x2x64x64xf32>
    %modded = "attn.score_mod"(%scores) ({
    ^bb0(%s: f32, %b: index, %h: index, %q_idx: index, %kv_idx: index):
      %s1 = arith.subi %kv_idx, %q_idx : index
      %s2 = arith.constant 63 : index
      %s3 = arith.addi %s1, %s2 : index
      %s4 = arith.constant 0 : index
      %s5 = arith.maxsi %h, %s4 : index
      %s6 = arith.constant 1 : index
      %s7 = arith.minsi %s5, %s6 : index
      %s8 = arith.constant 0 : index
      %s9 = arith.maxsi %s3, %s8 : index
      %s10 = arith.constant 126 : index
      %s11 = arith.minsi %s9, %s10 : index
      %s12 = tensor.extract %c0[%s7, %s11] : tensor<2x127xf32>
      %s13 = arith.addf %s, %s12 : f32
      "gpu.yield"(%s13) : (f32) -> ()
    }) : (tensor<1x2x64x64xf32>) -> tensor<1x2x64x64xf32>
    %probs, %lse = "attn.normalize"(%modded) ({}, {}, {}) {kind = "softmax", operandSegmentSizes = array<i32: 1, 0>, resultSegmentSizes = array<i32: 1, 1>} : (tensor<1x2x64x64xf32>) -> (tensor<1x2x64x64xf32>, tensor<1x2x64xf32>)
    %out = "attn.aggregate"(%probs, %v) : (tensor<1x2x64x64xf32>, tensor<1x2x64x16xf32>) -> tensor<1x2x64x16xf32>
    return %out, %lse : tensor<1x2x64x16xf32>, tensor<1x2x64xf32>
  }
}
