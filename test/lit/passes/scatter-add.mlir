// attn.scatter_add (L1; attn-tile-backward writes it for the gradients of closure tensors) in
// both lowerings. Three destinations, one index tile pattern each: (head, i - j + 63) varies over
// the whole tile, (head, row) over rows only, (head) over none.
// Triton: one relaxed f32 atomic add (atomic_rmw_op 5, sem 1, scope 1) per lane, masked where an
// index falls outside the destination; where every index is constant along a tile axis the values
// are summed along it first (tt.reduce), so the row-indexed destination gets [32, 1] atomics and
// the head-indexed one a single scalar atomic per tile. The bucket-indexed one, whose varying index
// reaches 8 elements, is summed per element in a loop of 8, one scalar atomic each where the sum
// is not zero.
// CPU (attn-cpu-lower-scatter): a loop nest that reads each value and index and adds in place
// (tensor.extract / tensor.insert) under a bounds check, over the whole tile for the table; the
// values are summed first (linalg.reduce) along the axes no index varies on, so the row-indexed
// destination gets one loop over the rows (indices read at column 0) and the head-indexed one a
// single add of the tile's sum; the whole CPU pipeline then reaches the llvm dialect.
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-lower-to-triton)' | FileCheck %s --check-prefix=TRITON
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-cpu-lower-scatter)' --no-mlir-print-op-generic | FileCheck %s --check-prefix=LOOPS --implicit-check-not=attn.scatter_add
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-lower-to-cpu)' | FileCheck %s --check-prefix=LLVM --implicit-check-not=scf.for --implicit-check-not=tensor.insert

// TRITON: "tt.func"
// TRITON: "tt.atomic_rmw"(%{{.*}}, %{{.*}}, %{{.*}}) {atomic_rmw_op = 5 : i32, scope = 1 : i32, sem = 1 : i32} : (tensor<32x32x!tt.ptr<f32>>, tensor<32x32xf32>, tensor<32x32xi1>) -> tensor<32x32xf32>
// TRITON: %[[ROWS:.*]] = "tt.reduce"(%{{.*}}) ({
// TRITON: {axis = 1 : i32} : (tensor<32x32xf32>) -> tensor<32xf32>
// TRITON: %[[ROW:.*]] = "tt.expand_dims"(%[[ROWS]]) {axis = 1 : i32}
// TRITON: "tt.atomic_rmw"(%{{.*}}, %[[ROW]], %{{.*}}) {atomic_rmw_op = 5 : i32, scope = 1 : i32, sem = 1 : i32} : (tensor<32x1x!tt.ptr<f32>>, tensor<32x1xf32>, tensor<32x1xi1>) -> tensor<32x1xf32>
// TRITON: {axis = 1 : i32} : (tensor<32x32xf32>) -> tensor<32xf32>
// TRITON: %[[ALL:.*]] = "tt.reduce"
// TRITON: {axis = 0 : i32} : (tensor<32xf32>) -> f32
// TRITON: "tt.atomic_rmw"(%{{.*}}, %[[ALL]], %{{.*}}) {atomic_rmw_op = 5 : i32, scope = 1 : i32, sem = 1 : i32} : (!tt.ptr<f32>, f32, i1) -> f32
// TRITON: "scf.for"(%{{.*}}, %[[EIGHT:.*]], %{{.*}}) ({
// TRITON-NEXT: ^bb0(%[[E:.*]]: i32):
// TRITON: %[[AT_E:.*]] = "tt.splat"(%[[E]])
// TRITON: "arith.cmpi"(%{{.*}}, %[[AT_E]]) <{predicate = 0 : i64}> : (tensor<32x32xi32>, tensor<32x32xi32>) -> tensor<32x32xi1>
// TRITON: "arith.select"
// TRITON: "tt.reduce"
// TRITON: "tt.reduce"
// TRITON: "arith.remsi"(%[[E]], %{{.*}})
// TRITON: "arith.cmpf"(%{{.*}}, %{{.*}}) <{fastmath = #arith.fastmath<none>, predicate = 13 : i64}> : (f32, f32) -> i1
// TRITON: "tt.atomic_rmw"({{.*}}) {atomic_rmw_op = 5 : i32, scope = 1 : i32, sem = 1 : i32} : (!tt.ptr<f32>, f32, i1) -> f32
// TRITON: attn.kernel_args = ["q", {{.*}}, "dc0", "dc0.stride0", "dc0.stride1", "dc1", "dc1.stride0", "dc1.stride1", "dc2", "dc2.stride0", "dc3", "dc3.stride0", "dc3.stride1"]

