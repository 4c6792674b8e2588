// Tiles whose extent is not a power of two are padded in Triton IR; where a computed tile's
// padding lanes would enter a reduction or a dot's contraction, they are first set to the
// reduction's identity (0 for sums) with an arith.select on the column mask (here the one the load
// built: columns < 24).
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-lower-to-triton)' | FileCheck %s

// A row sum over 24 columns (padded to 32) of exp(x): exp(0) = 1 in the padding must not count.
// CHECK-LABEL: "tt.func"
// CHECK: %[[X:.*]] = "tt.load"({{.*}}) -> tensor<16x32xf32>
// CHECK: %[[E:.*]] = "math.exp"(%[[X]])
// CHECK: %[[SAFE:.*]] = "arith.select"(%{{.*}}, %[[E]], %{{.*}}) : (tensor<16x32xi1>, tensor<16x32xf32>, tensor<16x32xf32>)
// CHECK: "tt.reduce"(%[[SAFE]])
// The same before a dot that contracts over the padded 24: exp(q) (16 x 24) @ k (24 x 16).
// CHECK: "arith.select"({{.*}}) : (tensor<16x32xi1>, tensor<16x32xf32>, tensor<16x32xf32>) -> tensor<16x32xf32>
// CHECK: "tt.dot"
func.func @padded(%q: tensor<1x1x16x24xf32>, %k: tensor<1x1x24x16xf32>, %v: tensor<1x1x16x16xf32>, %out: tensor<1x1x16x16xf32>, %sums: tensor<1x1x16xf32>) -> (tensor<1x1x16x16xf32>, tensor<1x1x16xf32>) attributes {attn.grid = array<i64: 1, 1, 1>} {
  %c0 = arith.constant 0 : index
  %zero = arith.constant 0.0 : f32
  %tile = tensor.extract_slice %q[%c0, %c0, 0, 0] [1, 1, 16, 24] [1, 1, 1, 1] : tensor<1x1x16x24xf32> to tensor<16x24xf32>
  %e0 = tensor.empty() : tensor<16x24xf32>
  %exp = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]} ins(%tile : tensor<16x24xf32>) outs(%e0 : tensor<16x24xf32>) {
  ^bb0(%x: f32, %o: f32):
    %y = math.exp %x : f32
    linalg.yield %y : f32
  } -> tensor<16x24xf32>
  %e = tensor.empty() : tensor<16xf32>
  %init = linalg.fill ins(%zero : f32) outs(%e : tensor<16xf32>) -> tensor<16xf32>
  %sum = linalg.reduce ins(%exp : tensor<16x24xf32>) outs(%init : tensor<16xf32>) dimensions = [1]
    (%a: f32, %b: f32) {
      %s = arith.addf %a, %b : f32
      linalg.yield %s : f32
    }
  %kt = tensor.extract_slice %k[%c0, %c0, 0, 0] [1, 1, 24, 16] [1, 1, 1, 1] : tensor<1x1x24x16xf32> to tensor<24x16xf32>
  %e1 = tensor.empty() : tensor<16x16xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%e1 : tensor<16x16xf32>) -> tensor<16x16xf32>
  %prod = linalg.matmul ins(%exp, %kt : tensor<16x24xf32>, tensor<24x16xf32>) outs(%acc : tensor<16x16xf32>) -> tensor<16x16xf32>
  %o = tensor.insert_slice %prod into %out[%c0, %c0, 0, 0] [1, 1, 16, 16] [1, 1, 1, 1] : tensor<16x16xf32> into tensor<1x1x16x16xf32>
  %s2 = tensor.insert_slice %sum into %sums[%c0, %c0, 0] [1, 1, 16] [1, 1, 1] : tensor<16xf32> into tensor<1x1x16xf32>
  return %o, %s2 : tensor<1x1x16x16xf32>, tensor<1x1x16xf32>
}
