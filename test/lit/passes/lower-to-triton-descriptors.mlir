// tensor-descriptors: a 2-D tile of an aligned float argument whose slice is the tile cut at the
// tensor's end loads through a TMA descriptor made once at function level (before the KV loop),
// at the program's batch and head; the general variant, and slices cut shorter by a length read
// at run time, keep masked pointer loads.
// RUN: ae-opt %s --split-input-file --pass-pipeline='builtin.module(attn-lower-to-triton{tensor-descriptors=true})' | FileCheck %s
// RUN: ae-opt %s --split-input-file --pass-pipeline='builtin.module(attn-lower-to-triton{tensor-descriptors=true assume-aligned=false})' | FileCheck %s --check-prefix=GENERAL
// RUN: ae-opt %s --split-input-file --pass-pipeline='builtin.module(attn-lower-to-triton{tensor-descriptors=true})' --emit=ptx --target=cuda:90 | FileCheck %s --check-prefix=PTX
// host-descriptors: each descriptor is a kernel parameter over the whole argument (labelled
// "<role>.tma", then its sizes and strides as Triton's launcher passes them), made on the host per
// launch; a tile loads at the program's (batch, head, row, column), one element deep in the
// leading dimensions, and is reshaped to the tile; no descriptor is made in the kernel.
// RUN: ae-opt %s --split-input-file --pass-pipeline='builtin.module(attn-lower-to-triton{tensor-descriptors=true host-descriptors=true})' | FileCheck %s --check-prefix=HOST
// RUN: ae-opt %s --split-input-file --pass-pipeline='builtin.module(attn-lower-to-triton{tensor-descriptors=true host-descriptors=true})' --emit=ptx --target=cuda:90 | FileCheck %s --check-prefix=HOSTPTX

// K tiles of L = 40 in 32-row blocks: rows [32 * i, min(32 * i + 32, 40)), the last one ragged.
// CHECK-LABEL: "tt.func"
// CHECK: "tt.get_program_id"() {axis = 1 : i32}
// CHECK: %[[QD:.*]] = "tt.make_tensor_descriptor"(%{{.*}}) : (!tt.ptr<f32>, i32, i32, i64, i64) -> !tt.tensordesc<tensor<16x32xf32>>
// CHECK: %[[QT:.*]] = "tt.descriptor_load"(%[[QD]], %{{.*}}, %{{.*}}) : (!tt.tensordesc<tensor<16x32xf32>>, i32, i32) -> tensor<16x32xf32>
// CHECK: %[[BASE:.*]] = "tt.addptr"(%{{.*}}, %{{.*}}) : (!tt.ptr<f32>, i64) -> !tt.ptr<f32>
// CHECK: %[[KD:.*]] = "tt.make_tensor_descriptor"(%[[BASE]], %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}) : (!tt.ptr<f32>, i32, i32, i64, i64) -> !tt.tensordesc<tensor<32x32xf32>>
// CHECK: "scf.for"
// CHECK: %[[KT:.*]] = "tt.descriptor_load"(%[[KD]], %{{.*}}, %{{.*}}) : (!tt.tensordesc<tensor<32x32xf32>>, i32, i32) -> tensor<32x32xf32>
// CHECK: %[[KTT:.*]] = "tt.trans"(%[[KT]])
// CHECK: "tt.dot"(%[[QT]], %[[KTT]], %{{.*}})
// CHECK-NOT: "tt.load"
// CHECK: sym_name = "keys"
// GENERAL-LABEL: "tt.func"
// GENERAL-NOT: descriptor
// GENERAL: "tt.load"
// GENERAL: sym_name = "keys"
// PTX: cp.async.bulk.tensor.2d
// HOST-LABEL: "tt.func"
// HOST: ^bb0({{.*}}, %[[QD:[a-z0-9_]+]]: !tt.tensordesc<tensor<1x1x16x32xf32>>, %{{.*}}: i32, %{{.*}}: i32, %{{.*}}: i32, %{{.*}}: i32, %{{.*}}: i64, %{{.*}}: i64, %{{.*}}: i64, %{{.*}}: i64, %[[KD:[a-z0-9_]+]]: !tt.tensordesc<tensor<1x1x32x32xf32>>
// HOST-NOT: "tt.make_tensor_descriptor"
// HOST: %[[H:.*]] = "tt.get_program_id"() {axis = 1 : i32}
// HOST: %[[QB:.*]] = "tt.descriptor_load"(%[[QD]], %{{.*}}, %[[H]], %{{.*}}, %{{.*}}) : (!tt.tensordesc<tensor<1x1x16x32xf32>>, i32, i32, i32, i32) -> tensor<1x1x16x32xf32>
// HOST: %[[QT:.*]] = "tt.reshape"(%[[QB]]) : (tensor<1x1x16x32xf32>) -> tensor<16x32xf32>
// HOST: "scf.for"
// HOST: %[[KB:.*]] = "tt.descriptor_load"(%[[KD]], %{{.*}}, %[[H]], %{{.*}}, %{{.*}}) : (!tt.tensordesc<tensor<1x1x32x32xf32>>, i32, i32, i32, i32) -> tensor<1x1x32x32xf32>
// HOST: "tt.reshape"(%[[KB]])
// HOST-NOT: "tt.load"
// HOST: attn.kernel_args = [{{.*}}"q.tma", "q.tma.size0", "q.tma.size1", "q.tma.size2", "q.tma.size3", "q.tma.stride0", "q.tma.stride1", "q.tma.stride2", "q.tma.stride3", "k.tma",
// HOST-SAME: sym_name = "keys"
// HOSTPTX: .param .align 64 .b8 {{.*}}[128]
// HOSTPTX-NOT: tensormap.replace
// HOSTPTX: cp.async.bulk.tensor.4d
func.func @keys(%q: tensor<1x2x16x32xf32>, %k: tensor<1x2x40x32xf32>, %v: tensor<1x2x40x32xf32>, %out: tensor<1x2x16x32xf32>) -> tensor<1x2x16x32xf32> attributes {attn.grid = array<i64: 1, 2, 1>} {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %c32 = arith.constant 32 : index
  %c40 = arith.constant 40 : index
  %zero = arith.constant 0.0 : f32
  %h = "attn.program_id"() {axis = 1 : i64} : () -> index
  %e1 = tensor.empty() : tensor<16x32xf32>
  %init = linalg.fill ins(%zero : f32) outs(%e1 : tensor<16x32xf32>) -> tensor<16x32xf32>
  %qt = tensor.extract_slice %q[%c0, %h, 0, 0] [1, 1, 16, 32] [1, 1, 1, 1] : tensor<1x2x16x32xf32> to tensor<16x32xf32>
  %acc = scf.for %i = %c0 to %c2 step %c1 iter_args(%a = %init) -> (tensor<16x32xf32>) {
    %start = arith.muli %i, %c32 : index
    %left = arith.subi %c40, %start : index
    %rows = arith.minsi %left, %c32 : index
    %high = arith.subi %c32, %rows : index
    %ks = tensor.extract_slice %k[%c0, %h, %start, 0] [1, 1, %rows, 32] [1, 1, 1, 1] : tensor<1x2x40x32xf32> to tensor<?x32xf32>
    %kt = tensor.pad %ks low[0, 0] high[%high, 0] {
    ^bb0(%x: index, %y: index):
      tensor.yield %zero : f32
    } : tensor<?x32xf32> to tensor<32x32xf32>
    %e = tensor.empty() : tensor<32x32xf32>
    %ktt = linalg.transpose ins(%kt : tensor<32x32xf32>) outs(%e : tensor<32x32xf32>) permutation = [1, 0]
    %s = linalg.matmul ins(%qt, %ktt : tensor<16x32xf32>, tensor<32x32xf32>) outs(%a : tensor<16x32xf32>) -> tensor<16x32xf32>
    scf.yield %s : tensor<16x32xf32>
  }
  %o = tensor.insert_slice %acc into %out[%c0, %h, 0, 0] [1, 1, 16, 32] [1, 1, 1, 1] : tensor<16x32xf32> into tensor<1x2x16x32xf32>
  return %o : tensor<1x2x16x32xf32>
}

