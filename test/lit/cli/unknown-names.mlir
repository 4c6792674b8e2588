// Unknown presets, emit kinds and targets fail cleanly, before reading the input, and list the
// known ones.
// RUN: not ae-opt %s --pipeline=gpu 2>&1 | FileCheck %s --check-prefix=PRESET --implicit-check-not=Traceback
// RUN: not ae-opt %s --emit=spirv 2>&1 | FileCheck %s --check-prefix=EMIT --implicit-check-not=Traceback
// RUN: not ae-opt %s --target=cuda:sm90 2>&1 | FileCheck %s --check-prefix=TARGET --implicit-check-not=Traceback

// PRESET: error: unknown pipeline 'gpu' (expected one of cpu, triton)
// EMIT: error: unknown --emit kind 'spirv' (expected one of mlir, ttir, ptx, amdgcn, llvmir)
// TARGET: error: unknown --target 'cuda:sm90' (expected cuda:<sm>, hip:<gfx arch> or host)
func.func @f() {
  return
}
