// attn-lower-to-cpu takes L1 only: attn ops other than attn.program_id, or a program id outside a
// kernel with attn.grid, are errors at the op.
// RUN: ae-opt %s --split-input-file --attn-lower-to-cpu --verify-diagnostics

func.func @l0(%q: tensor<1x1x4x8xf32>, %k: tensor<1x1x4x8xf32>) -> tensor<1x1x4x4xf32> {
  // expected-error @+1 {{is not L1 input for the CPU lowering; run attn-fuse-online-softmax and attn-tile (or attn-chunk-recurrence) first}}
  %s = "attn.score"(%q, %k) {scale = 0.125 : f32} : (tensor<1x1x4x8xf32>, tensor<1x1x4x8xf32>) -> tensor<1x1x4x4xf32>
  return %s : tensor<1x1x4x4xf32>
}

// -----

func.func @no_grid(%out: tensor<4xindex>) -> tensor<4xindex> {
  // expected-error @+1 {{attn.program_id may appear only in a function with 'attn.grid'}}
  %p = "attn.program_id"() {axis = 0 : i64} : () -> index
  %c0 = arith.constant 0 : index
  %r = tensor.insert %p into %out[%c0] : tensor<4xindex>
  return %r : tensor<4xindex>
}

// -----

func.func @axis(%out: tensor<4xindex>) -> tensor<4xindex> attributes {attn.grid = array<i64: 4>} {
  // expected-error @+1 {{axis 1 is outside the 1-d grid}}
  %p = "attn.program_id"() {axis = 1 : i64} : () -> index
  %r = tensor.insert %p into %out[%p] : tensor<4xindex>
  return %r : tensor<4xindex>
}

// -----

// expected-error @+1 {{result type tensor<4xf32> does not match its destination argument type tensor<4xindex>}}
func.func @not_a_destination(%x: tensor<4xf32>, %out: tensor<4xindex>) -> tensor<4xf32> attributes {attn.grid = array<i64: 4>} {
  return %x : tensor<4xf32>
}
