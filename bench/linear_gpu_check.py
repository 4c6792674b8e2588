"""The per-dimension decays' kernels on a GPU against the recurrence in float64: GLA's forward
("token_dim") and the runs its backward takes for dq and dk ("token_value_dim"), forward and in
reversed time, bf16 inputs, at gentle decays (the tensor-core forms) and at a chunk that decays
past the span limit in a few dimensions (the blocks' exact forms). The TTIR interpreter in the
tests cannot show codegen faults of a GPU compiler; this does.

    python bench/linear_gpu_check.py build --out bench/bundles/linear_gpu_check   # here
    python bench/linear_gpu_check.py run --bundles bench/bundles/linear_gpu_check --out DIR   # GPU

A case passes when its output's and final state's largest error is within 2e-2 of their
largest magnitude (bf16 operands, float32 accumulation).
"""
from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import harness  # noqa: E402

# (decay, B, H, L, Dk, Dv, decays past the span limit, reversed)
CASES = [(decay, *shape, strong, rev)
         for decay in ("token_dim", "token_value_dim")
         for shape in [(1, 2, 128, 128, 128), (2, 4, 300, 64, 128), (2, 16, 2048, 128, 128)]
         for strong in (False, True) for rev in (False, True)]
SCALE, CHUNK, TOLERANCE = 0.125, 64, 2e-2


def _inputs(case, device):
    import torch

    decay, b, h, length, dk, dv, strong, _ = case
    gen = torch.Generator(device=device).manual_seed(CASES.index(case))
    q, k = (torch.randn(b, h, length, dk, generator=gen, device=device).bfloat16() for _ in range(2))
    v = torch.randn(b, h, length, dv, generator=gen, device=device).bfloat16()
    width = dk if decay == "token_dim" else dv
    # GLA's gates: log-sigmoid outputs scaled by 1/16, so a chunk decays a few nats at most.
    g = torch.nn.functional.logsigmoid(torch.randn(b, h, length, width, generator=gen, device=device)) / 16
    if strong:
        g[:, :, 40:60, 3] = -3.0  # 60 nats within the first chunk in one dimension
        g[:, :, 70:128, width - 1] = -1.0  # and 58 in the last one of the second chunk
    s0 = torch.randn(b, h, dk, dv, generator=gen, device=device)
    return q, k, v, g, s0


def _module(case, tensors):
    import torch

    from ae_mlir.frontend.linear_kernel_backward import plain_module

    return plain_module(case[0], SCALE, CHUNK, *tensors, torch.float32)


def _recurrence(decay, q, k, v, g, s0):
    """(o, S_L) one token at a time in float64: S_t = diag(e^g_t) S_{t-1} + k_t^T v_t for
    "token_dim", S_{t-1} diag(e^g_t) + k_t^T v_t for "token_value_dim"; o_t = scale q_t S_t."""
    import torch

    q, k, v, g = (t.double() for t in (q, k, v, g))
    state = s0.double().clone()
    axis = -1 if decay == "token_dim" else -2
    outs = []
    for t in range(q.shape[2]):
        state = state * torch.exp(g[:, :, t]).unsqueeze(axis) + k[:, :, t].unsqueeze(-1) * v[:, :, t].unsqueeze(-2)
        outs.append(SCALE * torch.einsum("bhd,bhde->bhe", q[:, :, t], state))
    return torch.stack(outs, 2), state


def build(out: str) -> None:
    os.environ["AE_MLIR_CACHE_DIR"] = os.path.abspath(out)
    from ae_mlir import runtime
    from ae_mlir.backends import triton as tb

    runtime.CACHE.clear_memory()
    for case in CASES:
        tb.get_bundle(_module(case, _inputs(case, "cpu")), "cuda:90")
    print("built", len(CASES), "cases")


def run(bundles: str, out_dir: str) -> None:
    os.environ["AE_MLIR_CACHE_DIR"] = os.path.abspath(bundles)
    import torch

    from ae_mlir import runtime
    from ae_mlir.frontend.linear_kernel_backward import run_plain

    runtime.CACHE.clear_memory()
    doc = harness.results_doc(out_dir, __doc__, dtype="bfloat16", chunk=CHUNK, tolerance=TOLERANCE)
    for case in CASES:
        decay, rev = case[0], case[-1]
        q, k, v, g, s0 = _inputs(case, "cuda")
        rec = {"case": dict(zip(("decay", "B", "H", "L", "Dk", "Dv", "strong", "reversed"), case))}
        try:
            out, state = run_plain("triton", decay, SCALE, CHUNK, q, k, v, g, s0, torch.float32, reverse=rev)
            torch.cuda.synchronize()
            flip = (lambda t: t.flip(2)) if rev else (lambda t: t)
            want_out, want_state = _recurrence(decay, flip(q), flip(k), flip(v), g, s0)
            want_out = flip(want_out)
            errors = {"out": float((out.double() - want_out).abs().max() / want_out.abs().max()),
                      "state": float((state.double() - want_state).abs().max() / want_state.abs().max())}
            # Which of a chunk's rows miss: a codegen fault showed as every row after the first 16.
            row_err = (out.double() - want_out).abs().amax(dim=(0, 1, 3)) / want_out.abs().max()
            bad = (row_err > TOLERANCE).nonzero().flatten().tolist()
            rec.update(errors=errors, bad_rows=bad[:16], bad_row_count=len(bad),
                       passed=max(errors.values()) <= TOLERANCE)
        except Exception as exc:
            rec.update(error=f"{type(exc).__name__}: {str(exc)[:300]}", passed=False)
        print(rec, flush=True)
        doc["cases"].append(rec)
        harness.save(doc, out_dir, "linear-gpu-check.json")
    print("failed:", sum(not r["passed"] for r in doc["cases"]), "of", len(doc["cases"]))


if __name__ == "__main__":
    sys.exit(harness.main(__doc__, build, run, "linear_gpu_check"))
