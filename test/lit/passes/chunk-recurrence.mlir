// attn-chunk-recurrence turns attn.linear_recurrence into an L1 kernel: one program per (b, h, V
// column block), an scf.for over chunks of C tokens carrying the f32 state S [Dk, BV] (and, with
// normalize, the key sum z [Dk]) plus the output destination, into which each chunk stores its rows.
// RUN: ae-opt %s --split-input-file --pass-pipeline='builtin.module(attn-chunk-recurrence{block-v=16},cse)' --no-mlir-print-op-generic | FileCheck %s

// decay "token", L = 40 in chunks of 32 (the second is ragged), Dk = 16, Dv = 32 split into two
// programs of 16 columns; k_mod elu + 1, v_mod scaled by a captured dt[b, h, t]; initial state.
// CHECK-LABEL: func.func @token
// CHECK-SAME: %[[DT:[a-z0-9]+]]: tensor<1x2x40xf32>, %[[OUT:[a-z0-9]+]]: tensor<1x2x40x32xf32>, %[[ST:[a-z0-9]+]]: tensor<1x2x16x32xf32>)
// CHECK-SAME: attn.block_v = 16 : i64, attn.chunk_size = 32 : i64, attn.grid = array<i64: 1, 2, 2>
// CHECK-DAG: %[[PB:.*]] = "attn.program_id"() {axis = 0 : i64}
// CHECK-DAG: %[[PH:.*]] = "attn.program_id"() {axis = 1 : i64}
// CHECK-DAG: %[[PV:.*]] = "attn.program_id"() {axis = 2 : i64}
// CHECK: %[[V0:.*]] = arith.muli %[[PV]], %c16
// The state starts as the program's slice of the initial state.
// CHECK: %[[S0:.*]] = tensor.extract_slice %arg4[%[[PB]], %[[PH]], 0, %[[V0]]] [1, 1, 16, 16]
// CHECK: %[[LOOP:.*]]:2 = scf.for %[[IT:.*]] = %c0 to %c2 step %c1 iter_args(%[[S:.*]] = %[[S0]], %[[O:.*]] = %[[OUT]]) -> (tensor<16x16xf32>, tensor<1x2x40x32xf32>)
// CHECK: %[[T0:.*]] = arith.muli %[[IT]], %c32
// CHECK: %[[ROWS:.*]] = arith.minsi
// CHECK: %[[Q:.*]] = tensor.pad
// The k_mod, then padded rows (t >= L) forced back to zero.
// CHECK: %[[K:.*]] = linalg.generic
// CHECK: math.exp
// CHECK: arith.select
// CHECK: arith.cmpi slt, %{{.*}}, %c40
// CHECK: arith.select
// The v tile is the program's column slice; v_mod reads dt at a clamped t.
// CHECK: tensor.extract_slice %arg2[%[[PB]], %[[PH]], %[[T0]], %[[V0]]] [1, 1, %[[ROWS]], 16]
// CHECK: %[[V:.*]] = linalg.generic
// CHECK: arith.minsi %{{.*}}, %c39
// CHECK: tensor.extract %[[DT]][%[[PB]], %[[PH]], %{{.*}}]
// G: the chunk's g, masked to [j <= i] and summed along rows; G_end picked from its last entry.
// CHECK: tensor.extract_slice %arg3[%[[PB]], %[[PH]], %[[T0]]] [1, 1, %[[ROWS]]]
// CHECK: linalg.generic
// CHECK: arith.cmpi sle
// CHECK: %[[G:.*]] = linalg.reduce
// CHECK: %[[GEND:.*]] = linalg.reduce
// CHECK: %[[GEND_K:.*]] = linalg.reduce
// Intra-chunk: q k^T, scaled, times exp(G_t - G_s) for s <= t (the exponent of s > t is zeroed).
// CHECK: %[[KT:.*]] = linalg.transpose ins(%[[K]] : tensor<32x16xf32>)
// CHECK: %[[QK:.*]] = linalg.matmul {attn.precision = "ieee"} ins(%[[Q]], %[[KT]] : tensor<32x16xf32>, tensor<16x32xf32>)
// CHECK: %[[A:.*]] = linalg.generic {{.*}} ins(%[[QK]], %[[G]], %[[G]] :
// CHECK: %[[KEEP:.*]] = arith.cmpi sle
// CHECK: %[[DIFF:.*]] = arith.subf
// CHECK: %[[ARG:.*]] = arith.select %[[KEEP]], %[[DIFF]], %cst
// CHECK: math.exp %[[ARG]]
// CHECK: %[[OI:.*]] = linalg.matmul {attn.precision = "ieee"} ins(%[[A]], %[[V]] : tensor<32x32xf32>, tensor<32x16xf32>)
// Inter-chunk: (scale * q * exp(G)) @ S, accumulated onto the intra-chunk part.
// CHECK: %[[QD:.*]] = linalg.generic {{.*}} ins(%[[Q]], %[[G]] :
// CHECK: math.exp
// CHECK: %[[OT:.*]] = linalg.matmul {attn.precision = "ieee"} ins(%[[QD]], %[[S]] : tensor<32x16xf32>, tensor<16x16xf32>) outs(%[[OI]] : tensor<32x16xf32>)
// CHECK: %[[OV:.*]] = tensor.extract_slice %[[OT]][0, 0] [%[[ROWS]], 16]
// CHECK: %[[O2:.*]] = tensor.insert_slice %[[OV]] into %[[O]][%[[PB]], %[[PH]], %[[T0]], %[[V0]]] [1, 1, %[[ROWS]], 16]
// State update: S * exp(G_end) (in place: S is the generic's output) + (k * exp(G_end - G))^T @ v.
// CHECK: %[[KD:.*]] = linalg.generic {{.*}} ins(%[[K]], %[[G]], %[[GEND]] :
// CHECK: arith.subf
// CHECK: math.exp
// CHECK: %[[SD:.*]] = linalg.generic {{.*}} ins(%[[GEND_K]] : tensor<16xf32>) outs(%[[S]] : tensor<16x16xf32>)
// CHECK: math.exp
// CHECK: %[[KDT:.*]] = linalg.transpose ins(%[[KD]]
// CHECK: %[[S2:.*]] = linalg.matmul {attn.precision = "ieee"} ins(%[[KDT]], %[[V]] : tensor<16x32xf32>, tensor<32x16xf32>) outs(%[[SD]] : tensor<16x16xf32>)
// CHECK: scf.yield %[[S2]], %[[O2]]
// CHECK: %[[FINAL:.*]] = tensor.insert_slice %[[LOOP]]#0 into %[[ST]][%[[PB]], %[[PH]], 0, %[[V0]]] [1, 1, 16, 16]
// CHECK: return %[[LOOP]]#1, %[[FINAL]]
func.func @token(%q: tensor<1x2x40x16xf32>, %k: tensor<1x2x40x16xf32>, %v: tensor<1x2x40x32xf32>, %g: tensor<1x2x40xf32>, %s0: tensor<1x2x16x32xf32>, %dt: tensor<1x2x40xf32>) -> (tensor<1x2x40x32xf32>, tensor<1x2x16x32xf32>) {
  %out, %state = "attn.linear_recurrence"(%q, %k, %v, %g, %s0) ({}, {
  ^bb0(%x: f32, %b: index, %h: index, %t: index, %d: index):
    %zero = arith.constant 0.0 : f32
    %pos = arith.cmpf ogt, %x, %zero : f32
    %one = arith.constant 1.0 : f32
    %xp1 = arith.addf %x, %one : f32
    %ex = math.exp %x : f32
    %r = arith.select %pos, %xp1, %ex : f32
    "gpu.yield"(%r) : (f32) -> ()
  }, {
  ^bb0(%x: f32, %b: index, %h: index, %t: index, %d: index):
    %step = tensor.extract %dt[%b, %h, %t] : tensor<1x2x40xf32>
    %r = arith.mulf %x, %step : f32
    "gpu.yield"(%r) : (f32) -> ()
  }) {decay = "token", scale = 0.25 : f32, normalize = false, chunk_size = 32 : i64, operandSegmentSizes = array<i32: 1, 1, 1, 1, 1, 0>} : (tensor<1x2x40x16xf32>, tensor<1x2x40x16xf32>, tensor<1x2x40x32xf32>, tensor<1x2x40xf32>, tensor<1x2x16x32xf32>) -> (tensor<1x2x40x32xf32>, tensor<1x2x16x32xf32>)
  return %out, %state : tensor<1x2x40x32xf32>, tensor<1x2x16x32xf32>
}

