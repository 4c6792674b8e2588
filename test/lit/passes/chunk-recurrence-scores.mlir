// The split form of GLA ("token_dim"): the cumulative decays (a program per four chunks and 24
// of G's 48 columns), the chunk states, then the scores A [C, C] of every chunk into workspace w2 (a
// program per chunk: one product of its decayed queries and keys, masked to s <= t, stored if
// the chunk's decay max |G| stays under the limit; past it, a loop of one trip takes the chunk's
// four blocks of 16 rows: a product against the chunk's keys factorized at the block's boundary,
// and if the block's own decay passes the limit too, the product's columns before the block and
// the diagonal block recomputed in the 3-D generic over (t, s, d), in slices of 24 columns of
// Dk, moved to its columns by a product with the 0/1 placement), then the output kernel: two
// products over the chunk's 64 rows. L = 96 is ragged: w2 holds both chunks' 128 rows, so its
// tiles are stored and loaded whole.
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-chunk-recurrence{split=1 block-v=64},cse)' --no-mlir-print-op-generic | FileCheck %s

// CHECK-LABEL: func.func @gla_decays
// CHECK-SAME: attn.chunk_stage = "decays"
// CHECK-SAME: attn.grid = array<i64: 1, 2, 2>
// CHECK: %[[DPID:.*]] = "attn.program_id"() {axis = 2 : i64}
// CHECK: %[[GROUP:.*]] = arith.divsi %[[DPID]], %c2
// CHECK: arith.remsi %[[DPID]], %c2
// Both chunks in one program's loop.
// CHECK: %[[FIRST_CHUNK:.*]] = arith.muli %[[GROUP]], %c4
// CHECK: scf.for
// CHECK: linalg.matmul {attn.precision = "tf32x3"} ins(%{{.*}}, %{{.*}} : tensor<64x64xf32>, tensor<64x24xf32>)
// CHECK-LABEL: func.func @gla_states
// CHECK-LABEL: func.func @gla_scores(
// CHECK-SAME: %[[W1:[a-z0-9]+]]: tensor<1x2x96x48xf32>, %[[W2:[a-z0-9]+]]: tensor<1x2x128x64xf32>) -> tensor<1x2x128x64xf32>
// CHECK-SAME: attn.arg_roles = ["q", "k", "v", "c0", "w1", "w2"]
// CHECK-SAME: attn.chunk_stage = "scores"
// CHECK-SAME: attn.grid = array<i64: 1, 2, 2>
// CHECK: %[[IT:.*]] = "attn.program_id"() {axis = 2 : i64}
// CHECK: %[[T0:.*]] = arith.muli %[[IT]], %c64
// The chunk's decayed queries and keys (their exponents capped at 40), one product.
// CHECK: math.exp
// CHECK: arith.constant 4.000000e+01 : f32
// CHECK: arith.minimumf
// CHECK: %[[WHOLE:.*]] = linalg.matmul {attn.precision = "ieee"} ins(%{{.*}}, %{{.*}} : tensor<64x48xf32>, tensor<48x64xf32>) outs(%{{.*}} : tensor<64x64xf32>)
// The chunk's decay, max |G|, as a scalar.
// CHECK: math.absf
// CHECK: linalg.reduce ins(%{{.*}} : tensor<64x48xf32>) outs(%{{.*}} : tensor<64xf32>) dimensions = [1]
// CHECK: linalg.reduce ins(%{{.*}} : tensor<64xf32>) outs(%{{.*}} : tensor<f32>) dimensions = [0]
// CHECK: %[[MASKED:.*]] = linalg.generic {{.*}} ins(%[[WHOLE]] : tensor<64x64xf32>)
// CHECK: arith.cmpi sle
// CHECK: %[[CAP:.*]] = arith.constant 4.000000e+01 : f32
// CHECK: %[[CHUNK_WIDE:.*]] = arith.cmpf ogt, %{{.*}}, %[[CAP]] : f32
// CHECK: %[[CHUNK_TRIPS:.*]] = arith.select %[[CHUNK_WIDE]], %c1, %c0 : index
// CHECK: %[[NARROW:.*]] = arith.subi %c1, %[[CHUNK_TRIPS]]
// CHECK: %[[STORED:.*]] = scf.for %{{.*}} = %c0 to %[[NARROW]] step %c1 iter_args(%[[D:.*]] = %[[W2]])
// CHECK: tensor.insert_slice %[[MASKED]] into %[[D]][%{{.*}}, %{{.*}}, %[[T0]], 0] [1, 1, 64, 64]
// Past the limit, the chunk's blocks.
// CHECK: scf.for %{{.*}} = %c0 to %[[CHUNK_TRIPS]] step %c1 iter_args(%{{.*}} = %[[STORED]])
// CHECK: scf.for %[[BLOCK:.*]] = %c0 to %c4 step %c1 iter_args
// CHECK: %[[FIRST:.*]] = arith.muli %[[BLOCK]], %c16
// CHECK: %[[START:.*]] = arith.addi %[[T0]], %[[FIRST]]
// The boundary row R_I: 0 in a chunk's first block.
// CHECK: %[[IN_CHUNK:.*]] = arith.remsi %[[START]], %c64
// CHECK: %[[FIRST_BLOCK:.*]] = arith.cmpi eq, %[[IN_CHUNK]], %c0
// CHECK: arith.select %[[FIRST_BLOCK]], %{{.*}}, %{{.*}} : f32
// The block's decayed queries against the chunk's 64 decayed keys (their exponents capped at 40).
// CHECK: arith.minimumf %{{.*}}, %[[CAP]]
// CHECK: %[[PRODUCTS:.*]] = linalg.matmul {attn.precision = "ieee"} ins(%{{.*}}, %{{.*}} : tensor<16x48xf32>, tensor<48x64xf32>) outs(%{{.*}} : tensor<16x64xf32>)
// Causal: column s <= first + i.
// CHECK: %[[FAST:.*]] = linalg.generic {{.*}} ins(%[[PRODUCTS]] : tensor<16x64xf32>)
// CHECK: arith.addi %[[FIRST]]
// CHECK: arith.cmpi sle
// The block's decay, max(R_I - G), as a scalar: past the limit, one trip of the exact form.
// CHECK: linalg.reduce ins(%{{.*}} : tensor<16x48xf32>) outs(%{{.*}} : tensor<16xf32>) dimensions = [1]
// CHECK: %[[SPAN:.*]] = linalg.reduce ins(%{{.*}} : tensor<16xf32>) outs(%{{.*}} : tensor<f32>) dimensions = [0]
// CHECK: %[[SPAN_F:.*]] = tensor.extract %[[SPAN]][] : tensor<f32>
// CHECK: %[[WIDE:.*]] = arith.cmpf ogt, %[[SPAN_F]], %[[CAP]] : f32
// CHECK: %[[TRIPS:.*]] = arith.select %[[WIDE]], %c1, %c0 : index
// CHECK: %[[SCORES:.*]] = scf.for %{{.*}} = %c0 to %[[TRIPS]] step %c1 iter_args(%{{.*}} = %[[FAST]]) -> (tensor<16x64xf32>)
// The products' columns before the block, the 0/1 placement, the diagonal block in two slices
// of 24 columns, placed.
// CHECK: arith.cmpi slt, %{{.*}}, %[[FIRST]]
// CHECK: %[[PLACEMENT:.*]] = linalg.generic
// CHECK: arith.addi %[[FIRST]]
// CHECK: linalg.generic {{.*}} iterator_types = ["parallel", "parallel", "reduction"]} ins({{.*}} : tensor<16x24xf32>, tensor<16x24xf32>, tensor<16x24xf32>, tensor<16x24xf32>) outs(%{{.*}} : tensor<16x16xf32>)
// CHECK: %[[DIAG:.*]] = linalg.generic {{.*}} iterator_types = ["parallel", "parallel", "reduction"]} ins({{.*}} : tensor<16x24xf32>, tensor<16x24xf32>, tensor<16x24xf32>, tensor<16x24xf32>) outs(%{{.*}} : tensor<16x16xf32>)
// CHECK: %[[ROWS:.*]] = linalg.matmul {attn.precision = "ieee"} ins(%[[DIAG]], %[[PLACEMENT]] : tensor<16x16xf32>, tensor<16x64xf32>)
// CHECK: scf.yield %[[ROWS]]
// CHECK: tensor.insert_slice %[[SCORES]] into %{{.*}}[%{{.*}}, %{{.*}}, %[[START]], 0] [1, 1, 16, 64]
// The output kernel keeps the function's name and is no stage.
// CHECK-LABEL: func.func @gla(
// CHECK-SAME: attn.arg_roles = ["q", "k", "v", "c0", "w1", "w2", "w0", "out"]
// CHECK-NOT: attn.chunk_stage
// CHECK-SAME: attn.grid = array<i64: 1, 2, 2>
// CHECK: %[[STATE:.*]] = tensor.extract_slice %{{.*}} : tensor<1x2x2x48x40xf32> to tensor<48x40xf32>
// CHECK: %[[O:.*]] = linalg.matmul {{.*}} ins(%{{.*}}, %[[STATE]] : tensor<64x48xf32>, tensor<48x40xf32>)
// CHECK: %[[A:.*]] = tensor.extract_slice %{{.*}} [1, 1, 64, 64] [1, 1, 1, 1] : tensor<1x2x128x64xf32> to tensor<64x64xf32>
// CHECK: linalg.matmul {{.*}} ins(%[[A]], %{{.*}} : tensor<64x64xf32>, tensor<64x40xf32>) outs(%[[O]] : tensor<64x40xf32>)
// CHECK: tensor.insert_slice

func.func @gla(%q: tensor<1x2x96x48xf32>, %k: tensor<1x2x96x48xf32>, %v: tensor<1x2x96x40xf32>, %g: tensor<1x2x96x48xf32>) -> (tensor<1x2x96x40xf32>, tensor<1x2x48x40xf32>) {
  %o, %st = "attn.linear_recurrence"(%q, %k, %v, %g) ({}, {}, {}) {decay = "token_dim", scale = 0.125 : f32, normalize = false, chunk_size = 64 : i64, operandSegmentSizes = array<i32: 1, 1, 1, 1, 0, 0>} : (tensor<1x2x96x48xf32>, tensor<1x2x96x48xf32>, tensor<1x2x96x40xf32>, tensor<1x2x96x48xf32>) -> (tensor<1x2x96x40xf32>, tensor<1x2x48x40xf32>)
  return %o, %st : tensor<1x2x96x40xf32>, tensor<1x2x48x40xf32>
}
