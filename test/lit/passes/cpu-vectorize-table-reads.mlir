// attn-cpu-vectorize runs an op that reads a tensor's elements one row at a time, and writes its
// index subtractions whose subtrahend does not read the innermost loop's index as additions:
// upstream's vectorizer makes every read on a vector of several rows a gather, and on one row
// takes a read as contiguous only where its index is built from the innermost loop's index by
// additions. So a relative-position table read at kv_idx - q_idx + c (the composed relative
// bias, T5's buckets) becomes one contiguous load of 64 keys per row, and a read at the head
// alone (ALiBi's slope) a broadcast of one element; before, both were 4 x 64-lane gathers.
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-cpu-grid-loops,canonicalize,cse,attn-cpu-vectorize)' --no-mlir-print-op-generic | FileCheck %s --implicit-check-not=vector.gather

// CHECK-LABEL: func.func @bias(
// CHECK-SAME: %[[TABLE:[a-z0-9]+]]: tensor<2x127xf32>, %[[SLOPES:[a-z0-9]+]]: tensor<2xf32>
// CHECK: scf.for %[[ROW:[a-z0-9]+]] = %c0 to %c64 step %c1
// CHECK: arith.subi %c0, %[[ROW]] : index
// CHECK: vector.transfer_read %[[TABLE]][%{{.*}}, %{{.*}}], %{{.*}} {in_bounds = [true, true]} : tensor<2x127xf32>, vector<1x64xf32>
// CHECK: scf.for %{{.*}} = %c0 to %c64 step %c1
// CHECK: %[[SLOPE:.*]] = tensor.extract %[[SLOPES]][%{{.*}}] : tensor<2xf32>
// CHECK: vector.broadcast %[[SLOPE]] : f32 to vector<1x64xf32>
// CHECK-LABEL: func.func @scores(
// CHECK: vector.transfer_read {{.*}} : tensor<64x64xf32>, vector<4x64xf32>
#tile = affine_map<(d0, d1) -> (d0, d1)>
func.func @bias(%s: tensor<64x64xf32>, %table: tensor<2x127xf32>, %slopes: tensor<2xf32>, %out: tensor<64x64xf32>, %out2: tensor<64x64xf32>) -> (tensor<64x64xf32>, tensor<64x64xf32>) attributes {attn.grid = array<i64: 2>} {
  %h = "attn.program_id"() {axis = 0 : i64} : () -> index
  %relative = linalg.generic {indexing_maps = [#tile, #tile], iterator_types = ["parallel", "parallel"]} ins(%s : tensor<64x64xf32>) outs(%out : tensor<64x64xf32>) {
  ^bb0(%x: f32, %o: f32):
    %i = linalg.index 0 : index
    %j = linalg.index 1 : index
    %d = arith.subi %j, %i : index
    %c63 = arith.constant 63 : index
    %at = arith.addi %d, %c63 : index
    %b = tensor.extract %table[%h, %at] : tensor<2x127xf32>
    %y = arith.addf %x, %b : f32
    linalg.yield %y : f32
  } -> tensor<64x64xf32>
  %alibi = linalg.generic {indexing_maps = [#tile, #tile], iterator_types = ["parallel", "parallel"]} ins(%s : tensor<64x64xf32>) outs(%out2 : tensor<64x64xf32>) {
  ^bb0(%x: f32, %o: f32):
    %slope = tensor.extract %slopes[%h] : tensor<2xf32>
    %y = arith.mulf %x, %slope : f32
    linalg.yield %y : f32
  } -> tensor<64x64xf32>
  return %relative, %alibi : tensor<64x64xf32>, tensor<64x64xf32>
}

func.func @scores(%s: tensor<64x64xf32>, %out: tensor<64x64xf32>) -> tensor<64x64xf32> attributes {attn.grid = array<i64: 1>} {
  %r = linalg.generic {indexing_maps = [#tile, #tile], iterator_types = ["parallel", "parallel"]} ins(%s : tensor<64x64xf32>) outs(%out : tensor<64x64xf32>) {
  ^bb0(%x: f32, %o: f32):
    %y = arith.mulf %x, %x : f32
    linalg.yield %y : f32
  } -> tensor<64x64xf32>
  return %r : tensor<64x64xf32>
}
