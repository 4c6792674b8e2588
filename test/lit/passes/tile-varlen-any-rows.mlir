// A packed batch of any total row count: the packed tensors' rows are `?`, so one module (and
// one kernel) serves every total of the batches that share its sequence-count and longest-
// sequence buckets. attn-tile clamps the offsets into the rows the packed tensor has at run time
// (tensor.dim) instead of a constant; attn-lower-to-triton passes that size as a kernel argument
// ("q.size2"); the CPU pipeline keeps it in the memref descriptor.
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-fuse-online-softmax,attn-tile{block-m=32 block-n=32},cse)' --no-mlir-print-op-generic | FileCheck %s
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-fuse-online-softmax,attn-tile{block-m=32 block-n=32},attn-lower-to-triton)' | FileCheck %s --check-prefix=TTIR
// RUN: ae-opt %s --pipeline=cpu | FileCheck %s --check-prefix=CPU

// CHECK-LABEL: func.func @packed_any_rows(
// CHECK-SAME: %[[Q:[a-z0-9]+]]: tensor<1x2x?x16xbf16>, %[[K:[a-z0-9]+]]: tensor<1x2x?x16xbf16>, %{{.*}}: tensor<1x2x?x16xbf16>, %{{.*}}: tensor<4xi32>, %[[CU:[a-z0-9]+]]: tensor<5xi32>, %{{.*}}: tensor<1x2x?x16xbf16>, %{{.*}}: tensor<1x2x?xf32>)
// CHECK: %[[S:.*]] = "attn.program_id"() {axis = 0 : i64}
// CHECK: %[[ROWS:.*]] = tensor.dim %[[Q]], %c2 : tensor<1x2x?x16xbf16>
// CHECK: %[[LO_RAW:.*]] = tensor.extract %[[CU]][%[[S]]] : tensor<5xi32>
// CHECK: %[[LO_I:.*]] = arith.index_cast %[[LO_RAW]]
// CHECK: %[[LO_POS:.*]] = arith.maxsi %[[LO_I]], %c0
// CHECK: %[[LO:.*]] = arith.minsi %[[LO_POS]], %[[ROWS]]
// CHECK: %[[HI_POS:.*]] = arith.maxsi %{{.*}}, %[[LO]]
// CHECK: arith.minsi %[[HI_POS]], %[[ROWS]]
// The keys' spans are clamped into the keys' own rows.
// CHECK: tensor.dim %[[K]], %c2 : tensor<1x2x?x16xbf16>

// Each packed tensor's rows become an i32 argument after its strides: q's (%arg4) clamps the
// query offsets, k's (%arg9) the key offsets.
// TTIR-LABEL: "tt.func"
// TTIR: ^bb0(%arg0: !tt.ptr<bf16>, %arg1: i32, %arg2: i32, %arg3: i32, %arg4: i32, %arg5: !tt.ptr<bf16>, %arg6: i32, %arg7: i32, %arg8: i32, %arg9: i32,
// TTIR: "arith.minsi"(%{{.*}}, %arg4) : (i32, i32) -> i32
// TTIR: "arith.minsi"(%{{.*}}, %arg4) : (i32, i32) -> i32
// TTIR: "arith.minsi"(%{{.*}}, %arg9) : (i32, i32) -> i32
// TTIR: attn.kernel_args = ["q", "q.stride0", "q.stride1", "q.stride2", "q.size2", "k", "k.stride0", "k.stride1", "k.stride2", "k.size2", "v", "v.stride0", "v.stride1", "v.stride2", "v.size2", "c0", "c1", "out", "out.stride0", "out.stride1", "out.stride2", "out.size2", "lse", "lse.stride0", "lse.stride1", "lse.size2"

// The CPU kernel compiles too (its numerics at several totals: test/test_varlen_totals.py).
// CPU: sym_name = "packed_any_rows"
func.func @packed_any_rows(%q: tensor<1x2x?x16xbf16>, %k: tensor<1x2x?x16xbf16>, %v: tensor<1x2x?x16xbf16>, %n: tensor<4xi32>, %cu: tensor<5xi32>) -> (tensor<1x2x?x16xbf16>, tensor<1x2x?xf32>) {
  %ql = "attn.unpack_sequences"(%q, %cu) : (tensor<1x2x?x16xbf16>, tensor<5xi32>) -> tensor<4x2x64x16xbf16>
  %kl = "attn.unpack_sequences"(%k, %cu) : (tensor<1x2x?x16xbf16>, tensor<5xi32>) -> tensor<4x2x64x16xbf16>
  %vl = "attn.unpack_sequences"(%v, %cu) : (tensor<1x2x?x16xbf16>, tensor<5xi32>) -> tensor<4x2x64x16xbf16>
  %s = "attn.score"(%ql, %kl) {scale = 0.25 : f32} : (tensor<4x2x64x16xbf16>, tensor<4x2x64x16xbf16>) -> tensor<4x2x64x64xf32>
  %keep = "attn.mask"(%n) ({
  ^bb0(%b: index, %h: index, %i: index, %j: index):
    %c = arith.cmpi sge, %i, %j : index
    "gpu.yield"(%c) : (i1) -> ()
  }) : (tensor<4xi32>) -> tensor<4x2x64x64xi1>
  %p, %lse = "attn.normalize"(%s, %keep) ({}, {}, {}) {kind = "softmax", operandSegmentSizes = array<i32: 1, 1>, resultSegmentSizes = array<i32: 1, 1>} : (tensor<4x2x64x64xf32>, tensor<4x2x64x64xi1>) -> (tensor<4x2x64x64xf32>, tensor<4x2x64xf32>)
  %o = "attn.aggregate"(%p, %vl) : (tensor<4x2x64x64xf32>, tensor<4x2x64x16xbf16>) -> tensor<4x2x64x16xbf16>
  %op = "attn.pack_sequences"(%o, %cu) : (tensor<4x2x64x16xbf16>, tensor<5xi32>) -> tensor<1x2x?x16xbf16>
  %lp = "attn.pack_sequences"(%lse, %cu) : (tensor<4x2x64xf32>, tensor<5xi32>) -> tensor<1x2x?xf32>
  return %op, %lp : tensor<1x2x?x16xbf16>, tensor<1x2x?xf32>
}