// LOOPS-LABEL: func.func @scatter(
// LOOPS-SAME: %[[DTABLE:[a-z0-9]+]]: tensor<2x127xf32>, %{{.*}}: tensor<2x64xf32>, %{{.*}}: tensor<2xf32>, %{{.*}}: tensor<2x8xf32>)
// LOOPS: %[[VALUES:.*]] = linalg.generic
// LOOPS: %[[HEADS:.*]] = linalg.generic
// LOOPS: %[[ROWS:.*]] = linalg.generic
// LOOPS: %[[OFFSETS:.*]] = linalg.generic
// LOOPS: %[[T:.*]] = scf.for %[[I:.*]] = %{{.*}} iter_args(%[[A:.*]] = %[[DTABLE]]) -> (tensor<2x127xf32>)
// LOOPS: scf.for %[[J:.*]] = %{{.*}} iter_args(%[[B:.*]] = %[[A]]) -> (tensor<2x127xf32>)
// LOOPS: %[[H:.*]] = tensor.extract %[[HEADS]][%[[I]], %[[J]]] : tensor<32x32xi32>
// LOOPS: %[[HI:.*]] = arith.index_cast %[[H]] : i32 to index
// LOOPS: %[[O:.*]] = tensor.extract %[[OFFSETS]][%[[I]], %[[J]]] : tensor<32x32xi32>
// LOOPS: %[[OI:.*]] = arith.index_cast %[[O]] : i32 to index
// LOOPS: arith.cmpi slt, %[[OI]], %{{.*}}
// LOOPS: scf.if %{{.*}} -> (tensor<2x127xf32>)
// LOOPS: %[[OLD:.*]] = tensor.extract %[[B]][%[[HI]], %[[OI]]]
// LOOPS: %[[X:.*]] = tensor.extract %[[VALUES]][%[[I]], %[[J]]]
// LOOPS: %[[NEW:.*]] = arith.addf %[[OLD]], %[[X]] : f32
// LOOPS: tensor.insert %[[NEW]] into %[[B]][%[[HI]], %[[OI]]]
// LOOPS: } else {
// LOOPS: scf.yield %[[B]]
// LOOPS: %[[ROW_SUMS:.*]] = linalg.reduce ins(%[[VALUES]] : tensor<32x32xf32>) outs(%{{.*}} : tensor<32xf32>) dimensions = [1]
// LOOPS: %[[R:.*]] = scf.for %[[I2:.*]] = %{{.*}} iter_args(%[[C:.*]] = %{{.*}}) -> (tensor<2x64xf32>) {
// LOOPS-NOT: scf.for
// LOOPS: tensor.extract %[[ROWS]][%[[I2]], %[[ZERO:.*]]] : tensor<32x32xi32>
// LOOPS: tensor.extract %[[ROW_SUMS]][%[[I2]]] : tensor<32xf32>
// LOOPS: %[[TILE_ROWS:.*]] = linalg.reduce ins(%[[VALUES]] : tensor<32x32xf32>) outs(%{{.*}} : tensor<32xf32>) dimensions = [1]
// LOOPS: %[[TILE_SUM:.*]] = linalg.reduce ins(%[[TILE_ROWS]] : tensor<32xf32>) outs(%{{.*}} : tensor<f32>) dimensions = [0]
// LOOPS-NOT: scf.for
// LOOPS: %[[HEAD:.*]] = tensor.extract %[[HEADS]][%{{.*}}, %{{.*}}] : tensor<32x32xi32>
// LOOPS: %[[S:.*]] = scf.if %{{.*}} -> (tensor<2xf32>) {
// LOOPS: tensor.extract %[[TILE_SUM]][] : tensor<f32>
// LOOPS: scf.for
// LOOPS: scf.for
// LOOPS: return %[[T]], %[[R]], %[[S]], %{{.*}} : tensor<2x127xf32>, tensor<2x64xf32>, tensor<2xf32>, tensor<2x8xf32>

