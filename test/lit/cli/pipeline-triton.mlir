// --pipeline=triton is the pipeline the Triton backend runs, its options derived from the input
// (shapes, dtype) and the target; --dump-pass-pipeline prints it with the kernels' launch
// options, and NAME{opt=value ...} overrides an option. ae-opt prints the aligned variant
// (assume-aligned=true), which the runtime launches on the usual layouts.
// RUN: ae-opt %s --pipeline=triton --dump-pass-pipeline 2>&1 >/dev/null | FileCheck %s --check-prefix=CUDA
// RUN: ae-opt %s --pipeline=triton --target=hip:gfx942 --dump-pass-pipeline 2>&1 >/dev/null | FileCheck %s --check-prefix=HIP
// RUN: ae-opt %s --pipeline='triton{assume-aligned=false block-m=32}' --dump-pass-pipeline 2>&1 >/dev/null | FileCheck %s --check-prefix=OVERRIDE
// RUN: ae-opt %s --pipeline=triton --mlir-print-ir-after-all 2>&1 >/dev/null | FileCheck %s --check-prefix=AFTER
// RUN: not ae-opt %s --pipeline=triton --target=host 2>&1 | FileCheck %s --check-prefix=HOST --implicit-check-not=Traceback
// RUN: not ae-opt %s --pipeline='triton{colour=red}' 2>&1 | FileCheck %s --check-prefix=UNKNOWN --implicit-check-not=Traceback
// RUN: not ae-opt %s --pipeline='triton{tensor-descriptors=true}' --target=hip:gfx942 2>&1 | FileCheck %s --check-prefix=NOTMA --implicit-check-not=Traceback
// RUN: ae-opt %s --pipeline='triton{tensor-descriptors=true}' --emit=ttir | FileCheck %s --check-prefix=TMA
// RUN: not ae-opt %s --pipeline='triton{num-warps=3}' 2>&1 | FileCheck %s --check-prefix=WARPS --implicit-check-not=Traceback
// RUN: not ae-opt %s --pipeline='triton{num-stages=0}' 2>&1 | FileCheck %s --check-prefix=STAGES --implicit-check-not=Traceback
// RUN: ae-opt %s --pipeline='triton{num-warps=8 decays-num-warps=0 states-num-stages=0}' --dump-pass-pipeline 2>&1 >/dev/null | FileCheck %s --check-prefix=FOLLOW

// CUDA: builtin.module(attn-verify,attn-fuse-online-softmax,attn-chunk-recurrence{split=true block-v=64 block-k=64},attn-tile{block-m=16 block-n=16 call-time-tables=true kv-splits=1 pack-gqa=false whole-tiles=false prescale-q=false mirror-reads=true raw-row-max=true},attn-fold-index-clamps{padded-tiles=true},canonicalize,cse,attn-lower-to-triton{assume-aligned=true input-precision=ieee tensor-descriptors=false host-descriptors=false fast-tanh=false wave-programs=132})
// CUDA-NEXT: // launch: num-warps=4 num-stages=3
// HIP: attn-tile{block-m=16 block-n=16 call-time-tables=true kv-splits=1 pack-gqa=false whole-tiles=false prescale-q=false mirror-reads=true raw-row-max=true}
// HIP-SAME: wave-programs=304}
// HIP: // launch: num-warps=4 num-stages=2
// OVERRIDE: attn-tile{block-m=32 block-n=16 call-time-tables=true kv-splits=1 pack-gqa=false whole-tiles=false prescale-q=false mirror-reads=true raw-row-max=true},attn-fold-index-clamps{padded-tiles=true},canonicalize,cse,attn-lower-to-triton{assume-aligned=false input-precision=ieee tensor-descriptors=false host-descriptors=false fast-tanh=false wave-programs=132})
// AFTER: IR Dump After AttnTile (attn-tile)
// AFTER: IR Dump After Canonicalizer (canonicalize)
// AFTER: IR Dump After CSE (cse)
// AFTER: IR Dump After LowerToTriton (attn-lower-to-triton)
// HOST: error: pipeline 'triton' compiles for a cuda or hip target, got 'host'
// UNKNOWN: error: the presets have no option 'colour'
// NOTMA: error: preset option 'tensor-descriptors' needs an NVIDIA target from sm90 on (TMA), got 'hip:gfx942'
// WARPS: error: preset option 'num-warps' must be a power of two from 1 to 32, got 3
// STAGES: error: preset option 'num-stages' must be at least 1, got 0
// FOLLOW: // launch: num-warps=8 num-stages=3
// TMA: "tt.make_tensor_descriptor"
// TMA: "tt.descriptor_load"
func.func @attention(%q: tensor<1x2x8x16xf32>, %k: tensor<1x2x8x16xf32>, %v: tensor<1x2x8x16xf32>) -> tensor<1x2x8x16xf32> {
  %s = "attn.score"(%q, %k) {scale = 0.25 : f32} : (tensor<1x2x8x16xf32>, tensor<1x2x8x16xf32>) -> tensor<1x2x8x8xf32>
  %p = "attn.normalize"(%s) ({}, {}, {}) {kind = "softmax", operandSegmentSizes = array<i32: 1, 0>, resultSegmentSizes = array<i32: 1, 0>} : (tensor<1x2x8x8xf32>) -> tensor<1x2x8x8xf32>
  %o = "attn.aggregate"(%p, %v) : (tensor<1x2x8x8xf32>, tensor<1x2x8x16xf32>) -> tensor<1x2x8x16xf32>
  return %o : tensor<1x2x8x16xf32>
}
