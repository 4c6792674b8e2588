// Linear attention on a packed batch of any total rows (`?`): the split form's workspaces follow
// the packed rows, so they take any rows too, and each kernel says how the runtime sizes them
// from q's rows T (attn.workspace_rows = {role: [divisor, addend]}): the chunk states w0 hold
// T / 32 + S + 1 chunks, the cumulative decays w1 T + S * 32 rows (S = 4 sequences, C = 32). The
// output kernel stops its G loads at w1's rows as the tensor has them (tensor.dim); the Triton
// lowering passes every such size as an i32 argument ("w1.size2").
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-chunk-recurrence{split=true},cse)' --no-mlir-print-op-generic | FileCheck %s
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-chunk-recurrence{split=true},cse,attn-lower-to-triton)' | FileCheck %s --check-prefix=TTIR

// CHECK: func.func @packed_decays({{.*}}: tensor<1x2x?xf32>) -> tensor<1x2x?xf32> attributes {{{.*}}attn.workspace_rows = {w1 = array<i64: 1, 128>}
// CHECK: func.func @packed_states({{.*}}: tensor<1x2x?xf32>, %{{.*}}: tensor<1x2x?x16x16xbf16>, %{{.*}}: tensor<4x2x16x16xf32>) -> (tensor<1x2x?x16x16xbf16>, tensor<4x2x16x16xf32>) attributes {{{.*}}attn.workspace_rows = {w0 = array<i64: 32, 5>, w1 = array<i64: 1, 128>}
// CHECK: func.func @packed({{.*}}%[[G_CUM:[a-z0-9]+]]: tensor<1x2x?xf32>, %{{.*}}: tensor<1x2x?x16x16xbf16>, %{{.*}}: tensor<1x2x?x16xbf16>) -> tensor<1x2x?x16xbf16>
// CHECK: tensor.dim %[[G_CUM]], %c2 : tensor<1x2x?xf32>

// TTIR-LABEL: "tt.func"
// TTIR: attn.kernel_args = [{{.*}}"w1", "w1.stride0", "w1.stride1", "w1.size2"
func.func @packed(%q: tensor<1x2x?x16xbf16>, %k: tensor<1x2x?x16xbf16>, %v: tensor<1x2x?x16xbf16>, %g: tensor<1x2x?xf32>, %n: tensor<4xi32>, %cu: tensor<5xi32>) -> (tensor<1x2x?x16xbf16>, tensor<4x2x16x16xf32>) {
  %ql = "attn.unpack_sequences"(%q, %cu) : (tensor<1x2x?x16xbf16>, tensor<5xi32>) -> tensor<4x2x64x16xbf16>
  %kl = "attn.unpack_sequences"(%k, %cu) : (tensor<1x2x?x16xbf16>, tensor<5xi32>) -> tensor<4x2x64x16xbf16>
  %vl = "attn.unpack_sequences"(%v, %cu) : (tensor<1x2x?x16xbf16>, tensor<5xi32>) -> tensor<4x2x64x16xbf16>
  %gl = "attn.unpack_sequences"(%g, %cu) : (tensor<1x2x?xf32>, tensor<5xi32>) -> tensor<4x2x64xf32>
  %o, %st = "attn.linear_recurrence"(%ql, %kl, %vl, %gl, %n) ({}, {}, {}) {decay = "token", scale = 0.25 : f32, normalize = false, chunk_size = 32 : i64, operandSegmentSizes = array<i32: 1, 1, 1, 1, 0, 1>} : (tensor<4x2x64x16xbf16>, tensor<4x2x64x16xbf16>, tensor<4x2x64x16xbf16>, tensor<4x2x64xf32>, tensor<4xi32>) -> (tensor<4x2x64x16xbf16>, tensor<4x2x16x16xf32>)
  %op = "attn.pack_sequences"(%o, %cu) : (tensor<4x2x64x16xbf16>, tensor<5xi32>) -> tensor<1x2x?x16xbf16>
  return %op, %st : tensor<1x2x?x16xbf16>, tensor<4x2x16x16xf32>
}
