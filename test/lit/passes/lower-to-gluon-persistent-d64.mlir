// attn-lower-to-gluon{programs=8} at head dim 64: a persistent grid of at most 8 programs, each
// taking query blocks (of 192 rows: three consumer warpgroups of 64) a grid's width apart, so
// the stub's grid is 8 where a program per block would be 2 * 2 * 3 = 12; the kernel fits 128
// registers a thread (16 warps: three consumer warpgroups and the loader's, padded); each
// partition loops over its blocks (scf.for), the loader waiting for Q's release before copying
// the next block's rows.
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-lower-to-gluon{programs=8})' | FileCheck %s
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-lower-to-gluon{programs=8})' --emit=ttir | FileCheck %s --check-prefix=TTGIR
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-lower-to-gluon{programs=64})' | FileCheck %s --check-prefix=FEWER
// With warpgroups=2 a program holds two consumer warpgroups (128 rows, 168 registers, 12 warps):
// 2 * 2 * 4 blocks, and the kernel's partitions are the two consumers' and the loader's.
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-lower-to-gluon{warpgroups=2})' | FileCheck %s --check-prefix=TWO
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-lower-to-gluon{warpgroups=2})' --emit=ttir | FileCheck %s --check-prefix=TWO-TTGIR

// CHECK: "tt.func"()
// CHECK: attn.block_m = 192 : i64, attn.block_n = 128 : i64, attn.grid = array<i64: 8, 1, 1>
// CHECK-SAME: attn.max_registers = 128 : i64
// CHECK-SAME: sym_name = "causal_d64"
// FEWER: attn.grid = array<i64: 12, 1, 1>
// TWO: attn.block_m = 128 : i64, attn.block_n = 128 : i64, attn.grid = array<i64: 16, 1, 1>
// TWO-SAME: attn.max_registers = 168 : i64
// TWO-TTGIR: "ttg.num-warps" = 4
// TWO-TTGIR: ttg.warp_specialize
// TWO-TTGIR: partition0(
// TWO-TTGIR-SAME: num_warps(4)
// TWO-TTGIR: partition1(
// TWO-TTGIR-SAME: num_warps(1)
// TWO-TTGIR-NOT: partition2(
// TTGIR: tt.func public @attention_forward(%q_desc: !tt.tensordesc<tensor<1x1x64x64xbf16, #shared>>
// TTGIR: ttg.warp_specialize
// TTGIR: default {
// TTGIR: scf.for
// TTGIR: ttng.warp_group_dot
// TTGIR: partition0(
// TTGIR-SAME: num_warps(4)
// TTGIR: partition1(
// TTGIR-SAME: num_warps(4)
// TTGIR: partition2(
// TTGIR-SAME: num_warps(1)
// TTGIR: scf.for
// TTGIR: ttng.wait_barrier
// TTGIR: ttng.async_tma_copy_global_to_local
func.func @causal_d64(%q: tensor<2x2x500x64xbf16>, %k: tensor<2x2x500x64xbf16>, %v: tensor<2x2x500x64xbf16>) -> (tensor<2x2x500x64xbf16>, tensor<2x2x500xf32>) {
  %s = "attn.score"(%q, %k) {scale = 0.125 : f32} : (tensor<2x2x500x64xbf16>, tensor<2x2x500x64xbf16>) -> tensor<2x2x500x500xf32>
  %m = "attn.mask"() ({
  ^bb0(%b: index, %h: index, %i: index, %j: index):
    %c = arith.cmpi sge, %i, %j : index
    "gpu.yield"(%c) : (i1) -> ()
  }) : () -> tensor<2x2x500x500xi1>
  %p, %lse = "attn.normalize"(%s, %m) ({}, {}, {}) {kind = "softmax", operandSegmentSizes = array<i32: 1, 1>, resultSegmentSizes = array<i32: 1, 1>} : (tensor<2x2x500x500xf32>, tensor<2x2x500x500xi1>) -> (tensor<2x2x500x500xf32>, tensor<2x2x500xf32>)
  %o = "attn.aggregate"(%p, %v) : (tensor<2x2x500x500xf32>, tensor<2x2x500x64xbf16>) -> tensor<2x2x500x64xbf16>
  return %o, %lse : tensor<2x2x500x64xbf16>, tensor<2x2x500xf32>
}
