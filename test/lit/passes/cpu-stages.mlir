// attn-lower-to-cpu is a pipeline of stage passes, so --mlir-print-ir-after-all shows the IR
// between them. Here a kernel whose own loop carries a running maximum: after the grid loops it is
// on tensors and takes a range [first, last) of its programs as two index arguments after its
// arrays, one loop over that range carrying the destination, its own loop tagged as a state loop;
// after bufferization the state is one buffer per call that the loop updates in place, and each
// program writes its own row of the destination argument, which is not copied as a whole; the
// kernel returns nothing. Its C interface takes the range as two integers; its claiming entry's
// (attn-cpu-claim-programs) takes the arrays, the counters and two integers.
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-lower-to-cpu)' --mlir-print-ir-after-all --no-mlir-print-op-generic 2>&1 >/dev/null | FileCheck %s
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-lower-to-cpu)' --mlir-print-ir-after-all 2>&1 >/dev/null | grep 'IR Dump After' | FileCheck %s --check-prefix=ORDER

// CHECK-LABEL: IR Dump After GridLoops (attn-cpu-grid-loops)
// CHECK: func.func @running_max(%[[X:[a-z0-9]+]]: tensor<2x4x8xf32>, %[[OUT:[a-z0-9]+]]: tensor<2x8xf32>, %[[FIRST:[a-z0-9]+]]: index, %[[LAST:[a-z0-9]+]]: index) -> tensor<2x8xf32> attributes {llvm.emit_c_interface} {
// CHECK: %[[GRID:.*]] = scf.for %[[P:.*]] = %[[FIRST]] to %[[LAST]] step %c1 iter_args(%[[DEST:.*]] = %[[OUT]]) -> (tensor<2x8xf32>) {
// CHECK: scf.for %[[K:[a-z0-9]+]] = {{.*}} -> (tensor<8xf32>) {
// CHECK: tensor.extract_slice %[[X]][%[[P]], %[[K]], 0]
// CHECK: } {ae.cpu_state_loop}
// CHECK: %[[STORED:.*]] = tensor.insert_slice %{{.*}} into %[[DEST]][%[[P]], 0]
// CHECK-NEXT: scf.yield %[[STORED]]
// CHECK: return %[[GRID]]

// CHECK-LABEL: IR Dump After CarryStateInPlace (attn-cpu-carry-state-in-place)
// CHECK: scf.for {{.*}} iter_args(%[[STATE:[a-z0-9]+]] = %{{.*}}) -> (tensor<8xf32>) {
// CHECK: %[[NEXT:.*]] = vector.transfer_write
// CHECK-NEXT: %[[COPY:.*]] = linalg.copy {{.*}}ins(%[[NEXT]] : tensor<8xf32>) outs(%[[STATE]] : tensor<8xf32>)
// CHECK-NEXT: scf.yield %[[COPY]]
// CHECK-NOT: ae.cpu_state_loop

// CHECK-LABEL: IR Dump After Bufferize (attn-cpu-bufferize)
// CHECK: func.func @running_max(%{{[a-z0-9]+}}: memref<2x4x8xf32, strided<[?, ?, ?], offset: ?>>, %[[OUT:[a-z0-9]+]]: memref<2x8xf32, strided<[?, ?], offset: ?>>, %[[FIRST:[a-z0-9]+]]: index, %[[LAST:[a-z0-9]+]]: index) attributes {llvm.emit_c_interface} {
// CHECK-NOT: %[[OUT]]
// CHECK: scf.for %[[P:.*]] = %[[FIRST]] to %[[LAST]] step %c1 {
// CHECK: %[[STATE:.*]] = memref.alloc() {alignment = 64 : i64} : memref<8xf32>
// CHECK: vector.transfer_write %{{.*}}, %[[STATE]][%c0]
// CHECK: scf.for
// CHECK: vector.transfer_read %[[STATE]][%c0]
// CHECK: vector.transfer_write %{{.*}}, %[[STATE]][%c0]
// CHECK-NEXT: {{^ *}}}{{$}}
// CHECK: vector.transfer_write %{{.*}}, %[[OUT]][%[[P]], %c0]
// CHECK-NEXT: {{^ *}}}{{$}}
// CHECK-NEXT: return{{$}}

// CHECK-LABEL: IR Dump After PinUnitInnerStride (attn-cpu-pin-unit-inner-stride)
// CHECK: func.func @running_max(%{{[a-z0-9]+}}: memref<2x4x8xf32, strided<[?, ?, 1], offset: ?>>, %{{[a-z0-9]+}}: memref<2x8xf32, strided<[?, 1], offset: ?>>, %{{[a-z0-9]+}}: index, %{{[a-z0-9]+}}: index)

