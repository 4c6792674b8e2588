// Dialect rules: each case is one module; the expected diagnostics sit next to the bad op.
// RUN: ae-opt %s --split-input-file --verify-diagnostics

func.func @wrong_rank(%q: tensor<4x8x16xf32>, %k: tensor<2x4x8x16xf32>) {
  // expected-error @+1 {{'attn.score' op q must have rank 4, got tensor<4x8x16xf32>}}
  %s = "attn.score"(%q, %k) {scale = 0.25 : f32} : (tensor<4x8x16xf32>, tensor<2x4x8x16xf32>) -> tensor<2x4x8x8xf32>
  return
}

// -----

func.func @batch_mismatch(%q: tensor<2x4x8x16xf32>, %k: tensor<3x4x8x16xf32>) {
  %s = "attn.score"(%q, %k) {scale = 0.25 : f32} : (tensor<2x4x8x16xf32>, tensor<3x4x8x16xf32>) -> tensor<2x4x8x8xf32> // expected-error {{q and k batch sizes differ (2 vs 3)}}
  return
}

// -----

func.func @gqa_not_divisible(%q: tensor<2x4x8x16xf32>, %k: tensor<2x3x8x16xf32>) {
  // expected-error @below {{query heads (4) must be a multiple of k heads (3)}}
  %s = "attn.score"(%q, %k) {scale = 0.25 : f32} : (tensor<2x4x8x16xf32>, tensor<2x3x8x16xf32>) -> tensor<2x4x8x8xf32>
  return
}

// -----

func.func @gqa_aggregate(%p: tensor<2x4x8x8xf32>, %v: tensor<2x3x8x16xf32>) {
  %o = "attn.aggregate"(%p, %v) : (tensor<2x4x8x8xf32>, tensor<2x3x8x16xf32>) -> tensor<2x4x8x16xf32>
  // expected-error @above {{query heads (4) must be a multiple of v heads (3)}}
  return
}

// -----

func.func @kv_len_per_batch_entry(%n: tensor<3xi32>) {
  // expected-error @+1 {{kv_len must have shape [2] (one length per batch entry), got [3]}}
  %m = "attn.mask"(%n) ({
  ^bb0(%b: index, %h: index, %i: index, %j: index):
    %c = arith.constant true
    "gpu.yield"(%c) : (i1) -> ()
  }) : (tensor<3xi32>) -> tensor<2x4x8x8xi1>
  return
}

// -----

func.func @kv_len_is_i32(%n: tensor<2xi64>) {
  // expected-error @+1 {{kv_len must have element type i32}}
  %m = "attn.mask"(%n) ({
  ^bb0(%b: index, %h: index, %i: index, %j: index):
    %c = arith.constant true
    "gpu.yield"(%c) : (i1) -> ()
  }) : (tensor<2xi64>) -> tensor<2x4x8x8xi1>
  return
}

// -----

func.func @gather_pages_shape(%p: tensor<9x2x64x16xbf16>, %t: tensor<2x4xi32>) {
  // expected-error @+1 {{result must have shape [2, 2, 256, 16] (batch, heads, table width x page size, head dim), got [2, 2, 200, 16]}}
  %k = "attn.gather_pages"(%p, %t) : (tensor<9x2x64x16xbf16>, tensor<2x4xi32>) -> tensor<2x2x200x16xbf16>
  return
}

// -----

func.func @mask_region_signature() {
  // expected-error @+1 {{mask region must take (index, index, index, index), got (index, index, index)}}
  %m = "attn.mask"() ({
  ^bb0(%b: index, %i: index, %j: index):
    %c = arith.cmpi sge, %i, %j : index
    "gpu.yield"(%c) : (i1) -> ()
  }) : () -> tensor<2x4x8x8xi1>
  return
}

// -----

func.func @q_mod_signature(%q: tensor<1x2x64x16xf32>, %k: tensor<1x2x64x16xf32>, %v: tensor<1x2x64x8xf32>) {
  // expected-error @+1 {{q_mod region must take (f32, index, index, index, index), got (f32, index, index, index, i32)}}
  %o, %st = "attn.linear_recurrence"(%q, %k, %v) ({
  ^bb0(%x: f32, %b: index, %h: index, %t: index, %d: i32):
    "gpu.yield"(%x) : (f32) -> ()
  }, {}, {}) {decay = "none", scale = 0.25 : f32, normalize = false, chunk_size = 64 : i64, operandSegmentSizes = array<i32: 1, 1, 1, 0, 0, 0>} : (tensor<1x2x64x16xf32>, tensor<1x2x64x16xf32>, tensor<1x2x64x8xf32>) -> (tensor<1x2x64x8xf32>, tensor<1x2x16x8xf32>)
  return
}

