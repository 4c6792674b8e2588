// Packed sequences whose offsets are no argument of the function (a constant here) cannot be read
// per call: attn-tile reports it at the op, not as an internal error, call-time tables or not.
// RUN: not ae-opt %s --pass-pipeline='builtin.module(attn-fuse-online-softmax,attn-tile{block-m=32 block-n=32 call-time-tables=true})' 2>&1 | FileCheck %s
// RUN: not ae-opt %s --pass-pipeline='builtin.module(attn-fuse-online-softmax,attn-tile{block-m=32 block-n=32})' 2>&1 | FileCheck %s

// CHECK: error: 'attn.online_attention' op cu_seqlens must be an argument of the enclosing function
// CHECK-NOT: internal compiler error
func.func @attention(%q: tensor<1x2x?x16xbf16>, %k: tensor<1x2x?x16xbf16>, %v: tensor<1x2x?x16xbf16>, %c0: tensor<4xi64>, %c1: tensor<4xi32>, %c2: tensor<5xi32>, %c3: tensor<5xi32>) -> (tensor<1x2x?x16xbf16>, tensor<1x2x?xf32>) {
  %cc = arith.constant dense<[0, 8, 16, 24, 32]> : tensor<5xi32>
  %q_logical = "attn.unpack_sequences"(%q, %cc) : (tensor<1x2x?x16xbf16>, tensor<5xi32>) -> tensor<4x2x32x16xbf16>
  %k_logical = "attn.unpack_sequences"(%k, %c3) : (tensor<1x2x?x16xbf16>, tensor<5xi32>) -> tensor<4x2x32x16xbf16>
  %v_logical = "attn.unpack_sequences"(%v, %c3) : (tensor<1x2x?x16xbf16>, tensor<5xi32>) -> tensor<4x2x32x16xbf16>
  %scores = "attn.score"(%q_logical, %k_logical) {scale = 0.25 : f32} : (tensor<4x2x32x16xbf16>, tensor<4x2x32x16xbf16>) -> tensor<4x2x32x32xf32>
  %keep = "attn.mask"(%c1) ({
  ^bb0(%b: index, %h: index, %q_idx: index, %kv_idx: index):
    %m1 = arith.cmpi sle, %kv_idx, %q_idx : index
    %m2 = arith.constant 0 : index
    %m3 = arith.maxsi %b, %m2 : index
    %m4 = arith.constant 3 : index
    %m5 = arith.minsi %m3, %m4 : index
    %m6 = tensor.extract %c0[%m5] : tensor<4xi64>
    %m7 = arith.index_cast %m6 : i64 to index
    %m8 = arith.cmpi slt, %kv_idx, %m7 : index
    %m9 = arith.ori %m1, %m8 : i1
    "gpu.yield"(%m9) : (i1) -> ()
  }) : (tensor<4xi32>) -> tensor<4x2x32x32xi1>
  %probs, %lse = "attn.normalize"(%scores, %keep) ({}, {}, {}) {kind = "softmax", operandSegmentSizes = array<i32: 1, 1>, resultSegmentSizes = array<i32: 1, 1>} : (tensor<4x2x32x32xf32>, tensor<4x2x32x32xi1>) -> (tensor<4x2x32x32xf32>, tensor<4x2x32xf32>)
  %out = "attn.aggregate"(%probs, %v_logical) : (tensor<4x2x32x32xf32>, tensor<4x2x32x16xbf16>) -> tensor<4x2x32x16xbf16>
  %out_packed = "attn.pack_sequences"(%out, %c2) : (tensor<4x2x32x16xbf16>, tensor<5xi32>) -> tensor<1x2x?x16xbf16>
  %lse_packed = "attn.pack_sequences"(%lse, %c2) : (tensor<4x2x32xf32>, tensor<5xi32>) -> tensor<1x2x?xf32>
  return %out_packed, %lse_packed : tensor<1x2x?x16xbf16>, tensor<1x2x?xf32>
}