// LLVM: sym_name = "scatter"
#tile = affine_map<(d0, d1) -> (d0, d1)>
func.func @scatter(%q: tensor<1x2x64x16xf32>, %k: tensor<1x2x64x16xf32>, %v: tensor<1x2x64x16xf32>, %dtable: tensor<2x127xf32>, %drows: tensor<2x64xf32>, %dslopes: tensor<2xf32>, %dbuckets: tensor<2x8xf32>) -> (tensor<2x127xf32>, tensor<2x64xf32>, tensor<2xf32>, tensor<2x8xf32>) attributes {attn.arg_roles = ["q", "k", "v", "dc0", "dc1", "dc2", "dc3"], attn.grid = array<i64: 1, 2, 2>} {
  %h = "attn.program_id"() {axis = 1 : i64} : () -> index
  %pm = "attn.program_id"() {axis = 2 : i64} : () -> index
  %c32 = arith.constant 32 : index
  %m0 = arith.muli %pm, %c32 : index
  %ef = tensor.empty() : tensor<32x32xf32>
  %ei = tensor.empty() : tensor<32x32xi32>
  %values = linalg.generic {indexing_maps = [#tile], iterator_types = ["parallel", "parallel"]} outs(%ef : tensor<32x32xf32>) {
  ^bb0(%out: f32):
    %i = linalg.index 0 : index
    %j = linalg.index 1 : index
    %ij = arith.addi %i, %j : index
    %n = arith.index_cast %ij : index to i32
    %x = arith.sitofp %n : i32 to f32
    linalg.yield %x : f32
  } -> tensor<32x32xf32>
  %heads = linalg.generic {indexing_maps = [#tile], iterator_types = ["parallel", "parallel"]} outs(%ei : tensor<32x32xi32>) {
  ^bb0(%out: i32):
    %x = arith.index_cast %h : index to i32
    linalg.yield %x : i32
  } -> tensor<32x32xi32>
  %rows = linalg.generic {indexing_maps = [#tile], iterator_types = ["parallel", "parallel"]} outs(%ei : tensor<32x32xi32>) {
  ^bb0(%out: i32):
    %i = linalg.index 0 : index
    %r = arith.addi %m0, %i : index
    %x = arith.index_cast %r : index to i32
    linalg.yield %x : i32
  } -> tensor<32x32xi32>
  %offsets = linalg.generic {indexing_maps = [#tile], iterator_types = ["parallel", "parallel"]} outs(%ei : tensor<32x32xi32>) {
  ^bb0(%out: i32):
    %i = linalg.index 0 : index
    %j = linalg.index 1 : index
    %r = arith.addi %m0, %i : index
    %d = arith.subi %r, %j : index
    %c63 = arith.constant 63 : index
    %o = arith.addi %d, %c63 : index
    %x = arith.index_cast %o : index to i32
    linalg.yield %x : i32
  } -> tensor<32x32xi32>
  %t = "attn.scatter_add"(%dtable, %values, %heads, %offsets) : (tensor<2x127xf32>, tensor<32x32xf32>, tensor<32x32xi32>, tensor<32x32xi32>) -> tensor<2x127xf32>
  %r = "attn.scatter_add"(%drows, %values, %heads, %rows) : (tensor<2x64xf32>, tensor<32x32xf32>, tensor<32x32xi32>, tensor<32x32xi32>) -> tensor<2x64xf32>
  %s = "attn.scatter_add"(%dslopes, %values, %heads) : (tensor<2xf32>, tensor<32x32xf32>, tensor<32x32xi32>) -> tensor<2xf32>
  %buckets = linalg.generic {indexing_maps = [#tile], iterator_types = ["parallel", "parallel"]} outs(%ei : tensor<32x32xi32>) {
  ^bb0(%out: i32):
    %i = linalg.index 0 : index
    %j = linalg.index 1 : index
    %ij = arith.addi %i, %j : index
    %c8 = arith.constant 8 : index
    %bucket = arith.remsi %ij, %c8 : index
    %x = arith.index_cast %bucket : index to i32
    linalg.yield %x : i32
  } -> tensor<32x32xi32>
  %u = "attn.scatter_add"(%dbuckets, %values, %heads, %buckets) : (tensor<2x8xf32>, tensor<32x32xf32>, tensor<32x32xi32>, tensor<32x32xi32>) -> tensor<2x8xf32>
  return %t, %r, %s, %u : tensor<2x127xf32>, tensor<2x64xf32>, tensor<2xf32>, tensor<2x8xf32>
}
