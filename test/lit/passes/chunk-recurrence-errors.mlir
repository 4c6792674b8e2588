// attn-chunk-recurrence reads packed sequences in place only with each sequence's length (the
// view's rows past a sequence are not its tokens) and a packed output; it says so at the op.
// RUN: ae-opt %s --split-input-file --attn-chunk-recurrence --verify-diagnostics

func.func @packed_without_lengths(%q: tensor<1x2x20x8xf32>, %k: tensor<1x2x20x8xf32>, %v: tensor<1x2x20x8xf32>, %cu: tensor<3xi32>) -> (tensor<1x2x20x8xf32>, tensor<2x2x8x8xf32>) {
  %ql = "attn.unpack_sequences"(%q, %cu) : (tensor<1x2x20x8xf32>, tensor<3xi32>) -> tensor<2x2x16x8xf32>
  %kl = "attn.unpack_sequences"(%k, %cu) : (tensor<1x2x20x8xf32>, tensor<3xi32>) -> tensor<2x2x16x8xf32>
  %vl = "attn.unpack_sequences"(%v, %cu) : (tensor<1x2x20x8xf32>, tensor<3xi32>) -> tensor<2x2x16x8xf32>
  // expected-error @+1 {{'attn.linear_recurrence' op reads packed sequences in place only when q, k, v (and a per-token g) are attn.unpack_sequences views of one set of offsets, lengths are given and out is packed by attn.pack_sequences with the same offsets}}
  %o, %st = "attn.linear_recurrence"(%ql, %kl, %vl) ({}, {}, {}) {decay = "none", scale = 0.25 : f32, normalize = false, chunk_size = 16 : i64, operandSegmentSizes = array<i32: 1, 1, 1, 0, 0, 0>} : (tensor<2x2x16x8xf32>, tensor<2x2x16x8xf32>, tensor<2x2x16x8xf32>) -> (tensor<2x2x16x8xf32>, tensor<2x2x8x8xf32>)
  %op = "attn.pack_sequences"(%o, %cu) : (tensor<2x2x16x8xf32>, tensor<3xi32>) -> tensor<1x2x20x8xf32>
  return %op, %st : tensor<1x2x20x8xf32>, tensor<2x2x8x8xf32>
}

// -----

// The output packed with other offsets than the views': the kernels would write the wrong rows.
func.func @packed_with_other_offsets(%q: tensor<1x2x20x8xf32>, %k: tensor<1x2x20x8xf32>, %v: tensor<1x2x20x8xf32>, %n: tensor<2xi32>, %cu: tensor<3xi32>, %cu2: tensor<3xi32>) -> (tensor<1x2x20x8xf32>, tensor<2x2x8x8xf32>) {
  %ql = "attn.unpack_sequences"(%q, %cu) : (tensor<1x2x20x8xf32>, tensor<3xi32>) -> tensor<2x2x16x8xf32>
  %kl = "attn.unpack_sequences"(%k, %cu) : (tensor<1x2x20x8xf32>, tensor<3xi32>) -> tensor<2x2x16x8xf32>
  %vl = "attn.unpack_sequences"(%v, %cu) : (tensor<1x2x20x8xf32>, tensor<3xi32>) -> tensor<2x2x16x8xf32>
  // expected-error @+1 {{and out is packed by attn.pack_sequences with the same offsets}}
  %o, %st = "attn.linear_recurrence"(%ql, %kl, %vl, %n) ({}, {}, {}) {decay = "none", scale = 0.25 : f32, normalize = false, chunk_size = 16 : i64, operandSegmentSizes = array<i32: 1, 1, 1, 0, 0, 1>} : (tensor<2x2x16x8xf32>, tensor<2x2x16x8xf32>, tensor<2x2x16x8xf32>, tensor<2xi32>) -> (tensor<2x2x16x8xf32>, tensor<2x2x8x8xf32>)
  %op = "attn.pack_sequences"(%o, %cu2) : (tensor<2x2x16x8xf32>, tensor<3xi32>) -> tensor<1x2x20x8xf32>
  return %op, %st : tensor<1x2x20x8xf32>, tensor<2x2x8x8xf32>
}

// -----

// Other ops than the views stay refused.
func.func @gathered_pages(%p: tensor<4x2x8x8xf32>, %t: tensor<2x2xi32>, %v: tensor<2x2x16x8xf32>) -> (tensor<2x2x16x8xf32>, tensor<2x2x8x8xf32>) {
  // expected-error @+1 {{a function to be chunked must hold only 'attn.linear_recurrence', constants and the views it reads or writes (attn.unpack_sequences, attn.pack_sequences)}}
  %k = "attn.gather_pages"(%p, %t) : (tensor<4x2x8x8xf32>, tensor<2x2xi32>) -> tensor<2x2x16x8xf32>
  %o, %st = "attn.linear_recurrence"(%k, %k, %v) ({}, {}, {}) {decay = "none", scale = 0.25 : f32, normalize = false, chunk_size = 16 : i64, operandSegmentSizes = array<i32: 1, 1, 1, 0, 0, 0>} : (tensor<2x2x16x8xf32>, tensor<2x2x16x8xf32>, tensor<2x2x16x8xf32>) -> (tensor<2x2x16x8xf32>, tensor<2x2x8x8xf32>)
  return %o, %st : tensor<2x2x16x8xf32>, tensor<2x2x8x8xf32>
}
