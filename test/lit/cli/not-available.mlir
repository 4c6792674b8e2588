// Presets and emit kinds whose passes do not exist yet fail cleanly, before reading the input;
// unknown names list the known ones.
// RUN: not ae-opt %s --pipeline=cpu 2>&1 | FileCheck %s --check-prefix=CPU --implicit-check-not=Traceback
// RUN: not ae-opt %s --pipeline=triton 2>&1 | FileCheck %s --check-prefix=TRITON --implicit-check-not=Traceback
// RUN: not ae-opt %s --pipeline=gpu 2>&1 | FileCheck %s --check-prefix=PRESET --implicit-check-not=Traceback
// RUN: not ae-opt %s --emit=ptx 2>&1 | FileCheck %s --check-prefix=PTX --implicit-check-not=Traceback
// RUN: not ae-opt %s --emit=spirv 2>&1 | FileCheck %s --check-prefix=EMIT --implicit-check-not=Traceback
// RUN: not ae-opt %s --target=cuda:sm90 2>&1 | FileCheck %s --check-prefix=TARGET --implicit-check-not=Traceback

// CPU: error: pipeline 'cpu' needs pass '{{attn-[a-z-]+}}', which is not available yet
// TRITON: error: pipeline 'triton' needs pass '{{attn-[a-z-]+}}', which is not available yet
// PRESET: error: unknown pipeline 'gpu' (expected one of cpu, triton)
// PTX: error: --emit=ptx is not available yet
// EMIT: error: unknown --emit kind 'spirv' (expected one of mlir, ttir, ptx, amdgcn, llvmir)
// TARGET: error: unknown --target 'cuda:sm90' (expected cuda:<sm>, hip:<gfx arch> or host)
func.func @f() {
  return
}
