// attn-cpu-amx-tile-products: a bf16 kernel's tile products on AMX units. Scores: Q [32, 64] times
// K's transposed tile; K [32, 64] is read as 32-bit pairs and transposed in 16 x 16 blocks by
// shuffles into AMX's right-operand layout (the linalg.transpose goes), the product starts from
// zero tiles (the fill is not read) and takes two 32-wide steps per 16 x 16 result tile. P's
// rounding to bf16 picks a NaN's bits on the 32-bit lanes, then narrows. P V: V's rows are
// interleaved in pairs, the accumulator's tiles loaded. Each product is a function of its own
// (kept out of the kernel). A product of 8 rows (not a multiple of 16), and one of a padded tile
// load, stay linalg.matmul.
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-cpu-amx-tile-products)' --no-mlir-print-op-generic | FileCheck %s

// CHECK-LABEL: func.func private @ae_amx_product_32x64x32_acc(
// CHECK-SAME: %[[P:[a-z0-9]+]]: memref<32x32xbf16, strided<[?, 1], offset: ?>>, %[[VP:[a-z0-9]+]]: memref<16x128xbf16>, %[[ACC:[a-z0-9]+]]: memref<32x64xf32, strided<[?, 1], offset: ?>>, %[[OUT:[a-z0-9]+]]: memref<32x64xf32>) attributes {passthrough = ["noinline"]}
// CHECK: scf.for %[[I:.*]] = %c0 to %c32 step %c16
// CHECK-NEXT: scf.for %[[J:.*]] = %c0 to %c64 step %c16
// CHECK-NEXT: %[[T:.*]] = amx.tile_load %[[ACC]][%[[I]], %[[J]]]
// CHECK: amx.tile_load %[[P]][%[[I]], %c0]
// CHECK-NEXT: amx.tile_load %[[VP]][%c0, %{{.*}}]
// CHECK-NEXT: %[[T1:.*]] = amx.tile_mulf %{{.*}}, %{{.*}}, %[[T]]
// CHECK-NEXT: amx.tile_store %[[OUT]][%[[I]], %[[J]]], %[[T1]]

// CHECK-LABEL: func.func private @ae_amx_product_32x32x64(
// CHECK-SAME: %[[Q:[a-z0-9]+]]: memref<32x64xbf16, strided<[?, 1], offset: ?>>, %[[KP:[a-z0-9]+]]: memref<32x64xbf16>, %[[S:[a-z0-9]+]]: memref<32x32xf32>)
// CHECK: scf.for %[[I:.*]] = %c0 to %c32 step %c16
// CHECK-NEXT: scf.for %[[J:.*]] = %c0 to %c32 step %c16
// CHECK-NEXT: %[[Z:.*]] = amx.tile_zero : !amx.tile<16x16xf32>
// CHECK: amx.tile_load %[[Q]][%[[I]], %c0]
// CHECK-NEXT: amx.tile_load %[[KP]][%c0, %{{.*}}]
// CHECK-NEXT: %[[T0:.*]] = amx.tile_mulf %{{.*}}, %{{.*}}, %[[Z]]
// CHECK-NEXT: amx.tile_load %[[Q]][%[[I]], %c32]
// CHECK-NEXT: amx.tile_load %[[KP]][%c16, %{{.*}}]
// CHECK-NEXT: %[[T1:.*]] = amx.tile_mulf %{{.*}}, %{{.*}}, %[[T0]]
// CHECK-NEXT: amx.tile_store %[[S]][%[[I]], %[[J]]], %[[T1]]

