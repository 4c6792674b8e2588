"""Autotuning of the backward kernels on the GPU: each case's two backward kernels (dQ, then
dK/dV) at the presets' default configuration and after `tuned_backward_bundle` searched their
candidates (`ae_mlir.autotune.backward_candidates`, the dQ kernel's, then the dK/dV kernel's over
that choice), in the same process; bf16, B=8 H=16 L=2048.

    python bench/autotune_backward.py build --out bench/bundles/autotune_backward   # here
    python bench/autotune_backward.py run --bundles bench/bundles/autotune_backward --out DIR   # GPU

`build` fills a kernel cache (AE_MLIR_CACHE_DIR) with each case's forward bundle, its default
backward bundle and every combination of the backward's candidates, recorded unchosen
(`backends.triton.prepare_backward_tuning`), with the derivative and the problem each module
poses, so the GPU machine, which has no MLIR bindings, tunes from them. `run` computes a forward's
output and logsumexp, then the search (each candidate timed by `triton.testing.do_bench` on the
case's tensors, written to the record), then times the default and the tuned bundles alternately
(`runtime.launch_roles`, median of do_bench), ROUNDS times each, without the closure tensors'
gradients (ALiBi's slopes, the document ids do not require grad); TFLOP/s count the backward as
2.5x the forward's FLOPs. The tuned gradients are compared with the default's (same inputs; only
the tiling differs). `--cases` narrows the cases (comma-separated names as listed in CASES).
"""
from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import harness  # noqa: E402
import suite  # noqa: E402

BATCH, HEADS, SEQ = 8, 16, 2048
ROUNDS = 3  # default and tuned alternately, as bench/autotune.py does, under the same drift
CASES = ["full_d128", "causal_d128", "full_d64", "causal_d64", "softcap_d128", "alibi_d128", "document_d128",
         "sliding_window_d128", "relative_bias_d128", "t5_bias_d128", "sigmoid_d128", "prefix_lm_d128",
         "gqa_d128", "retnet_d128", "mla_dims_d128", "causal_d256"]


def _case(name: str) -> suite.Case:
    variant, dim = name.rsplit("_d", 1)
    return suite.Case("catalogue", variant, BATCH, HEADS, SEQ, int(dim), "bfloat16")


def _call(attn, q, k, v, target: str) -> tuple:
    """(the module text, its closure tensors, whether the backward makes their gradients: never
    here, as in a step where they do not require grad, the call-time backward tiles) of attn on
    q, k, v."""
    from ae_mlir.backends import call_time_tiles as ctt

    text, captures = attn._prepare(q, k, v)
    grads = False
    roles = dict(zip(("q", "k", "v"), (q, k, v)), **{f"c{i}": t for i, t in enumerate(captures)})
    return text, captures, grads, ctt.backward_call_time_tiles(text, target, roles)


def build(out: str) -> None:
    os.environ["AE_MLIR_CACHE_DIR"] = os.path.abspath(out)
    import torch

    from ae_mlir import runtime
    from ae_mlir.backends import triton as tb
    from ae_mlir.backends import triton_tuning as tuning

    runtime.CACHE.clear_memory()
    for name in CASES:
        attn, shape = suite.softmax_problem(_case(name), "cpu")
        q, k, v = (torch.zeros(t.shape, dtype=torch.bfloat16) for t in suite.meta_like(shape, "bfloat16"))
        text, captures, grads, tiles = _call(attn, q, k, v, "cuda:90")
        tb._default_bundle(text, "cuda:90", [q, k, v, *captures])
        record = tuning.prepare_backward_tuning(text, "cuda:90", grads, tiles)
        print("built", name, len(record["candidates"]), "candidates", flush=True)


def run(bundles: str, out_dir: str) -> None:
    os.environ["AE_MLIR_CACHE_DIR"] = os.path.abspath(bundles)
    import torch

    from ae_mlir import autotune, runtime
    from ae_mlir.backends import triton as tb
    from ae_mlir.backends import triton_tuning as tuning

    runtime.CACHE.clear_memory()
    device = torch.device("cuda")
    target = runtime.current_target(device)
    doc = harness.results_doc(out_dir, __doc__, shape={"B": BATCH, "H": HEADS, "L": SEQ}, dtype="bfloat16")
    for name in CASES:
        rec = {"case": name}
        try:
            attn, shape = suite.softmax_problem(_case(name), device)
            q, k, v = suite.softmax_inputs(shape, "bfloat16", device)
            kept = suite.kept_fraction(attn.mask_mod, shape.seq_q, shape.seq_k, device,
                                       batch=suite.mask_batch(name.rsplit("_d", 1)[0], shape))
            flops = 2.5 * suite.softmax_flops(shape, kept)
            text, captures, grads, tiles = _call(attn, q, k, v, target)
            # Softmax's kernels read the forward's output and logsumexp; the other normalizers'
            # recompute what they need.
            tensors = {"q": q, "k": k, "v": v, **{f"c{i}": t for i, t in enumerate(captures)}}
            if attn.normalize == "softmax":
                out, lse = attn(q, k, v, return_lse=True)
                tensors.update(out=out, lse=lse, dlse=torch.zeros_like(lse))
            else:
                out = attn(q, k, v)
            tensors["do"] = torch.randn_like(out)
            bundles = {"default": tb.get_backward_bundle(text, target, closure_grads=grads, tiles=tiles),
                       "tuned": tuning.tuned_backward_bundle(text, target, tensors, grads, tiles)}
            got = {label: runtime.launch_roles(bundle, tensors) for label, bundle in bundles.items()}
            rec["max_abs_diff_vs_default"] = max(float((got["tuned"][r].float() - got["default"][r].float()).abs().max())
                                                 for r in ("dq", "dk", "dv"))

            def time(label):
                return harness.bench_ms(lambda: runtime.launch_roles(bundles[label], tensors))

            harness.alternated(rec, time, flops, ROUNDS)
            rec["search"] = autotune.load(tuning._backward_tuning_keys(text, target, grads, tiles, "ieee")[0])
        except Exception as exc:
            rec["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        harness.record_tuning(doc, rec, out_dir, "autotune-backward.json")


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--cases", default=",".join(CASES))
    known, rest = parser.parse_known_args(argv)
    harness.pick(parser, CASES, known.cases, "cases")
    return harness.main(__doc__, build, run, "autotune_backward", rest)


if __name__ == "__main__":
    sys.exit(main())