// -----

// The keys' length read from a closure tensor (per-entry lengths): the slice stops at
// min(len - start, 32), short of the tensor's end, where a descriptor would read on; and the
// head is chosen inside the loop. Both stay pointer loads.
// CHECK-LABEL: "tt.func"
// CHECK-NOT: descriptor
// CHECK: "tt.load"
// CHECK-NOT: descriptor
// CHECK: sym_name = "lengths"
func.func @lengths(%q: tensor<1x2x16x32xf32>, %k: tensor<1x2x40x32xf32>, %v: tensor<1x2x40x32xf32>, %len: tensor<1xi32>, %out: tensor<1x2x16x32xf32>) -> tensor<1x2x16x32xf32> attributes {attn.grid = array<i64: 1, 2, 1>} {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %c32 = arith.constant 32 : index
  %zero = arith.constant 0.0 : f32
  %h = "attn.program_id"() {axis = 1 : i64} : () -> index
  %n32 = tensor.extract %len[%c0] : tensor<1xi32>
  %n = arith.index_cast %n32 : i32 to index
  %e1 = tensor.empty() : tensor<16x32xf32>
  %init = linalg.fill ins(%zero : f32) outs(%e1 : tensor<16x32xf32>) -> tensor<16x32xf32>
  %acc = scf.for %i = %c0 to %c2 step %c1 iter_args(%a = %init) -> (tensor<16x32xf32>) {
    %start = arith.muli %i, %c32 : index
    %left = arith.subi %n, %start : index
    %rows = arith.minsi %left, %c32 : index
    %high = arith.subi %c32, %rows : index
    %ks = tensor.extract_slice %k[%c0, %h, %start, 0] [1, 1, %rows, 32] [1, 1, 1, 1] : tensor<1x2x40x32xf32> to tensor<?x32xf32>
    %kt = tensor.pad %ks low[0, 0] high[%high, 0] {
    ^bb0(%x: index, %y: index):
      tensor.yield %zero : f32
    } : tensor<?x32xf32> to tensor<32x32xf32>
    %qt = tensor.extract_slice %q[%c0, %i, 0, 0] [1, 1, 16, 32] [1, 1, 1, 1] : tensor<1x2x16x32xf32> to tensor<16x32xf32>
    %e = tensor.empty() : tensor<32x32xf32>
    %ktt = linalg.transpose ins(%kt : tensor<32x32xf32>) outs(%e : tensor<32x32xf32>) permutation = [1, 0]
    %s = linalg.matmul ins(%qt, %ktt : tensor<16x32xf32>, tensor<32x32xf32>) outs(%a : tensor<16x32xf32>) -> tensor<16x32xf32>
    scf.yield %s : tensor<16x32xf32>
  }
  %o = tensor.insert_slice %acc into %out[%c0, %h, 0, 0] [1, 1, 16, 32] [1, 1, 1, 1] : tensor<16x32xf32> into tensor<1x2x16x32xf32>
  return %o : tensor<1x2x16x32xf32>
}
