"""Backend dispatch: run an L0 module's function on torch tensors."""
from __future__ import annotations


def run(module_text: str, inputs: list, backend: str, out_dtype, mask_mod=None) -> list:
    """Compile (or interpret) `module_text` for `backend` and run it on `inputs`; `mask_mod` lets a
    backend classify tiles at call time for masks that read closure tensors."""
    if backend == "reference":
        from ..reference import run_module_text

        return run_module_text(module_text, inputs, out_dtype)
    if backend == "cpu":
        from .cpu import run_module_text

        return run_module_text(module_text, inputs, out_dtype, mask_mod)
    if backend == "triton":
        from .triton import run

        return run(module_text, inputs, out_dtype, mask_mod)
    raise NotImplementedError(
        f"backend '{backend}' is not available in this version of ae-mlir; use backend='reference'"
    )
