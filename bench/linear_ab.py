"""Two builds of the linear-attention bundles, one GPU run: the suite's linear cases built twice
(two checkouts, or one with preset overrides) and timed alternately in one process on the GPU,
with flash-linear-attention's chunk kernel for the same decay between them.

    python bench/linear_ab.py build --out bench/bundles/lab/new                       # this checkout
    python bench/linear_ab.py build --out bench/bundles/lab/old --config decays_num_warps=4
    python3 bench/linear_ab.py run --a bench/bundles/lab/old --b bench/bundles/lab/new --out DIR   # GPU

`--variants` picks among retention, simple_gla and gla (default: retention, simple_gla), each at
the suite's shapes (bf16, B*L = 16384, H = 16, D 64 and 128, L 2048 and 8192; fla's [B, T, H, D]
storage, ae-mlir reading [B, H, T, D] views of it, a per-token g copied as ae.linear_attention
copies it). `run` times a, b and fla in five alternating rounds (median of
`triton.testing.do_bench` each) and reports the medians and the ratios: a / b (above 1: b
faster) and fla / b (above 1: b faster than fla). Each output's largest error against fla's is
recorded beside it.
"""
from __future__ import annotations

import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import harness  # noqa: E402
import suite  # noqa: E402

VARIANTS = ["retention", "simple_gla"]
ROUNDS = 5


def _cases(variants: list) -> list:
    return [c for c in suite.cases(["linear"]) if c.variant in variants]


def build(out: str, variants: list, config: dict | None) -> None:
    from build_suite import build_one

    os.makedirs(out, exist_ok=True)
    for case in _cases(variants):
        build_one(case, "cuda:90", config).save(os.path.join(out, case.bundle_file))
        print("built", case.name, flush=True)


def run(a: str, b: str, out_dir: str, variants: list) -> None:
    import torch

    from ae_mlir import runtime

    doc = harness.results_doc(out_dir, __doc__, a=a, b=b)
    for case in _cases(variants):
        data = suite.linear_inputs(case, "cuda")
        q, k, v, g = data["ae"]
        fla = suite.fla_op(case.variant)
        engines = {"fla": lambda: fla(*data["fla"])}
        for label, path in (("a", a), ("b", b)):
            bundle = runtime.Bundle.load(os.path.join(path, case.bundle_file))
            out = torch.empty(bundle.outputs[0].shape, dtype=runtime.torch_dtype(bundle.outputs[0].dtype),
                              device="cuda")
            engines[label] = lambda bundle=bundle, out=out: runtime.launch(bundle, q, k, v, suite.ae_decay(g),
                                                                         out=out, lse=None)[0]
        theirs = engines["fla"]().transpose(1, 2).float()
        rec = {"case": case.name, "flops": suite.linear_flops(case), "results": {}}
        for label in ("a", "b"):
            rec["results"][label] = {"max_abs_diff_vs_fla": float((engines[label]().float() - theirs).abs().max())}
        rec["results"]["fla"] = {}
        times = {label: [] for label in engines}
        for _ in range(ROUNDS):
            for label, fn in engines.items():
                times[label].append(harness.bench_ms(fn))
        for label, ms in times.items():
            median = statistics.median(ms)
            rec["results"][label].update(ms=median, tflops=rec["flops"] / (median * 1e-3) / 1e12, rounds=ms)
        ms = {label: r["ms"] for label, r in rec["results"].items()}
        rec["a_over_b"], rec["fla_over_b"] = ms["a"] / ms["b"], ms["fla"] / ms["b"]
        doc["cases"].append(rec)
        print(case.name, {label: round(m, 4) for label, m in ms.items()},
              f"a/b {rec['a_over_b']:.3f} fla/b {rec['fla_over_b']:.3f}", flush=True)
        harness.save(doc, out_dir, "linear-ab.json")


def main(argv=None) -> int:
    return harness.ab_main(__doc__, build, run, VARIANTS, list(suite.LINEAR_DECAYS), argv)


if __name__ == "__main__":
    sys.exit(main())
