// attn-lower-to-cpu turns an L1 kernel into LLVM-dialect code: a loop over a range of the flat
// program ids of attn.grid, given as two index arguments, carrying the destination (each program
// id decoded from the flat one, the last axis fastest), then tiling, vectorization and one-shot
// bufferization with strided arguments, then upstream conversions to the llvm dialect.
// LOOPS and MEM run the stages up to the grid loops and up to the conversion to LLVM; ANY shows
// that unit-inner-stride=false leaves attn-cpu-pin-unit-inner-stride out of the pipeline.
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-cpu-grid-loops,canonicalize,cse,attn-cpu-split-empty-tensors)' --no-mlir-print-op-generic | FileCheck %s --check-prefix=LOOPS
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-cpu-grid-loops,canonicalize,cse,attn-cpu-split-empty-tensors,attn-cpu-vectorize,attn-cpu-carry-state-in-place,attn-cpu-bufferize,attn-cpu-pin-unit-inner-stride,canonicalize,cse,attn-cpu-lower-vectors,func.func(buffer-loop-hoisting),buffer-deallocation-pipeline,convert-bufferization-to-memref,convert-linalg-to-loops,convert-vector-to-scf,canonicalize,cse,attn-cpu-legalize-for-llvm)' --no-mlir-print-op-generic | FileCheck %s --check-prefix=MEM
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-lower-to-cpu{unit-inner-stride=false})' --mlir-print-ir-after-all --no-mlir-print-op-generic 2>&1 >/dev/null | FileCheck %s --check-prefix=ANY
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-lower-to-cpu)' --no-mlir-print-op-generic | FileCheck %s --check-prefix=LLVM

// Each program (b, h, m) loads rows [8m, 8m + 8) of q[b, h] (zero-padded past L = 12), adds a
// captured per-head bias, takes exp2 and stores the valid rows into out[b, h].

// LOOPS-LABEL: func.func @kernel
// LOOPS-SAME: (%[[Q:[a-z0-9]+]]: tensor<2x2x12x16xf32>, %[[BIAS:[a-z0-9]+]]: tensor<2xf32>, %[[OUT:[a-z0-9]+]]: tensor<2x2x12x16xf32>, %[[FIRST:[a-z0-9]+]]: index, %[[LAST:[a-z0-9]+]]: index) -> tensor<2x2x12x16xf32>
// LOOPS-SAME: attributes {llvm.emit_c_interface} {
// LOOPS: %[[R:.*]] = scf.for %[[P:.*]] = %[[FIRST]] to %[[LAST]] step %c1 iter_args(%[[O:.*]] = %[[OUT]]) -> (tensor<2x2x12x16xf32>)
// LOOPS-NEXT: %[[M:.*]] = arith.remui %[[P]], %c2
// LOOPS-NEXT: %[[BH:.*]] = arith.divui %[[P]], %c2
// LOOPS-NEXT: %[[H:.*]] = arith.remui %[[BH]], %c2
// LOOPS-NEXT: %[[B:.*]] = arith.divui %[[BH]], %c2
// LOOPS-NEXT: %[[M0:.*]] = arith.muli %[[M]], %c8
// LOOPS: tensor.extract_slice %[[Q]][%[[B]], %[[H]], %[[M0]], 0]
// LOOPS: tensor.pad
// LOOPS: linalg.generic
// LOOPS: tensor.extract %[[BIAS]][%[[H]]]
// LOOPS: math.exp2
// LOOPS: %[[STORED:.*]] = tensor.insert_slice %{{.*}} into %[[O]][%[[B]], %[[H]], %[[M0]], 0]
// LOOPS-NEXT: scf.yield %[[STORED]]
// LOOPS-NEXT: }
// LOOPS-NEXT: return %[[R]]

