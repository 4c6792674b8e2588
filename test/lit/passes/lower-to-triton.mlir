// attn-lower-to-triton turns the L1 kernel into a Triton IR tt.func (generic form): Q loaded once
// by a masked tt.load, then the KV loops (scf.for, i32) with tt.dot for Q K^T and P V, tt.reduce
// for the row max and sum, exp2, and masked tt.stores of O and lse after the loops.
// RUN: ae-opt %s --split-input-file --pass-pipeline='builtin.module(attn-fuse-online-softmax,attn-tile{block-m=32 block-n=32},attn-lower-to-triton)' | FileCheck %s
// RUN: ae-opt %s --split-input-file --pass-pipeline='builtin.module(attn-fuse-online-softmax,attn-tile{block-m=32 block-n=32},attn-lower-to-triton)' --emit=ttir | FileCheck %s --check-prefix=TTIR
// RUN: ae-opt %s --split-input-file --pass-pipeline='builtin.module(attn-fuse-online-softmax,attn-tile{block-m=32 block-n=32},attn-lower-to-triton{assume-aligned=false})' | FileCheck %s --check-prefix=GENERAL
// RUN: not ae-opt %s --split-input-file --pass-pipeline='builtin.module(attn-lower-to-triton)' 2>&1 | FileCheck %s --check-prefix=ERR
// Upstream mlir-opt verifies the result with the tt IRDL file alone.
// RUN: ae-opt %s --split-input-file --pass-pipeline='builtin.module(attn-fuse-online-softmax,attn-tile{block-m=32 block-n=32},attn-lower-to-triton)' | mlir-opt --irdl-file=%S/../../../dialects/tt.irdl.mlir --split-input-file | FileCheck %s --check-prefix=UPSTREAM

// Causal, L = 100, 32x32 tiles, B = 1, H = 2: programs x = 4 query blocks, y = 2 heads, z = 1.
// Aligned (default): q/k/v/out/lse have no last-dim stride argument; pointers and strides carry
// divisibility hints.
// CHECK-LABEL: "tt.func"
// CHECK: ^bb0(%[[Q:arg0]]: !tt.ptr<bf16>, %{{.*}}: i32, %{{.*}}: i32, %{{.*}}: i32, %[[K:arg4]]: !tt.ptr<bf16>
// CHECK-SAME: %{{.*}}: !tt.ptr<f32>, %{{.*}}: i32, %{{.*}}: i32)
// CHECK-DAG: "tt.get_program_id"() {axis = 0 : i32}
// CHECK-DAG: "tt.make_range"() {end = 32 : i32, start = 0 : i32}
// The Q tile: pointers from the program's origin (an i64 offset), rows masked at L = 100.
// CHECK: "tt.addptr"(%[[Q]], %{{.*}}) : (!tt.ptr<bf16>, i64) -> !tt.ptr<bf16>
// CHECK: %[[QT:.*]] = "tt.load"({{.*}}) {{.*}}operandSegmentSizes = array<i32: 1, 1, 1>{{.*}} -> tensor<32x16xbf16>
// Partial tiles (the diagonal): the mask is evaluated.
// CHECK: "scf.for"
// CHECK: "tt.addptr"(%[[K]], %{{.*}}) : (!tt.ptr<bf16>, i64) -> !tt.ptr<bf16>
// CHECK: %[[KT:.*]] = "tt.load"({{.*}}) -> tensor<32x16xbf16>
// CHECK: %[[VT:.*]] = "tt.load"({{.*}}) -> tensor<32x16xbf16>
// CHECK: %[[KTT:.*]] = "tt.trans"(%[[KT]]) {order = array<i32: 1, 0>}
// CHECK: "tt.dot"(%[[QT]], %[[KTT]], %{{.*}}) {{.*}} -> tensor<32x32xf32>
// CHECK: "arith.cmpi"({{.*}}) <{predicate = 5 : i64}> : (tensor<32x32xi32>, tensor<32x32xi32>)
// CHECK: "tt.reduce"
// CHECK: "arith.maximumf"
// CHECK: "gpu.yield"
// CHECK: {axis = 1 : i32} : (tensor<32x32xf32>) -> tensor<32xf32>
// CHECK: "math.exp2"({{.*}} : (tensor<32x32xf32>)
// CHECK: "arith.truncf"({{.*}} : (tensor<32x32xf32>) -> tensor<32x32xbf16>
// CHECK: "tt.dot"(%{{.*}}, %[[VT]], %{{.*}}) {{.*}} -> tensor<32x16xf32>
// CHECK: "scf.yield"
// Full tiles: no mask.
// CHECK: "scf.for"
// CHECK-NOT: predicate = 5
// CHECK: "tt.dot"
// CHECK: "math.exp2"
// CHECK: "tt.dot"
// CHECK: "scf.yield"
// Finalize, then the masked stores of O (bf16) and lse (f32).
// CHECK: "arith.divf"
// CHECK: "tt.store"({{.*}}) {cache = 1 : i32, evict = 1 : i32} : (tensor<32x16x!tt.ptr<bf16>>, tensor<32x16xbf16>, tensor<32x16xi1>)
// CHECK: "math.log2"
// CHECK: "tt.store"({{.*}} : (tensor<32x!tt.ptr<f32>>, tensor<32xf32>, tensor<32xi1>)
// CHECK: "gpu.yield"() : () -> ()
// CHECK: {arg_attrs = [{tt.divisibility = 16 : i32}
// CHECK-SAME: attn.grid = array<i64: 4, 2, 1>
// CHECK-SAME: attn.kernel_args = ["q", "q.stride0", "q.stride1", "q.stride2", "k",
// CHECK-SAME: "out", "out.stride0", "out.stride1", "out.stride2", "lse", "lse.stride0", "lse.stride1"]
// CHECK-SAME: attn.tables = []
// CHECK-SAME: sym_name = "causal", sym_visibility = "public"

