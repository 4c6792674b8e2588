// Rules of the derivative ops attn-differentiate writes; the diagnostics sit next to the bad op.
// RUN: ae-opt %s --split-input-file --verify-diagnostics

func.func @grad_shape(%s: tensor<1x2x4x4xf32>, %g: tensor<1x2x4x5xf32>) {
  // expected-error @+1 {{'attn.score_mod_grad' op grad shape [1, 2, 4, 5] must equal the scores shape [1, 2, 4, 4]}}
  %d = "attn.score_mod_grad"(%s, %g) ({
  ^bb0(%x: f32, %dy: f32, %b: index, %h: index, %i: index, %j: index):
    "gpu.yield"(%dy) : (f32) -> ()
  }) : (tensor<1x2x4x4xf32>, tensor<1x2x4x5xf32>) -> tensor<1x2x4x4xf32>
  return
}

// -----

func.func @grad_region(%s: tensor<1x2x4x4xf32>, %g: tensor<1x2x4x4xf32>) {
  // expected-error @+1 {{score_mod_grad region must take (f32, f32, index, index, index, index), got (f32, index, index, index, index)}}
  %d = "attn.score_mod_grad"(%s, %g) ({
  ^bb0(%x: f32, %b: index, %h: index, %i: index, %j: index):
    "gpu.yield"(%x) : (f32) -> ()
  }) : (tensor<1x2x4x4xf32>, tensor<1x2x4x4xf32>) -> tensor<1x2x4x4xf32>
  return
}

// -----

func.func @closure_groups(%s: tensor<1x2x4x4xf32>, %g: tensor<1x2x4x4xf32>, %w: tensor<2x7xf32>) {
  // expected-error @+1 {{closure_grad region must yield groups (f32, index, index), one per read, got (f32, index)}}
  %d = "attn.closure_grad"(%s, %g, %w) ({
  ^bb0(%x: f32, %dy: f32, %b: index, %h: index, %i: index, %j: index):
    "gpu.yield"(%dy, %h) : (f32, index) -> ()
  }) : (tensor<1x2x4x4xf32>, tensor<1x2x4x4xf32>, tensor<2x7xf32>) -> tensor<2x7xf32>
  return
}

// -----

func.func @closure_result(%s: tensor<1x2x4x4xf32>, %g: tensor<1x2x4x4xf32>, %w: tensor<2x7xbf16>) {
  // expected-error @+1 {{'attn.closure_grad' op result shape [2, 6] must equal the closure's shape [2, 7]}}
  %d = "attn.closure_grad"(%s, %g, %w) ({
  ^bb0(%x: f32, %dy: f32, %b: index, %h: index, %i: index, %j: index):
    "gpu.yield"(%dy, %h, %j) : (f32, index, index) -> ()
  }) : (tensor<1x2x4x4xf32>, tensor<1x2x4x4xf32>, tensor<2x7xbf16>) -> tensor<2x6xf32>
  return
}

// -----

func.func @online_without_regions(%s: tensor<1x2x4x4xf32>, %dp: tensor<1x2x4x4xf32>) {
  // expected-error @+1 {{'attn.normalize_grad' op prob region must not be empty}}
  %d = "attn.normalize_grad"(%s, %dp) ({}, {}, {}, {}) {kind = "online", stat = "none", operandSegmentSizes = array<i32: 1, 0, 1>} : (tensor<1x2x4x4xf32>, tensor<1x2x4x4xf32>) -> tensor<1x2x4x4xf32>
  return
}

// -----

func.func @stat(%s: tensor<1x2x4x4xf32>, %dp: tensor<1x2x4x4xf32>) {
  // expected-error @+1 {{stat must be 'max' or 'none', got 'sum'}}
  %d = "attn.normalize_grad"(%s, %dp) ({}, {}, {}, {}) {kind = "softmax", stat = "sum", operandSegmentSizes = array<i32: 1, 0, 1>} : (tensor<1x2x4x4xf32>, tensor<1x2x4x4xf32>) -> tensor<1x2x4x4xf32>
  return
}

// -----

func.func @prob_grad_yield(%s: tensor<1x2x4x4xf32>, %dp: tensor<1x2x4x4xf32>) {
  // expected-error @+1 {{prob_grad region must yield (f32, f32), got (f32)}}
  %d = "attn.normalize_grad"(%s, %dp) ({
  ^bb0(%x: f32, %m: f32):
    "gpu.yield"(%x) : (f32) -> ()
  }, {
  ^bb0(%a: f32, %l: f32):
    "gpu.yield"(%a) : (f32) -> ()
  }, {
  ^bb0(%x: f32, %m: f32, %g: f32):
    "gpu.yield"(%g) : (f32) -> ()
  }, {
  ^bb0(%a: f32, %l: f32, %g: f32):
    "gpu.yield"(%g, %g) : (f32, f32) -> ()
  }) {kind = "online", stat = "none", operandSegmentSizes = array<i32: 1, 0, 1>} : (tensor<1x2x4x4xf32>, tensor<1x2x4x4xf32>) -> tensor<1x2x4x4xf32>
  return
}
