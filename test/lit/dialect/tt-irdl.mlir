// The tt subset in dialects/tt.irdl.mlir verifies Triton IR as attn-lower-to-triton writes it
// (inherent attributes in the attribute dictionary, gpu.yield ending the kernel and combiners),
// in ae-opt and in upstream mlir-opt with the IRDL file alone.
// RUN: ae-opt %s --split-input-file --verify-diagnostics
// RUN: mlir-opt --irdl-file=%S/../../../dialects/tt.irdl.mlir %s --split-input-file --verify-diagnostics

"tt.func"() ({
^bb0(%x: !tt.ptr<f32>, %n: i32):
  %pid = "tt.get_program_id"() {axis = 0 : i32} : () -> i32
  %r = "tt.make_range"() {start = 0 : i32, end = 16 : i32} : () -> tensor<16xi32>
  %base = "tt.addptr"(%x, %pid) : (!tt.ptr<f32>, i32) -> !tt.ptr<f32>
  %ps = "tt.splat"(%base) : (!tt.ptr<f32>) -> tensor<16x!tt.ptr<f32>>
  %p = "tt.addptr"(%ps, %r) : (tensor<16x!tt.ptr<f32>>, tensor<16xi32>) -> tensor<16x!tt.ptr<f32>>
  %ns = "tt.splat"(%n) : (i32) -> tensor<16xi32>
  %m = arith.cmpi slt, %r, %ns : tensor<16xi32>
  %zero = arith.constant dense<0.0> : tensor<16xf32>
  %v = "tt.load"(%p, %m, %zero) {cache = 1 : i32, evict = 1 : i32, isVolatile = false, operandSegmentSizes = array<i32: 1, 1, 1>} : (tensor<16x!tt.ptr<f32>>, tensor<16xi1>, tensor<16xf32>) -> tensor<16xf32>
  %col = "tt.expand_dims"(%v) {axis = 1 : i32} : (tensor<16xf32>) -> tensor<16x1xf32>
  %a = "tt.broadcast"(%col) : (tensor<16x1xf32>) -> tensor<16x16xf32>
  %b = "tt.trans"(%a) {order = array<i32: 1, 0>} : (tensor<16x16xf32>) -> tensor<16x16xf32>
  %acc = arith.constant dense<0.0> : tensor<16x16xf32>
  %d = "tt.dot"(%a, %b, %acc) {inputPrecision = 2 : i32, maxNumImpreciseAcc = 0 : i32} : (tensor<16x16xf32>, tensor<16x16xf32>, tensor<16x16xf32>) -> tensor<16x16xf32>
  %s = "tt.reduce"(%d) ({
  ^bb0(%l: f32, %rr: f32):
    %t = arith.addf %l, %rr : f32
    "gpu.yield"(%t) : (f32) -> ()
  }) {axis = 1 : i32} : (tensor<16x16xf32>) -> tensor<16xf32>
  "tt.store"(%p, %s, %m) {cache = 1 : i32, evict = 1 : i32} : (tensor<16x!tt.ptr<f32>>, tensor<16xf32>, tensor<16xi1>) -> ()
  "gpu.yield"() : () -> ()
}) {function_type = (!tt.ptr<f32>, i32) -> (), sym_name = "ok", sym_visibility = "public", noinline = false, arg_attrs = [{tt.divisibility = 16 : i32}, {}]} : () -> ()

// -----

"tt.func"() ({
^bb0(%x: !tt.ptr<f32>):
  // expected-error @+1 {{'tt.load' op attribute "cache" is expected but not provided}}
  %v = "tt.load"(%x) {evict = 1 : i32, isVolatile = false, operandSegmentSizes = array<i32: 1, 0, 0>} : (!tt.ptr<f32>) -> f32
  "gpu.yield"() : () -> ()
}) {function_type = (!tt.ptr<f32>) -> (), sym_name = "missing_cache", sym_visibility = "public", noinline = false} : () -> ()

// -----

"tt.func"() ({
^bb0(%a: tensor<16x16xf16>, %c: tensor<16x16xf32>):
  // The accumulator and the result share one type, as Triton's verifier demands.
  // expected-error @+1 {{expected 'tensor<16x16xf32>' but got 'tensor<16x16xf16>'}}
  %d = "tt.dot"(%a, %a, %c) {inputPrecision = 0 : i32, maxNumImpreciseAcc = 0 : i32} : (tensor<16x16xf16>, tensor<16x16xf16>, tensor<16x16xf32>) -> tensor<16x16xf16>
  "gpu.yield"() : () -> ()
}) {function_type = (tensor<16x16xf16>, tensor<16x16xf32>) -> (), sym_name = "dot_type", sym_visibility = "public", noinline = false} : () -> ()

// -----

// Properties syntax is rejected by extensible (IRDL) dialects: inherent attributes go in the
// attribute dictionary, where Triton's parser finds them too.
// expected-error @+1 {{extensible Dialects don't support properties}}
"tt.func"() <{function_type = () -> (), sym_name = "props", sym_visibility = "public"}> ({
  "gpu.yield"() : () -> ()
}) {noinline = false} : () -> ()
