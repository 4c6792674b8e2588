// Paged KV caches: k and v are attn.gather_pages of page pools [P, Hkv, S, D] (here 9 pages of
// 64 slots) through a block table [B, M]. attn-tile reads each KV tile through the table in
// place; the gathered [B, Hkv, M * S, D] tensors never exist.
// With 32-key tiles a tile lies in one page: one table read (page = table[b, n0 / 64], clamped
// into [0, 9)) and one slice of that page from slot n0 - 64 * (n0 / 64).
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-fuse-online-softmax,attn-tile{block-m=16 block-n=32},cse)' --no-mlir-print-op-generic | FileCheck %s --check-prefix=SLICE
// With 128-key tiles a tile spans two pages: a [128] vector of the rows' pages (one table read a
// row, shared by the K and V loads), then each row reads its own page's row (a gather).
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-fuse-online-softmax,attn-tile{block-m=16 block-n=128},cse)' --no-mlir-print-op-generic | FileCheck %s --check-prefix=GATHER

// SLICE-LABEL: func.func @paged(
// SLICE-SAME: %{{.*}}: tensor<2x2x1x16xbf16>, %[[KP:[a-z0-9]+]]: tensor<9x2x64x16xbf16>, %[[VP:[a-z0-9]+]]: tensor<9x2x64x16xbf16>, %[[T:[a-z0-9]+]]: tensor<2x4xi32>,
// SLICE-NOT: attn.gather_pages
// SLICE: %[[B:.*]] = "attn.program_id"() {axis = 0 : i64}
// SLICE: %[[H:.*]] = "attn.program_id"() {axis = 1 : i64}
// SLICE: scf.for
// SLICE: %[[N0:.*]] = arith.muli %{{.*}}, %c32
// SLICE: %[[PI:.*]] = arith.divui %[[N0]], %c64
// SLICE: %[[PM:.*]] = arith.muli %[[PI]], %c64
// SLICE: %[[SLOT:.*]] = arith.subi %[[N0]], %[[PM]]
// SLICE: %[[RAW:.*]] = tensor.extract %[[T]][%[[B]], %[[PI]]] : tensor<2x4xi32>
// SLICE: %[[NUM:.*]] = arith.index_cast %[[RAW]]
// SLICE: %[[LO:.*]] = arith.maxsi %[[NUM]], %c0
// SLICE: %[[PAGE:.*]] = arith.minsi %[[LO]], %c8
// SLICE: tensor.extract_slice %[[KP]][%[[PAGE]], %[[H]], %[[SLOT]], 0] [1, 1, %{{.*}}, 16] [1, 1, 1, 1] : tensor<9x2x64x16xbf16> to tensor<?x16xbf16>
// SLICE: tensor.extract_slice %[[VP]][%[[PAGE]], %[[H]], %[[SLOT]], 0]
// SLICE: linalg.matmul

// GATHER-LABEL: func.func @paged(
// GATHER-SAME: %[[KP:[a-z0-9]+]]: tensor<9x2x64x16xbf16>, %[[VP:[a-z0-9]+]]: tensor<9x2x64x16xbf16>, %[[T:[a-z0-9]+]]: tensor<2x4xi32>,
// GATHER: scf.for
// GATHER: %[[N0:.*]] = arith.muli %{{.*}}, %c128
// GATHER: %[[ROWS:.*]] = linalg.generic {{.*}} outs(%{{.*}} : tensor<128xi32>)
// GATHER: %[[R:.*]] = linalg.index 0
// GATHER: %[[KEY:.*]] = arith.addi %[[N0]], %[[R]]
// GATHER: %[[KC:.*]] = arith.minsi %[[KEY]], %{{.*}}
// GATHER: %[[PI:.*]] = arith.divui %[[KC]], %c64
// GATHER: tensor.extract %[[T]][%{{.*}}, %[[PI]]] : tensor<2x4xi32>
// GATHER: linalg.generic {{.*}} ins(%[[ROWS]] : tensor<128xi32>) outs(%{{.*}} : tensor<128x16xbf16>)
// GATHER: ^bb0(%[[PAGE:.*]]: i32, %{{.*}}: bf16):
// GATHER: %[[SLOT:.*]] = arith.subi
// GATHER: %[[P:.*]] = arith.index_cast %[[PAGE]] : i32 to index
// GATHER: %[[D:.*]] = linalg.index 1
// GATHER: %[[X:.*]] = tensor.extract %[[KP]][%[[P]], %{{.*}}, %[[SLOT]], %[[D]]] : tensor<9x2x64x16xbf16>
// GATHER: arith.cmpi slt, %{{.*}}, %c256
// GATHER: arith.select %{{.*}}, %[[X]]
// GATHER: linalg.generic {{.*}} ins(%[[ROWS]] : tensor<128xi32>)
// GATHER: tensor.extract %[[VP]]
// GATHER: linalg.matmul

func.func @paged(%q: tensor<2x2x1x16xbf16>, %kp: tensor<9x2x64x16xbf16>, %vp: tensor<9x2x64x16xbf16>, %t: tensor<2x4xi32>) -> (tensor<2x2x1x16xbf16>, tensor<2x2x1xf32>) {
  %k = "attn.gather_pages"(%kp, %t) : (tensor<9x2x64x16xbf16>, tensor<2x4xi32>) -> tensor<2x2x256x16xbf16>
  %v = "attn.gather_pages"(%vp, %t) : (tensor<9x2x64x16xbf16>, tensor<2x4xi32>) -> tensor<2x2x256x16xbf16>
  %s = "attn.score"(%q, %k) {scale = 0.25 : f32} : (tensor<2x2x1x16xbf16>, tensor<2x2x256x16xbf16>) -> tensor<2x2x1x256xf32>
  %p, %lse = "attn.normalize"(%s) ({}, {}, {}) {kind = "softmax", operandSegmentSizes = array<i32: 1, 0>, resultSegmentSizes = array<i32: 1, 1>} : (tensor<2x2x1x256xf32>) -> (tensor<2x2x1x256xf32>, tensor<2x2x1xf32>)
  %o = "attn.aggregate"(%p, %v) : (tensor<2x2x1x256xf32>, tensor<2x2x256x16xbf16>) -> tensor<2x2x1x16xbf16>
  return %o, %lse : tensor<2x2x1x16xbf16>, tensor<2x2x1xf32>
}
