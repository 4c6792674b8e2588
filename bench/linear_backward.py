"""Linear attention training step on the GPU: forward + backward of `ae.linear_attention` beside
fla's chunk kernels (`chunk_retention`, `chunk_simple_gla`, `chunk_gla`), bf16, B=8 T=2048 H=16
D=128, in the same process. The backward is three more runs of the compiled recurrence
(ae_mlir/frontend/linear_kernel_backward.py); GLA's ("token_dim") dq and dk runs decay the values'
columns ("token_value_dim").

    python bench/linear_backward.py build --out bench/bundles/linear_backward   # here: a kernel cache
    python bench/linear_backward.py run --bundles bench/bundles/linear_backward --out DIR   # GPU

`--cases retention,simple_gla,gla` (the default: all) picks the cases of either step; `--profile`
adds each implementation's kernels with their mean time per forward and per step (torch.profiler);
`--no-peers` times ae-mlir alone.

`build` fills a kernel cache (AE_MLIR_CACHE_DIR) with the bundles the run's calls compile to (the
forward, and the backward's runs, found by running the backward on CPU tensors with a runner that
only builds), so the GPU machine, which has no MLIR bindings, finds them there. `run` times
`torch.autograd.grad(op(q, k, v, g), (q, k, v[, g]), dO)` for each implementation (median of
`triton.testing.do_bench`, fresh inputs per case, ae-mlir reading [B, H, T, D] views of fla's
[B, T, H, D] tensors) and gives each one's gradients' largest error relative to the largest
gradient and their error norm relative to the gradient's norm, against float32 autograd of the
chunked recurrence (`suite.linear_reference`).
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
PROFILE = False  # --profile: also each implementation's kernels and their times
PEERS = True  # --no-peers: ae-mlir alone (a profile without fla's autotuning)
BATCH, HEADS, SEQ, DIM = 8, 16, 2048, 128


def _case(variant: str) -> suite.Case:
    return suite.Case(part="linear", variant=variant, dtype="bfloat16", batch=BATCH, heads=HEADS, seq=SEQ, dim=DIM)


def build(out: str) -> None:
    os.environ["AE_MLIR_CACHE_DIR"] = os.path.abspath(out)
    import torch

    from ae_mlir import runtime
    from ae_mlir.backends import triton as tb
    from ae_mlir.frontend import linear_kernel_backward

    runtime.CACHE.clear_memory()

    def build_only(*args, reverse=False, packing=None, like=None):
        tb.get_bundle(linear_kernel_backward.plain_module(*args, packing), "cuda:90")
        q, v, out_dtype = args[3], args[5], args[-1]
        b, h, length, dk = q.shape
        return (torch.zeros(b, h, length, v.shape[3], dtype=out_dtype),
                torch.zeros(b, h, dk, v.shape[3], dtype=torch.float32))

    for variant in CASES:
        case = _case(variant)
        q, k, v, g = suite.linear_inputs(case, "cpu", empty=True)["ae"]
        lin = suite.linear_attention(case)
        tb.get_bundle(lin.mlir(q, k, v, g), "cuda:90")
        wanted = [True, True, True, variant != "retention", False]
        call = lin._linear_call(q.shape[3], (), None, "triton")
        state = torch.zeros(q.shape[0], q.shape[1], q.shape[3], v.shape[3])
        linear_kernel_backward.gradients(call, (q, k, v, g, None), (torch.zeros_like(q), None), wanted, state,
                                         run=build_only)
        print("built", variant, flush=True)


def _relative_error(got, want) -> float:
    return float((got.float() - want.float()).abs().max() / want.float().abs().max())


def _norm_error(got, want) -> float:
    """||got - want|| / ||want||: every element counts, where the largest error over the largest
    gradient mostly measures the bf16 rounding of the largest gradients."""
    return float((got.double() - want.double()).norm() / want.double().norm())


def run(bundles: str, out_dir: str) -> None:
    os.environ["AE_MLIR_CACHE_DIR"] = os.path.abspath(bundles)
    import torch

    from ae_mlir import runtime

    runtime.CACHE.clear_memory()
    device = torch.device("cuda")
    doc = harness.results_doc(out_dir, __doc__, shape={"B": BATCH, "T": SEQ, "H": HEADS, "D": DIM}, dtype="bfloat16")
    for variant in CASES:
        case = _case(variant)
        tensors = suite.linear_inputs(case, device)
        q, k, v, g = tensors["fla"]
        decay = suite.LINEAR_DECAYS[variant]
        leaves = [t.requires_grad_() for t in (q, k, v)] + ([g.requires_grad_()] if g is not None else [])
        d_out = torch.randn_like(q)
        lin = suite.linear_attention(case)
        g_ae = tensors["ae"][3] if g is None else g.transpose(1, 2)
        fla = suite.fla_op(variant)

        def ae_forward():
            return lin(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), g_ae)

        def ae_step():
            return torch.autograd.grad(ae_forward(), leaves, d_out.transpose(1, 2))

        def fla_forward():
            return fla(q, k, v, g)

        def fla_step():
            return torch.autograd.grad(fla_forward(), leaves, d_out)

        def reference():
            ref = suite.linear_reference(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), g_ae, decay)
            return torch.autograd.grad(ref, leaves, d_out.transpose(1, 2).float())

        want = reference()
        names = ["dq", "dk", "dv", "dg"]
        rec = {"case": variant, "results": {}}
        runs = [("ae_mlir", ae_forward, ae_step)] + ([("fla", fla_forward, fla_step)] if PEERS else [])
        for label, forward, step in runs:
            try:
                grads = step()
                ms = harness.bench_ms(step)
                rec["results"][label] = {"forward_backward_ms": ms, "forward_ms": harness.bench_ms(forward),
                                         "max_rel_err_vs_f32": {
                    n: _relative_error(a, b) for n, a, b in zip(names, grads, want)},
                                         "norm_rel_err_vs_f32": {
                    n: _norm_error(a, b) for n, a, b in zip(names, grads, want)}}
                if PROFILE:
                    rec["results"][label]["kernels_us"] = {"forward": harness.kernel_times(forward),
                                                           "step": harness.kernel_times(step)}
            except Exception as exc:
                rec["results"][label] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        doc["cases"].append(rec)
        print(json.dumps(rec), flush=True)
        harness.save(doc, out_dir, "linear-backward.json")


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated: " + ", ".join(CASES))
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--no-peers", action="store_true")
    known, rest = parser.parse_known_args(argv)
    global PROFILE, PEERS
    PROFILE, PEERS = known.profile, not known.no_peers
    harness.pick(parser, CASES, known.cases, "cases")
    return harness.main(__doc__, build, run, "linear_backward", rest)


if __name__ == "__main__":
    sys.exit(main())
