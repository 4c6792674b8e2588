// attn-tile-backward{mirror-reads}: a closure read whose last index steps back along a kernel's
// tiles' rows is read from a mirrored copy of the tensor (one more input, c<i>_mirrored, that the
// runtime reverses along the last dimension) at n - 1 - x, which ascends. Two tables, each read
// clamped into [0, 62] as the frontend clamps every closure index: c0 at kv - q + 31 (the
// composed relative-position form) descends along the dK/dV kernel's rows of queries, so that
// kernel reads c0_mirrored at 62 - (kv - q + 31) = q - kv + 31; c1 at q - kv + 31 descends along
// the dQ kernel's rows of keys, so that kernel reads c1_mirrored at kv - q + 31. Each kernel keeps
// the read that ascends along its rows as written; without the option neither kernel changes.
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-differentiate,attn-tile-backward{block-m=16 block-n=16 mirror-reads=true closure-grads=false},attn-fold-index-clamps,canonicalize,cse)' --no-mlir-print-op-generic | FileCheck %s --check-prefix=MIRROR
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-differentiate,attn-tile-backward{block-m=16 block-n=16 closure-grads=false},attn-fold-index-clamps,canonicalize,cse)' --no-mlir-print-op-generic | FileCheck %s --check-prefix=PLAIN

// MIRROR-LABEL: func.func @attention_bwd_dq(
// MIRROR-SAME: %[[C0:arg3]]: tensor<2x63xf32>, %arg4: tensor<2x63xf32>
// MIRROR-SAME: %[[C1M:arg9]]: tensor<2x63xf32>
// MIRROR-SAME: attn.arg_roles = ["q", "k", "v", "c0", "c1", "out", "do", "lse", "dlse", "c1_mirrored", "dq", "delta"]
// MIRROR: %[[ROW:.*]] = linalg.index 0 : index
// MIRROR: %[[COL:.*]] = linalg.index 1 : index
// MIRROR: %[[Q:.*]] = arith.addi %{{.*}}, %[[ROW]] : index
// MIRROR: %[[KV:.*]] = arith.addi %{{.*}}, %[[COL]] : index
// MIRROR: %[[D:.*]] = arith.subi %[[KV]], %[[Q]] : index
// MIRROR: %[[X:.*]] = arith.addi %[[D]], %c31 : index
// MIRROR: tensor.extract %[[C0]][%{{.*}}, %[[X]]] : tensor<2x63xf32>
// MIRROR: tensor.extract %[[C1M]][%{{.*}}, %[[X]]] : tensor<2x63xf32>
// MIRROR-LABEL: func.func @attention_bwd_dkdv(
// MIRROR-SAME: %arg3: tensor<2x63xf32>, %[[C1:arg4]]: tensor<2x63xf32>
// MIRROR-SAME: %[[C0M:arg8]]: tensor<2x63xf32>
// MIRROR-SAME: attn.arg_roles = ["q", "k", "v", "c0", "c1", "do", "lse", "delta", "c0_mirrored", "dk", "dv"]
// MIRROR: %[[COL:.*]] = linalg.index 1 : index
// MIRROR: %[[ROW:.*]] = linalg.index 0 : index
// MIRROR: %[[Q:.*]] = arith.addi %{{.*}}, %[[COL]] : index
// MIRROR: %[[KV:.*]] = arith.addi %{{.*}}, %[[ROW]] : index
// MIRROR: %[[D:.*]] = arith.subi %[[Q]], %[[KV]] : index
// MIRROR: %[[X:.*]] = arith.addi %[[D]], %c31 : index
// MIRROR: tensor.extract %[[C0M]][%{{.*}}, %[[X]]] : tensor<2x63xf32>
// MIRROR: tensor.extract %[[C1]][%{{.*}}, %[[X]]] : tensor<2x63xf32>

// PLAIN-LABEL: func.func @attention_bwd_dq(
// PLAIN-SAME: attn.arg_roles = ["q", "k", "v", "c0", "c1", "out", "do", "lse", "dlse", "dq", "delta"]
// PLAIN-LABEL: func.func @attention_bwd_dkdv(
// PLAIN-SAME: %[[C0:arg3]]: tensor<2x63xf32>
// PLAIN-SAME: attn.arg_roles = ["q", "k", "v", "c0", "c1", "do", "lse", "delta", "dk", "dv"]
// PLAIN: %[[COL:.*]] = linalg.index 1 : index
// PLAIN: %[[ROW:.*]] = linalg.index 0 : index
// PLAIN: %[[Q:.*]] = arith.addi %{{.*}}, %[[COL]] : index
// PLAIN: %[[KV:.*]] = arith.addi %{{.*}}, %[[ROW]] : index
// PLAIN: %[[D:.*]] = arith.subi %[[KV]], %[[Q]] : index
// PLAIN: %[[X:.*]] = arith.addi %[[D]], %c31 : index
// PLAIN: tensor.extract %[[C0]][%{{.*}}, %[[X]]] : tensor<2x63xf32>

module {
  func.func @attention(%q: tensor<1x2x32x16xf32>, %k: tensor<1x2x32x16xf32>, %v: tensor<1x2x32x16xf32>, %c0: tensor<2x63xf32>, %c1: tensor<2x63xf32>) -> (tensor<1x2x32x16xf32>, tensor<1x2x32xf32>) {
    %scores = "attn.score"(%q, %k) {scale = 0.25 : f32} : (tensor<1x2x32x16xf32>, tensor<1x2x32x16xf32>) -> tensor<1x2x32x32xf32>
    %modded = "attn.score_mod"(%scores) ({
    ^bb0(%s: f32, %b: index, %h: index, %q_idx: index, %kv_idx: index):
      %d = arith.subi %kv_idx, %q_idx : index
      %c31 = arith.constant 31 : index
      %i = arith.addi %d, %c31 : index
      %c0i = arith.constant 0 : index
      %lo = arith.maxsi %i, %c0i : index
      %c62 = arith.constant 62 : index
      %x = arith.minsi %lo, %c62 : index
      %bias = tensor.extract %c0[%h, %x] : tensor<2x63xf32>
      %e = arith.subi %q_idx, %kv_idx : index
      %j = arith.addi %e, %c31 : index
      %lo2 = arith.maxsi %j, %c0i : index
      %y = arith.minsi %lo2, %c62 : index
      %bias2 = tensor.extract %c1[%h, %y] : tensor<2x63xf32>
      %r = arith.addf %s, %bias : f32
      %r2 = arith.addf %r, %bias2 : f32
      "gpu.yield"(%r2) : (f32) -> ()
    }) : (tensor<1x2x32x32xf32>) -> tensor<1x2x32x32xf32>
    %probs, %lse = "attn.normalize"(%modded) ({}, {}, {}) {kind = "softmax", operandSegmentSizes = array<i32: 1, 0>, resultSegmentSizes = array<i32: 1, 1>} : (tensor<1x2x32x32xf32>) -> (tensor<1x2x32x32xf32>, tensor<1x2x32xf32>)
    %out = "attn.aggregate"(%probs, %v) : (tensor<1x2x32x32xf32>, tensor<1x2x32x16xf32>) -> tensor<1x2x32x16xf32>
    return %out, %lse : tensor<1x2x32x16xf32>, tensor<1x2x32xf32>
  }
}
