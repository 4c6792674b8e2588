// What attn-lower-to-gluon does not lower of a score_mod gets a located diagnostic: the
// forward's kernel takes none; the backward's needs attn-differentiate's derivative of it. The
// backward's kernels take both mods, and a closure tensor read (ALiBi's slopes) becomes their
// argument c0, a pointer the Gluon kernels load from.
// RUN: ae-opt %s --split-input-file --verify-diagnostics --pass-pipeline='builtin.module(attn-lower-to-gluon)'
// RUN: ae-opt %s --split-input-file --pass-pipeline='builtin.module(attn-differentiate,attn-lower-to-gluon{backward=true})' 2>&1 | FileCheck %s --check-prefix=BWD
// RUN: not ae-opt %s --split-input-file --pass-pipeline='builtin.module(attn-lower-to-gluon{backward=true})' 2>&1 >/dev/null | FileCheck %s --check-prefix=UNDIFF

// BWD-NOT: error:
// BWD: sym_name = "softcap_bwd_dq"
// BWD: sym_name = "softcap_bwd_dkdv"
// UNDIFF: [[# @LINE + 1]]:1: error: 'func.func' op has a score_mod whose derivative attn-lower-to-gluon reads from attn-differentiate's @<name>_grad (run attn-differentiate first)
func.func @softcap(%q: tensor<1x1x256x128xbf16>, %k: tensor<1x1x256x128xbf16>, %v: tensor<1x1x256x128xbf16>) -> (tensor<1x1x256x128xbf16>, tensor<1x1x256xf32>) {
  %s = "attn.score"(%q, %k) {scale = 0.0883883461 : f32} : (tensor<1x1x256x128xbf16>, tensor<1x1x256x128xbf16>) -> tensor<1x1x256x256xf32>
  // expected-error @+1 {{'attn.score_mod' op is not lowered by attn-lower-to-gluon (softmax attention with no score_mod, or one in the backward, and no mask or the causal one)}}
  %sm = "attn.score_mod"(%s) ({
  ^bb0(%x: f32, %b: index, %h: index, %i: index, %j: index):
    %inv = arith.constant 0.0333333351 : f32
    %cap = arith.constant 30.0 : f32
    %y = arith.mulf %x, %inv : f32
    %t = math.tanh %y : f32
    %z = arith.mulf %t, %cap : f32
    "gpu.yield"(%z) : (f32) -> ()
  }) : (tensor<1x1x256x256xf32>) -> tensor<1x1x256x256xf32>
  %p, %lse = "attn.normalize"(%sm) ({}, {}, {}) {kind = "softmax", operandSegmentSizes = array<i32: 1, 0>, resultSegmentSizes = array<i32: 1, 1>} : (tensor<1x1x256x256xf32>) -> (tensor<1x1x256x256xf32>, tensor<1x1x256xf32>)
  %o = "attn.aggregate"(%p, %v) : (tensor<1x1x256x256xf32>, tensor<1x1x256x128xbf16>) -> tensor<1x1x256x128xbf16>
  return %o, %lse : tensor<1x1x256x128xbf16>, tensor<1x1x256xf32>
}

// -----

// BWD: "delta.stride1", "c0"]
// BWD-SAME: %closures: !tt.ptr<f32>
// BWD-SAME: sym_name = "alibi_bwd_dq"
// BWD: "dv.stride2", "c0"]
// BWD-SAME: %closures: !tt.ptr<f32>
// BWD-SAME: sym_name = "alibi_bwd_dkdv"
// BWD-NOT: error:
func.func @alibi(%q: tensor<1x2x256x128xbf16>, %k: tensor<1x2x256x128xbf16>, %v: tensor<1x2x256x128xbf16>, %slopes: tensor<2xf32>) -> (tensor<1x2x256x128xbf16>, tensor<1x2x256xf32>) {
  %s = "attn.score"(%q, %k) {scale = 0.0883883461 : f32} : (tensor<1x2x256x128xbf16>, tensor<1x2x256x128xbf16>) -> tensor<1x2x256x256xf32>
  // expected-error @+1 {{'attn.score_mod' op is not lowered by attn-lower-to-gluon}}
  %sm = "attn.score_mod"(%s) ({
  ^bb0(%x: f32, %b: index, %h: index, %i: index, %j: index):
    %e = tensor.extract %slopes[%h] : tensor<2xf32>
    %d = arith.subi %j, %i : index
    %d64 = arith.index_cast %d : index to i64
    %df = arith.sitofp %d64 : i64 to f32
    %bias = arith.mulf %e, %df : f32
    %y = arith.addf %x, %bias : f32
    "gpu.yield"(%y) : (f32) -> ()
  }) : (tensor<1x2x256x256xf32>) -> tensor<1x2x256x256xf32>
  %p, %lse = "attn.normalize"(%sm) ({}, {}, {}) {kind = "softmax", operandSegmentSizes = array<i32: 1, 0>, resultSegmentSizes = array<i32: 1, 1>} : (tensor<1x2x256x256xf32>) -> (tensor<1x2x256x256xf32>, tensor<1x2x256xf32>)
  %o = "attn.aggregate"(%p, %v) : (tensor<1x2x256x256xf32>, tensor<1x2x256x128xbf16>) -> tensor<1x2x256x128xbf16>
  return %o, %lse : tensor<1x2x256x128xbf16>, tensor<1x2x256xf32>
}
