// --mlir-print-ir-after-all dumps the IR (generic form) to stderr after each pass, ae and
// upstream alike; stdout keeps the final module only.
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-verify,canonicalize)' --mlir-print-ir-after-all 2>&1 >/dev/null | FileCheck %s
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-verify,canonicalize)' --mlir-print-ir-after-all 2>/dev/null | FileCheck %s --check-prefix=OUT

// CHECK: // -----// IR Dump After AttnVerify (attn-verify) //----- //
// CHECK-NEXT: "builtin.module"() ({
// CHECK: "arith.constant"
// CHECK: // -----// IR Dump After Canonicalizer (canonicalize) //----- //
// CHECK-NEXT: "builtin.module"() ({
// CHECK-NEXT: sym_name = "f"
// CHECK-NEXT: "func.return"

// OUT-NOT: IR Dump
// OUT: "builtin.module"
func.func @f() {
  %unused = arith.constant 1.0 : f32
  return
}
