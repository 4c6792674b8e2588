"""ae-mlir inside another Python MLIR stack that uses the same upstream bindings.

The caller keeps its own `Context`, modules and `PassManager`; ae-mlir adds its dialects to the
context and its passes, by name, next to the caller's passes:

    from mlir import ir, passmanager
    from ae_mlir.embedding import add_pass, add_passes, load_dialects

    ctx = ir.Context()
    load_dialects(ctx)                      # before parsing IR that uses attn ops
    module = ir.Module.parse(text, ctx)
    pm = passmanager.PassManager("builtin.module", context=ctx)
    pm.add("canonicalize")
    add_passes(pm, "attn-verify,func.func(cse)")
    add_pass(pm, "attn-verify", max_errors=1)
    pm.run(module.operation)

A failing ae pass reports like any MLIR pass: `pm.run` raises `ir.MLIRError` whose
`error_diagnostics` carry the messages and locations (or the context's diagnostic handler receives
them). An unknown pass name or a bad option raises `CompileError` when the pass is added.
"""
from __future__ import annotations

from .core.context import CompileError, dialect_path, load_dialects
from .passes import add_pass, pass_names
from .passes import add_pipeline as add_passes

__all__ = ["CompileError", "add_pass", "add_passes", "dialect_path", "load_dialects", "pass_names"]
