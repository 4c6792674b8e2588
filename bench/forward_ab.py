"""Two builds of the compiler, one GPU run: the forward bundles of catalogue entries built by each
(here, each with its own checkout) and timed alternately in one process on the GPU, with each
output's error against the float32 materialized reference.

    python bench/forward_ab.py build --out bench/bundles/ab/new                     # this checkout
    PYTHONPATH=OLD python OLD/bench/forward_ab.py build --out bench/bundles/ab/old   # another one
    python bench/forward_ab.py build --out bench/bundles/ab/off --config raw_row_max=false   # or options
    python3 bench/forward_ab.py run --a bench/bundles/ab/old --b bench/bundles/ab/new --out DIR   # GPU

(OLD: a `git worktree` of the other commit, with `ae_mlir/passes` and `ae_mlir/dialects` linked
to its own `passes` and `dialects`, so that it compiles with its own passes.) `--variants`
picks softmax catalogue entries (default: alibi, softcap, relative_bias, t5_bias; any of
ae_mlir.variants.CATALOGUE), each at L 2048 and
8192, bf16, B*L = 16384, H = 16, D = 128 (`--dim`, given to both `build` and `run`). `run` times both bundles of a case in five alternating
rounds (median of `triton.testing.do_bench` each) and reports the medians, TFLOP/s and the
ratio a / b of their times (above 1: b faster).
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

VARIANTS = ["alibi", "softcap", "relative_bias", "t5_bias"]
LENGTHS = (2048, 8192)
ROUNDS = 5
DIM = 128


def _case(variant: str, length: int, dim: int) -> suite.Case:
    return suite.Case(part="catalogue", variant=variant, dtype="bfloat16", batch=suite.TOKENS // length,
                      heads=suite.HEADS, seq=length, dim=dim)


def build(out: str, variants: list, config: dict | None = None, dim: int = DIM) -> None:
    from ae_mlir.backends import triton as tb

    os.makedirs(out, exist_ok=True)
    for variant in variants:
        for length in LENGTHS:
            attn, shape = suite.softmax_problem(_case(variant, length, dim), "cpu")
            q, k, v = suite.meta_like(shape, "bfloat16")
            tb.compile_bundle(attn, q, k, v, target="cuda:90", config=config).save(
                os.path.join(out, f"{variant}_{length}.json"))
            print("built", variant, length, flush=True)


def run(a: str, b: str, out_dir: str, variants: list, dim: int = DIM) -> None:
    import triton

    from ae_mlir import runtime

    doc = harness.results_doc(out_dir, __doc__, a=a, b=b, dtype="bfloat16", dim=dim)
    for variant in variants:
        for length in LENGTHS:
            attn, shape = suite.softmax_problem(_case(variant, length, dim), "cuda")
            q, k, v = suite.softmax_inputs(shape, "bfloat16", "cuda")
            captures = attn._build(q, k, v)[1]
            bundles = {label: runtime.Bundle.load(os.path.join(path, f"{variant}_{length}.json"))
                       for label, path in (("a", a), ("b", b))}
            rows = suite.sample_rows(length)
            want = suite.attention_reference(attn, q, k, v, rows)
            rec = {"variant": variant, "seq": length, "results": {}}
            kept = suite.kept_fraction(attn.mask_mod, length, length, "cuda", batch=suite.mask_batch(variant, shape))
            flops = suite.softmax_flops(shape, kept)
            times = {label: [] for label in bundles}
            for label, bundle in bundles.items():
                out = runtime.launch(bundle, q, k, v, *captures)[0]
                rec["results"][label] = {"max_abs_err": float((out[:, :, rows.to(out.device)].float() - want).abs().max())}
            for _ in range(ROUNDS):
                for label, bundle in bundles.items():
                    times[label].append(triton.testing.do_bench(
                        lambda bundle=bundle: runtime.launch(bundle, q, k, v, *captures), warmup=25, rep=100,
                        return_mode="median"))
            for label, ms in times.items():
                median = statistics.median(ms)
                rec["results"][label].update(ms=median, tflops=flops / (median * 1e-3) / 1e12, rounds=ms)
            rec["a_over_b"] = rec["results"]["a"]["ms"] / rec["results"]["b"]["ms"]
            doc["cases"].append(rec)
            print(variant, length, {label: round(r["ms"], 4) for label, r in rec["results"].items()},
                  f"a/b {rec['a_over_b']:.3f}", flush=True)
            harness.save(doc, out_dir, "forward-ab.json")


def main(argv=None) -> int:
    from ae_mlir.variants import CATALOGUE

    return harness.ab_main(__doc__, build, run, VARIANTS, list(CATALOGUE), argv,
                           dim=(int, DIM, "head dim (Dk = Dv)"))


if __name__ == "__main__":
    sys.exit(main())
