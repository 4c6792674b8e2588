// attn-cpu-claim-programs adds, after each lowered kernel (arrays, then a range [first, last) of
// its programs), an entry that threads share: it takes the kernel's arrays, three counters (the
// next unclaimed program, the threads that entered, the threads that finished), the programs per
// claim (at least one) and the number of programs. It counts itself in, claims ranges with an
// atomic fetch-and-add and runs the kernel on each until the counter passes the programs, counts
// itself out, and spins on atomic reads until every thread that entered has finished, sleeping
// 20 us a round (libc's usleep, declared once) after 65536 rounds. Functions that are not lowered
// kernels get none.
// RUN: ae-opt %s --attn-cpu-claim-programs --no-mlir-print-op-generic | FileCheck %s

// CHECK: func.func private @usleep(i32) -> i32
// CHECK-LABEL: func.func @kernel(
// CHECK-LABEL: func.func @kernel_claiming(
// CHECK-SAME: %[[A:[a-z0-9]+]]: memref<2x8xf32, strided<[?, 1], offset: ?>>, %[[C:[a-z0-9]+]]: memref<3xi64>, %[[CHUNK:[a-z0-9]+]]: index, %[[N:[a-z0-9]+]]: index) attributes {llvm.emit_c_interface} {
// CHECK-DAG: %[[NEXT:.*]] = arith.constant 0 : index
// CHECK-DAG: %[[ENTERED:.*]] = arith.constant 1 : index
// CHECK-DAG: %[[FINISHED:.*]] = arith.constant 2 : index
// CHECK-DAG: %[[ZERO:.*]] = arith.constant 0 : i64
// CHECK-DAG: %[[ONE:.*]] = arith.constant 1 : i64
// CHECK: %[[STEP:.*]] = arith.maxui %[[CHUNK]], %[[ENTERED]] : index
// CHECK: memref.atomic_rmw addi %[[ONE]], %[[C]][%[[ENTERED]]]
// CHECK: scf.while : () -> index {
// CHECK: %[[STEP64:.*]] = arith.index_cast %[[STEP]] : index to i64
// CHECK: %[[OLD:.*]] = memref.atomic_rmw addi %[[STEP64]], %[[C]][%[[NEXT]]]
// CHECK: %[[FIRST:.*]] = arith.index_cast %[[OLD]] : i64 to index
// CHECK: %[[MORE:.*]] = arith.cmpi ult, %[[FIRST]], %[[N]] : index
// CHECK: scf.condition(%[[MORE]]) %[[FIRST]] : index
// CHECK: ^bb0(%[[F:.*]]: index):
// CHECK: %[[END:.*]] = arith.addi %[[F]], %[[STEP]] : index
// CHECK: %[[LAST:.*]] = arith.minui %[[END]], %[[N]] : index
// CHECK: func.call @kernel(%[[A]], %[[F]], %[[LAST]])
// CHECK: memref.atomic_rmw addi %[[ONE]], %[[C]][%[[FINISHED]]]
// CHECK: scf.while (%[[SPIN:.*]] = %[[ZERO]]) : (i64) -> i64 {
// CHECK: %[[DONE:.*]] = memref.atomic_rmw addi %[[ZERO]], %[[C]][%[[FINISHED]]]
// CHECK: %[[IN:.*]] = memref.atomic_rmw addi %[[ZERO]], %[[C]][%[[ENTERED]]]
// CHECK: %[[WAIT:.*]] = arith.cmpi ult, %[[DONE]], %[[IN]] : i64
// CHECK: scf.condition(%[[WAIT]]) %[[SPIN]] : i64
// CHECK: ^bb0(%[[N:.*]]: i64):
// CHECK: %[[LONG:.*]] = arith.cmpi uge, %[[N]], %c65536_i64 : i64
// CHECK: scf.if %[[LONG]] {
// CHECK: func.call @usleep(%c20_i32) : (i32) -> i32
// CHECK: %[[NEXT_SPIN:.*]] = arith.addi %[[N]], %[[ONE]] : i64
// CHECK: scf.yield %[[NEXT_SPIN]] : i64
// CHECK: return
// CHECK-NOT: func.func @helper_claiming
func.func @kernel(%a: memref<2x8xf32, strided<[?, 1], offset: ?>>, %first: index, %last: index)
    attributes {llvm.emit_c_interface} {
  %c1 = arith.constant 1 : index
  %zero = arith.constant 0.0 : f32
  scf.for %p = %first to %last step %c1 {
    %c0 = arith.constant 0 : index
    memref.store %zero, %a[%p, %c0] : memref<2x8xf32, strided<[?, 1], offset: ?>>
  }
  return
}

func.func @helper(%x: index) -> index {
  return %x : index
}
