// Which block each Triton program computes. attn-tile marks a kernel whose programs at one end
// of the block axis visit more KV tiles (attn.heavy_blocks: causal's last query blocks). The
// lowering walks the blocks from the last down; with wave-programs (the GPU's multiprocessors,
// the preset's per target) it takes the heads in sections whose programs fill the wave, the
// heaviest block of every head in the section first (passes/triton/program_order.py).
// RUN: ae-opt %s --split-input-file --pass-pipeline='builtin.module(attn-fuse-online-softmax,attn-tile{block-m=32 block-n=32})' | FileCheck %s --check-prefix=L1
// RUN: ae-opt %s --split-input-file --pass-pipeline='builtin.module(attn-fuse-online-softmax,attn-tile{block-m=32 block-n=32},canonicalize,cse,attn-lower-to-triton)' | FileCheck %s --check-prefix=PER-HEAD
// RUN: ae-opt %s --split-input-file --pass-pipeline='builtin.module(attn-fuse-online-softmax,attn-tile{block-m=32 block-n=32},canonicalize,cse,attn-lower-to-triton{wave-programs=16})' | FileCheck %s --check-prefix=SECTIONS
// RUN: not ae-opt %s --split-input-file --pass-pipeline='builtin.module(attn-fuse-online-softmax,attn-tile{block-m=32 block-n=32},attn-lower-to-triton{wave-programs=-1})' 2>&1 | FileCheck %s --check-prefix=ERR --implicit-check-not=Traceback

// Causal, L = 256, 32x32 tiles, B = 1, H = 4: query block i visits i + 1 KV tiles.
// L1: attn.grid = array<i64: 1, 4, 8>, attn.heavy_blocks = "last"
// Without a wave: block 7 - x, head y, batch z.
// PER-HEAD-DAG: %[[C7:.*]] = "arith.constant"() <{value = 7 : i32}>
// PER-HEAD: %[[X:.*]] = "tt.get_program_id"() {axis = 0 : i32}
// PER-HEAD: "arith.subi"(%[[C7]], %[[X]])
// PER-HEAD-NOT: "arith.divsi"
// A wave of 16 programs: sections of 2 heads (16 programs), each walked rank by rank (the
// rank's block in both heads), the ranks from block 7 down.
// SECTIONS-DAG: %[[C8:.*]] = "arith.constant"() <{value = 8 : i32}>
// SECTIONS-DAG: %[[C4:.*]] = "arith.constant"() <{value = 4 : i32}>
// SECTIONS-DAG: %[[C16:.*]] = "arith.constant"() <{value = 16 : i32}>
// SECTIONS-DAG: %[[C2:.*]] = "arith.constant"() <{value = 2 : i32}>
// SECTIONS-DAG: %[[C7:.*]] = "arith.constant"() <{value = 7 : i32}>
// SECTIONS: %[[X:.*]] = "tt.get_program_id"() {axis = 0 : i32}
// SECTIONS: %[[Y:.*]] = "tt.get_program_id"() {axis = 1 : i32}
// SECTIONS: %[[Z:.*]] = "tt.get_program_id"() {axis = 2 : i32}
// The linear position x + 8 (y + 4 z), its section and the first head of it.
// SECTIONS: %[[HZ:.*]] = "arith.muli"(%[[C4]], %[[Z]])
// SECTIONS: %[[YZ:.*]] = "arith.addi"(%[[Y]], %[[HZ]])
// SECTIONS: %[[NYZ:.*]] = "arith.muli"(%[[C8]], %[[YZ]])
// SECTIONS: %[[LIN:.*]] = "arith.addi"(%[[X]], %[[NYZ]])
// SECTIONS: %[[SEC:.*]] = "arith.divsi"(%[[LIN]], %[[C16]])
// SECTIONS: %[[FIRST:.*]] = "arith.muli"(%[[SEC]], %[[C2]])
// Heads in this section (the last may hold fewer), the rank and the head within it.
// SECTIONS: %[[LEFT:.*]] = "arith.subi"(%[[C4]], %[[FIRST]])
// SECTIONS: %[[N:.*]] = "arith.minsi"(%[[C2]], %[[LEFT]])
// SECTIONS: %[[WITHIN:.*]] = "arith.subi"(%[[LIN]], %{{.*}})
// SECTIONS: %[[RANK:.*]] = "arith.divsi"(%[[WITHIN]], %[[N]])
// SECTIONS: %[[FLAT:.*]] = "arith.addi"(%[[FIRST]], %{{.*}})
// SECTIONS: "arith.remsi"(%[[FLAT]], %[[C4]])
// SECTIONS: "arith.divsi"(%[[FLAT]], %[[C4]])
// SECTIONS: "arith.subi"(%[[C7]], %[[RANK]])
// ERR: error: invalid options for pass 'attn-lower-to-triton': wave-programs must be at least 0, got -1
func.func @causal(%q: tensor<1x4x256x16xbf16>, %k: tensor<1x4x256x16xbf16>, %v: tensor<1x4x256x16xbf16>) -> (tensor<1x4x256x16xbf16>, tensor<1x4x256xf32>) {
  %s = "attn.score"(%q, %k) {scale = 0.25 : f32} : (tensor<1x4x256x16xbf16>, tensor<1x4x256x16xbf16>) -> tensor<1x4x256x256xf32>
  %m = "attn.mask"() ({
  ^bb0(%b: index, %h: index, %i: index, %j: index):
    %c = arith.cmpi sge, %i, %j : index
    "gpu.yield"(%c) : (i1) -> ()
  }) : () -> tensor<1x4x256x256xi1>
  %p, %lse = "attn.normalize"(%s, %m) ({}, {}, {}) {kind = "softmax", operandSegmentSizes = array<i32: 1, 1>, resultSegmentSizes = array<i32: 1, 1>} : (tensor<1x4x256x256xf32>, tensor<1x4x256x256xi1>) -> (tensor<1x4x256x256xf32>, tensor<1x4x256xf32>)
  %o = "attn.aggregate"(%p, %v) : (tensor<1x4x256x256xf32>, tensor<1x4x256x16xbf16>) -> tensor<1x4x256x16xbf16>
  return %o, %lse : tensor<1x4x256x16xbf16>, tensor<1x4x256xf32>
}

