"""`attn-cpu-no-avx512-bf16`: the kernels of a module in the llvm dialect are compiled without
AVX512-BF16 instructions."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from . import ModulePass
from .cpu_support import ops

# LLVM's x86 backend, on hosts with AVX512-BF16 (Sapphire Rapids and later), aborts the process
# legalizing some bf16 vectors ("Do not know how to soft promote this operator's operand" on a
# `scalar_to_vector` of v8bf16: tiles whose rows are 9, 17 or 33 bf16 wide). The kernels compute in
# f32 and convert bf16 by integer bit operations (`arith-expand{include-bf16}`), so they have no
# use for those instructions. A function's "target-features" replaces the JIT's host feature list:
# the function gets the features its CPU model implies, less AVX512-BF16; a host that has those
# instructions has that model's vector features too, which is why the cpu preset runs this pass
# only on such hosts (`attn-lower-to-cpu{no-avx512-bf16}`) and nowhere else.
FEATURES = '#llvm.target_features<["-avx512bf16"]>'


@dataclass(frozen=True)
class NoAvx512Bf16(ModulePass):
    name: ClassVar[str] = "attn-cpu-no-avx512-bf16"
    summary: ClassVar[str] = ("CPU lowering: compile the module's functions without AVX512-BF16 instructions, "
                              "whose bf16 vector legalization aborts LLVM's x86 backend")

    def apply(self, module_op) -> None:
        from mlir import ir

        with module_op.context:
            features = ir.Attribute.parse(FEATURES)
        for op in ops(module_op.regions[0].blocks[0]):
            if op.name == "llvm.func" and op.regions[0].blocks:
                op.attributes["target_features"] = features
