// A score_mod's f32 tanh in the Triton lowering: by default the exact expansion (exp2 of -2|x|,
// a division, the series below 0.05); with fast-tanh (the preset's choice for 16-bit attention on
// NVIDIA GPUs) one inline PTX tanh.approx.f32 per tile, and the softmax's exp2 after it.
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-fuse-online-softmax,attn-tile{block-m=32 block-n=32},attn-lower-to-triton)' | FileCheck %s --check-prefix=EXACT
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-fuse-online-softmax,attn-tile{block-m=32 block-n=32},attn-lower-to-triton{fast-tanh=true})' | FileCheck %s --check-prefix=FAST
// EXACT: "scf.for"
// EXACT: "tt.dot"
// EXACT-NOT: tt.elementwise_inline_asm
// EXACT: "math.absf"
// EXACT: "math.exp2"
// EXACT: "arith.divf"
// EXACT: "math.exp2"
// EXACT: "scf.yield"
// FAST: "scf.for"
// FAST: "tt.dot"
// FAST-NOT: "math.absf"
// FAST: %[[T:.*]] = "tt.elementwise_inline_asm"(%{{.*}}) {asm_string = "tanh.approx.f32 $0, $1;", constraints = "=r,r", packed_element = 1 : i32, pure = true} : (tensor<32x32xf32>) -> tensor<32x32xf32>
// FAST: "arith.mulf"(%[[T]], %{{.*}})
// FAST: "math.exp2"
// FAST: "scf.yield"
func.func @softcap(%q: tensor<1x2x64x32xbf16>, %k: tensor<1x2x64x32xbf16>, %v: tensor<1x2x64x32xbf16>) -> tensor<1x2x64x32xbf16> {
  %s = "attn.score"(%q, %k) {scale = 0.125 : f32} : (tensor<1x2x64x32xbf16>, tensor<1x2x64x32xbf16>) -> tensor<1x2x64x64xf32>
  %m = "attn.score_mod"(%s) ({
  ^bb0(%x: f32, %b: index, %h: index, %i: index, %j: index):
    %c = arith.constant 30.0 : f32
    %d = arith.divf %x, %c : f32
    %t = math.tanh %d : f32
    %y = arith.mulf %t, %c : f32
    "gpu.yield"(%y) : (f32) -> ()
  }) : (tensor<1x2x64x64xf32>) -> tensor<1x2x64x64xf32>
  %p = "attn.normalize"(%m) ({}, {}, {}) {kind = "softmax", operandSegmentSizes = array<i32: 1, 0>, resultSegmentSizes = array<i32: 1, 0>} : (tensor<1x2x64x64xf32>) -> tensor<1x2x64x64xf32>
  %o = "attn.aggregate"(%p, %v) : (tensor<1x2x64x64xf32>, tensor<1x2x64x32xbf16>) -> tensor<1x2x64x32xbf16>
  return %o : tensor<1x2x64x32xbf16>
}

