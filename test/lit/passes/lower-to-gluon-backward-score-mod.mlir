// attn-lower-to-gluon{backward=true} with a score_mod (soft-capping, causal, bf16, D 128): the
// score_mod region and attn-differentiate's derivative of it (@softcap_grad's
// attn.score_mod_grad) become Gluon functions the kernels call where they recompute P and form
// dS; both functions are consumed, and the same three stubs as without a mod are left. With
// fast-tanh the recomputed tanh (in the mod and in its derivative, 1 - tanh^2) is the hardware's
// approximation, as attn-lower-to-triton{fast-tanh=true} writes it; without it, the exact
// formula (exp2 and a division).
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-differentiate,attn-lower-to-gluon{backward=true reduce-dq=true fast-tanh=true})' | FileCheck %s
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-differentiate,attn-lower-to-gluon{backward=true reduce-dq=true fast-tanh=true})' --emit=ttir | FileCheck %s --check-prefix=FAST
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-differentiate,attn-lower-to-gluon{backward=true fast-tanh=false})' --emit=ttir | FileCheck %s --check-prefix=EXACT

// CHECK: sym_name = "softcap_bwd_delta"
// CHECK: attn.grid = array<i64: 4, 1, 1>
// CHECK-SAME: sym_name = "softcap_bwd_dkdvdq"
// CHECK: sym_name = "softcap_bwd_convert"
// CHECK-NOT: func.func
// FAST: tt.func public @attention_backward_fused(
// FAST: ttg.warp_specialize
// FAST: tt.elementwise_inline_asm "tanh.approx.f32 $0, $1;"
// FAST: math.exp2
// FAST: tt.elementwise_inline_asm "tanh.approx.f32 $0, $1;"
// FAST: ttng.async_tma_reduce add
// EXACT: tt.func public @attention_backward_dq(
// EXACT-NOT: tanh.approx
// EXACT: math.exp2
// EXACT: arith.divf
// EXACT: tt.func public @attention_backward_dkdv(
// EXACT-NOT: tanh.approx
func.func @softcap(%q: tensor<1x2x200x128xbf16>, %k: tensor<1x2x200x128xbf16>, %v: tensor<1x2x200x128xbf16>) -> (tensor<1x2x200x128xbf16>, tensor<1x2x200xf32>) {
  %s = "attn.score"(%q, %k) {scale = 0.0883883461 : f32} : (tensor<1x2x200x128xbf16>, tensor<1x2x200x128xbf16>) -> tensor<1x2x200x200xf32>
  %sm = "attn.score_mod"(%s) ({
  ^bb0(%x: f32, %b: index, %h: index, %i: index, %j: index):
    %inv = arith.constant 0.0333333351 : f32
    %cap = arith.constant 30.0 : f32
    %y = arith.mulf %x, %inv : f32
    %t = math.tanh %y : f32
    %z = arith.mulf %t, %cap : f32
    "gpu.yield"(%z) : (f32) -> ()
  }) : (tensor<1x2x200x200xf32>) -> tensor<1x2x200x200xf32>
  %m = "attn.mask"() ({
  ^bb0(%b: index, %h: index, %i: index, %j: index):
    %c = arith.cmpi sge, %i, %j : index
    "gpu.yield"(%c) : (i1) -> ()
  }) : () -> tensor<1x2x200x200xi1>
  %p, %lse = "attn.normalize"(%sm, %m) ({}, {}, {}) {kind = "softmax", operandSegmentSizes = array<i32: 1, 1>, resultSegmentSizes = array<i32: 1, 1>} : (tensor<1x2x200x200xf32>, tensor<1x2x200x200xi1>) -> (tensor<1x2x200x200xf32>, tensor<1x2x200xf32>)
  %o = "attn.aggregate"(%p, %v) : (tensor<1x2x200x200xf32>, tensor<1x2x200x128xbf16>) -> tensor<1x2x200x128xbf16>
  return %o, %lse : tensor<1x2x200x128xbf16>, tensor<1x2x200xf32>
}
