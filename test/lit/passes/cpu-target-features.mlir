// attn-cpu-no-avx512-bf16 gives every function defined in an llvm-dialect module the target
// feature "-avx512bf16": on hosts with those instructions LLVM's x86 backend aborted legalizing
// bf16 vectors such as this row of 9 (a bf16 head dim of 9 or 17); the kernels convert bf16 with
// integer bit operations and need none of them. attn-cpu-narrow-isa leaves out the x86 vector
// extensions wider than its vector-bits (AVX-512F at 256, AVX at 128), as a host without them
// would run the kernels; the two add to what a function has, in either order. Declarations stay
// as they are.
// RUN: ae-opt %s --attn-cpu-no-avx512-bf16 --no-mlir-print-op-generic | FileCheck %s
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-cpu-no-avx512-bf16,attn-cpu-narrow-isa)' --no-mlir-print-op-generic | FileCheck %s --check-prefix=AVX2
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-cpu-narrow-isa{vector-bits=128},attn-cpu-no-avx512-bf16)' --no-mlir-print-op-generic | FileCheck %s --check-prefix=SSE
// RUN: not ae-opt %s --pass-pipeline='builtin.module(attn-cpu-narrow-isa{vector-bits=512})' 2>&1 | FileCheck %s --check-prefix=BAD --implicit-check-not=Traceback

// CHECK-LABEL: llvm.func @malloc(i64) -> !llvm.ptr
// CHECK-NOT: target_features
// CHECK: llvm.func @load_row(%{{.*}}: !llvm.ptr) -> vector<9xbf16> attributes {target_features = #llvm.target_features<["-avx512bf16"]>}
// CHECK-NEXT: llvm.load

// AVX2: llvm.func @malloc(i64) -> !llvm.ptr{{$}}
// AVX2: llvm.func @load_row(%{{.*}}: !llvm.ptr) -> vector<9xbf16> attributes {target_features = #llvm.target_features<["-avx512bf16", "-avx512f"]>}
// SSE: llvm.func @malloc(i64) -> !llvm.ptr{{$}}
// SSE: llvm.func @load_row(%{{.*}}: !llvm.ptr) -> vector<9xbf16> attributes {target_features = #llvm.target_features<["-avx", "-avx512bf16"]>}
// BAD: error: option 'vector-bits' of pass 'attn-cpu-narrow-isa' must be one of 128, 256, got '512'
llvm.func @malloc(i64) -> !llvm.ptr
llvm.func @load_row(%p: !llvm.ptr) -> vector<9xbf16> {
  %v = llvm.load %p : !llvm.ptr -> vector<9xbf16>
  llvm.return %v : vector<9xbf16>
}
