"""Autotuning on the GPU: each case's forward at the presets' default launch configuration and
after `autotune=True` searched its candidates (`ae_mlir.autotune`), in the same process.

    python bench/autotune.py build --out bench/bundles/autotune     # here: every candidate compiled
    python bench/autotune.py run --bundles bench/bundles/autotune --out DIR   # GPU, no MLIR

`build` fills a kernel cache (AE_MLIR_CACHE_DIR) with each case's default bundle and its tuning
candidates, and records them unchosen (`backends.triton.prepare_tuning`), so the GPU machine,
which has no MLIR bindings, tunes from them. `run` times `attn(q, k, v)` (median of
`triton.testing.do_bench`, fresh random inputs per case): the first call with `autotune=True`
searches (each candidate timed the same way, written to the record), then the default and the
tuned configuration are timed alternately, ROUNDS times each; the medians and each round's ratio
are recorded, TFLOP/s as in bench/run_suite.py. The tuned output is compared with the default's
(same inputs; only the tiling differs).
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
# Default and tuned are timed alternately this many times each: on an H200 one bundle's do_bench
# time drifted 22-41% within a run (bench/results/h200-autotune-2026-12-02.json), and
# alternating puts both sides of each ratio under the same drift.
ROUNDS = 3
SOFTMAX = [("full", 128), ("causal", 128), ("full", 64), ("causal", 64), ("softcap", 128), ("alibi", 128),
           ("sliding_window", 128), ("document", 128), ("relative_bias", 128), ("t5_bias", 128)]
LINEAR = [("retention", 128), ("simple_gla", 128)]


def _cases() -> list:
    return ([suite.Case("catalogue", variant, BATCH, HEADS, SEQ, dim, "bfloat16") for variant, dim in SOFTMAX]
            + [suite.Case("linear", variant, BATCH, HEADS, SEQ, dim, "bfloat16") for variant, dim in LINEAR])


def _problem(case, device):
    """(the case's ae-mlir callable, its inputs, its FLOPs)."""
    if case.part == "linear":
        q, k, v, g = suite.linear_inputs(case, device)["ae"]
        return suite.linear_attention(case), (q, k, v, g), suite.linear_flops(case)
    attn, shape = suite.softmax_problem(case, device)
    inputs = suite.softmax_inputs(shape, case.dtype, device)
    kept = suite.kept_fraction(attn.mask_mod, shape.seq_q, shape.seq_k, device,
                               batch=suite.mask_batch(case.variant, shape))
    return attn, inputs, suite.softmax_flops(shape, kept)


def build(out: str) -> None:
    os.environ["AE_MLIR_CACHE_DIR"] = os.path.abspath(out)
    from ae_mlir import runtime
    from ae_mlir.backends import triton as tb
    from ae_mlir.backends import triton_tuning as tuning

    runtime.CACHE.clear_memory()
    for case in _cases():
        if case.part == "linear":
            fn, inputs = suite.linear_attention(case), suite.linear_meta(case)
        else:
            fn, shape = suite.softmax_problem(case, "cpu")
            inputs = suite.meta_like(shape, case.dtype)
        text = fn.mlir(*inputs)
        tb.get_bundle(text, "cuda:90")
        record = tuning.prepare_tuning(text, "cuda:90")
        print("built", case.name, len(record["candidates"]), "candidates", flush=True)


def run(bundles: str, out_dir: str) -> None:
    os.environ["AE_MLIR_CACHE_DIR"] = os.path.abspath(bundles)
    import torch

    from ae_mlir import autotune, runtime
    from ae_mlir.backends import triton_tuning as tuning

    runtime.CACHE.clear_memory()
    device = torch.device("cuda")
    doc = harness.results_doc(out_dir, __doc__, shape={"B": BATCH, "H": HEADS, "L": SEQ}, dtype="bfloat16")
    for case in _cases():
        fn, inputs, flops = _problem(case, device)
        rec = {"case": case.name}
        try:
            default_out = fn(*inputs)
            fn.autotune = True
            tuned_out = fn(*inputs)  # the search
            rec["max_abs_diff_vs_default"] = float((tuned_out.float() - default_out.float()).abs().max())

            def time(label):
                fn.autotune = label == "tuned"
                return harness.bench_ms(lambda: fn(*inputs))

            harness.alternated(rec, time, flops, ROUNDS)
            rec["search"] = autotune.load(tuning.tuning_key(fn.mlir(*inputs), runtime.current_target()))
        except Exception as exc:
            rec["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        harness.record_tuning(doc, rec, out_dir, "autotune.json")


def main(argv=None) -> int:
    return harness.main(__doc__, build, run, "autotune", argv)


if __name__ == "__main__":
    sys.exit(main())
