// Linear attention on packed sequences: q, k, v and the per-token g are attn.unpack_sequences
// views of packed [1, H, T(, D)] tensors (4 sequences in 100 rows, offsets %cu), lengths %n says
// how many tokens each sequence has, and the output goes back through attn.pack_sequences.
// attn-chunk-recurrence runs a program per (sequence, head); it reads its length once (clamped
// into the view's 64 rows) and its sequence's packed rows [lo, hi) from the offsets, walks only
// ceil(end / C) chunks, loads rows lo + t0 .. of the packed tensors in place (zero from `end` on,
// so nothing past the sequence enters the state), and writes its output rows straight into the
// packed output at lo + t0. The state stays per sequence ([4, H, Dk, Dv]).
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-chunk-recurrence,cse)' --no-mlir-print-op-generic | FileCheck %s
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-chunk-recurrence{split=true},cse)' --no-mlir-print-op-generic | FileCheck %s --check-prefix=SPLIT

// CHECK-LABEL: func.func @packed(
// CHECK-SAME: %[[Q:[a-z0-9]+]]: tensor<1x2x100x16xbf16>, %{{.*}}: tensor<1x2x100x16xbf16>, %{{.*}}: tensor<1x2x100x16xbf16>, %[[G:[a-z0-9]+]]: tensor<1x2x100xf32>, %[[N:[a-z0-9]+]]: tensor<4xi32>, %[[CU:[a-z0-9]+]]: tensor<5xi32>, %[[OUT:[a-z0-9]+]]: tensor<1x2x100x16xbf16>, %[[STATE:[a-z0-9]+]]: tensor<4x2x16x16xf32>)
// CHECK-SAME: attn.grid = array<i64: 4, 2, 1>
// CHECK-NOT: attn.unpack_sequences
// CHECK: %[[S:.*]] = "attn.program_id"() {axis = 0 : i64}
// CHECK: %[[H:.*]] = "attn.program_id"() {axis = 1 : i64}
// CHECK: %[[LEN:.*]] = tensor.extract %[[N]][%[[S]]] : tensor<4xi32>
// CHECK: %[[LEN_I:.*]] = arith.index_cast %[[LEN]]
// CHECK: %[[LEN_POS:.*]] = arith.maxsi %[[LEN_I]], %c0
// CHECK: %[[LEN_CUT:.*]] = arith.minsi %[[LEN_POS]], %c64
// CHECK: %[[LO_RAW:.*]] = tensor.extract %[[CU]][%[[S]]] : tensor<5xi32>
// CHECK: %[[LO_I:.*]] = arith.index_cast %[[LO_RAW]]
// CHECK: %[[LO_POS:.*]] = arith.maxsi %[[LO_I]], %c0
// CHECK: %[[LO:.*]] = arith.minsi %[[LO_POS]], %c100
// CHECK: %[[SPAN:.*]] = arith.subi %{{.*}}, %[[LO]] : index
// CHECK: %[[END:.*]] = arith.minsi %[[LEN_CUT]], %[[SPAN]] : index
// Only the chunks holding the sequence's tokens are walked.
// CHECK: %[[CHUNKS:.*]] = arith.ceildivsi %[[END]], %c32 : index
// CHECK: scf.for %[[IT:.*]] = %c0 to %[[CHUNKS]] step %c1 iter_args(%{{.*}} = %{{.*}}, %[[ACC:.*]] = %[[OUT]])
// CHECK: %[[T0:.*]] = arith.muli %[[IT]], %c32 : index
// CHECK: %[[ROW0:.*]] = arith.addi %[[LO]], %[[T0]] : index
// CHECK: %[[STOP:.*]] = arith.addi %[[LO]], %[[END]] : index
// CHECK: %[[LEFT:.*]] = arith.subi %[[STOP]], %[[ROW0]] : index
// CHECK: tensor.extract_slice %[[Q]][%c0, %[[H]], %{{.*}}, 0] [1, 1, %{{.*}}, 16]
// CHECK: tensor.pad
// CHECK: tensor.extract_slice %[[G]][%c0, %[[H]], %{{.*}}] [1, 1, %{{.*}}]
// CHECK: tensor.insert_slice %{{.*}} into %[[ACC]][%c0, %[[H]], %{{.*}}, 0] [1, 1, %{{.*}}, 16]
// CHECK: scf.yield
// CHECK: tensor.insert_slice %{{.*}} into %[[STATE]][%[[S]], %[[H]], 0, 0] [1, 1, 16, 16]

