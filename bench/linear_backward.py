"""Linear attention training step on the GPU: forward + backward of `ae.linear_attention` (the
compiled forward, the torch recomputation backward of ae_mlir/frontend/linear_backward.py) beside
fla's chunk kernels (`chunk_retention`, `chunk_simple_gla`, `chunk_gla`), bf16, B=8 T=2048 H=16
D=128, in the same process.

    python bench/linear_backward.py build --out bench/bundles/linear_backward   # here: a kernel cache
    python bench/linear_backward.py run --bundles bench/bundles/linear_backward --out DIR   # GPU

`build` fills a kernel cache (AE_MLIR_CACHE_DIR) with the bundles the run's calls compile to, so
the GPU machine, which has no MLIR bindings, finds them there. `run` times
`torch.autograd.grad(op(q, k, v, g), (q, k, v[, g]), dO)` for each implementation (median of
`triton.testing.do_bench`, fresh inputs per case, ae-mlir reading [B, H, T, D] views of fla's
[B, T, H, D] tensors) and compares ae-mlir's gradients with fla's.
"""
from __future__ import annotations

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import harness  # noqa: E402
import suite  # noqa: E402

CASES = ["retention", "simple_gla", "gla"]
BATCH, HEADS, SEQ, DIM = 8, 16, 2048, 128


def _case(variant: str) -> suite.Case:
    return suite.Case(part="linear", variant=variant, dtype="bfloat16", batch=BATCH, heads=HEADS, seq=SEQ, dim=DIM)


def build(out: str) -> None:
    os.environ["AE_MLIR_CACHE_DIR"] = os.path.abspath(out)
    from ae_mlir import runtime
    from ae_mlir.backends import triton as tb

    runtime.CACHE.clear_memory()
    for variant in CASES:
        case = _case(variant)
        q, k, v, g = suite.linear_inputs(case, "cpu", empty=True)["ae"]
        tb.get_bundle(suite.linear_attention(case).mlir(q, k, v, g), "cuda:90")
        print("built", variant, flush=True)


def _relative_error(got, want) -> float:
    return float((got.float() - want.float()).abs().max() / want.float().abs().max())


def run(bundles: str, out_dir: str) -> None:
    os.environ["AE_MLIR_CACHE_DIR"] = os.path.abspath(bundles)
    import torch
    import triton

    from ae_mlir import runtime

    runtime.CACHE.clear_memory()
    device = torch.device("cuda")
    doc = harness.results_doc(out_dir, __doc__, shape={"B": BATCH, "T": SEQ, "H": HEADS, "D": DIM}, dtype="bfloat16")
    for variant in CASES:
        case = _case(variant)
        tensors = suite.linear_inputs(case, device)
        q, k, v, g = tensors["fla"]
        leaves = [t.requires_grad_() for t in (q, k, v)] + ([g.requires_grad_()] if g is not None else [])
        d_out = torch.randn_like(q)
        lin = suite.linear_attention(case)
        g_ae = tensors["ae"][3] if g is None else g.transpose(1, 2)
        fla = suite.fla_op(variant)

        def ae_step():
            out = lin(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), g_ae)
            return torch.autograd.grad(out, leaves, d_out.transpose(1, 2))

        def fla_step():
            return torch.autograd.grad(fla(q, k, v, g), leaves, d_out)

        rec = {"case": variant, "results": {}}
        grads = {}
        for label, step in (("ae_mlir", ae_step), ("fla", fla_step)):
            try:
                grads[label] = step()
                ms = float(triton.testing.do_bench(step, warmup=25, rep=100, return_mode="median"))
                rec["results"][label] = {"forward_backward_ms": ms}
            except Exception as exc:
                rec["results"][label] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        if len(grads) == 2:
            names = ["dq", "dk", "dv", "dg"]
            rec["max_rel_diff_vs_fla"] = {n: _relative_error(a, b) for n, a, b in zip(names, *grads.values())}
        doc["cases"].append(rec)
        print(json.dumps(rec), flush=True)
        harness.save(doc, out_dir, "linear-backward.json")


def main(argv=None) -> int:
    return harness.main(__doc__, build, run, "linear_backward", argv)


if __name__ == "__main__":
    sys.exit(main())
