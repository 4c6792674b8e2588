// A ragged tile whose size is a constant: attn-tile slices it with a dynamic size and pads it to
// the block, and canonicalize folds the size into the slice's type (tensor<8x32xf32>), leaving a
// tensor.pad from a static shape to the block. The lowering loads such a slice, read only by
// pads, once at the padded shape with its rows masked; loaded at the slice's own power of two
// (16 rows), the pad could not widen it ("pads a slice of a function argument only").
// RUN: ae-opt %s --split-input-file --pass-pipeline='builtin.module(canonicalize)' | FileCheck %s --check-prefix=CANON
// RUN: ae-opt %s --split-input-file --pass-pipeline='builtin.module(canonicalize,cse,attn-lower-to-triton)' | FileCheck %s

// The last K tile of L = 40 with 32-row tiles: rows [32, 40), min(40 - 32, 32) = 8 of them.
// CANON-LABEL: sym_name = "tail"
// CANON: %[[KS:.*]] = "tensor.extract_slice"(%arg1) <{{{.*}}static_offsets = array<i64: 0, 0, 32, 0>, static_sizes = array<i64: 1, 1, 8, 32>{{.*}} -> tensor<8x32xf32>
// CANON: "tensor.pad"(%[[KS]], %{{.*}})
// CANON: }) : (tensor<8x32xf32>, index) -> tensor<32x32xf32>
// CHECK-LABEL: "tt.func"
// CHECK: %[[EIGHT:.*]] = "arith.constant"() <{value = 8 : i32}> : () -> i32
// CHECK: %[[BOUND:.*]] = "tt.splat"(%[[EIGHT]]) : (i32) -> tensor<32x1xi32>
// CHECK: %[[ROWS:.*]] = "arith.cmpi"(%{{.*}}, %[[BOUND]]) <{predicate = 2 : i64}> : (tensor<32x1xi32>, tensor<32x1xi32>) -> tensor<32x1xi1>
// CHECK: %[[MASK:.*]] = "tt.broadcast"(%[[ROWS]]) : (tensor<32x1xi1>) -> tensor<32x32xi1>
// CHECK: %[[KT:.*]] = "tt.load"(%{{.*}}, %[[MASK]], %{{.*}}) {{.*}} -> tensor<32x32xf32>
// CHECK: %[[KTT:.*]] = "tt.trans"(%[[KT]])
// CHECK: "tt.dot"(%{{.*}}, %[[KTT]], %{{.*}}) {{.*}} -> tensor<16x32xf32>
// CHECK-NOT: tensor.pad
// CHECK: sym_name = "tail"
func.func @tail(%q: tensor<1x1x16x32xf32>, %k: tensor<1x1x40x32xf32>, %v: tensor<1x1x40x32xf32>, %out: tensor<1x1x16x32xf32>) -> tensor<1x1x16x32xf32> attributes {attn.grid = array<i64: 1, 1, 1>} {
  %c0 = arith.constant 0 : index
  %c32 = arith.constant 32 : index
  %c40 = arith.constant 40 : index
  %zero = arith.constant 0.0 : f32
  %left = arith.subi %c40, %c32 : index
  %rows = arith.minsi %left, %c32 : index
  %high = arith.subi %c32, %rows : index
  %qt = tensor.extract_slice %q[%c0, %c0, 0, 0] [1, 1, 16, 32] [1, 1, 1, 1] : tensor<1x1x16x32xf32> to tensor<16x32xf32>
  %ks = tensor.extract_slice %k[%c0, %c0, %c32, 0] [1, 1, %rows, 32] [1, 1, 1, 1] : tensor<1x1x40x32xf32> to tensor<?x32xf32>
  %kt = tensor.pad %ks low[0, 0] high[%high, 0] {
  ^bb0(%i: index, %j: index):
    tensor.yield %zero : f32
  } : tensor<?x32xf32> to tensor<32x32xf32>
  %e = tensor.empty() : tensor<32x32xf32>
  %ktt = linalg.transpose ins(%kt : tensor<32x32xf32>) outs(%e : tensor<32x32xf32>) permutation = [1, 0]
  %e1 = tensor.empty() : tensor<16x32xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%e1 : tensor<16x32xf32>) -> tensor<16x32xf32>
  %s = linalg.matmul ins(%qt, %ktt : tensor<16x32xf32>, tensor<32x32xf32>) outs(%acc : tensor<16x32xf32>) -> tensor<16x32xf32>
  %o = tensor.insert_slice %s into %out[%c0, %c0, 0, 0] [1, 1, 16, 32] [1, 1, 1, 1] : tensor<16x32xf32> into tensor<1x1x16x32xf32>
  return %o : tensor<1x1x16x32xf32>
}

// -----

