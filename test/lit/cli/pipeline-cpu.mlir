// --pipeline=cpu is the pipeline the CPU backend runs (in two stages, L0 -> L1 -> llvm): tiles
// shrunk to the sequence (8 rows here), call-time tables (forward and backward kernels), unit-inner-stride tile loads, register
// tiles for the host's vector width (AVX-512F: 512 bits, AVX2: 256, else 128), which the option
// overrides, and kernels without AVX512-BF16 instructions on hosts that have them.
// RUN: ae-opt %s --pipeline=cpu --dump-pass-pipeline 2>&1 >/dev/null | FileCheck %s
// RUN: ae-opt %s --pipeline='cpu{unit-inner-stride=false}' --dump-pass-pipeline 2>&1 >/dev/null | FileCheck %s --check-prefix=STRIDED
// RUN: ae-opt %s --pipeline='cpu{vector-bits=128}' --dump-pass-pipeline 2>&1 >/dev/null | FileCheck %s --check-prefix=NARROW
// RUN: ae-opt %s --pipeline='cpu{backward=true}' --dump-pass-pipeline 2>&1 >/dev/null | FileCheck %s --check-prefix=BACKWARD
// RUN: not ae-opt %s --pipeline=cpu --target=cuda:90 2>&1 | FileCheck %s --check-prefix=TARGET --implicit-check-not=Traceback

// CHECK: builtin.module(attn-verify,attn-fuse-online-softmax,attn-chunk-recurrence{split=false block-v=64 block-k=64},attn-tile{block-m=8 block-n=8 call-time-tables=true kv-splits=1 pack-gqa=false whole-tiles=true prescale-q=true mirror-reads=true raw-row-max=false},attn-fold-index-clamps{padded-tiles=false},attn-lower-to-cpu{unit-inner-stride=true vector-bits={{128|256|512}} no-avx512-bf16={{true|false}} narrow-isa={{true|false}} amx=false})
// CHECK-NOT: launch
// STRIDED: attn-lower-to-cpu{unit-inner-stride=false vector-bits={{128|256|512}} no-avx512-bf16={{true|false}} narrow-isa={{true|false}} amx=false})
// NARROW: attn-lower-to-cpu{unit-inner-stride=true vector-bits=128 no-avx512-bf16={{true|false}} narrow-isa={{true|false}} amx=false})
// The backward kernels take call-time tables too (a closure-reading mask's tiles per call).
// BACKWARD: builtin.module(attn-verify,attn-differentiate,attn-tile-backward{block-m=8 block-n=8 dkdv-block-m=0 dkdv-block-n=0 whole-tiles=true closure-grads=true mirror-reads=true call-time-tables=true},attn-fold-index-clamps{padded-tiles=false},attn-lower-to-cpu{
// TARGET: error: pipeline 'cpu' compiles for --target=host, got 'cuda:90'
func.func @attention(%q: tensor<1x2x8x16xf32>, %k: tensor<1x2x8x16xf32>, %v: tensor<1x2x8x16xf32>) -> tensor<1x2x8x16xf32> {
  %s = "attn.score"(%q, %k) {scale = 0.25 : f32} : (tensor<1x2x8x16xf32>, tensor<1x2x8x16xf32>) -> tensor<1x2x8x8xf32>
  %p = "attn.normalize"(%s) ({}, {}, {}) {kind = "softmax", operandSegmentSizes = array<i32: 1, 0>, resultSegmentSizes = array<i32: 1, 0>} : (tensor<1x2x8x8xf32>) -> tensor<1x2x8x8xf32>
  %o = "attn.aggregate"(%p, %v) : (tensor<1x2x8x8xf32>, tensor<1x2x8x16xf32>) -> tensor<1x2x8x16xf32>
  return %o : tensor<1x2x8x16xf32>
}
