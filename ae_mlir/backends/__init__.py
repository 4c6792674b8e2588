"""Backend dispatch: run an L0 module's function on torch tensors."""
from __future__ import annotations


def run(module_text: str, inputs: list, backend: str, out_dtype, autotune: bool = False) -> list:
    """Compile (or interpret) `module_text` for `backend` and run it on `inputs` (q, k, v, then the
    closure tensors); a mask that reads closure tensors is classified from the compiled kernel's
    own mask program, so nothing but tensors is needed. `autotune` tunes the kernels' launch
    configuration on the cpu and triton backends (`ae_mlir.autotune`); the reference executor has
    none."""
    if backend == "reference":
        from ..reference import run_module_text

        return run_module_text(module_text, inputs, out_dtype)
    if backend == "cpu":
        from .cpu import run_module_text

        return run_module_text(module_text, inputs, out_dtype, autotune)
    if backend == "triton":
        from .triton import run

        return run(module_text, inputs, out_dtype, autotune)
    raise NotImplementedError(
        f"backend '{backend}' is not available in this version of ae-mlir; use backend='reference'"
    )


def run_backward(module_text: str, tensors: dict, backend: str, closure_grads: bool = True,
                 kind: str | None = None, stat: str = "none", autotune: bool = False) -> dict:
    """dq, dk and dv (by role) of the attention `module_text` (softmax, an element-wise
    normalizer or a user's online one: its normalize `kind`, by default softmax when `tensors`
    has lse, and its `stat`, "max" for a running max) from its backward kernels, and with `closure_grads` the gradients
    dc<i> of the closure tensors the score_mod reads; `tensors` holds q, k, v, the closure
    tensors c<i>, do, and for softmax out, lse and dlse, by role. `autotune` tunes the Triton
    kernels' launch configuration (`ae_mlir.autotune`); the CPU's backward keeps its tiles."""
    if backend == "cpu":
        from .cpu import run_backward as run_cpu

        return run_cpu(module_text, tensors, closure_grads, kind, stat)
    if backend == "triton":
        from .triton import run_backward as run_triton

        return run_triton(module_text, tensors, closure_grads, autotune)
    raise NotImplementedError(f"backend '{backend}' has no backward kernels")
