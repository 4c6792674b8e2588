"""Time each kernel of the linear-attention bundles under several launch configurations.

    python bench/linear_configs.py [--bundles bench/bundles] [--out DIR] [--configs w4s3,...] [--name NAME] [--graphs]

On the GPU machine (torch + triton, no MLIR). For every linear case of bench/suite.py whose bundle
is in --bundles, each kernel (the stages in launch order, then the output kernel) runs alone on the
case's inputs under every (num_warps, num_stages) of CONFIGS (or --configs); the Triton IR does not
change, only how Triton compiles it. Pointing --bundles at bundles built with other block sizes
compares those. Writes NAME.json (default linear-configs): per case and kernel, the median ms of each
configuration (triton.testing.do_bench, or with --graphs the replays of a CUDA graph, for kernels
shorter than their launch from Python), from which ae_mlir.launch_defaults' linear defaults are
chosen. The compiles run first, in parallel worker processes (Triton's disk cache keeps them).
"""
from __future__ import annotations

import argparse
import concurrent.futures as futures
import datetime
import json
import multiprocessing
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import suite  # noqa: E402

CONFIGS = [(w, s) for w in (4, 8) for s in (1, 2, 3)]


def _compile(path: str, index: int, warps: int, stages: int, target: str) -> str:
    from ae_mlir import runtime

    bundle = runtime.Bundle.load(path)
    kernel = (bundle.stages + [bundle])[index]
    try:
        runtime.compile_variant(kernel.variants["aligned"], target, warps, stages)
    except Exception as err:  # recorded again, per config, by the timing pass
        return f"{type(err).__name__}: {err}"
    return ""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bundles", default=os.path.join(HERE, "bundles"))
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    p.add_argument("--workers", type=int, default=min(14, os.cpu_count() or 1))
    p.add_argument("--configs", default=",".join(f"w{w}s{s}" for w, s in CONFIGS),
                   help="comma-separated w<num_warps>s<num_stages>")
    p.add_argument("--name", default="linear-configs")
    p.add_argument("--graphs", action="store_true",
                   help="time replays of a CUDA graph (triton.testing.do_bench_cudagraph): a kernel of a few "
                        "microseconds launched alone from Python is timed at the launches' rate otherwise")
    args = p.parse_args(argv)
    configs = [tuple(int(x) for x in c[1:].split("s")) for c in args.configs.split(",")]

    import torch
    import triton
    from triton.testing import do_bench, do_bench_cudagraph

    from ae_mlir import runtime

    target = runtime.current_target()
    cases = [c for c in suite.cases(["linear"]) if os.path.exists(os.path.join(args.bundles, c.bundle_file))]
    jobs = []
    for case in cases:
        path = os.path.join(args.bundles, case.bundle_file)
        n = len(runtime.Bundle.load(path).stages) + 1
        jobs += [(path, i, w, s, target) for i in range(n) for w, s in configs]
    with futures.ProcessPoolExecutor(args.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        list(pool.map(_compile, *zip(*jobs)))

    records = []
    for case in cases:
        bundle = runtime.Bundle.load(os.path.join(args.bundles, case.bundle_file))
        q, k, v, g = suite.linear_inputs(case, "cuda")["ae"]
        g = suite.ae_decay(g)  # copied once here; run_suite times that copy
        tensors = runtime.bind(bundle, q, k, v, g)
        aligned = runtime.aligned_ok(bundle, tensors)
        rec = {"case": case.name, "variant": "aligned" if aligned else "generic",
               "config": bundle.meta.get("config"),
               "kernels": []}
        for kernel in bundle.stages + [bundle]:
            variant = kernel.variants["aligned" if aligned else "generic"]
            call = runtime.argument_values(variant, tensors, runtime.device_tables(bundle, q.device))
            times = {}
            for warps, stages in configs:
                key = f"w{warps}s{stages}"
                try:
                    compiled = runtime.compile_variant(variant, target, warps, stages)
                    run = lambda: compiled[tuple(kernel.grid)](*call)  # noqa: E731
                    run()
                    torch.cuda.synchronize()
                    ms = (do_bench_cudagraph(run, rep=100, return_mode="median") if args.graphs
                          else do_bench(run, warmup=25, rep=100, return_mode="median"))
                    times[key] = {"ms": float(ms),
                                  "registers": getattr(compiled, "n_regs", None),
                                  "spills": getattr(compiled, "n_spills", None),
                                  "shared_bytes": compiled.metadata.shared}
                except Exception as err:
                    times[key] = {"error": f"{type(err).__name__}: {str(err).splitlines()[0]}"}
            best = min((t["ms"], key) for key, t in times.items() if "ms" in t) if any(
                "ms" in t for t in times.values()) else (None, None)
            rec["kernels"].append({"name": kernel.name, "grid": kernel.grid, "configs": times, "best": best[1],
                                   "best_ms": best[0]})
            print(case.name, kernel.name, best, flush=True)
        records.append(rec)
        del q, k, v, g, tensors
        torch.cuda.empty_cache()

    doc = {"date": datetime.date.today().isoformat(), "gpu": torch.cuda.get_device_name(),
           "torch": torch.__version__, "triton": triton.__version__,
           "benchmark": ("triton.testing.do_bench_cudagraph median, rep 100 ms" if args.graphs else
                         "triton.testing.do_bench median, warmup 25 ms, rep 100 ms") + "; one kernel alone",
           "cases": records}
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"{args.name}.json")
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    print("wrote", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
