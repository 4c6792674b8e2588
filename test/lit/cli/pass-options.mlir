// Pass options are typed: unknown names and bad values are clean errors, in pipeline syntax
// (space-separated) and in flag syntax (comma-separated). Upstream passes' options are checked by
// MLIR itself and reported the same way.
// RUN: not ae-opt %s --pass-pipeline='builtin.module(attn-verify{max-errors=1 colour=red})' 2>&1 | FileCheck %s --check-prefix=UNKNOWN --implicit-check-not=Traceback
// RUN: not ae-opt %s --attn-verify=max-errors=1,colour=red 2>&1 | FileCheck %s --check-prefix=UNKNOWN --implicit-check-not=Traceback
// RUN: not ae-opt %s --attn-verify=max-errors=many 2>&1 | FileCheck %s --check-prefix=VALUE --implicit-check-not=Traceback
// RUN: not ae-opt %s --pass-pipeline='builtin.module(attn-verify{max-errors=-1})' 2>&1 | FileCheck %s --check-prefix=RANGE --implicit-check-not=Traceback
// RUN: not ae-opt %s --pass-pipeline='builtin.module(canonicalize{max-iterations=many})' 2>&1 | FileCheck %s --check-prefix=UPSTREAM --implicit-check-not=Traceback
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-verify{max-errors=2},canonicalize{max-iterations=3})' | FileCheck %s
// RUN: ae-opt %s --attn-verify=max-errors=2 --canonicalize=max-iterations=3 | FileCheck %s

// UNKNOWN: error: pass 'attn-verify' has no option 'colour' (its options: max-errors)
// VALUE: error: option 'max-errors' of pass 'attn-verify' expects an integer, got 'many'
// RANGE: error: invalid options for pass 'attn-verify': max-errors must be at least 0, got -1
// UPSTREAM: error: cannot add 'canonicalize{max-iterations=many}' to the pass pipeline: {{.*}}'many' value invalid

// CHECK: sym_name = "f"
func.func @f() {
  return
}
