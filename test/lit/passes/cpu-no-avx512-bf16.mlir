// attn-cpu-no-avx512-bf16 gives every function defined in an llvm-dialect module the target
// feature "-avx512bf16": on hosts with those instructions LLVM's x86 backend aborted legalizing
// bf16 vectors such as this row of 9 (a bf16 head dim of 9 or 17); the kernels convert bf16 with
// integer bit operations and need none of them. Declarations stay as they are.
// RUN: ae-opt %s --attn-cpu-no-avx512-bf16 --no-mlir-print-op-generic | FileCheck %s

// CHECK-LABEL: llvm.func @malloc(i64) -> !llvm.ptr
// CHECK-NOT: target_features
// CHECK: llvm.func @load_row(%{{.*}}: !llvm.ptr) -> vector<9xbf16> attributes {target_features = #llvm.target_features<["-avx512bf16"]>}
// CHECK-NEXT: llvm.load
llvm.func @malloc(i64) -> !llvm.ptr
llvm.func @load_row(%p: !llvm.ptr) -> vector<9xbf16> {
  %v = llvm.load %p : !llvm.ptr -> vector<9xbf16>
  llvm.return %v : vector<9xbf16>
}
