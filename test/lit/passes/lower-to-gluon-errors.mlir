// What attn-lower-to-gluon does not lower gets a located diagnostic: another mask, a score_mod,
// f32 inputs, a causal mask over unequal lengths.
// RUN: ae-opt %s --split-input-file --verify-diagnostics --pass-pipeline='builtin.module(attn-lower-to-gluon)'
// The backward's kernels take what the forward's does, with the same diagnostics.
// RUN: ae-opt %s --split-input-file --verify-diagnostics --pass-pipeline='builtin.module(attn-lower-to-gluon{backward=true})'

func.func @window(%q: tensor<1x1x256x128xbf16>, %k: tensor<1x1x256x128xbf16>, %v: tensor<1x1x256x128xbf16>) -> (tensor<1x1x256x128xbf16>, tensor<1x1x256xf32>) {
  %s = "attn.score"(%q, %k) {scale = 0.0883883461 : f32} : (tensor<1x1x256x128xbf16>, tensor<1x1x256x128xbf16>) -> tensor<1x1x256x256xf32>
  // expected-error @+1 {{'attn.mask' op is not the causal mask (q_idx >= kv_idx), the only mask attn-lower-to-gluon lowers}}
  %m = "attn.mask"() ({
  ^bb0(%b: index, %h: index, %i: index, %j: index):
    %c = arith.cmpi sgt, %i, %j : index
    "gpu.yield"(%c) : (i1) -> ()
  }) : () -> tensor<1x1x256x256xi1>
  %p, %lse = "attn.normalize"(%s, %m) ({}, {}, {}) {kind = "softmax", operandSegmentSizes = array<i32: 1, 1>, resultSegmentSizes = array<i32: 1, 1>} : (tensor<1x1x256x256xf32>, tensor<1x1x256x256xi1>) -> (tensor<1x1x256x256xf32>, tensor<1x1x256xf32>)
  %o = "attn.aggregate"(%p, %v) : (tensor<1x1x256x256xf32>, tensor<1x1x256x128xbf16>) -> tensor<1x1x256x128xbf16>
  return %o, %lse : tensor<1x1x256x128xbf16>, tensor<1x1x256xf32>
}

// -----

// expected-error @+1 {{'func.func' op has f32 inputs; attn-lower-to-gluon takes bf16 or f16 q, k, v of one type}}
func.func @f32(%q: tensor<1x1x256x128xf32>, %k: tensor<1x1x256x128xf32>, %v: tensor<1x1x256x128xf32>) -> (tensor<1x1x256x128xf32>, tensor<1x1x256xf32>) {
  %s = "attn.score"(%q, %k) {scale = 0.0883883461 : f32} : (tensor<1x1x256x128xf32>, tensor<1x1x256x128xf32>) -> tensor<1x1x256x256xf32>
  %p, %lse = "attn.normalize"(%s) ({}, {}, {}) {kind = "softmax", operandSegmentSizes = array<i32: 1, 0>, resultSegmentSizes = array<i32: 1, 1>} : (tensor<1x1x256x256xf32>) -> (tensor<1x1x256x256xf32>, tensor<1x1x256xf32>)
  %o = "attn.aggregate"(%p, %v) : (tensor<1x1x256x256xf32>, tensor<1x1x256x128xf32>) -> tensor<1x1x256x128xf32>
  return %o, %lse : tensor<1x1x256x128xf32>, tensor<1x1x256xf32>
}

// -----

// expected-error @+1 {{'func.func' op is causal with 128 queries and 256 keys; attn-lower-to-gluon takes equal lengths}}
func.func @causal_unequal(%q: tensor<1x1x128x128xbf16>, %k: tensor<1x1x256x128xbf16>, %v: tensor<1x1x256x128xbf16>) -> (tensor<1x1x128x128xbf16>, tensor<1x1x128xf32>) {
  %s = "attn.score"(%q, %k) {scale = 0.0883883461 : f32} : (tensor<1x1x128x128xbf16>, tensor<1x1x256x128xbf16>) -> tensor<1x1x128x256xf32>
  %m = "attn.mask"() ({
  ^bb0(%b: index, %h: index, %i: index, %j: index):
    %c = arith.cmpi sle, %j, %i : index
    "gpu.yield"(%c) : (i1) -> ()
  }) : () -> tensor<1x1x128x256xi1>
  %p, %lse = "attn.normalize"(%s, %m) ({}, {}, {}) {kind = "softmax", operandSegmentSizes = array<i32: 1, 1>, resultSegmentSizes = array<i32: 1, 1>} : (tensor<1x1x128x256xf32>, tensor<1x1x128x256xi1>) -> (tensor<1x1x128x256xf32>, tensor<1x1x128xf32>)
  %o = "attn.aggregate"(%p, %v) : (tensor<1x1x128x256xf32>, tensor<1x1x256x128xbf16>) -> tensor<1x1x128x128xbf16>
  return %o, %lse : tensor<1x1x128x128xbf16>, tensor<1x1x128xf32>
}