// -----

// decay "token_dim" (GLA), bf16, normalize, no initial state: G = tril(ones) @ g per key dim (an
// f32 product, as three tf32 tensor-core products on a GPU: about 21 bits, where 16-bit operands
// would lose the cumulative sum's accuracy); the intra-chunk scores are a product of factors
// q * exp(G) and k * exp(-G) while |G| stays under 40 nats, else one 3-D linalg.generic over
// (t, s, d) reducing d, where every exponent is a difference G[t, d] - G[s, d] with s <= t. The other products
// take bf16 operands (the raw v tile, A, the decayed q and k and the state rounded to bf16) into
// f32 accumulators. Dv = 8 fits one program.
// CHECK-LABEL: func.func @token_dim
// CHECK-SAME: %[[OUT:[a-z0-9]+]]: tensor<1x2x40x8xbf16>, %[[ST:[a-z0-9]+]]: tensor<1x2x16x8xf32>)
// CHECK-SAME: attn.arg_roles = ["q", "k", "v", "c0", "out", "state"], attn.block_v = 8 : i64, attn.chunk_size = 32 : i64, attn.grid = array<i64: 1, 2, 1>
// The lower-triangular ones, built once before the loop.
// CHECK: %[[TRIL:.*]] = linalg.generic {{.*}} outs(%{{.*}} : tensor<32x32xf32>)
// CHECK: arith.cmpi sle
// The state starts at zero, and so does z.
// CHECK: %[[LOOP:.*]]:3 = scf.for {{.*}} iter_args(%[[S:.*]] = %{{.*}}, %[[Z:.*]] = %{{.*}}, %[[O:.*]] = %[[OUT]]) -> (tensor<16x8xf32>, tensor<16xf32>, tensor<1x2x40x8xbf16>)
// q and k are widened to f32 once loaded, for the elementwise work; v only feeds products.
// CHECK: %[[Q:.*]] = linalg.generic
// CHECK: arith.extf
// CHECK: %[[K:.*]] = linalg.generic
// CHECK: %[[VRAW:.*]] = tensor.pad
// CHECK: tensor.extract_slice %arg3
// CHECK: %[[GF:.*]] = linalg.generic
// CHECK: %[[G:.*]] = linalg.matmul {attn.precision = "tf32x3"} ins(%[[TRIL]], %[[GF]] : tensor<32x32xf32>, tensor<32x16xf32>)
// CHECK: %[[GT:.*]] = linalg.transpose ins(%[[G]]
// CHECK: %[[GEND:.*]] = linalg.reduce
// A: the masked bf16 product (scale * q * exp(G)) @ (k * exp(-G))^T while |G| stays under 40
// nats in the chunk, else (a loop of one trip) the 3-D generic over (t, s, d).
// CHECK: %[[QF:.*]] = linalg.generic {{.*}} ins(%[[Q]], %[[G]] :
// CHECK: %[[KF:.*]] = linalg.generic {{.*}} ins(%[[K]], %[[G]] :
// CHECK: arith.negf
// CHECK: %[[QF16:.*]] = linalg.generic {{.*}} ins(%[[QF]] :
// CHECK: %[[QK:.*]] = linalg.matmul ins(%[[QF16]], %{{.*}} : tensor<32x16xbf16>, tensor<16x32xbf16>) outs(%{{.*}} : tensor<32x32xf32>)
// CHECK: %[[FAST:.*]] = linalg.generic {{.*}} ins(%[[QK]] : tensor<32x32xf32>)
// CHECK: math.absf
// CHECK: %[[TRIPS:.*]] = arith.select %{{.*}}, %c1, %c0 : index
// CHECK: %[[A:.*]] = scf.for %{{.*}} = %c0 to %[[TRIPS]] step %c1 iter_args(%{{.*}} = %[[FAST]]) -> (tensor<32x32xf32>)
// CHECK: linalg.generic {{.*}} iterator_types = ["parallel", "parallel", "reduction"]} ins(%[[Q]], %[[K]], %[[G]], %[[G]] : {{.*}}) outs(%{{.*}} : tensor<32x32xf32>)
// CHECK: %[[KEEP:.*]] = arith.cmpi sle
// CHECK: %[[DIFF:.*]] = arith.subf
// CHECK: %[[ARG:.*]] = arith.select %[[KEEP]], %[[DIFF]]
// CHECK: math.exp %[[ARG]]
// CHECK: arith.addf %out
// CHECK: scf.yield
// CHECK: %[[A16:.*]] = linalg.generic {{.*}} ins(%[[A]] : tensor<32x32xf32>)
// CHECK: arith.truncf {{.*}} : f32 to bf16
// CHECK: %[[OI:.*]] = linalg.matmul ins(%[[A16]], %[[VRAW]] : tensor<32x32xbf16>, tensor<32x8xbf16>) outs(%{{.*}} : tensor<32x8xf32>)
// The state's part takes scale * q * exp(G), A's factor (one op after CSE).
// CHECK: %[[OT:.*]] = linalg.matmul ins(%[[QF16]], %[[S16:.*]] : tensor<32x16xbf16>, tensor<16x8xbf16>) outs(%[[OI]] : tensor<32x8xf32>)
// normalize: divide by rowsum(A) + (scale * q * exp(G)) . z, then round to bf16.
// CHECK: %[[DA:.*]] = linalg.reduce ins(%[[A]]
// CHECK: linalg.generic {{.*}} ins(%[[QF]], %[[Z]] :
// CHECK: %[[DS:.*]] = linalg.reduce
// CHECK: linalg.generic {{.*}} ins(%[[OT]], %[[DA]], %[[DS]] :
// CHECK: arith.divf
// CHECK: arith.truncf {{.*}} : f32 to bf16
// CHECK: tensor.insert_slice %{{.*}} into %[[O]]
// CHECK: %[[KD:.*]] = linalg.generic {{.*}} ins(%[[K]], %[[G]], %[[GEND]] :
// CHECK: %[[KD16:.*]] = linalg.generic {{.*}} ins(%[[KD]] :
// CHECK: linalg.generic {{.*}} ins(%[[GEND]] : tensor<16xf32>) outs(%[[S]] : tensor<16x8xf32>)
// CHECK: %[[KDT:.*]] = linalg.transpose ins(%[[KD16]]
// CHECK: linalg.matmul ins(%[[KDT]], %[[VRAW]] : tensor<16x32xbf16>, tensor<32x8xbf16>) outs(%{{.*}} : tensor<16x8xf32>)
// z: z * exp(G_end) + the row sums of the decayed k^T (f32).
// CHECK: %[[KDTF:.*]] = linalg.transpose ins(%[[KD]]
// CHECK: %[[KS:.*]] = linalg.reduce ins(%[[KDTF]]
// CHECK: linalg.generic {{.*}} ins(%[[GEND]], %[[KS]] : tensor<16xf32>, tensor<16xf32>) outs(%[[Z]] : tensor<16xf32>)
// CHECK: scf.yield
// CHECK: tensor.insert_slice %[[LOOP]]#0 into %[[ST]]
func.func @token_dim(%q: tensor<1x2x40x16xbf16>, %k: tensor<1x2x40x16xbf16>, %v: tensor<1x2x40x8xbf16>, %g: tensor<1x2x40x16xbf16>) -> (tensor<1x2x40x8xbf16>, tensor<1x2x16x8xf32>) {
  %out, %state = "attn.linear_recurrence"(%q, %k, %v, %g) ({}, {}, {}) {decay = "token_dim", scale = 0.25 : f32, normalize = true, chunk_size = 32 : i64, operandSegmentSizes = array<i32: 1, 1, 1, 1, 0, 0>} : (tensor<1x2x40x16xbf16>, tensor<1x2x40x16xbf16>, tensor<1x2x40x8xbf16>, tensor<1x2x40x16xbf16>) -> (tensor<1x2x40x8xbf16>, tensor<1x2x16x8xf32>)
  return %out, %state : tensor<1x2x40x8xbf16>, tensor<1x2x16x8xf32>
}

