"""`attn-cpu-bf16-memory-as-integers`: in the llvm dialect, bf16 vectors that only move between
memory and integer vectors are loaded and stored as i16 vectors.

    %v = llvm.bitcast %bits : vector<64xi16> to vector<64xbf16>;  llvm.store %v, %p
  becomes  llvm.store %bits, %p ; and
    %v = llvm.load %p : vector<64xbf16>;  llvm.store %v, %q   (a tile copy)
    %w = llvm.load %p : vector<32xbf16>;  llvm.bitcast %w : ... to vector<16xi32>
  load i16 vectors (and store or bitcast those).

Why: LLVM's x86 backend without AVX512-BF16 (`attn-cpu-no-avx512-bf16`) promotes every bf16
value to f32, so a store of a bf16 vector is written one element at a time (its lanes extracted
to general registers), and a bf16 load that is stored again goes through f32 and back. The
kernels compute in f32 and make bf16 by integer rounding, so their bf16 vectors only cross
memory: the AMX operands (`attn-cpu-amx-tile-products`: P, the repacked K and V tiles) and
16-bit outputs. Same bits, so nothing changes but the instructions. Hand-written: no upstream
pass rewrites a load's or store's element type.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from . import ModulePass
from .cpu_support import walk


@dataclass(frozen=True)
class Bf16MemoryAsIntegers(ModulePass):
    name: ClassVar[str] = "attn-cpu-bf16-memory-as-integers"
    summary: ClassVar[str] = ("CPU lowering: load and store bf16 vectors that only cross memory as i16 vectors "
                              "(LLVM's x86 backend scalarizes bf16 vector stores without AVX512-BF16)")

    def apply(self, module_op) -> None:
        with module_op.context:
            _store_bits(module_op)
            _load_bits(module_op)


def _bf16_vector(t) -> bool:
    from mlir import ir

    return isinstance(t, ir.VectorType) and t.element_type == ir.BF16Type.get()


def _as_i16(t):
    from mlir import ir

    return ir.VectorType.get(list(t.shape), ir.IntegerType.get_signless(16))


def _store_bits(module_op) -> None:
    """A store of a bf16 vector bitcast from an integer vector stores the integers."""
    from mlir import ir

    for store in walk(module_op, "llvm.store"):
        value = store.operands[0]
        owner = value.owner
        if not _bf16_vector(value.type) or isinstance(owner, ir.Block) or owner.name != "llvm.bitcast":
            continue
        source = owner.operands[0]
        if not isinstance(source.type, ir.VectorType) or isinstance(source.type.element_type, ir.FloatType):
            continue
        store.operands[0] = source
        if not list(value.uses):
            owner.erase()


def _load_bits(module_op) -> None:
    """A bf16 vector load whose every use is a store or a bitcast loads i16 instead."""
    from mlir import ir
    from mlir.dialects import llvm

    for load in walk(module_op, "llvm.load"):
        value = load.results[0]
        uses = [use.owner for use in value.uses]
        if not _bf16_vector(value.type) or not uses:
            continue
        if not all(u.name == "llvm.bitcast" or (u.name == "llvm.store" and u.operands[0] == value) for u in uses):
            continue
        attributes = {name: load.attributes[name] for name in load.attributes}
        with load.location, ir.InsertionPoint(load):
            bits = ir.Operation.create("llvm.load", results=[_as_i16(value.type)], operands=list(load.operands),
                                       attributes=attributes).results[0]
        for use in uses:
            if use.name == "llvm.store":
                use.operands[0] = bits
            else:
                with use.location, ir.InsertionPoint(use):
                    cast = llvm.BitcastOp(use.results[0].type, bits).result
                use.results[0].replace_all_uses_with(cast)
                use.erase()
        load.erase()