// The scratch buffers are allocated by each call, before its loop over the programs from %arg16
// (first; the two memrefs take 9 and 7 values), never in a global: calls on several threads share
// none.
// CHECK-LABEL: IR Dump After DefineBf16Truncation (attn-cpu-define-bf16-truncation)
// CHECK-NOT: llvm.mlir.global
// CHECK: llvm.func @running_max(
// CHECK: llvm.call @malloc
// CHECK: llvm.br ^bb{{[0-9]+}}(%arg16 : i64)
// CHECK: llvm.call @free
// CHECK: llvm.func @_mlir_ciface_running_max(%{{.*}}: !llvm.ptr, %{{.*}}: !llvm.ptr, %{{.*}}: i64, %{{.*}}: i64)
// CHECK: llvm.func @running_max_claiming(
// CHECK: llvm.func @_mlir_ciface_running_max_claiming(%{{.*}}: !llvm.ptr, %{{.*}}: !llvm.ptr, %{{.*}}: !llvm.ptr, %{{.*}}: i64, %{{.*}}: i64)
// CHECK: llvm.func @__truncsfbf2(

// ORDER: IR Dump After LowerScatter (attn-cpu-lower-scatter)
// ORDER-NEXT: IR Dump After GridLoops (attn-cpu-grid-loops)
// ORDER-NEXT: IR Dump After Canonicalizer (canonicalize)
// ORDER-NEXT: IR Dump After CSE (cse)
// ORDER-NEXT: IR Dump After WidenMatmulOperands (attn-cpu-widen-matmul-operands)
// ORDER-NEXT: IR Dump After SplitEmptyTensors (attn-cpu-split-empty-tensors)
// ORDER-NEXT: IR Dump After Vectorize (attn-cpu-vectorize)
// ORDER-NEXT: IR Dump After CarryStateInPlace (attn-cpu-carry-state-in-place)
// ORDER-NEXT: IR Dump After Bufferize (attn-cpu-bufferize)
// ORDER-NEXT: IR Dump After PinUnitInnerStride (attn-cpu-pin-unit-inner-stride)
// ORDER-NEXT: IR Dump After Canonicalizer (canonicalize)
// ORDER-NEXT: IR Dump After CSE (cse)
// ORDER-NEXT: IR Dump After LowerVectors (attn-cpu-lower-vectors)
// ORDER-NEXT: IR Dump After ExpandSinCos (attn-cpu-expand-sin-cos)
// ORDER-NEXT: (buffer-loop-hoisting)
// ORDER: (convert-vector-to-scf)
// ORDER-NEXT: IR Dump After Canonicalizer (canonicalize)
// ORDER-NEXT: IR Dump After CSE (cse)
// ORDER-NEXT: IR Dump After LegalizeForLlvm (attn-cpu-legalize-for-llvm)
// ORDER-NEXT: IR Dump After ClaimPrograms (attn-cpu-claim-programs)
// ORDER-NEXT: (lower-affine)
// ORDER: (reconcile-unrealized-casts)
// ORDER-NEXT: IR Dump After Canonicalizer (canonicalize)
// ORDER-NEXT: IR Dump After DefineBf16Truncation (attn-cpu-define-bf16-truncation)
// ORDER-NEXT: IR Dump After Bf16MemoryAsIntegers (attn-cpu-bf16-memory-as-integers)
// ORDER-NOT: IR Dump

#id = affine_map<(d0) -> (d0)>
func.func @running_max(%x: tensor<2x4x8xf32>, %out: tensor<2x8xf32>) -> tensor<2x8xf32>
    attributes {attn.grid = array<i64: 2>} {
  %p = "attn.program_id"() {axis = 0 : i64} : () -> index
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c4 = arith.constant 4 : index
  %lowest = arith.constant 0xFF800000 : f32
  %empty = tensor.empty() : tensor<8xf32>
  %init = linalg.fill ins(%lowest : f32) outs(%empty : tensor<8xf32>) -> tensor<8xf32>
  %max = scf.for %k = %c0 to %c4 step %c1 iter_args(%state = %init) -> (tensor<8xf32>) {
    %row = tensor.extract_slice %x[%p, %k, 0] [1, 1, 8] [1, 1, 1] : tensor<2x4x8xf32> to tensor<8xf32>
    %next = linalg.generic {indexing_maps = [#id, #id, #id], iterator_types = ["parallel"]}
        ins(%state, %row : tensor<8xf32>, tensor<8xf32>) outs(%empty : tensor<8xf32>) {
    ^bb0(%a: f32, %b: f32, %o: f32):
      %m = arith.maximumf %a, %b : f32
      linalg.yield %m : f32
    } -> tensor<8xf32>
    scf.yield %next : tensor<8xf32>
  }
  %r = tensor.insert_slice %max into %out[%p, 0] [1, 8] [1, 1] : tensor<8xf32> into tensor<2x8xf32>
  return %r : tensor<2x8xf32>
}
