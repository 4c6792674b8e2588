// attn-lower-to-gluon{backward=true}: the backward of causal softmax (bf16, D 128, two query heads
// per KV head) becomes two stub tt.funcs in launch order: the dQ kernel (a 1-D grid of programs of
// 128 query rows of each batch entry and head, 3 x 4; it writes delta for the next) and the dK/dV
// kernel (128 key rows of each batch entry and KV head, 3 x 2, the GQA group summed inside). Each
// takes the q, k, v and do host descriptors with their sizes and strides, then its pointers;
// --emit=ttir prints their Triton GPU IR: two consumer warpgroups issuing wgmma products and one
// loader warp issuing TMA copies.
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-lower-to-gluon{backward=true})' | FileCheck %s
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-lower-to-gluon{backward=true})' --emit=ttir | FileCheck %s --check-prefix=TTGIR

// CHECK: "tt.func"()
// CHECK: attn.block_m = 128 : i64, attn.block_n = 64 : i64, attn.grid = array<i64: 12, 1, 1>
// CHECK-SAME: attn.kernel_args = ["q.tma", "q.tma.size0"
// CHECK-SAME: "do.tma", "do.tma.size0", "do.tma.size1", "do.tma.size2", "do.tma.size3", "do.tma.stride0", "do.tma.stride1", "do.tma.stride2", "do.tma.stride3", "out", "out.stride0", "out.stride1", "out.stride2", "lse", "lse.stride0", "lse.stride1", "dlse", "dlse.stride0", "dlse.stride1", "dq", "dq.stride0", "dq.stride1", "dq.stride2", "delta", "delta.stride0", "delta.stride1"]
// CHECK-SAME: attn.max_registers = 168 : i64
// CHECK-SAME: sym_name = "causal_bwd_dq"
// CHECK: "tt.func"()
// CHECK: attn.block_m = 64 : i64, attn.block_n = 128 : i64, attn.grid = array<i64: 6, 1, 1>
// CHECK-SAME: "do.tma.stride3", "lse", "lse.stride0", "lse.stride1", "delta", "delta.stride0", "delta.stride1", "dk", "dk.stride0", "dk.stride1", "dk.stride2", "dv", "dv.stride0", "dv.stride1", "dv.stride2"]
// CHECK-SAME: sym_name = "causal_bwd_dkdv"
// CHECK-NOT: func.func
// TTGIR: tt.func public @attention_backward_dq(%q_desc: !tt.tensordesc<tensor<1x1x64x128xbf16, #shared>>
// TTGIR: ttg.warp_specialize
// TTGIR: default {
// TTGIR-DAG: ttng.warp_group_dot
// TTGIR-DAG: math.exp2
// TTGIR: partition0(
// TTGIR-SAME: num_warps(4)
// TTGIR: partition1(
// TTGIR-SAME: num_warps(1)
// TTGIR: ttng.async_tma_copy_global_to_local
// TTGIR: tt.func public @attention_backward_dkdv(%q_desc: !tt.tensordesc<tensor<1x1x64x128xbf16, #shared>>
// TTGIR: ttg.warp_specialize
// TTGIR: default {
// TTGIR-DAG: ttng.warp_group_dot
// TTGIR-DAG: math.exp2
// TTGIR: partition0(
// TTGIR-SAME: num_warps(4)
// TTGIR: partition1(
// TTGIR-SAME: num_warps(1)
// TTGIR: ttng.async_tma_copy_global_to_local
func.func @causal(%q: tensor<1x4x300x128xbf16>, %k: tensor<1x2x300x128xbf16>, %v: tensor<1x2x300x128xbf16>) -> (tensor<1x4x300x128xbf16>, tensor<1x4x300xf32>) {
  %s = "attn.score"(%q, %k) {scale = 0.0883883461 : f32} : (tensor<1x4x300x128xbf16>, tensor<1x2x300x128xbf16>) -> tensor<1x4x300x300xf32>
  %m = "attn.mask"() ({
  ^bb0(%b: index, %h: index, %i: index, %j: index):
    %c = arith.cmpi sge, %i, %j : index
    "gpu.yield"(%c) : (i1) -> ()
  }) : () -> tensor<1x4x300x300xi1>
  %p, %lse = "attn.normalize"(%s, %m) ({}, {}, {}) {kind = "softmax", operandSegmentSizes = array<i32: 1, 1>, resultSegmentSizes = array<i32: 1, 1>} : (tensor<1x4x300x300xf32>, tensor<1x4x300x300xi1>) -> (tensor<1x4x300x300xf32>, tensor<1x4x300xf32>)
  %o = "attn.aggregate"(%p, %v) : (tensor<1x4x300x300xf32>, tensor<1x2x300x128xbf16>) -> tensor<1x4x300x128xbf16>
  return %o, %lse : tensor<1x4x300x128xbf16>, tensor<1x4x300xf32>
}
