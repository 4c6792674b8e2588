// attn-cpu-bf16-memory-as-integers: bf16 vectors that only cross memory are loaded and stored as
// i16 vectors (LLVM's x86 backend, without AVX512-BF16, writes a bf16 vector store one element
// at a time). A store of integers bitcast to bf16 stores the integers; a copy loads and stores
// i16; a load bitcast to i32 lanes loads i16 and bitcasts that. A load that arithmetic reads
// (fpext) stays bf16.
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-cpu-bf16-memory-as-integers)' --no-mlir-print-op-generic | FileCheck %s

// CHECK-LABEL: llvm.func @moves(
// CHECK-SAME: %[[P:[a-z0-9]+]]: !llvm.ptr, %[[Q:[a-z0-9]+]]: !llvm.ptr, %[[BITS:[a-z0-9]+]]: vector<64xi16>)
// CHECK-NEXT: llvm.store %[[BITS]], %[[P]] : vector<64xi16>, !llvm.ptr
// CHECK-NEXT: %[[COPY:.*]] = llvm.load %[[P]] {alignment = 2 : i64} : !llvm.ptr -> vector<64xi16>
// CHECK-NEXT: llvm.store %[[COPY]], %[[Q]] : vector<64xi16>, !llvm.ptr
// CHECK-NEXT: %[[PAIRS:.*]] = llvm.load %[[Q]] : !llvm.ptr -> vector<32xi16>
// CHECK-NEXT: %[[WIDE:.*]] = llvm.bitcast %[[PAIRS]] : vector<32xi16> to vector<16xi32>
// CHECK-NEXT: llvm.store %[[WIDE]], %[[P]] : vector<16xi32>, !llvm.ptr
// CHECK-NEXT: %[[X:.*]] = llvm.load %[[Q]] : !llvm.ptr -> vector<16xbf16>
// CHECK-NEXT: llvm.fpext %[[X]] : vector<16xbf16> to vector<16xf32>
// CHECK-NOT: bf16>, !llvm.ptr
llvm.func @moves(%p: !llvm.ptr, %q: !llvm.ptr, %bits: vector<64xi16>) {
  %v = llvm.bitcast %bits : vector<64xi16> to vector<64xbf16>
  llvm.store %v, %p : vector<64xbf16>, !llvm.ptr
  %l = llvm.load %p {alignment = 2 : i64} : !llvm.ptr -> vector<64xbf16>
  llvm.store %l, %q : vector<64xbf16>, !llvm.ptr
  %w = llvm.load %q : !llvm.ptr -> vector<32xbf16>
  %i = llvm.bitcast %w : vector<32xbf16> to vector<16xi32>
  llvm.store %i, %p : vector<16xi32>, !llvm.ptr
  %x = llvm.load %q : !llvm.ptr -> vector<16xbf16>
  %e = llvm.fpext %x : vector<16xbf16> to vector<16xf32>
  llvm.store %e, %p : vector<16xf32>, !llvm.ptr
  llvm.return
}