// The split form: the decay and chunk-state kernels keep per-sequence workspaces; the
// chunk-parallel kernels' programs for chunks past a sequence's end skip the chunk (a loop of
// one trip, or none). A cumulative-decay program walks up to four chunks: both of the view's.
// SPLIT: func.func @packed_decays({{.*}} attn.grid = array<i64: 4, 2, 1>
// SPLIT: %[[GROUP:.*]] = "attn.program_id"() {axis = 2 : i64}
// SPLIT: %[[FIRST:.*]] = arith.muli %[[GROUP]], %c4 : index
// SPLIT: %[[LEFT:.*]] = arith.subi %c2, %[[FIRST]] : index
// SPLIT: %[[WALK:.*]] = arith.minsi %c4, %[[LEFT]] : index
// SPLIT: scf.for %[[J:.*]] = %c0 to %[[WALK]] step %c1
// SPLIT: %[[C:.*]] = arith.addi %[[FIRST]], %[[J]] : index
// SPLIT: %[[T0:.*]] = arith.muli %[[C]], %c32 : index
// SPLIT: %[[IN:.*]] = arith.cmpi slt, %[[T0]], %[[END:.*]] : index
// SPLIT: %[[TRIPS:.*]] = arith.select %[[IN]], %c1, %c0 : index
// SPLIT: scf.for %{{.*}} = %c0 to %[[TRIPS]] step %c1
// SPLIT: func.func @packed_states(
// SPLIT: arith.ceildivsi
// SPLIT: scf.for
// The output kernel loads its chunk's G from the decays' workspace w1 (packed rows, 228 of
// them) instead of summing g again.
// SPLIT: func.func @packed({{.*}}%[[OUT:[a-z0-9]+]]: tensor<1x2x100x16xbf16>) -> tensor<1x2x100x16xbf16> attributes {attn.arg_roles = ["q", "k", "v", "c0", "c1", "c2", "w1", "w0", "out"]{{.*}}attn.grid = array<i64: 4, 2, 2>
// SPLIT: %[[OTRIPS:.*]] = arith.select %{{.*}}, %c1, %c0 : index
// SPLIT: scf.for %{{.*}} = %c0 to %[[OTRIPS]] step %c1 iter_args(%[[ACC:.*]] = %[[OUT]])
// SPLIT: tensor.extract_slice %{{.*}}[%c0, %{{.*}}, %{{.*}}] [1, 1, %{{.*}}] [1, 1, 1] : tensor<1x2x228xf32> to tensor<?xf32>
// SPLIT-NOT: linalg.reduce
// SPLIT: tensor.insert_slice %{{.*}} into %[[ACC]][%c0, %{{.*}}, %{{.*}}, 0] [1, 1, %{{.*}}, 16]
func.func @packed(%q: tensor<1x2x100x16xbf16>, %k: tensor<1x2x100x16xbf16>, %v: tensor<1x2x100x16xbf16>, %g: tensor<1x2x100xf32>, %n: tensor<4xi32>, %cu: tensor<5xi32>) -> (tensor<1x2x100x16xbf16>, tensor<4x2x16x16xf32>) {
  %ql = "attn.unpack_sequences"(%q, %cu) : (tensor<1x2x100x16xbf16>, tensor<5xi32>) -> tensor<4x2x64x16xbf16>
  %kl = "attn.unpack_sequences"(%k, %cu) : (tensor<1x2x100x16xbf16>, tensor<5xi32>) -> tensor<4x2x64x16xbf16>
  %vl = "attn.unpack_sequences"(%v, %cu) : (tensor<1x2x100x16xbf16>, tensor<5xi32>) -> tensor<4x2x64x16xbf16>
  %gl = "attn.unpack_sequences"(%g, %cu) : (tensor<1x2x100xf32>, tensor<5xi32>) -> tensor<4x2x64xf32>
  %o, %st = "attn.linear_recurrence"(%ql, %kl, %vl, %gl, %n) ({}, {}, {}) {decay = "token", scale = 0.25 : f32, normalize = false, chunk_size = 32 : i64, operandSegmentSizes = array<i32: 1, 1, 1, 1, 0, 1>} : (tensor<4x2x64x16xbf16>, tensor<4x2x64x16xbf16>, tensor<4x2x64x16xbf16>, tensor<4x2x64xf32>, tensor<4xi32>) -> (tensor<4x2x64x16xbf16>, tensor<4x2x16x16xf32>)
  %op = "attn.pack_sequences"(%o, %cu) : (tensor<4x2x64x16xbf16>, tensor<5xi32>) -> tensor<1x2x100x16xbf16>
  return %op, %st : tensor<1x2x100x16xbf16>, tensor<4x2x16x16xf32>
}