// After bufferization the kernel writes its destination in place and returns nothing. Arguments
// keep dynamic strides (unit innermost stride unless unit-inner-stride=false), the q tile is a
// subview of q read by masked vector transfers, no buffer is as large as an input, the captured
// bias is read by scalar loads, and exp2 is a polynomial (with floor for the exponent): its
// argument is clamped by min/max without NaN propagation (a select passes NaN through after),
// and its Horner steps may contract to fused multiply-adds.
// MEM-LABEL: func.func @kernel
// MEM-SAME: (%[[Q:[a-z0-9]+]]: memref<2x2x12x16xf32, strided<[?, ?, ?, 1], offset: ?>>, %[[BIAS:[a-z0-9]+]]: memref<2xf32, strided<[1], offset: ?>>, %[[OUT:[a-z0-9]+]]: memref<2x2x12x16xf32, strided<[?, ?, ?, 1], offset: ?>>, %{{[a-z0-9]+}}: index, %{{[a-z0-9]+}}: index)
// MEM-SAME: attributes
// MEM-NOT: memref.alloc() {{.*}} memref<2x2x12x16xf32>
// MEM-NOT: math.exp2
// MEM-NOT: vector.gather
// MEM: scf.for
// MEM: memref.subview %[[Q]]
// MEM: vector.load
// MEM: memref.load %[[BIAS]]
// MEM: arith.maxnumf {{.*}} fastmath<nnan>
// MEM: arith.minnumf {{.*}} fastmath<nnan>
// MEM: math.floor
// MEM: arith.mulf {{.*}} fastmath<contract>
// MEM: arith.addf {{.*}} fastmath<contract>
// MEM: arith.cmpf uno
// MEM: memref.subview %[[OUT]]
// MEM: memref.dealloc
// MEM-NEXT: return
// ANY: IR Dump After Bufferize (attn-cpu-bufferize)
// ANY: func.func @kernel
// ANY-SAME: (%{{[a-z0-9]+}}: memref<2x2x12x16xf32, strided<[?, ?, ?, ?], offset: ?>>, %{{[a-z0-9]+}}: memref<2xf32, strided<[?], offset: ?>>, %{{[a-z0-9]+}}: memref<2x2x12x16xf32, strided<[?, ?, ?, ?], offset: ?>>, %{{[a-z0-9]+}}: index, %{{[a-z0-9]+}}: index)
// ANY-NOT: attn-cpu-pin-unit-inner-stride
// ANY: IR Dump After DefineBf16Truncation (attn-cpu-define-bf16-truncation)

// LLVM-NOT: attn.
// LLVM: llvm.func @kernel(%arg0: !llvm.ptr, %arg1: !llvm.ptr, %arg2: i64
// LLVM-SAME: llvm.emit_c_interface
// LLVM: llvm.intr.floor
// LLVM: llvm.func @_mlir_ciface_kernel(%arg0: !llvm.ptr, %arg1: !llvm.ptr, %arg2: !llvm.ptr, %arg3: i64, %arg4: i64)
// LLVM-NEXT: llvm.load %arg0
// LLVM: llvm.call @kernel(

func.func @kernel(%q: tensor<2x2x12x16xf32>, %bias: tensor<2xf32>, %out: tensor<2x2x12x16xf32>) -> tensor<2x2x12x16xf32>
    attributes {attn.grid = array<i64: 2, 2, 2>} {
  %b = "attn.program_id"() {axis = 0 : i64} : () -> index
  %h = "attn.program_id"() {axis = 1 : i64} : () -> index
  %m = "attn.program_id"() {axis = 2 : i64} : () -> index
  %c8 = arith.constant 8 : index
  %c12 = arith.constant 12 : index
  %zero = arith.constant 0.0 : f32
  %m0 = arith.muli %m, %c8 : index
  %left = arith.subi %c12, %m0 : index
  %rows = arith.minsi %left, %c8 : index
  %pad = arith.subi %c8, %rows : index
  %slice = tensor.extract_slice %q[%b, %h, %m0, 0] [1, 1, %rows, 16] [1, 1, 1, 1] : tensor<2x2x12x16xf32> to tensor<?x16xf32>
  %tile = tensor.pad %slice low[0, 0] high[%pad, 0] {
  ^bb0(%i: index, %j: index):
    tensor.yield %zero : f32
  } : tensor<?x16xf32> to tensor<8x16xf32>
  %empty = tensor.empty() : tensor<8x16xf32>
  %e = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0, d1)>],
                       iterator_types = ["parallel", "parallel"]}
      ins(%tile : tensor<8x16xf32>) outs(%empty : tensor<8x16xf32>) {
  ^bb0(%x: f32, %o: f32):
    %s = tensor.extract %bias[%h] : tensor<2xf32>
    %y = arith.addf %x, %s : f32
    %z = math.exp2 %y : f32
    linalg.yield %z : f32
  } -> tensor<8x16xf32>
  %valid = tensor.extract_slice %e[0, 0] [%rows, 16] [1, 1] : tensor<8x16xf32> to tensor<?x16xf32>
  %r = tensor.insert_slice %valid into %out[%b, %h, %m0, 0] [1, 1, %rows, 16] [1, 1, 1, 1] : tensor<?x16xf32> into tensor<2x2x12x16xf32>
  return %r : tensor<2x2x12x16xf32>
}
