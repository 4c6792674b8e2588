// attn-lower-to-gluon{backward=true reduce-dq=true}: the same backward (causal, bf16, D 128, two
// query heads per KV head) in five tile products becomes three stubs in launch order: a kernel
// of 64 query rows a program (5 x 4) that writes delta and zeroes the float32 dQ sums, the
// dK/dV kernel (3 x 2 programs of 128 keys) that also adds each query block's dS K into those
// sums through a fifth descriptor (dq_sums.tma) by TMA reduce-adds, and a kernel that converts
// the sums to dQ. reduce-dq without backward=true is an error.
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-lower-to-gluon{backward=true reduce-dq=true})' | FileCheck %s
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-lower-to-gluon{backward=true reduce-dq=true})' --emit=ttir | FileCheck %s --check-prefix=TTGIR
// RUN: not ae-opt %s --pass-pipeline='builtin.module(attn-lower-to-gluon{reduce-dq=true})' 2>&1 | FileCheck %s --check-prefix=ERR

// CHECK: "tt.func"()
// CHECK: attn.block_m = 64 : i64, attn.block_n = 128 : i64, attn.grid = array<i64: 20, 1, 1>
// CHECK-SAME: attn.kernel_args = ["out", "out.stride0", "out.stride1", "out.stride2", "do", "do.stride0", "do.stride1", "do.stride2", "dlse", "dlse.stride0", "dlse.stride1", "delta", "delta.stride0", "delta.stride1", "dq_sums", "dq_sums.stride0", "dq_sums.stride1", "dq_sums.stride2"]
// CHECK-SAME: attn.max_registers = 0 : i64
// CHECK-SAME: sym_name = "causal_bwd_delta"
// CHECK: "tt.func"()
// CHECK: attn.grid = array<i64: 6, 1, 1>
// CHECK-SAME: attn.kernel_args = ["q.tma"
// CHECK-SAME: "do.tma.stride3", "dq_sums.tma", "dq_sums.tma.size0", "dq_sums.tma.size1", "dq_sums.tma.size2", "dq_sums.tma.size3", "dq_sums.tma.stride0", "dq_sums.tma.stride1", "dq_sums.tma.stride2", "dq_sums.tma.stride3", "lse", "lse.stride0", "lse.stride1", "delta", "delta.stride0", "delta.stride1", "dk", "dk.stride0", "dk.stride1", "dk.stride2", "dv", "dv.stride0", "dv.stride1", "dv.stride2"]
// CHECK-SAME: attn.max_registers = 168 : i64
// CHECK-SAME: sym_name = "causal_bwd_dkdvdq"
// CHECK: "tt.func"()
// CHECK: attn.grid = array<i64: 20, 1, 1>
// CHECK-SAME: attn.kernel_args = ["dq_sums", "dq_sums.stride0", "dq_sums.stride1", "dq_sums.stride2", "dq", "dq.stride0", "dq.stride1", "dq.stride2"]
// CHECK-SAME: sym_name = "causal_bwd_convert"
// CHECK-NOT: func.func
// TTGIR: tt.func public @attention_backward_delta(
// TTGIR: "tt.reduce"
// TTGIR: tt.func public @attention_backward_fused(%q_desc: !tt.tensordesc<tensor<1x1x64x128xbf16, #shared>>
// TTGIR-SAME: %dq_sums_desc: !tt.tensordesc<tensor<1x1x64x64xf32, #shared1>>
// TTGIR: ttg.warp_specialize
// TTGIR: default {
// TTGIR: ttng.warp_group_dot
// TTGIR: ttng.async_tma_reduce add, %dq_sums_desc
// TTGIR: ttng.async_tma_store_wait
// TTGIR: tt.func public @attention_backward_convert(
// TTGIR: arith.truncf
// ERR: error: attn-lower-to-gluon: reduce-dq is an option of the backward (backward=true)
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
