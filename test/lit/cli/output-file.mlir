// -o writes the output file, atomically: a failed run leaves an existing file as it was and
// creates none; an unwritable path is a clean error.
// RUN: rm -rf %t && mkdir -p %t
// RUN: ae-opt %s -o %t/out.mlir
// RUN: FileCheck %s < %t/out.mlir
// RUN: echo 'old contents' > %t/kept.mlir
// RUN: echo 'func.func @broken(' > %t/broken.mlir
// RUN: not ae-opt %t/broken.mlir -o %t/kept.mlir 2>&1 | FileCheck %s --check-prefix=BROKEN --implicit-check-not=Traceback
// RUN: FileCheck %s --check-prefix=KEPT < %t/kept.mlir
// RUN: not ae-opt %t/broken.mlir -o %t/new.mlir
// RUN: not ls %t/new.mlir
// RUN: not ae-opt %s -o %t/missing-dir/out.mlir 2>&1 | FileCheck %s --check-prefix=UNWRITABLE --implicit-check-not=Traceback
// RUN: not ls %t/missing-dir
// RUN: ls %t | FileCheck %s --check-prefix=NO-TEMP --implicit-check-not=.tmp

// CHECK: sym_name = "f"
// BROKEN: broken.mlir:1:{{[0-9]+}}: error:
// KEPT: old contents
// UNWRITABLE: error: cannot write output file '{{.*}}missing-dir/out.mlir': No such file or directory
// NO-TEMP: out.mlir
func.func @f() {
  return
}
