"""The IR layer: contexts and diagnostics, the dialects' verifier, mod regions as scalar programs,
the built-in normalizers' regions.

Everything above (passes, backends, the frontend, the CLI) builds on this package; it imports
nothing from them. The MLIR bindings load lazily, so the runtime may use the parts that need none.
"""
