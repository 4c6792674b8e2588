// RUN: ae-opt --list-passes | FileCheck %s

// CHECK: ae-mlir passes
// CHECK: attn-differentiate {{.+}}
// CHECK: attn-verify {{.+}}
// CHECK-NEXT: max-errors=<integer> {{.+}} (default: 0)
// CHECK: Upstream MLIR passes (canonicalize, cse, {{.*}}) are accepted by name too
// CHECK: Pipelines (--pipeline=NAME):
// CHECK-NEXT: cpu {{.*}}attn-lower-to-cpu
// CHECK-NEXT: triton {{.*}}attn-lower-to-triton
