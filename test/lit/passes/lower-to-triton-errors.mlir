// L1 the Triton lowering cannot express gets a located diagnostic, never a traceback.
// RUN: ae-opt %s --split-input-file --verify-diagnostics --pass-pipeline='builtin.module(attn-lower-to-triton)'

func.func @unsupported(%q: tensor<1x1x16x16xf32>, %k: tensor<1x1x16x16xf32>, %v: tensor<1x1x16x16xf32>, %out: tensor<1x1x16x16xf32>) -> tensor<1x1x16x16xf32> attributes {attn.grid = array<i64: 1, 1, 1>} {
  // expected-error @+1 {{'tensor.cast' op is not supported by the Triton lowering}}
  %any = tensor.cast %q : tensor<1x1x16x16xf32> to tensor<?x1x16x16xf32>
  return %out : tensor<1x1x16x16xf32>
}

// -----

// Reshapes apply to tiles (a packed GQA tile), not to whole arguments.
func.func @reshape(%q: tensor<1x1x16x16xf32>, %k: tensor<1x1x16x16xf32>, %v: tensor<1x1x16x16xf32>, %out: tensor<1x1x16x16xf32>) -> tensor<1x1x16x16xf32> attributes {attn.grid = array<i64: 1, 1, 1>} {
  // expected-error @+1 {{'tensor.collapse_shape' op expects a tile operand, got a whole argument}}
  %flat = tensor.collapse_shape %q [[0, 1, 2, 3]] : tensor<1x1x16x16xf32> into tensor<256xf32>
  return %out : tensor<1x1x16x16xf32>
}

// -----

func.func @odd_reduction(%q: tensor<1x1x16x24xf32>, %k: tensor<1x1x16x24xf32>, %v: tensor<1x1x16x24xf32>, %out: tensor<1x1x16x24xf32>) -> tensor<1x1x16x24xf32> attributes {attn.grid = array<i64: 1, 1, 1>} {
  %c0 = arith.constant 0 : index
  %zero = arith.constant 0.0 : f32
  %tile = tensor.extract_slice %q[%c0, %c0, 0, 0] [1, 1, 16, 24] [1, 1, 1, 1] : tensor<1x1x16x24xf32> to tensor<16x24xf32>
  %e = tensor.empty() : tensor<16xf32>
  %init = linalg.fill ins(%zero : f32) outs(%e : tensor<16xf32>) -> tensor<16xf32>
  // expected-error @+1 {{reduces a dimension of size 24, padded to 32, with 'arith.maxnumf', which has no identity the lowering knows}}
  %sum = linalg.reduce ins(%tile : tensor<16x24xf32>) outs(%init : tensor<16xf32>) dimensions = [1]
    (%a: f32, %b: f32) {
      %s = arith.maxnumf %a, %b : f32
      linalg.yield %s : f32
    }
  return %out : tensor<1x1x16x24xf32>
}

// -----

func.func @stores_into_an_input(%q: tensor<1x1x16x16xf32>, %k: tensor<1x1x16x16xf32>, %v: tensor<1x1x16x16xf32>, %out: tensor<1x1x16x16xf32>) -> tensor<1x1x16x16xf32> attributes {attn.grid = array<i64: 1, 1, 1>} {
  %c0 = arith.constant 0 : index
  %tile = tensor.extract_slice %k[%c0, %c0, 0, 0] [1, 1, 16, 16] [1, 1, 1, 1] : tensor<1x1x16x16xf32> to tensor<16x16xf32>
  // expected-error @+1 {{inserts into a destination argument only}}
  %bad = tensor.insert_slice %tile into %q[%c0, %c0, 0, 0] [1, 1, 16, 16] [1, 1, 1, 1] : tensor<16x16xf32> into tensor<1x1x16x16xf32>
  return %out : tensor<1x1x16x16xf32>
}

// -----

// Only a packed batch's rows may take any size: an L1 kernel over a tensor of any batch size is
// refused.
// expected-error @+1 {{argument 0 (q) must be a statically shaped tensor, got tensor<?x1x16x16xf32> (only a packed batch's rows, dimension 2, may take any size)}}
func.func @any_batch(%q: tensor<?x1x16x16xf32>, %k: tensor<1x1x16x16xf32>, %v: tensor<1x1x16x16xf32>, %out: tensor<1x1x16x16xf32>) -> tensor<1x1x16x16xf32> attributes {attn.grid = array<i64: 1, 1, 1>} {
  return %out : tensor<1x1x16x16xf32>
}
