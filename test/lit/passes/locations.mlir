// Locations survive fusion and tiling: the ops of a mod region, inlined into the tiled kernel's
// linalg.generic bodies, keep the locations they had at L0 (here, lines of the user's mods.py),
// and the kernel's own ops are at the fused op's location: no op points into an intermediate text.
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-fuse-online-softmax,attn-tile{block-m=32 block-n=32})' --mlir-print-debuginfo --no-mlir-print-op-generic | FileCheck %s
// RUN: ae-opt %s --attn-fuse-online-softmax --mlir-print-debuginfo --no-mlir-print-op-generic | FileCheck %s --check-prefix=FUSE
// RUN: ae-opt %s --pass-pipeline='builtin.module(attn-fuse-online-softmax,attn-tile)' --mlir-print-debuginfo | FileCheck %s --check-prefix=NOWHERE
// NOWHERE-NOT: loc("-":{{[1-9]}}

// The fused op is located at all the ops it replaces; the softmax regions it builds are at the
// normalize op's location, the moved mod regions keep theirs.
// FUSE: [[CALL:#loc[0-9]+]] = loc("mods.py":17:7)
// FUSE: "attn.online_attention"
// FUSE: tensor.extract %{{.*}}[%{{.*}}] : tensor<2xf32> loc([[SLOPE:#loc[0-9]+]])
// FUSE: math.exp2 %{{.*}} : f32 loc([[CALL]])
// FUSE: normalizer = "softmax"{{.*}} loc([[FUSED:#loc[0-9]+]])
// FUSE-DAG: [[SLOPE]] = loc("mods.py":8:20)
// FUSE-DAG: [[FUSED]] = loc(fused[[[CALL]], #loc{{[0-9]+}}, #loc{{[0-9]+}}])

// CHECK: [[KERNEL:#loc[0-9]+]] = loc(fused[
// CHECK-LABEL: func.func @alibi_causal
// CHECK: "attn.program_id"() {axis = 0 : i64} : () -> index loc([[KERNEL]])
// CHECK: scf.for
// CHECK: linalg.matmul {{.*}} loc([[KERNEL]])
// CHECK: linalg.generic
// CHECK: tensor.extract %{{.*}}[%{{.*}}] : tensor<2xf32> loc([[SLOPE:#loc[0-9]+]])
// CHECK: arith.addf %{{.*}}, %{{.*}} : f32 loc([[ADD:#loc[0-9]+]])
// CHECK: arith.cmpi sge, %{{.*}}, %{{.*}} : index loc([[CAUSAL:#loc[0-9]+]])
// CHECK: scf.yield
// CHECK-DAG: [[SLOPE]] = loc("mods.py":8:20)
// CHECK-DAG: [[ADD]] = loc("mods.py":8:12)
// CHECK-DAG: [[CAUSAL]] = loc("mods.py":12:12)
func.func @alibi_causal(%q: tensor<1x2x100x16xf32>, %k: tensor<1x2x100x16xf32>, %v: tensor<1x2x100x16xf32>, %slopes: tensor<2xf32>) -> tensor<1x2x100x16xf32> {
  %s = "attn.score"(%q, %k) {scale = 0.25 : f32} : (tensor<1x2x100x16xf32>, tensor<1x2x100x16xf32>) -> tensor<1x2x100x100xf32> loc("mods.py":17:7)
  %sm = "attn.score_mod"(%s) ({
  ^bb0(%x: f32, %b: index, %h: index, %i: index, %j: index):
    %e = tensor.extract %slopes[%h] : tensor<2xf32> loc("mods.py":8:20)
    %y = arith.addf %x, %e : f32 loc("mods.py":8:12)
    "gpu.yield"(%y) : (f32) -> () loc("mods.py":8:12)
  }) : (tensor<1x2x100x100xf32>) -> tensor<1x2x100x100xf32> loc("mods.py":7:0)
  %m = "attn.mask"() ({
  ^bb0(%b: index, %h: index, %i: index, %j: index):
    %c = arith.cmpi sge, %i, %j : index loc("mods.py":12:12)
    "gpu.yield"(%c) : (i1) -> () loc("mods.py":12:12)
  }) : () -> tensor<1x2x100x100xi1> loc("mods.py":11:0)
  %p = "attn.normalize"(%sm, %m) ({}, {}, {}) {kind = "softmax", operandSegmentSizes = array<i32: 1, 1>, resultSegmentSizes = array<i32: 1, 0>} : (tensor<1x2x100x100xf32>, tensor<1x2x100x100xi1>) -> tensor<1x2x100x100xf32> loc("mods.py":17:7)
  %o = "attn.aggregate"(%p, %v) : (tensor<1x2x100x100xf32>, tensor<1x2x100x16xf32>) -> tensor<1x2x100x16xf32> loc("mods.py":17:7)
  return %o : tensor<1x2x100x16xf32> loc("mods.py":17:7)
}