// -----

// split: the chunk states, then the outputs. decay "head", bf16, L = 40 in chunks of 16 (three,
// the last ragged), Dk = 32 in two state-row blocks of 16, Dv = 32 in two column blocks of 16.
// RUN: ae-opt %s --split-input-file --pass-pipeline='builtin.module(attn-chunk-recurrence{split=true block-k=16 block-v=16},cse)' --no-mlir-print-op-generic | FileCheck %s --check-prefix=SPLIT
// The chunk-state kernel: a program per (b, h, K block, V block) walks the chunks, storing the
// state entering each chunk (rounded to bf16) into the workspace w0 before updating it.
// SPLIT-LABEL: func.func @head_states(
// SPLIT-SAME: %[[W:[a-z0-9]+]]: tensor<1x2x3x32x32xbf16>, %[[ST:[a-z0-9]+]]: tensor<1x2x32x32xf32>) -> (tensor<1x2x3x32x32xbf16>, tensor<1x2x32x32xf32>)
// SPLIT-SAME: attn.arg_roles = ["q", "k", "v", "c0", "w0", "state"], attn.block_v = 16 : i64, attn.chunk_size = 16 : i64, attn.chunk_stage = "states", attn.grid = array<i64: 1, 2, 4>
// SPLIT: %[[P2:.*]] = "attn.program_id"() {axis = 2 : i64}
// SPLIT: %[[KB:.*]] = arith.divsi %[[P2]], %c2
// SPLIT: %[[VB:.*]] = arith.remsi %[[P2]], %c2
// SPLIT: %[[V0:.*]] = arith.muli %[[VB]], %c16
// SPLIT: %[[K0:.*]] = arith.muli %[[KB]], %c16
// SPLIT: %[[LOOP:.*]]:2 = scf.for %[[IT:.*]] = %c0 to %c3 step %c1 iter_args(%[[S:.*]] = %{{.*}}, %[[H:.*]] = %[[W]]) -> (tensor<16x16xf32>, tensor<1x2x3x32x32xbf16>)
// SPLIT: arith.truncf {{.*}} : f32 to bf16
// SPLIT: %[[H2:.*]] = tensor.insert_slice %{{.*}} into %[[H]][%{{.*}}, %{{.*}}, %[[IT]], %[[K0]], %[[V0]]] [1, 1, 1, 16, 16]
// Only k's K block and v's V block are loaded; q is not.
// SPLIT-NOT: tensor.extract_slice %arg0
// SPLIT: tensor.extract_slice %arg1[{{.*}}, %[[K0]]] [1, 1, %{{.*}}, 16]
// SPLIT-NOT: tensor.extract_slice %arg0
// SPLIT: tensor.extract_slice %arg2[{{.*}}, %[[V0]]] [1, 1, %{{.*}}, 16]
// SPLIT-NOT: tensor.extract_slice %arg0
// The head decay in closed form, G_t = min(t + 1, n) * g_h: no cumulative sum, no reduction.
// SPLIT: arith.minsi
// SPLIT: arith.sitofp
// SPLIT-NOT: linalg.reduce
// SPLIT: linalg.matmul ins(%{{.*}}, %{{.*}} : tensor<16x16xbf16>, tensor<16x16xbf16>) outs(%{{.*}} : tensor<16x16xf32>)
// SPLIT: scf.yield %{{.*}}, %[[H2]]
// SPLIT: tensor.insert_slice %[[LOOP]]#0 into %[[ST]][%{{.*}}, %{{.*}}, %[[K0]], %[[V0]]] [1, 1, 16, 16]
// The output kernel: a program per (b, h, chunk). G is one value per row and Dk (32) is wider than
// the 16 V columns of a block, so the chunk's scores A are built once and a loop walks its two V
// blocks: A @ v, then q @ S with q as loaded and the product's rows scaled by scale * exp(G), the
// state's block from w0.
// SPLIT-LABEL: func.func @head(
// SPLIT-SAME: %[[W:[a-z0-9]+]]: tensor<1x2x3x32x32xbf16>, %[[OUT:[a-z0-9]+]]: tensor<1x2x40x32xbf16>) -> tensor<1x2x40x32xbf16>
// SPLIT-SAME: attn.arg_roles = ["q", "k", "v", "c0", "w0", "out"], attn.block_v = 16 : i64, attn.chunk_size = 16 : i64, attn.grid = array<i64: 1, 2, 3>
// SPLIT: %[[C:.*]] = "attn.program_id"() {axis = 2 : i64}
// SPLIT: %[[Q:.*]] = tensor.pad
// SPLIT: %[[QK:.*]] = linalg.matmul ins(%[[Q]], %{{.*}} : tensor<16x32xbf16>, tensor<32x16xbf16>) outs(%{{.*}} : tensor<16x16xf32>)
// SPLIT: %[[A:.*]] = linalg.generic {{.*}} ins(%{{.*}} : tensor<16x16xf32>) outs(%{{.*}} : tensor<16x16xbf16>)
// SPLIT: %[[BLOCKS:.*]] = scf.for %[[J:.*]] = %c0 to %c2 step %c1 iter_args(%[[O:.*]] = %[[OUT]])
// SPLIT: %[[V0:.*]] = arith.muli %[[J]], %c16
// SPLIT: %[[S:.*]] = tensor.extract_slice %[[W]][%{{.*}}, %{{.*}}, %[[C]], 0, %[[V0]]] [1, 1, 1, 32, 16]
// SPLIT: %[[AV:.*]] = linalg.matmul ins(%[[A]], %{{.*}} : tensor<16x16xbf16>, tensor<16x16xbf16>)
// SPLIT: %[[QS:.*]] = linalg.matmul ins(%[[Q]], %[[S]] : tensor<16x32xbf16>, tensor<32x16xbf16>)
// SPLIT: linalg.generic {{.*}} ins(%[[AV]], %[[QS]], %{{.*}} : tensor<16x16xf32>, tensor<16x16xf32>, tensor<16xf32>)
// SPLIT: math.exp
// SPLIT: arith.mulf
// SPLIT: arith.constant 2.500000e-01
// SPLIT: arith.mulf
// SPLIT: arith.addf
// SPLIT: %[[O2:.*]] = tensor.insert_slice %{{.*}} into %[[O]][%{{.*}}, %{{.*}}, %{{.*}}, %[[V0]]]
// SPLIT: scf.yield %[[O2]]
// SPLIT: return %[[BLOCKS]]
func.func @head(%q: tensor<1x2x40x32xbf16>, %k: tensor<1x2x40x32xbf16>, %v: tensor<1x2x40x32xbf16>, %g: tensor<2xf32>) -> (tensor<1x2x40x32xbf16>, tensor<1x2x32x32xf32>) {
  %out, %state = "attn.linear_recurrence"(%q, %k, %v, %g) ({}, {}, {}) {decay = "head", scale = 0.25 : f32, normalize = false, chunk_size = 16 : i64, operandSegmentSizes = array<i32: 1, 1, 1, 1, 0, 0>} : (tensor<1x2x40x32xbf16>, tensor<1x2x40x32xbf16>, tensor<1x2x40x32xbf16>, tensor<2xf32>) -> (tensor<1x2x40x32xbf16>, tensor<1x2x32x32xf32>)
  return %out, %state : tensor<1x2x40x32xbf16>, tensor<1x2x32x32xf32>
}

// -----

// Functions without a recurrence are left alone (attn-tile handles attn.online_attention).
// CHECK-LABEL: func.func @other
// CHECK-NEXT: return %arg0
func.func @other(%x: tensor<4xf32>) -> tensor<4xf32> {
  return %x : tensor<4xf32>
}
