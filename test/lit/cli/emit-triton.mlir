// --emit=ttir|ptx|amdgcn: the lowered kernel as Triton IR, and compiled by triton.compile for
// an H100/H200 (cuda:90, Hopper wgmma tensor-core instructions) and an MI300 (hip:gfx942, mfma);
// no GPU is needed for either.
// RUN: ae-opt %s --pipeline=triton --emit=ttir | FileCheck %s --check-prefix=TTIR
// RUN: ae-opt %s --pipeline=triton --emit=ptx --target=cuda:90 | FileCheck %s --check-prefix=PTX
// RUN: ae-opt %s --pipeline=triton --emit=amdgcn --target=hip:gfx942 | FileCheck %s --check-prefix=AMDGCN
// RUN: not ae-opt %s --pipeline=triton --emit=ptx --target=hip:gfx942 2>&1 | FileCheck %s --check-prefix=MISMATCH
// RUN: not ae-opt %s --emit=ttir 2>&1 | FileCheck %s --check-prefix=UNLOWERED --implicit-check-not=Traceback

// TTIR: "tt.func"
// TTIR: "tt.dot"
// TTIR: "tt.reduce.return"
// TTIR: "tt.return"
// PTX: .visible .entry causal(
// PTX: wgmma.mma_async.sync.aligned.m64n{{[0-9]+}}k16.f32.bf16.bf16
// AMDGCN: .globl causal
// AMDGCN: v_mfma_f32
// MISMATCH: error: --emit=ptx needs a cuda target, got --target=hip:gfx942
// UNLOWERED: error: the module holds no tt.func kernel; run attn-lower-to-triton first
func.func @causal(%q: tensor<1x2x256x64xbf16>, %k: tensor<1x2x256x64xbf16>, %v: tensor<1x2x256x64xbf16>) -> (tensor<1x2x256x64xbf16>, tensor<1x2x256xf32>) {
  %s = "attn.score"(%q, %k) {scale = 0.125 : f32} : (tensor<1x2x256x64xbf16>, tensor<1x2x256x64xbf16>) -> tensor<1x2x256x256xf32>
  %m = "attn.mask"() ({
  ^bb0(%b: index, %h: index, %i: index, %j: index):
    %c = arith.cmpi sge, %i, %j : index
    "gpu.yield"(%c) : (i1) -> ()
  }) : () -> tensor<1x2x256x256xi1>
  %p, %lse = "attn.normalize"(%s, %m) ({}, {}, {}) {kind = "softmax", operandSegmentSizes = array<i32: 1, 1>, resultSegmentSizes = array<i32: 1, 1>} : (tensor<1x2x256x256xf32>, tensor<1x2x256x256xi1>) -> (tensor<1x2x256x256xf32>, tensor<1x2x256xf32>)
  %o = "attn.aggregate"(%p, %v) : (tensor<1x2x256x256xf32>, tensor<1x2x256x64xbf16>) -> tensor<1x2x256x64xbf16>
  return %o, %lse : tensor<1x2x256x64xbf16>, tensor<1x2x256xf32>
}