// -----

func.func @wrong_yield_type(%s: tensor<2x4x8x8xf32>) {
  // expected-error @+1 {{score_mod region must yield one f32, got (i1)}}
  %sm = "attn.score_mod"(%s) ({
  ^bb0(%x: f32, %b: index, %h: index, %i: index, %j: index):
    %c = arith.cmpi sge, %i, %j : index
    "gpu.yield"(%c) : (i1) -> ()
  }) : (tensor<2x4x8x8xf32>) -> tensor<2x4x8x8xf32>
  return
}

// -----

func.func @unknown_normalize_kind(%s: tensor<2x4x8x8xf32>) {
  // expected-error @+1 {{unknown normalize kind 'softmin'}}
  %p = "attn.normalize"(%s) ({}, {}, {}) {kind = "softmin", operandSegmentSizes = array<i32: 1, 0>, resultSegmentSizes = array<i32: 1, 0>} : (tensor<2x4x8x8xf32>) -> tensor<2x4x8x8xf32>
  return
}

// -----

func.func @lse_without_softmax(%s: tensor<2x4x8x8xf32>) {
  // expected-error @+1 {{only softmax has a logsumexp result, not 'sigmoid'}}
  %p, %lse = "attn.normalize"(%s) ({}, {}, {}) {kind = "sigmoid", operandSegmentSizes = array<i32: 1, 0>, resultSegmentSizes = array<i32: 1, 1>} : (tensor<2x4x8x8xf32>) -> (tensor<2x4x8x8xf32>, tensor<2x4x8xf32>)
  return
}

// -----

func.func @value_decay_shape(%q: tensor<1x2x64x16xf32>, %k: tensor<1x2x64x16xf32>, %v: tensor<1x2x64x8xf32>, %g: tensor<1x2x64x16xf32>) {
  // expected-error @+1 {{g for decay 'token_value_dim' must have shape [1, 2, 64, 8], got [1, 2, 64, 16]}}
  %o, %st = "attn.linear_recurrence"(%q, %k, %v, %g) ({}, {}, {}) {decay = "token_value_dim", scale = 0.25 : f32, normalize = false, chunk_size = 64 : i64, operandSegmentSizes = array<i32: 1, 1, 1, 1, 0, 0>} : (tensor<1x2x64x16xf32>, tensor<1x2x64x16xf32>, tensor<1x2x64x8xf32>, tensor<1x2x64x16xf32>) -> (tensor<1x2x64x8xf32>, tensor<1x2x16x8xf32>)
  return
}

// -----

func.func @value_decay_normalized(%q: tensor<1x2x64x16xf32>, %k: tensor<1x2x64x16xf32>, %v: tensor<1x2x64x8xf32>, %g: tensor<1x2x64x8xf32>) {
  // expected-error @+1 {{decay 'token_value_dim' does not take normalize = true}}
  %o, %st = "attn.linear_recurrence"(%q, %k, %v, %g) ({}, {}, {}) {decay = "token_value_dim", scale = 0.25 : f32, normalize = true, chunk_size = 64 : i64, operandSegmentSizes = array<i32: 1, 1, 1, 1, 0, 0>} : (tensor<1x2x64x16xf32>, tensor<1x2x64x16xf32>, tensor<1x2x64x8xf32>, tensor<1x2x64x8xf32>) -> (tensor<1x2x64x8xf32>, tensor<1x2x16x8xf32>)
  return
}

// -----

func.func @decay_shape(%q: tensor<1x2x64x16xf32>, %k: tensor<1x2x64x16xf32>, %v: tensor<1x2x64x8xf32>, %g: tensor<1x2xf32>) {
  // expected-error @+1 {{g for decay 'token' must have shape [1, 2, 64], got [1, 2]}}
  %o, %st = "attn.linear_recurrence"(%q, %k, %v, %g) ({}, {}, {}) {decay = "token", scale = 0.25 : f32, normalize = false, chunk_size = 64 : i64, operandSegmentSizes = array<i32: 1, 1, 1, 1, 0, 0>} : (tensor<1x2x64x16xf32>, tensor<1x2x64x16xf32>, tensor<1x2x64x8xf32>, tensor<1x2xf32>) -> (tensor<1x2x64x8xf32>, tensor<1x2x16x8xf32>)
  return
}

// -----

