"""`attn-cpu-define-bf16-truncation`: a module in the llvm dialect gets its own `__truncsfbf2`."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from . import ModulePass
from .cpu_support import ops

# LLVM's x86 backend, without AVX512-BF16, moves bf16 vectors (loads, shuffles) through f32 and
# calls compiler-rt's `__truncsfbf2` on the way back; the JIT finds no such symbol in this process
# (libgcc has it only from GCC 13). The module defines it, rounding to nearest even as
# `arith-expand{include-bf16}` does, with a quiet NaN kept quiet.
TRUNCSFBF2 = """
llvm.func @__truncsfbf2(%x: f32) -> bf16 {
  %bits = llvm.bitcast %x : f32 to i32
  %c16 = llvm.mlir.constant(16 : i32) : i32
  %one = llvm.mlir.constant(1 : i32) : i32
  %bias = llvm.mlir.constant(32767 : i32) : i32
  %qnan = llvm.mlir.constant(32704 : i16) : i16
  %high = llvm.lshr %bits, %c16 : i32
  %odd = llvm.and %high, %one : i32
  %round = llvm.add %bias, %odd : i32
  %sum = llvm.add %bits, %round : i32
  %shifted = llvm.lshr %sum, %c16 : i32
  %narrow = llvm.trunc %shifted : i32 to i16
  %nan = llvm.fcmp "uno" %x, %x : f32
  %pick = llvm.select %nan, %qnan, %narrow : i1, i16
  %out = llvm.bitcast %pick : i16 to bf16
  llvm.return %out : bf16
}
"""


@dataclass(frozen=True)
class DefineBf16Truncation(ModulePass):
    name: ClassVar[str] = "attn-cpu-define-bf16-truncation"
    summary: ClassVar[str] = ("CPU lowering: define __truncsfbf2 (f32 to bf16, round to nearest even) in the "
                              "llvm-dialect module, for hosts whose JIT cannot resolve it")

    def apply(self, module_op) -> None:
        define_bf16_truncation(module_op)


def define_bf16_truncation(module_op) -> None:
    """Add `__truncsfbf2` to a module in the llvm dialect that has none."""
    from mlir import ir

    body = module_op.regions[0].blocks[0]
    for op in ops(body):
        if op.name == "llvm.func" and ir.StringAttr(op.attributes["sym_name"]).value == "__truncsfbf2":
            return
    with module_op.context, ir.Location.unknown():
        library = ir.Module.parse(TRUNCSFBF2)
        for op in library.body.operations:
            op.operation.clone(ip=ir.InsertionPoint(body))
