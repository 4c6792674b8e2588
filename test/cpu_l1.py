"""Run a hand-written L1 kernel of one program through the CPU lowering (`attn-lower-to-cpu`) and
the LLVM JIT, on torch tensors: for tests of one lowering step's numerics (the math expansions)."""
from __future__ import annotations

import ctypes

from ae_mlir.backends import cpu_launch


def run_one_program(text: str, name: str, tensors: list) -> str:
    """Lower the module `text`, run its kernel `name` on `tensors` (inputs then the destinations
    it writes), and return the lowered module's text."""
    from mlir.execution_engine import ExecutionEngine

    from ae_mlir.core.context import new_context, parse_module
    from ae_mlir.passes import build_pass_manager

    ctx = new_context()
    module = parse_module(text, ctx)
    build_pass_manager("builtin.module(attn-lower-to-cpu)", ctx).run(module.operation)
    engine = ExecutionEngine(module, opt_level=3)
    entry = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(engine.raw_lookup(f"_mlir_ciface_{name}"))
    cpu_launch.RangeLaunch(entry, tensors, programs=1)(0, 1)  # the range of programs to run: its one program
    return str(module)
