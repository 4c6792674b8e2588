// attn-lower-to-gluon{wave-programs=N}: a causal forward on a grid of a program per query block
// starts every head's longest block first across sections of heads whose programs fill N
// (pipeline.query_item, the order attn-lower-to-triton's wave-programs gives its programs).
// Here 2 x 2 heads of 3 blocks (192 rows at head dim 64): a wave of 4 takes sections of 2 heads,
// so the consumers' and the loader's item decode clamps a section to min(2, heads left); without
// the option (or on a persistent grid) a section is one head, head after head.
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-lower-to-gluon{wave-programs=4})' | FileCheck %s
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-lower-to-gluon{wave-programs=4})' --emit=ttir | FileCheck %s --check-prefix=SECTIONS
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-lower-to-gluon)' --emit=ttir | FileCheck %s --check-prefix=HEADS
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-lower-to-gluon{programs=8 wave-programs=4})' --emit=ttir | FileCheck %s --check-prefix=HEADS
// RUN: not ae-opt %s --pass-pipeline='builtin.module(attn-lower-to-gluon{wave-programs=-1})' 2>&1 | FileCheck %s --check-prefix=ERR --implicit-check-not=Traceback

// CHECK: "tt.func"()
// CHECK: attn.grid = array<i64: 12, 1, 1>
// SECTIONS: %first = arith.muli
// SECTIONS: %count = arith.subi %c4_i32, %first
// SECTIONS-NEXT: arith.minsi %count, %c2_i32
// HEADS: %count = arith.subi %c4_i32, %{{first|number}}
// HEADS-NEXT: arith.minsi %count, %c1_i32
// ERR: wave-programs must be at least 0, got -1
func.func @causal_d64(%q: tensor<2x2x500x64xbf16>, %k: tensor<2x2x500x64xbf16>, %v: tensor<2x2x500x64xbf16>) -> (tensor<2x2x500x64xbf16>, tensor<2x2x500xf32>) {
  %s = "attn.score"(%q, %k) {scale = 0.125 : f32} : (tensor<2x2x500x64xbf16>, tensor<2x2x500x64xbf16>) -> tensor<2x2x500x500xf32>
  %m = "attn.mask"() ({
  ^bb0(%b: index, %h: index, %i: index, %j: index):
    %c = arith.cmpi sge, %i, %j : index
    "gpu.yield"(%c) : (i1) -> ()
  }) : () -> tensor<2x2x500x500xi1>
  %p, %lse = "attn.normalize"(%s, %m) ({}, {}, {}) {kind = "softmax", operandSegmentSizes = array<i32: 1, 1>, resultSegmentSizes = array<i32: 1, 1>} : (tensor<2x2x500x500xf32>, tensor<2x2x500x500xi1>) -> (tensor<2x2x500x500xf32>, tensor<2x2x500xf32>)
  %o = "attn.aggregate"(%p, %v) : (tensor<2x2x500x500xf32>, tensor<2x2x500x64xbf16>) -> tensor<2x2x500x64xbf16>
  return %o, %lse : tensor<2x2x500x64xbf16>, tensor<2x2x500xf32>
}
