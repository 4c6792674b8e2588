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

import argparse
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


def _case(variant: str, length: int) -> suite.Case:
    return suite.Case(part="catalogue", variant=variant, dtype="bfloat16", batch=suite.TOKENS // length,
                      heads=suite.HEADS, seq=length, dim=DIM)


def build(out: str, config: dict | None = None) -> None:
    from ae_mlir.backends import triton as tb

    os.makedirs(out, exist_ok=True)
    for variant in VARIANTS:
        for length in LENGTHS:
            attn, shape = suite.softmax_problem(_case(variant, length), "cpu")
            q, k, v = suite.meta_like(shape, "bfloat16")
            tb.compile_bundle(attn, q, k, v, target="cuda:90", config=config).save(
                os.path.join(out, f"{variant}_{length}.json"))
            print("built", variant, length, flush=True)


def run(a: str, b: str, out_dir: str) -> None:
    import triton

    from ae_mlir import runtime

    doc = harness.results_doc(out_dir, __doc__, a=a, b=b, dtype="bfloat16", dim=DIM)
    for variant in VARIANTS:
        for length in LENGTHS:
            attn, shape = suite.softmax_problem(_case(variant, length), "cuda")
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
    global DIM
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("build", "run"))
    parser.add_argument("--out", required=True)
    parser.add_argument("--a", help="run: the first build's bundles")
    parser.add_argument("--b", help="run: the second build's bundles")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--config", default="", help="build: preset overrides for every bundle, key=value,...")
    parser.add_argument("--dim", type=int, default=DIM, help="head dim (Dk = Dv)")
    args = parser.parse_args(argv)
    DIM = args.dim
    from ae_mlir.variants import CATALOGUE

    harness.pick(parser, VARIANTS, args.variants, "variants", known=list(CATALOGUE))
    if args.mode == "build":
        from build_suite import parse_config

        build(args.out, parse_config(args.config) or None)
    elif not (args.a and args.b):
        parser.error("run needs --a and --b")
    else:
        run(args.a, args.b, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
