"""`attn-lower-to-cpu`: L1 kernels become LLVM-dialect code for the host CPU.

A pipeline, so that `attn-tile,attn-lower-to-cpu` (or `attn-chunk-recurrence,attn-lower-to-cpu`)
ends in the llvm dialect, ready for the JIT, while `--mlir-print-ir-after-all` shows every stage
and a pipeline of the first few stages stops wherever one wants to look. In order:

1. `attn-cpu-lower-scatter` (the scatter-adds of closure gradients to element loops), then
   `attn-cpu-grid-loops`: one loop over a range of each kernel's programs (two index arguments),
   carrying the destination tensors; then `canonicalize,cse`, with `amx`
   `attn-cpu-amx-tile-products` (bf16 tile products on AMX units), `attn-cpu-widen-matmul-operands`
   (the other 16-bit tile products take f32 operands converted once) and
   `attn-cpu-split-empty-tensors`.
2. `attn-cpu-vectorize`: matmuls to register tiles, elementwise ops and row reductions to row
   blocks, then every linalg op to vector ops; a tile load becomes a masked transfer.
3. `attn-cpu-carry-state-in-place`, then `attn-cpu-bufferize`: one-shot bufferization with fully
   dynamic layouts at function boundaries; the kernel writes its destination arguments and
   returns nothing. With `unit-inner-stride`, `attn-cpu-pin-unit-inner-stride`.
4. `attn-cpu-lower-vectors`: accumulators in registers, contractions as outer products,
   transfers as 1-D loads and stores; `attn-cpu-expand-sin-cos` writes vector sin and cos as
   polynomials (with libm behind a branch). Buffers leave the loops and get their deallocations
   (`LOOPS_PIPELINE`); `attn-cpu-legalize-for-llvm` readies the IR for the LLVM conversion, and
   `attn-cpu-claim-programs` adds each kernel's claiming entry (threads take its programs from a
   shared counter).
5. Upstream conversions to the llvm dialect (`LLVM_PIPELINE`, with `amx` the AMX ops' too),
   `attn-cpu-define-bf16-truncation`, `attn-cpu-bf16-memory-as-integers`, with `no-avx512-bf16`
   `attn-cpu-no-avx512-bf16`, with `narrow-isa` `attn-cpu-narrow-isa`, and with `amx`
   `attn-cpu-amx-features`; the kernel carries
   `llvm.emit_c_interface`, so a C caller passes one memref descriptor per array, then the
   program range.

Hand-written, because no upstream pass or transform op does it (each says why): `lower_grid` and
`widen_bool_arguments` (cpu_grid_loops), `split_empty_tensors`, `carry_loop_state_in_place` (with
`mark_state_loops`), `pin_unit_inner_stride`, `lower_gathers` and `store_padded_rows`
(cpu_lower_vectors), `lower_scatter` (cpu_lower_scatter), `align_vector_views` and
`flatten_math_vectors` (cpu_legalize_for_llvm), `expand_erf`, `expand_tanh`, `expand_expm1`,
`expand_logarithms` and `expand_exponentials` (cpu_math_expansions), `attn-cpu-expand-sin-cos`,
`define_bf16_truncation`, `attn-cpu-bf16-memory-as-integers`, `attn-cpu-amx-tile-products`,
`attn-cpu-no-avx512-bf16`, `attn-cpu-claim-programs`, `attn-cpu-widen-matmul-operands` and
`_subtractions_as_additions` (cpu_vectorize).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from . import PassPipeline, option

# On tensors, before tiling and bufferization; `attn-cpu-split-empty-tensors` then undoes what CSE
# does to tensor.empty.
TENSOR_PIPELINE = ("canonicalize", "cse")

# After bufferization and vector lowering: tile buffers out of the loops, deallocation, the
# remaining linalg ops (those that did not vectorize) to loops.
LOOPS_PIPELINE = (
    "func.func(buffer-loop-hoisting)",
    "buffer-deallocation-pipeline",
    "convert-bufferization-to-memref",
    "convert-linalg-to-loops",
    "convert-vector-to-scf",
    "canonicalize",
    "cse",
)

# To the llvm dialect. bf16 has no LLVM arithmetic on most CPUs, and the L1 kernel only converts to
# and from it (all arithmetic is f32), so `arith-expand{include-bf16}` turning extf/truncf into
# integer bit operations is enough; f16 conversions are native (F16C, NEON). Row sums may be
# added in any order (a tree of vector adds instead of one scalar add per element). log1p (whose
# LLVM conversion, log(1 + x), loses small x) and the math ops LLVM has no intrinsic for become
# libm calls; on vectors the libm conversion unrolls them into vector.extract and vector.insert,
# so it runs before the vector conversion, and after the math one, which takes the ops that have
# (vector) intrinsics.
LLVM_PIPELINE = (
    "lower-affine",
    "convert-scf-to-cf",
    "arith-expand{include-bf16}",
    "expand-strided-metadata",
    "lower-affine",
    "convert-math-to-llvm{approximate-log1p=false}",
    "convert-math-to-libm",
    "convert-vector-to-llvm{reassociate-fp-reductions}",
    "finalize-memref-to-llvm",
    "convert-arith-to-llvm",
    "convert-index-to-llvm",
    "convert-cf-to-llvm",
    "convert-func-to-llvm",
    "convert-ub-to-llvm",
    "reconcile-unrealized-casts",
    "canonicalize",
)


@dataclass(frozen=True)
class LowerToCpu(PassPipeline):
    name: ClassVar[str] = "attn-lower-to-cpu"
    summary: ClassVar[str] = ("Pipeline: L1 kernels to the llvm dialect for the host CPU (the attn-cpu-* "
                              "stages with upstream canonicalization, deallocation and LLVM conversions)")

    unit_inner_stride: bool = option(
        True, "the caller passes arrays whose innermost dimension has unit stride (any other strides "
              "stay dynamic); false accepts any strides, at the cost of element-wise tile loads")
    vector_bits: int = option(512, "attn-cpu-vectorize's vector-bits: the target's vector register width")
    no_avx512_bf16: bool = option(False, "end with attn-cpu-no-avx512-bf16 (the cpu preset sets it on hosts "
                                         "with AVX512-BF16, whose bf16 vectors LLVM's x86 backend cannot all "
                                         "legalize)")
    narrow_isa: bool = option(False, "end with attn-cpu-narrow-isa: on x86, no vector extensions wider than "
                                     "vector-bits (the cpu preset sets it when AE_MLIR_CPU_VECTOR_BITS is below "
                                     "the host's width)")
    amx: bool = option(False, "bf16 tile products on AMX units (attn-cpu-amx-tile-products; the cpu preset "
                              "sets it for bf16 forwards on hosts with AMX-BF16)")

    def __post_init__(self):
        if self.narrow_isa and self.vector_bits not in (128, 256):
            raise ValueError(f"narrow-isa needs vector-bits 128 or 256, got {self.vector_bits}")

    def elements(self) -> list[str]:
        pinned_strides = ["attn-cpu-pin-unit-inner-stride"] if self.unit_inner_stride else []
        return [
            "attn-cpu-lower-scatter",
            "attn-cpu-grid-loops",
            *TENSOR_PIPELINE,
            *(["attn-cpu-amx-tile-products"] if self.amx else []),
            "attn-cpu-widen-matmul-operands",
            "attn-cpu-split-empty-tensors",
            f"attn-cpu-vectorize{{vector-bits={self.vector_bits}}}",
            "attn-cpu-carry-state-in-place",
            "attn-cpu-bufferize",
            *pinned_strides,
            "canonicalize",
            "cse",
            "attn-cpu-lower-vectors",
            "attn-cpu-expand-sin-cos",
            *LOOPS_PIPELINE,
            "attn-cpu-legalize-for-llvm",
            "attn-cpu-claim-programs",
            *(_with_amx(LLVM_PIPELINE) if self.amx else LLVM_PIPELINE),
            "attn-cpu-define-bf16-truncation",
            "attn-cpu-bf16-memory-as-integers",
            *(["attn-cpu-no-avx512-bf16"] if self.no_avx512_bf16 else []),
            *([f"attn-cpu-narrow-isa{{vector-bits={self.vector_bits}}}"] if self.narrow_isa else []),
            *(["attn-cpu-amx-features"] if self.amx else []),
        ]


def _with_amx(pipeline: tuple[str, ...]) -> tuple[str, ...]:
    """The LLVM conversions with the AMX ops' (part of the vector conversion)."""
    vector = "convert-vector-to-llvm{reassociate-fp-reductions}"
    return tuple("convert-vector-to-llvm{reassociate-fp-reductions enable-amx}" if p == vector else p
                 for p in pipeline)
