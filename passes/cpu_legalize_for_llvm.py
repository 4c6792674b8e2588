"""`attn-cpu-legalize-for-llvm`: the last rewrites of the memref and vector IR before the upstream
conversion to the llvm dialect, for what that conversion would reject, miscompile or make slow.

It reports i1 buffers and vector views of padded rows (which the conversion cannot handle) at the
op, aligns buffers viewed as vectors, writes expm1 with exp and log (Kahan), log1p with log
(Kahan) and tanh with a polynomial and exp, replaces f32 exp, exp2, log, log2 and erf by
polynomials (`cpu_math_expansions`), runs math ops on n-D vectors as 1-D ones, and lets max/min
reductions ignore the sign of zero.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from . import ModulePass
from .cpu_math_expansions import (expand_erf, expand_exponentials, expand_expm1, expand_logarithms,
                                  expand_tanh)
from .cpu_support import fail, rows_padded_in_memory, walk


@dataclass(frozen=True)
class LegalizeForLlvm(ModulePass):
    name: ClassVar[str] = "attn-cpu-legalize-for-llvm"
    summary: ClassVar[str] = ("CPU lowering: reject i1 buffers and padded vector views, align buffers viewed "
                              "as vectors, expm1 and log1p as Kahan's formulas, tanh as a series and exp, "
                              "exp/exp2/log/log2/erf as polynomials, math on n-D vectors as 1-D, max/min "
                              "reductions without the sign of zero")

    def apply(self, module_op) -> None:
        _reject_bool_buffers(module_op)
        _reject_padded_vector_views(module_op)
        align_vector_views(module_op)
        expand_erf(module_op)
        expand_tanh(module_op)
        expand_expm1(module_op)
        expand_logarithms(module_op)
        expand_exponentials(module_op)
        flatten_math_vectors(module_op)
        ignore_zero_signs_of_extrema(module_op)


def _reject_bool_buffers(module_op) -> None:
    """The LLVM conversion aborts the process on an i1 load or store (it asserts on sub-byte
    elements); deallocation with run-time ownership flags is what makes i1 buffers (see
    `attn-cpu-carry-state-in-place`), so report one instead of crashing."""
    from mlir import ir

    for name in ("memref.alloc", "memref.alloca"):
        for op in walk(module_op, name):
            elt = op.results[0].type.element_type
            if isinstance(elt, ir.IntegerType) and elt.width == 1:
                raise fail(op, "is a buffer of i1 (run-time buffer ownership), which the LLVM conversion "
                               "cannot load or store")


def _reject_padded_vector_views(module_op) -> None:
    """A buffer of scalars viewed as vectors whose rows LLVM pads in memory (rows of 24 floats
    take 32) would be overrun by the vector stores; `_tile_sizes` keeps tile rows to powers of two,
    and this says so if some other op still made one, rather than corrupting memory."""
    from mlir import ir

    for op in walk(module_op, "vector.type_cast"):
        source = op.operands[0].type
        vector = ir.MemRefType(op.results[0].type).element_type
        if isinstance(source.element_type, ir.VectorType) or not isinstance(vector, ir.VectorType):
            continue
        if rows_padded_in_memory(vector):
            raise fail(op, f"views a buffer as {vector}, whose rows LLVM pads in memory; the CPU lowering "
                           "needs power-of-two vector rows here")


def align_vector_views(module_op) -> None:
    """Align each buffer viewed as vectors (`vector.type_cast`) to the vector rows' own size.

    The whole-vector load or store through such a view becomes an LLVM load or store with the
    vector's ABI alignment (its size: 64 bytes for 16 floats), but the staging buffers that
    `split_transfer_full_partial` allocates for partial tiles are 32-byte aligned. With AVX-512,
    LLVM then emits an aligned 64-byte move into a 32-byte-aligned stack slot, which faults
    whenever the incoming stack pointer happens to be an odd multiple of 32.
    """
    from mlir import ir

    for op in walk(module_op, "vector.type_cast"):
        vector = ir.MemRefType(op.results[0].type).element_type
        if not isinstance(vector, ir.VectorType):
            continue
        row_bytes = vector.shape[-1] * max(1, vector.element_type.width // 8)
        alignment = 1 << (row_bytes - 1).bit_length()
        buffer = op.operands[0].owner
        if not isinstance(buffer, ir.OpView) or buffer.operation.name not in ("memref.alloca", "memref.alloc"):
            raise fail(op, f"views a buffer not allocated here as {vector}, whose alignment the CPU lowering "
                           "cannot raise to the vector's")
        buffer = buffer.operation
        if "alignment" in buffer.attributes and ir.IntegerAttr(buffer.attributes["alignment"]).value >= alignment:
            continue
        buffer.attributes["alignment"] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64, op.context), alignment)


def ignore_zero_signs_of_extrema(module_op) -> None:
    """Let vector max/min reductions (`maximumf`, `minimumf`) take either zero where both signs
    are among the candidates (fastmath `nsz`).

    IEEE maximum orders -0 below +0 and propagates NaN; LLVM's x86 lowering spends a sign-bit blend
    per step on the first, which the reductions of an L1 kernel do not need: they are row maxima
    of scores (each score then enters exp2(s - m), the same for either zero) and the largest
    decay span of a chunk (compared with a bound). NaN still propagates, and `nsz`, unlike
    `nnan`, makes no input poison. On the 2-core AMD EPYC with AVX-512 the forward's kernels ran
    3-6% faster (full and causal, L 512, one and two threads), with bit-identical outputs."""
    from mlir import ir

    for op in walk(module_op, "vector.reduction"):
        kind = str(op.attributes["kind"])
        if kind.endswith(("<maximumf>", "<minimumf>")):
            op.attributes["fastmath"] = ir.Attribute.parse("#arith.fastmath<nsz>", op.context)


def flatten_math_vectors(module_op) -> None:
    """Run math ops on n-D vectors as 1-D ones (shape casts around them).

    The math-to-LLVM conversion takes some ops (math.absi, for one) only on scalars and 1-D
    vectors, and the libm conversion only on scalars and vectors it can unroll; vectorized mods
    (`(q_idx - kv_idx).abs()`) produce them on the 2-D vectors of a row block.
    """
    from mlir import ir
    from mlir.dialects import vector

    for op in walk(module_op, "math."):
        types = [v.type for v in list(op.operands) + list(op.results)]
        if not any(isinstance(t, ir.VectorType) and t.rank > 1 for t in types):
            continue
        with op.context, op.location, ir.InsertionPoint(op):
            def flat(t):
                return ir.VectorType.get([math.prod(t.shape)], t.element_type)

            operands = [vector.shape_cast(flat(v.type), v) for v in op.operands]
            result_types = [flat(r.type) for r in op.results]
            attributes = {name: op.attributes[name] for name in op.attributes}
            flat_op = ir.Operation.create(op.name, results=result_types, operands=operands, attributes=attributes)
            for old, new in zip(op.results, flat_op.results):
                old.replace_all_uses_with(vector.shape_cast(old.type, new))
        op.erase()
