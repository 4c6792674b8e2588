// RUN: not ae-opt %t.does-not-exist.mlir 2>&1 | FileCheck %s --implicit-check-not=Traceback
// CHECK: error: cannot open input file '{{.*}}.does-not-exist.mlir': No such file or directory