// IRDL's own verifier runs while parsing.
func.func @operand_count(%q: tensor<2x4x8x16xf32>) {
  // expected-error @+1 {{expects exactly 2 operands, but got 1}}
  %s = "attn.score"(%q) {scale = 0.25 : f32} : (tensor<2x4x8x16xf32>) -> tensor<2x4x8x8xf32>
  return
}

// -----

// A chunk that verifies prints normally even among failing ones.
func.func @valid(%q: tensor<2x4x8x16xf32>, %k: tensor<2x4x8x16xf32>) -> tensor<2x4x8x8xf32> {
  %s = "attn.score"(%q, %k) {scale = 0.25 : f32} : (tensor<2x4x8x16xf32>, tensor<2x4x8x16xf32>) -> tensor<2x4x8x8xf32>
  return %s : tensor<2x4x8x8xf32>
}

// -----

// q, k, v, g, initial_state and the output may be f64 (the reference executor's); not integers.
func.func @linear_integer_q(%q: tensor<1x2x8x4xi32>, %k: tensor<1x2x8x4xf64>, %v: tensor<1x2x8x3xf64>) {
  // expected-error @+1 {{q must have element type f16 or bf16 or f32 or f64, got tensor<1x2x8x4xi32>}}
  %o, %st = "attn.linear_recurrence"(%q, %k, %v) ({}, {}, {}) {decay = "none", scale = 0.5 : f32, normalize = false, chunk_size = 16 : i64, operandSegmentSizes = array<i32: 1, 1, 1, 0, 0, 0>} : (tensor<1x2x8x4xi32>, tensor<1x2x8x4xf64>, tensor<1x2x8x3xf64>) -> (tensor<1x2x8x3xf64>, tensor<1x2x4x3xf32>)
  return
}

// -----

// The final state is f32 whatever q's type.
func.func @linear_f64_final_state(%q: tensor<1x2x8x4xf64>, %k: tensor<1x2x8x4xf64>, %v: tensor<1x2x8x3xf64>) {
  // expected-error @+1 {{final_state must have element type f32, got tensor<1x2x4x3xf64>}}
  %o, %st = "attn.linear_recurrence"(%q, %k, %v) ({}, {}, {}) {decay = "none", scale = 0.5 : f32, normalize = false, chunk_size = 16 : i64, operandSegmentSizes = array<i32: 1, 1, 1, 0, 0, 0>} : (tensor<1x2x8x4xf64>, tensor<1x2x8x4xf64>, tensor<1x2x8x3xf64>) -> (tensor<1x2x8x3xf64>, tensor<1x2x4x3xf64>)
  return
}

// -----

// A linear recurrence's lengths hold one i32 per batch entry.
func.func @linear_lengths_shape(%q: tensor<2x2x8x4xf32>, %k: tensor<2x2x8x4xf32>, %v: tensor<2x2x8x3xf32>, %n: tensor<3xi32>) {
  // expected-error @+1 {{lengths must have shape [2] (one length per batch entry), got [3]}}
  %o, %st = "attn.linear_recurrence"(%q, %k, %v, %n) ({}, {}, {}) {decay = "none", scale = 0.5 : f32, normalize = false, chunk_size = 16 : i64, operandSegmentSizes = array<i32: 1, 1, 1, 0, 0, 1>} : (tensor<2x2x8x4xf32>, tensor<2x2x8x4xf32>, tensor<2x2x8x3xf32>, tensor<3xi32>) -> (tensor<2x2x8x3xf32>, tensor<2x2x4x3xf32>)
  return
}

// -----

// Per-token vectors ([1, H, T], a linear recurrence's g) unpack to [S, H, L].
func.func @unpack_vector_heads(%g: tensor<1x2x10xf32>, %cu: tensor<3xi32>) {
  // expected-error @+1 {{view must be [2, 2, L] of f32 (sequences, heads, longest sequence)}}
  %v = "attn.unpack_sequences"(%g, %cu) : (tensor<1x2x10xf32>, tensor<3xi32>) -> tensor<2x3x8xf32>
  return
}

// -----

// A packed tensor may take any size in its rows alone (one module serves every total).
func.func @unpack_any_heads(%q: tensor<1x?x10x16xf32>, %cu: tensor<3xi32>) {
  // expected-error @+1 {{packed must have a static shape but for its rows (dimension 2), got tensor<1x?x10x16xf32>}}
  %v = "attn.unpack_sequences"(%q, %cu) : (tensor<1x?x10x16xf32>, tensor<3xi32>) -> tensor<2x2x8x16xf32>
  return
}