// What Triton parses: the terminators renamed.
// TTIR-LABEL: "tt.func"
// TTIR: "tt.reduce.return"(%{{.*}}) : (f32) -> ()
// TTIR: "tt.return"() : () -> ()
// TTIR-NOT: gpu.yield

// General layout: every stride is an i64 argument, no hints.
// GENERAL-LABEL: "tt.func"
// GENERAL: ^bb0(%arg0: !tt.ptr<bf16>, %arg1: i64, %arg2: i64, %arg3: i64, %arg4: i64, %arg5: !tt.ptr<bf16>
// GENERAL: arg_attrs = [{}, {}, {}
// GENERAL-SAME: attn.assume_aligned = false

// UPSTREAM-COUNT-2: "tt.func"

// ERR: error: attn-lower-to-triton needs an L1 kernel (a func.func with attn.grid); run attn-tile first
func.func @causal(%q: tensor<1x2x100x16xbf16>, %k: tensor<1x2x100x16xbf16>, %v: tensor<1x2x100x16xbf16>) -> (tensor<1x2x100x16xbf16>, tensor<1x2x100xf32>) {
  %s = "attn.score"(%q, %k) {scale = 0.25 : f32} : (tensor<1x2x100x16xbf16>, tensor<1x2x100x16xbf16>) -> tensor<1x2x100x100xf32>
  %m = "attn.mask"() ({
  ^bb0(%b: index, %h: index, %i: index, %j: index):
    %c = arith.cmpi sge, %i, %j : index
    "gpu.yield"(%c) : (i1) -> ()
  }) : () -> tensor<1x2x100x100xi1>
  %p, %lse = "attn.normalize"(%s, %m) ({}, {}, {}) {kind = "softmax", operandSegmentSizes = array<i32: 1, 1>, resultSegmentSizes = array<i32: 1, 1>} : (tensor<1x2x100x100xf32>, tensor<1x2x100x100xi1>) -> (tensor<1x2x100x100xf32>, tensor<1x2x100xf32>)
  %o = "attn.aggregate"(%p, %v) : (tensor<1x2x100x100xf32>, tensor<1x2x100x16xbf16>) -> tensor<1x2x100x16xbf16>
  return %o, %lse : tensor<1x2x100x16xbf16>, tensor<1x2x100xf32>
}

