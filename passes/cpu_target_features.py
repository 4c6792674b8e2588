"""The target features the kernels of a module in the llvm dialect are compiled with:
`attn-cpu-no-avx512-bf16` (without AVX512-BF16 instructions), `attn-cpu-narrow-isa` (without
the x86 vector extensions wider than the register tiles, as a host without them would run) and
`attn-cpu-amx-features` (with AMX's tile instructions).

A function's "target-features" edits the JIT's host feature list: the function gets the features
its CPU model implies, less those named. Both passes add to what a function already has, so they
compose in either order; declarations are left alone."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar, Literal

from . import ModulePass, option
from .cpu_support import ops

# LLVM's x86 backend, on hosts with AVX512-BF16 (Sapphire Rapids and later), aborts the process
# legalizing some bf16 vectors ("Do not know how to soft promote this operator's operand" on a
# `scalar_to_vector` of v8bf16: tiles whose rows are 9, 17 or 33 bf16 wide). The kernels compute in
# f32 and convert bf16 by integer bit operations (`arith-expand{include-bf16}`), so they have no
# use for those instructions; a host that has them has its model's other vector features too,
# which is why the cpu preset runs this pass only on such hosts (`attn-lower-to-cpu{no-avx512-bf16}`).
NO_AVX512_BF16 = ("-avx512bf16",)

# The x86 extensions a kernel tiled for a vector width leaves out, so that it runs as on a host
# whose widest registers are that wide: at 256 bits AVX-512 (everything AVX-512 implies goes with
# AVX512F), at 128 bits AVX (AVX2 and FMA with it).
NARROWER_THAN = {256: ("-avx512f",), 128: ("-avx",)}

# The tile instructions `attn-cpu-amx-tile-products` writes: the model LLVM's JIT takes for a host
# it does not name exactly need not imply them (a Xeon with AMX-BF16 failed to select TDPBF16PS
# without them).
AMX = ("+amx-tile", "+amx-bf16")


def add_target_features(module_op, edits: tuple[str, ...]) -> None:
    """Add the feature `edits` to every function defined in the llvm-dialect module."""
    from mlir import ir

    for op in ops(module_op.regions[0].blocks[0]):
        if op.name != "llvm.func" or not op.regions[0].blocks:
            continue
        present = re.findall(r'"([^"]*)"', str(op.attributes["target_features"])) \
            if "target_features" in op.attributes else []
        features = present + [e for e in edits if e not in present]
        listed = ", ".join(f'"{f}"' for f in features)
        with module_op.context:
            op.attributes["target_features"] = ir.Attribute.parse(f"#llvm.target_features<[{listed}]>")


@dataclass(frozen=True)
class NoAvx512Bf16(ModulePass):
    name: ClassVar[str] = "attn-cpu-no-avx512-bf16"
    summary: ClassVar[str] = ("CPU lowering: compile the module's functions without AVX512-BF16 instructions, "
                              "whose bf16 vector legalization aborts LLVM's x86 backend")

    def apply(self, module_op) -> None:
        add_target_features(module_op, NO_AVX512_BF16)


@dataclass(frozen=True)
class NarrowIsa(ModulePass):
    name: ClassVar[str] = "attn-cpu-narrow-isa"
    summary: ClassVar[str] = ("CPU lowering (x86): compile the module's functions without the vector extensions "
                              "wider than vector-bits, as a host without them would run them")

    vector_bits: Literal[128, 256] = option(256, "the widest vector registers the code may use, in bits")

    def apply(self, module_op) -> None:
        add_target_features(module_op, NARROWER_THAN[self.vector_bits])


@dataclass(frozen=True)
class AmxFeatures(ModulePass):
    name: ClassVar[str] = "attn-cpu-amx-features"
    summary: ClassVar[str] = ("CPU lowering (x86): compile the module's functions with AMX-TILE and AMX-BF16, "
                              "for the tile products of attn-cpu-amx-tile-products")

    def apply(self, module_op) -> None:
        add_target_features(module_op, AMX)
