"""`attn-verify`: the attn dialect's shape and region rules as a pass, so a pipeline can re-check
them between transformations (MLIR's own verifier only knows what IRDL could express)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..core.context import CompileError
from ..core.verifier import verify_module
from . import ModulePass, option


@dataclass(frozen=True)
class AttnVerify(ModulePass):
    name: ClassVar[str] = "attn-verify"
    summary: ClassVar[str] = "Check the attn dialect's shape and region-signature rules"

    max_errors: int = option(0, "report at most this many errors; 0 reports all")

    def __post_init__(self):
        if self.max_errors < 0:
            raise ValueError(f"max-errors must be at least 0, got {self.max_errors}")

    def apply(self, module_op) -> None:
        errors = verify_module(module_op)
        if errors:
            shown = errors[: self.max_errors] if self.max_errors else errors
            raise CompileError("invalid attn IR", shown)