// -----

// Head dim 80 is padded to 128 inside the kernel: the loads and the store mask columns >= 80;
// a captured tensor (ALiBi slopes, indexed by the head) becomes a pointer argument read by a
// gather, with no stride argument: the aligned variant assumes a closure tensor's last stride is
// 1; the gather needs no bounds mask, as the head (program id 1 of a grid of 4) is inside the
// slopes; GQA maps head h to KV head h / 2.
// CHECK-LABEL: "tt.func"
// CHECK: ^bb0(%{{.*}}: !tt.ptr<f16>, {{.*}}, %[[SLOPES:arg[0-9]+]]: !tt.ptr<f32>, %{{.*}}: !tt.ptr<f16>
// CHECK: "arith.cmpi"({{.*}}) <{predicate = 2 : i64}> : (tensor<1x128xi32>, tensor<1x128xi32>)
// CHECK: "arith.divui"
// CHECK: "tt.load"({{.*}}) -> tensor<32x128xf16>
// CHECK: "scf.for"
// CHECK: "tt.dot"({{.*}} : (tensor<32x128xf16>, tensor<128x32xf16>, tensor<32x32xf32>) -> tensor<32x32xf32>
// CHECK: "tt.addptr"(%[[SLOPES]], %{{.*}}) : (!tt.ptr<f32>, i64) -> !tt.ptr<f32>
// CHECK: "tt.load"(%{{.*}}) {{.*}} : (!tt.ptr<f32>) -> f32
// CHECK: "tt.store"({{.*}} : (tensor<32x128x!tt.ptr<f16>>, tensor<32x128xf16>, tensor<32x128xi1>)
// CHECK: attn.kernel_args = ["q", "q.stride0", "q.stride1", "q.stride2", "k", "k.stride0", "k.stride1", "k.stride2", "v", "v.stride0", "v.stride1", "v.stride2", "c0", "out",
func.func @alibi_gqa(%q: tensor<1x4x64x80xf16>, %k: tensor<1x2x64x80xf16>, %v: tensor<1x2x64x80xf16>, %slopes: tensor<4xf32>) -> (tensor<1x4x64x80xf16>, tensor<1x4x64xf32>) {
  %s = "attn.score"(%q, %k) {scale = 0.125 : f32} : (tensor<1x4x64x80xf16>, tensor<1x2x64x80xf16>) -> tensor<1x4x64x64xf32>
  %m = "attn.score_mod"(%s) ({
  ^bb0(%x: f32, %b: index, %h: index, %i: index, %j: index):
    %slope = tensor.extract %slopes[%h] : tensor<4xf32>
    %d = arith.subi %j, %i : index
    %di = arith.index_cast %d : index to i64
    %df = arith.sitofp %di : i64 to f32
    %bias = arith.mulf %slope, %df : f32
    %y = arith.addf %x, %bias : f32
    "gpu.yield"(%y) : (f32) -> ()
  }) : (tensor<1x4x64x64xf32>) -> tensor<1x4x64x64xf32>
  %p, %lse = "attn.normalize"(%m) ({}, {}, {}) {kind = "softmax", operandSegmentSizes = array<i32: 1, 0>, resultSegmentSizes = array<i32: 1, 1>} : (tensor<1x4x64x64xf32>) -> (tensor<1x4x64x64xf32>, tensor<1x4x64xf32>)
  %o = "attn.aggregate"(%p, %v) : (tensor<1x4x64x64xf32>, tensor<1x2x64x80xf16>) -> tensor<1x4x64x80xf16>
  return %o, %lse : tensor<1x4x64x80xf16>, tensor<1x4x64xf32>
}
