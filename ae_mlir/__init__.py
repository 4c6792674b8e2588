"""ae-mlir: an MLIR-based multi-level attention compiler.

Importing this package loads neither torch, triton nor the MLIR bindings; they load on first use.
"""
from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["attention", "linear_attention", "OnlineNormalizer", "CompileError"]


def __getattr__(name):
    if name == "attention":
        from .frontend.api import attention

        return attention
    if name == "linear_attention":
        from .frontend.linear_api import linear_attention

        return linear_attention
    if name == "OnlineNormalizer":
        from .normalizers import OnlineNormalizer

        return OnlineNormalizer
    if name == "CompileError":
        from .core.context import CompileError

        return CompileError
    raise AttributeError(f"module 'ae_mlir' has no attribute {name!r}")
