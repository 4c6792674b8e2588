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


_ELEMENTWISE_KERNEL = """
func.func @kernel(%x: tensor<{n}xf32>, %t: tensor<{n}xf32>) -> tensor<{n}xf32>
    attributes {{attn.grid = array<i64: 1>}} {{
  %r = linalg.generic {{indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>],
                       iterator_types = ["parallel"]}} ins(%x : tensor<{n}xf32>) outs(%t : tensor<{n}xf32>) {{
  ^bb0(%in: f32, %out: f32):
    %a = math.{op} %in : f32
    linalg.yield %a : f32
  }} -> tensor<{n}xf32>
  return %r : tensor<{n}xf32>
}}
"""


def run_math_op(op: str, x):
    """(math.`op` applied to each element of the f32 vector `x` by a lowered kernel, the lowered
    module's text)."""
    import torch

    out = torch.empty_like(x)
    lowered = run_one_program(_ELEMENTWISE_KERNEL.format(n=x.numel(), op=op), "kernel", [x, out])
    return out, lowered
