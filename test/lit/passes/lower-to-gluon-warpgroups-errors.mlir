// attn-lower-to-gluon{warpgroups=N} asks for N consumer warpgroups in the forward's programs: two
// at either head dim, three only at 64 (the default there). Anything else is a located
// diagnostic, and ae-opt exits 1 on it.
// RUN: ae-opt %s --verify-diagnostics --pass-pipeline='builtin.module(attn-lower-to-gluon{warpgroups=3})'
// RUN: not ae-opt %s --pass-pipeline='builtin.module(attn-lower-to-gluon{warpgroups=3})' 2>&1 | FileCheck %s
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-lower-to-gluon{warpgroups=2})' | FileCheck %s --check-prefix=TWO

// CHECK: lower-to-gluon-warpgroups-errors.mlir:{{[0-9]+}}:{{[0-9]+}}: error: 'func.func' op asks for 3 consumer warpgroups at head dim 128; the kernel takes 2 there
// TWO: attn.block_m = 128 : i64
// TWO-SAME: sym_name = "full_d128"

// expected-error @+1 {{'func.func' op asks for 3 consumer warpgroups at head dim 128; the kernel takes 2 there}}
func.func @full_d128(%q: tensor<1x2x256x128xbf16>, %k: tensor<1x2x256x128xbf16>, %v: tensor<1x2x256x128xbf16>) -> (tensor<1x2x256x128xbf16>, tensor<1x2x256xf32>) {
  %s = "attn.score"(%q, %k) {scale = 0.0883883461 : f32} : (tensor<1x2x256x128xbf16>, tensor<1x2x256x128xbf16>) -> tensor<1x2x256x256xf32>
  %p, %lse = "attn.normalize"(%s) ({}, {}, {}) {kind = "softmax", operandSegmentSizes = array<i32: 1, 0>, resultSegmentSizes = array<i32: 1, 1>} : (tensor<1x2x256x256xf32>) -> (tensor<1x2x256x256xf32>, tensor<1x2x256xf32>)
  %o = "attn.aggregate"(%p, %v) : (tensor<1x2x256x256xf32>, tensor<1x2x256x128xbf16>) -> tensor<1x2x256x128xbf16>
  return %o, %lse : tensor<1x2x256x128xbf16>, tensor<1x2x256xf32>
}
