// --mlir-print-ir-after-all dumps the IR (generic form) to stderr after each pass, ae and
// upstream alike; stdout keeps the final module only.
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-verify,canonicalize)' --mlir-print-ir-after-all 2>&1 >/dev/null | FileCheck %s
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-verify,canonicalize)' --mlir-print-ir-after-all 2>/dev/null | FileCheck %s --check-prefix=OUT
// A pipeline name stands for its passes, each dumped on its own, in pipeline and flag syntax alike.
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-lower-to-cpu)' --mlir-print-ir-after-all 2>&1 >/dev/null | FileCheck %s --check-prefix=STAGES
// RUN: ae-opt %s --attn-lower-to-cpu=unit-inner-stride=false --mlir-print-ir-after-all 2>&1 >/dev/null | FileCheck %s --check-prefix=STAGES

// CHECK: // -----// IR Dump After AttnVerify (attn-verify) //----- //
// CHECK-NEXT: "builtin.module"() ({
// CHECK: "arith.constant"
// CHECK: // -----// IR Dump After Canonicalizer (canonicalize) //----- //
// CHECK-NEXT: "builtin.module"() ({
// CHECK-NEXT: sym_name = "f"
// CHECK-NEXT: "func.return"

// STAGES-NOT: (attn-lower-to-cpu)
// STAGES: // -----// IR Dump After GridLoops (attn-cpu-grid-loops) //----- //
// STAGES: // -----// IR Dump After Bufferize (attn-cpu-bufferize) //----- //
// STAGES: // -----// IR Dump After ConvertFuncToLLVMPass (convert-func-to-llvm) //----- //
// STAGES: // -----// IR Dump After DefineBf16Truncation (attn-cpu-define-bf16-truncation) //----- //
// STAGES-NOT: (attn-lower-to-cpu)

// OUT-NOT: IR Dump
// OUT: "builtin.module"
func.func @f() {
  %unused = arith.constant 1.0 : f32
  return
}