// -----

// Unmasked: every block visits every tile, no attn.heavy_blocks, and no sections with a wave.
// L1: attn.grid = array<i64: 1, 4, 8>}
// SECTIONS: %[[X:.*]] = "tt.get_program_id"() {axis = 0 : i32}
// SECTIONS-NEXT: "tt.get_program_id"() {axis = 1 : i32}
// SECTIONS-NEXT: "tt.get_program_id"() {axis = 2 : i32}
// SECTIONS-NEXT: "arith.subi"(%{{.*}}, %[[X]])
func.func @full(%q: tensor<1x4x256x16xbf16>, %k: tensor<1x4x256x16xbf16>, %v: tensor<1x4x256x16xbf16>) -> (tensor<1x4x256x16xbf16>, tensor<1x4x256xf32>) {
  %s = "attn.score"(%q, %k) {scale = 0.25 : f32} : (tensor<1x4x256x16xbf16>, tensor<1x4x256x16xbf16>) -> tensor<1x4x256x256xf32>
  %p, %lse = "attn.normalize"(%s) ({}, {}, {}) {kind = "softmax", operandSegmentSizes = array<i32: 1, 0>, resultSegmentSizes = array<i32: 1, 1>} : (tensor<1x4x256x256xf32>) -> (tensor<1x4x256x256xf32>, tensor<1x4x256xf32>)
  %o = "attn.aggregate"(%p, %v) : (tensor<1x4x256x256xf32>, tensor<1x4x256x16xbf16>) -> tensor<1x4x256x16xbf16>
  return %o, %lse : tensor<1x4x256x16xbf16>, tensor<1x4x256xf32>
}

// -----

// Each query block sees the keys from its own on: the first blocks are the heaviest, and block x
// goes x-th.
// L1: attn.grid = array<i64: 1, 4, 8>, attn.heavy_blocks = "first"
// PER-HEAD: // -----
// PER-HEAD: // -----
// PER-HEAD: %[[X:.*]] = "tt.get_program_id"() {axis = 0 : i32}
// PER-HEAD-NOT: "arith.subi"(%{{.*}}, %[[X]])
// PER-HEAD: "arith.muli"(%[[X]], %{{.*}})
func.func @anticausal(%q: tensor<1x4x256x16xbf16>, %k: tensor<1x4x256x16xbf16>, %v: tensor<1x4x256x16xbf16>) -> (tensor<1x4x256x16xbf16>, tensor<1x4x256xf32>) {
  %s = "attn.score"(%q, %k) {scale = 0.25 : f32} : (tensor<1x4x256x16xbf16>, tensor<1x4x256x16xbf16>) -> tensor<1x4x256x256xf32>
  %m = "attn.mask"() ({
  ^bb0(%b: index, %h: index, %i: index, %j: index):
    %c = arith.cmpi sle, %i, %j : index
    "gpu.yield"(%c) : (i1) -> ()
  }) : () -> tensor<1x4x256x256xi1>
  %p, %lse = "attn.normalize"(%s, %m) ({}, {}, {}) {kind = "softmax", operandSegmentSizes = array<i32: 1, 1>, resultSegmentSizes = array<i32: 1, 1>} : (tensor<1x4x256x256xf32>, tensor<1x4x256x256xi1>) -> (tensor<1x4x256x256xf32>, tensor<1x4x256xf32>)
  %o = "attn.aggregate"(%p, %v) : (tensor<1x4x256x256xf32>, tensor<1x4x256x16xbf16>) -> tensor<1x4x256x16xbf16>
  return %o, %lse : tensor<1x4x256x16xbf16>, tensor<1x4x256xf32>
}