// A sequence shorter than the block (Lk = 5, 32-row tiles): the K and V slices are static from
// the start. K, read only by its pad, is loaded once at 32 rows. V is also read unpadded (its
// column sums), so it is loaded where it is sliced, at its own 16 rows, and its pad to 32 rows
// loads it again at that shape.
// CANON-LABEL: sym_name = "short"
// CHECK-LABEL: "tt.func"
// CHECK: %[[QT:.*]] = "tt.load"({{.*}}) {{.*}} -> tensor<32x16xf32>
// CHECK: %[[VS:.*]] = "tt.load"({{.*}}) {{.*}} -> tensor<16x16xf32>
// CHECK: "tt.reduce"(%{{.*}})
// CHECK: %[[KT:.*]] = "tt.load"({{.*}}) {{.*}} -> tensor<32x16xf32>
// CHECK: %[[VT:.*]] = "tt.load"({{.*}}) {{.*}} -> tensor<32x16xf32>
// CHECK-NOT: "tt.load"
// CHECK: %[[KTT:.*]] = "tt.trans"(%[[KT]])
// CHECK: "tt.dot"(%[[QT]], %[[KTT]], %{{.*}}) {{.*}} -> tensor<32x32xf32>
// CHECK: "tt.dot"(%{{.*}}, %[[VT]], %{{.*}}) {{.*}} -> tensor<32x16xf32>
// CHECK-NOT: tensor.pad
// CHECK: sym_name = "short"
func.func @short(%q: tensor<1x1x32x16xf32>, %k: tensor<1x1x5x16xf32>, %v: tensor<1x1x5x16xf32>, %out: tensor<1x1x32x16xf32>, %sums: tensor<1x1x16xf32>) -> (tensor<1x1x32x16xf32>, tensor<1x1x16xf32>) attributes {attn.grid = array<i64: 1, 1, 1>} {
  %c0 = arith.constant 0 : index
  %zero = arith.constant 0.0 : f32
  %qt = tensor.extract_slice %q[%c0, %c0, 0, 0] [1, 1, 32, 16] [1, 1, 1, 1] : tensor<1x1x32x16xf32> to tensor<32x16xf32>
  %vs = tensor.extract_slice %v[%c0, %c0, 0, 0] [1, 1, 5, 16] [1, 1, 1, 1] : tensor<1x1x5x16xf32> to tensor<5x16xf32>
  %e0 = tensor.empty() : tensor<16xf32>
  %init = linalg.fill ins(%zero : f32) outs(%e0 : tensor<16xf32>) -> tensor<16xf32>
  %sum = linalg.reduce ins(%vs : tensor<5x16xf32>) outs(%init : tensor<16xf32>) dimensions = [0]
    (%a: f32, %b: f32) {
      %s = arith.addf %a, %b : f32
      linalg.yield %s : f32
    }
  %ks = tensor.extract_slice %k[%c0, %c0, 0, 0] [1, 1, 5, 16] [1, 1, 1, 1] : tensor<1x1x5x16xf32> to tensor<5x16xf32>
  %kt = tensor.pad %ks low[0, 0] high[27, 0] {
  ^bb0(%i: index, %j: index):
    tensor.yield %zero : f32
  } : tensor<5x16xf32> to tensor<32x16xf32>
  %vt = tensor.pad %vs low[0, 0] high[27, 0] {
  ^bb0(%i: index, %j: index):
    tensor.yield %zero : f32
  } : tensor<5x16xf32> to tensor<32x16xf32>
  %e = tensor.empty() : tensor<16x32xf32>
  %ktt = linalg.transpose ins(%kt : tensor<32x16xf32>) outs(%e : tensor<16x32xf32>) permutation = [1, 0]
  %e1 = tensor.empty() : tensor<32x32xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%e1 : tensor<32x32xf32>) -> tensor<32x32xf32>
  %scores = linalg.matmul ins(%qt, %ktt : tensor<32x16xf32>, tensor<16x32xf32>) outs(%acc : tensor<32x32xf32>) -> tensor<32x32xf32>
  %e2 = tensor.empty() : tensor<32x16xf32>
  %acc2 = linalg.fill ins(%zero : f32) outs(%e2 : tensor<32x16xf32>) -> tensor<32x16xf32>
  %o = linalg.matmul ins(%scores, %vt : tensor<32x32xf32>, tensor<32x16xf32>) outs(%acc2 : tensor<32x16xf32>) -> tensor<32x16xf32>
  %r = tensor.insert_slice %o into %out[%c0, %c0, 0, 0] [1, 1, 32, 16] [1, 1, 1, 1] : tensor<32x16xf32> into tensor<1x1x32x16xf32>
  %r2 = tensor.insert_slice %sum into %sums[%c0, %c0, 0] [1, 1, 16] [1, 1, 1] : tensor<16xf32> into tensor<1x1x16xf32>
  return %r, %r2 : tensor<1x1x32x16xf32>, tensor<1x1x16xf32>
}
