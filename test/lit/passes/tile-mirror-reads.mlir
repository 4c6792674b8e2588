// attn-tile{mirror-reads}: the forward kernel's tiles run over keys along their last axis, so of
// the two tables (each read clamped into [0, 62] as the frontend clamps every closure index) c0
// at kv - q + 31 ascends and stays as written, while c1 at q - kv + 31 steps back and is read from
// its mirrored copy, one more input after the others (role c1_mirrored; the runtime reverses c1
// along its last dimension), at 62 - (q - kv + 31) = kv - q + 31. The kernel then names its
// arguments' roles. Without the option it reads c1 as written and keeps the softmax layout.
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-fuse-online-softmax,attn-tile{block-m=16 block-n=16 mirror-reads=true},attn-fold-index-clamps,canonicalize,cse)' --no-mlir-print-op-generic | FileCheck %s --check-prefix=MIRROR
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-fuse-online-softmax,attn-tile{block-m=16 block-n=16},attn-fold-index-clamps,canonicalize,cse)' --no-mlir-print-op-generic | FileCheck %s --check-prefix=PLAIN

// MIRROR-LABEL: func.func @attention(
// MIRROR-SAME: %[[C0:arg3]]: tensor<2x63xf32>, %arg4: tensor<2x63xf32>, %[[C1M:arg5]]: tensor<2x63xf32>
// MIRROR-SAME: attn.arg_roles = ["q", "k", "v", "c0", "c1", "c1_mirrored", "out", "lse"]
// MIRROR: %[[ROW:.*]] = linalg.index 0 : index
// MIRROR: %[[COL:.*]] = linalg.index 1 : index
// MIRROR: %[[Q:.*]] = arith.addi %{{.*}}, %[[ROW]] : index
// MIRROR: %[[KV:.*]] = arith.addi %{{.*}}, %[[COL]] : index
// MIRROR: %[[D:.*]] = arith.subi %[[KV]], %[[Q]] : index
// MIRROR: %[[X:.*]] = arith.addi %[[D]], %c31 : index
// MIRROR: tensor.extract %[[C0]][%{{.*}}, %[[X]]] : tensor<2x63xf32>
// MIRROR: tensor.extract %[[C1M]][%{{.*}}, %[[X]]] : tensor<2x63xf32>

// PLAIN-LABEL: func.func @attention(
// PLAIN-SAME: %arg3: tensor<2x63xf32>, %[[C1:arg4]]: tensor<2x63xf32>, %arg5: tensor<1x2x32x16xf32>
// PLAIN-NOT: attn.arg_roles
// PLAIN: %[[ROW:.*]] = linalg.index 0 : index
// PLAIN: %[[COL:.*]] = linalg.index 1 : index
// PLAIN: %[[Q:.*]] = arith.addi %{{.*}}, %[[ROW]] : index
// PLAIN: %[[KV:.*]] = arith.addi %{{.*}}, %[[COL]] : index
// PLAIN: %[[E:.*]] = arith.subi %[[Q]], %[[KV]] : index
// PLAIN: %[[Y:.*]] = arith.addi %[[E]], %c31 : index
// PLAIN: tensor.extract %[[C1]][%{{.*}}, %[[Y]]] : tensor<2x63xf32>

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