// CHECK-LABEL: func.func @tiles
// CHECK-NOT: linalg.transpose
// CHECK: %[[QB:.*]] = bufferization.to_buffer %{{.*}} read_only : tensor<32x64xbf16>
// CHECK-NEXT: %[[QC:.*]] = memref.cast %[[QB]] : {{.*}} to memref<32x64xbf16, strided<[?, 1], offset: ?>>
// CHECK: bufferization.to_buffer %{{.*}} read_only : tensor<32x64xbf16>
// CHECK: %[[KPACK:.*]] = memref.alloc() {alignment = 64 : i64} : memref<32x64xbf16>
// CHECK: vector.transfer_read %{{.*}} : memref<32x64xbf16, {{.*}}>, vector<32xbf16>
// CHECK: vector.bitcast %{{.*}} : vector<32xbf16> to vector<16xi32>
// CHECK: vector.shuffle %{{.*}} [0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30] : vector<16xi32>, vector<16xi32>
// CHECK: vector.store %{{.*}}, %[[KPACK]][%{{.*}}] : memref<32x64xbf16>, vector<32xbf16>
// CHECK: %[[SB:.*]] = memref.alloc() {alignment = 64 : i64} : memref<32x32xf32>
// CHECK-NEXT: call @ae_amx_product_32x32x64(%[[QC]], %[[KPACK]], %[[SB]])
// CHECK-NEXT: %[[ST:.*]] = bufferization.to_tensor %[[SB]] restrict writable
// CHECK: linalg.generic {{.*}} ins(%[[ST]] : tensor<32x32xf32>) outs(%{{.*}} : tensor<32x32xbf16>)
// CHECK-NOT: arith.truncf
// CHECK: %[[NAN:.*]] = arith.cmpf uno
// CHECK: %[[BITS:.*]] = arith.select %[[NAN]], %{{.*}}, %{{.*}} : i32
// CHECK-NEXT: %[[NARROW:.*]] = arith.trunci %[[BITS]] : i32 to i16
// CHECK-NEXT: arith.bitcast %[[NARROW]] : i16 to bf16
// CHECK: memref.alloc() {alignment = 64 : i64} : memref<16x128xbf16>
// CHECK: scf.for
// CHECK: vector.interleave %{{.*}}, %{{.*}} : vector<64xi16> -> vector<128xi16>
// CHECK: call @ae_amx_product_32x64x32_acc(
// CHECK: linalg.matmul ins(%{{.*}}, %{{.*}} : tensor<8x64xbf16>, tensor<64x32xbf16>)
// CHECK: %[[PADDED:.*]] = tensor.pad
// CHECK: linalg.matmul ins(%[[PADDED]], %{{.*}} : tensor<32x64xbf16>, tensor<64x32xbf16>)
#id = affine_map<(d0, d1) -> (d0, d1)>
func.func @tiles(%q: tensor<32x64xbf16>, %k: tensor<32x64xbf16>, %v: tensor<32x64xbf16>, %acc: tensor<32x64xf32>,
                 %q8: tensor<8x64xbf16>, %b8: tensor<64x32xbf16>, %rows: tensor<?x64xbf16>, %high: index)
    -> (tensor<32x64xf32>, tensor<8x32xf32>, tensor<32x32xf32>) {
  %zero = arith.constant 0.0 : f32
  %kte = tensor.empty() : tensor<64x32xbf16>
  %kt = linalg.transpose ins(%k : tensor<32x64xbf16>) outs(%kte : tensor<64x32xbf16>) permutation = [1, 0]
  %se = tensor.empty() : tensor<32x32xf32>
  %s0 = linalg.fill ins(%zero : f32) outs(%se : tensor<32x32xf32>) -> tensor<32x32xf32>
  %s = linalg.matmul ins(%q, %kt : tensor<32x64xbf16>, tensor<64x32xbf16>) outs(%s0 : tensor<32x32xf32>) -> tensor<32x32xf32>
  %pe = tensor.empty() : tensor<32x32xbf16>
  %p = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]} ins(%s : tensor<32x32xf32>) outs(%pe : tensor<32x32xbf16>) {
  ^bb0(%a: f32, %b: bf16):
    %t = arith.truncf %a : f32 to bf16
    linalg.yield %t : bf16
  } -> tensor<32x32xbf16>
  %pv = linalg.matmul ins(%p, %v : tensor<32x32xbf16>, tensor<32x64xbf16>) outs(%acc : tensor<32x64xf32>) -> tensor<32x64xf32>
  %s8e = tensor.empty() : tensor<8x32xf32>
  %s8z = linalg.fill ins(%zero : f32) outs(%s8e : tensor<8x32xf32>) -> tensor<8x32xf32>
  %s8 = linalg.matmul ins(%q8, %b8 : tensor<8x64xbf16>, tensor<64x32xbf16>) outs(%s8z : tensor<8x32xf32>) -> tensor<8x32xf32>
  %zb = arith.constant 0.0 : bf16
  %qp = tensor.pad %rows low[0, 0] high[%high, 0] {
  ^bb0(%i: index, %j: index):
    tensor.yield %zb : bf16
  } : tensor<?x64xbf16> to tensor<32x64xbf16>
  %sp = linalg.matmul ins(%qp, %b8 : tensor<32x64xbf16>, tensor<64x32xbf16>) outs(%s0 : tensor<32x32xf32>) -> tensor<32x32xf32>
  return %pv, %s8, %sp : tensor<32x64xf32>, tensor<8x32xf32>, tensor<32x32xf32>
}
