// attn-lower-to-gluon: causal softmax (bf16, D 128, two query heads per KV head) becomes a stub
// tt.func (the launch grid: a program per query block of 128 rows of each batch entry and head,
// B * H * 3 here; the argument labels: each host
// descriptor followed by its sizes and strides, then out's and lse's strides but the last) whose
// attn.ttgir attribute is the warp-specialized kernel; --emit=ttir prints that Triton GPU IR:
// two consumer warpgroups (the default region and partition0) issuing wgmma products, their
// softmax's exp2 and the masked stores, and a loader partition of one warp issuing TMA copies
// into shared memory.
// RUN: ae-opt %s --split-input-file --pass-pipeline='builtin.module(attn-lower-to-gluon)' | FileCheck %s
// RUN: ae-opt %s --split-input-file --pass-pipeline='builtin.module(attn-lower-to-gluon)' --emit=ttir | FileCheck %s --check-prefix=TTGIR

// CHECK: "tt.func"()
// CHECK-NEXT: "gpu.yield"()
// CHECK-NEXT: attn.block_m = 128 : i64, attn.block_n = 128 : i64, attn.grid = array<i64: 12, 1, 1>
// CHECK-SAME: attn.kernel_args = ["q.tma", "q.tma.size0", "q.tma.size1", "q.tma.size2", "q.tma.size3", "q.tma.stride0", "q.tma.stride1", "q.tma.stride2", "q.tma.stride3", "k.tma"
// CHECK-SAME: "out", "out.stride0", "out.stride1", "out.stride2", "lse", "lse.stride0", "lse.stride1"]
// CHECK-SAME: attn.max_registers = 168 : i64
// CHECK-SAME: attn.ttgir = "#loc
// CHECK-SAME: sym_name = "causal"
// CHECK-NOT: func.func
// TTGIR: tt.func public @attention_forward(%q_desc: !tt.tensordesc<tensor<1x1x64x128xbf16, #shared>>
// TTGIR: ttg.warp_specialize
// TTGIR: default {
// TTGIR-DAG: ttng.warp_group_dot
// TTGIR-DAG: math.exp2
// TTGIR-DAG: tt.store
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
