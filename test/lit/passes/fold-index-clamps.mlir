// attn-fold-index-clamps drops a min/max clamp against a constant when the value it clamps is
// provably inside: bounds come from the grid (attn.grid bounds attn.program_id), scf.for ranges,
// linalg.index over the generic's static domain, constant tables and the arith ops between.
// With padded-tiles (the default, Triton's preset) a tile dimension of n reaches the power-of-two
// lane count Triton computes it on (at least 16), padding lanes included; the CPU preset passes
// padded-tiles=false, whose tiles have no padding lanes.
// RUN: ae-opt %s --split-input-file --attn-fold-index-clamps --no-mlir-print-op-generic | FileCheck %s --check-prefixes=CHECK,PADDED
// RUN: ae-opt %s --split-input-file --attn-fold-index-clamps=padded-tiles=false --no-mlir-print-op-generic | FileCheck %s --check-prefixes=CHECK,EXACT

// A relative-position table [H, 2L - 1] at q - k + L - 1, L = 2048 in 16 query blocks of 128 and
// 32 KV tiles of 64: the tail clamps of q and k and the frontend's clamp into the table all go,
// the head's clamp too (program id 1 < 16); the extract reads the unclamped index.
// CHECK-LABEL: func.func @relative
// CHECK-NOT: arith.minsi
// CHECK-NOT: arith.maxsi
// CHECK: %[[Q:.*]] = arith.addi %{{.*}}, %{{.*}} : index
// CHECK: %[[K:.*]] = arith.addi %{{.*}}, %{{.*}} : index
// CHECK: %[[D:.*]] = arith.subi %[[Q]], %[[K]] : index
// CHECK: %[[I:.*]] = arith.addi %[[D]], %c2047 : index
// CHECK: tensor.extract %{{.*}}[%{{.*}}, %[[I]]] : tensor<16x4095xf32>
func.func @relative(%table: tensor<16x4095xf32>, %init: tensor<128x64xf32>) -> tensor<128x64xf32>
    attributes {attn.grid = array<i64: 1, 16, 16>} {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c15 = arith.constant 15 : index
  %c32 = arith.constant 32 : index
  %c64 = arith.constant 64 : index
  %c128 = arith.constant 128 : index
  %c2047 = arith.constant 2047 : index
  %c4094 = arith.constant 4094 : index
  %h = "attn.program_id"() {axis = 1 : i64} : () -> index
  %block = "attn.program_id"() {axis = 2 : i64} : () -> index
  %q0 = arith.muli %block, %c128 : index
  %r = scf.for %t = %c0 to %c32 step %c1 iter_args(%acc = %init) -> (tensor<128x64xf32>) {
    %k0 = arith.muli %t, %c64 : index
    %g = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>], iterator_types = ["parallel", "parallel"]}
        outs(%acc : tensor<128x64xf32>) {
    ^bb0(%out: f32):
      %i = linalg.index 0 : index
      %j = linalg.index 1 : index
      %q = arith.addi %q0, %i : index
      %k = arith.addi %k0, %j : index
      %qc = arith.minsi %q, %c2047 : index
      %kc = arith.minsi %k, %c2047 : index
      %d = arith.subi %qc, %kc : index
      %e = arith.addi %d, %c2047 : index
      %hl = arith.maxsi %h, %c0 : index
      %hc = arith.minsi %hl, %c15 : index
      %el = arith.maxsi %e, %c0 : index
      %ec = arith.minsi %el, %c4094 : index
      %x = tensor.extract %table[%hc, %ec] : tensor<16x4095xf32>
      %s = arith.addf %out, %x : f32
      linalg.yield %s : f32
    } -> tensor<128x64xf32>
    scf.yield %g : tensor<128x64xf32>
  }
  return %r : tensor<128x64xf32>
}

// -----

// L = 1000 in 8 query blocks of 128: the last block's rows 1000..1023 are padding, so the tail
// clamp of q stays. Reading a table of 1000 at q + 5, the clamp's lower side goes (q + 5 >= 5)
// and its upper side stays (q + 5 reaches 1004). An index from outside the kernel (a function
// argument) keeps both sides.
// CHECK-LABEL: func.func @ragged
// CHECK: %[[QC:.*]] = arith.minsi %{{.*}}, %c999 : index
// CHECK: %[[E:.*]] = arith.addi %[[QC]], %c5 : index
// CHECK-NOT: arith.maxsi %[[E]]
// CHECK: %[[EC:.*]] = arith.minsi %[[E]], %c999 : index
// CHECK: tensor.extract %arg0[%[[EC]]]
// CHECK: %[[AL:.*]] = arith.maxsi %arg2, %c0 : index
// CHECK: %[[AC:.*]] = arith.minsi %[[AL]], %c999 : index
// CHECK: tensor.extract %arg0[%[[AC]]]
func.func @ragged(%table: tensor<1000xf32>, %init: tensor<128xf32>, %n: index) -> tensor<128xf32>
    attributes {attn.grid = array<i64: 1, 1, 8>} {
  %c0 = arith.constant 0 : index
  %c5 = arith.constant 5 : index
  %c128 = arith.constant 128 : index
  %c999 = arith.constant 999 : index
  %block = "attn.program_id"() {axis = 2 : i64} : () -> index
  %q0 = arith.muli %block, %c128 : index
  %g = linalg.generic {indexing_maps = [affine_map<(i) -> (i)>], iterator_types = ["parallel"]}
      outs(%init : tensor<128xf32>) {
  ^bb0(%out: f32):
    %i = linalg.index 0 : index
    %q = arith.addi %q0, %i : index
    %qc = arith.minsi %q, %c999 : index
    %e = arith.addi %qc, %c5 : index
    %el = arith.maxsi %e, %c0 : index
    %ec = arith.minsi %el, %c999 : index
    %x = tensor.extract %table[%ec] : tensor<1000xf32>
    %al = arith.maxsi %n, %c0 : index
    %ac = arith.minsi %al, %c999 : index
    %y = tensor.extract %table[%ac] : tensor<1000xf32>
    %s = arith.addf %x, %y : f32
    %t = arith.addf %out, %s : f32
    linalg.yield %t : f32
  } -> tensor<128xf32>
  return %g : tensor<128xf32>
}

// -----

// Columns 24..47 of a [70, 48] tensor in a 24-wide tile: on 32 lanes the padding lanes reach
// column 55, so Triton's preset keeps the clamp into the tensor; exact tiles end at 47.
// CHECK-LABEL: func.func @padding_lanes
// PADDED: arith.minsi %{{.*}}, %c47 : index
// EXACT-NOT: arith.minsi
func.func @padding_lanes(%g: tensor<70x48xf32>, %init: tensor<24xf32>) -> tensor<24xf32> {
  %c24 = arith.constant 24 : index
  %c47 = arith.constant 47 : index
  %c5 = arith.constant 5 : index
  %r = linalg.generic {indexing_maps = [affine_map<(j) -> (j)>], iterator_types = ["parallel"]}
      outs(%init : tensor<24xf32>) {
  ^bb0(%out: f32):
    %j = linalg.index 0 : index
    %col = arith.addi %j, %c24 : index
    %cc = arith.minsi %col, %c47 : index
    %x = tensor.extract %g[%c5, %cc] : tensor<70x48xf32>
    %s = arith.addf %out, %x : f32
    linalg.yield %s : f32
  } -> tensor<24xf32>
  return %r : tensor<24xf32>
}
