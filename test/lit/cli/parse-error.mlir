// Unparsable input: an MLIR-style located error on stderr, exit status 1, no traceback; on stdin
// the file is called <stdin>.
// RUN: not ae-opt %s 2>&1 | FileCheck %s --implicit-check-not=Traceback
// RUN: not ae-opt < %s 2>&1 | FileCheck %s --check-prefix=STDIN --implicit-check-not=Traceback
// RUN: not ae-opt - < %s 2>&1 | FileCheck %s --check-prefix=STDIN --implicit-check-not=Traceback

func.func @f(%q: tensor<2x4x8x16xf32>) {
  %s = "attn.score"(%q, %q) {scale = 0.25 : f32} : (tensor<2x4x8x16xf32>, tensor<2x4x8x16xf32>) -> tensor<2x4x8x8xf32
  return
}
// CHECK: parse-error.mlir:[[@LINE-3]]:{{[0-9]+}}: error: expected '>'
// STDIN: <stdin>:[[@LINE-4]]:{{[0-9]+}}: error: expected '>'
