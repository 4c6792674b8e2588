"""What the GPU benchmarks that build bundles here and run them on a GPU share: the two-mode
command line and the timing of one implementation; and the host CPU's description that the CPU
benchmarks record (`cpu_description`)."""
from __future__ import annotations

import argparse
import inspect
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))


def cpu_description() -> str:
    """The host CPU as /proc/cpuinfo names it, with its family and model (two hosts sold under one
    name, such as "AMD EPYC", can be different generations), and how many logical CPUs it shows;
    the architecture alone where /proc/cpuinfo is missing."""
    import platform

    fields: dict = {}
    count = 0
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                count += key == "processor"
                fields.setdefault(key, value.strip())
    except OSError:
        return platform.processor() or platform.machine()
    if "model name" not in fields:
        return platform.processor() or platform.machine()
    return (f"{fields['model name']} (family {fields.get('cpu family', '?')}, model {fields.get('model', '?')}) "
            f"x {count}")


def measure(fn, error_of) -> dict:
    """{"ms": median of triton.testing.do_bench, "max_abs_err": error_of(fn())}, or {"error": ...}
    when the implementation fails: a peer that cannot run a case is recorded, not fatal."""
    try:
        err = error_of(fn())
        return {"ms": bench_ms(fn), "max_abs_err": err}
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}


def bench_ms(fn) -> float:
    """Median milliseconds of triton.testing.do_bench (25 warm-up, 100 ms of repetitions)."""
    import triton

    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def graphed(fn):
    """fn replayed from a CUDA graph: the kernels' own time, without the host's launch path."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def host_profile(fn, calls: int = 200) -> dict:
    """The host's time a call of `fn` (issued back to back after a synchronization, microseconds)
    and `profile_calls` over `calls` calls."""
    import time

    import torch

    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    host_us = (time.perf_counter() - start) / calls * 1e6
    torch.cuda.synchronize()
    return {"host_us": host_us, "top": profile_calls(fn, calls)}


def profile_calls(call, steps: int = 100) -> list:
    """cProfile's top functions of `steps` calls: (function, calls a step, own us, cumulative us),
    the 30 of most own time and the 40 of most cumulative time (the profiler's own cost inflates
    them, their ratios hold)."""
    import cProfile
    import pstats

    import torch

    profile = cProfile.Profile()
    profile.enable()
    for _ in range(steps):
        call()
    torch.cuda.synchronize()
    profile.disable()
    stats = pstats.Stats(profile).stats
    rows = [(f"{os.path.basename(f)}:{line}({name})", n / steps, own / steps * 1e6, cum / steps * 1e6)
            for (f, line, name), (_, n, own, cum, _) in stats.items()]
    top = sorted(rows, key=lambda r: -r[2])[:30] + sorted(rows, key=lambda r: -r[3])[:40]
    seen, kept = set(), []
    for row in top:
        if row[0] not in seen:
            seen.add(row[0])
            kept.append([row[0], round(row[1], 2), round(row[2], 1), round(row[3], 1)])
    return kept


def kernel_times(fn, calls: int = 10) -> list:
    """Where `fn`'s GPU time goes: [kernel name, mean microseconds a call] for each kernel it
    launches, longest first, from torch.profiler over `calls` calls after one warm-up call."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    rows = [(e.key, e.device_time_total / calls) for e in prof.key_averages() if e.device_time_total > 0]
    return [[name[:80], round(us, 1)] for name, us in sorted(rows, key=lambda r: -r[1])]


def peer_backward(fn, leaves: list, wrt: list, d_out, flops: float) -> dict:
    """A peer's backward timed as its forward + backward (gradients of `wrt`) less its forward:
    the ms of each, and TFLOP/s of `flops` over the difference."""
    import torch

    fwd_only = bench_ms(lambda: fn(*leaves))
    both = bench_ms(lambda: torch.autograd.grad(fn(*leaves), wrt, d_out))
    ms = both - fwd_only
    return {"forward_ms": fwd_only, "forward_backward_ms": both, "backward_ms": ms,
            "tflops": flops / (ms * 1e-3) / 1e12}


def rounds_timed(engines: dict, rounds: int, flops: float) -> dict:
    """Each engine (label: callable) timed by bench_ms once a round, in turn, `rounds` rounds, so
    that drift falls on all alike: {"ms": medians, "tflops": at `flops`, "rounds_ms": every time}."""
    import statistics

    times = {label: [] for label in engines}
    for _ in range(rounds):
        for label, fn in engines.items():
            times[label].append(bench_ms(fn))
    ms = {label: statistics.median(t) for label, t in times.items()}
    return {"ms": ms, "tflops": {label: flops / m * 1e-9 for label, m in ms.items()}, "rounds_ms": times}


def alternated(rec: dict, time, flops: float, rounds: int) -> None:
    """Time the default and the tuned configuration alternately (`time(label)`: ms), `rounds`
    times each, so that drift falls on both alike; record their medians, TFLOP/s at `flops`, and
    the speedup (default / tuned), overall and per round."""
    import statistics

    times = {"default": [], "tuned": []}
    for _ in range(rounds):
        for label, taken in times.items():
            taken.append(time(label))
    rec["rounds_ms"] = times
    for label, taken in times.items():
        rec[f"{label}_ms"] = statistics.median(taken)
        rec[f"{label}_tflops"] = flops / (rec[f"{label}_ms"] * 1e-3) / 1e12
    rec["speedup"] = rec["default_ms"] / rec["tuned_ms"]
    rec["speedup_per_round"] = [d / t for d, t in zip(times["default"], times["tuned"])]


def record_tuning(doc: dict, rec: dict, out_dir: str, name: str) -> None:
    """Add an autotuning case's record to the results, print it (with its search's choice, not
    the search) and save the results."""
    doc["cases"].append(rec)
    print(json.dumps({k: v for k, v in rec.items() if k != "search"}), (rec.get("search") or {}).get("chosen"),
          flush=True)
    save(doc, out_dir, name)


def save(doc: dict, out_dir: str, name: str) -> None:
    """Rewrite the results file after every case, so a run cut short keeps what it measured."""
    with open(os.path.join(out_dir, name), "w") as f:
        json.dump(doc, f, indent=1)


def main(description: str, build, run, bundles: str, argv=None) -> int:
    """`build --out DIR` (here, with the MLIR bindings) or `run --bundles DIR --out DIR` (on the
    GPU, torch and triton only)."""
    parser = argparse.ArgumentParser(description=description.splitlines()[0])
    parser.add_argument("mode", choices=("build", "run"))
    parser.add_argument("--out", required=True)
    parser.add_argument("--bundles", default=os.path.join(HERE, "bundles", bundles))
    takes_baseline = "baseline" in inspect.signature(run).parameters
    if takes_baseline:
        parser.add_argument("--baseline", help="also time this directory's bundles (built by another version), "
                                               "alternating with --bundles' in the same process")
    takes_config = "config" in inspect.signature(build).parameters
    if takes_config:
        parser.add_argument("--config", default="", help="build: preset overrides for every bundle, key=value,...")
    args = parser.parse_args(argv)
    if args.mode == "build" and takes_config:
        from build_suite import parse_config

        build(args.out, parse_config(args.config) or None)
    elif args.mode == "build":
        build(args.out)
    else:
        run(args.bundles, args.out, **({"baseline": args.baseline} if takes_baseline else {}))
    return 0


def ab_main(description: str, build, run, variants: list, known: list, argv=None, **extra) -> int:
    """The command line of a two-build comparison: `build --out DIR [--config k=v,...]` (here) or
    `run --a DIR --b DIR --out DIR` (on the GPU), over `--variants` (some of `known`, default
    `variants`). `extra`: more options, name -> (type, default, help), passed to both as keywords."""
    parser = argparse.ArgumentParser(description=description.splitlines()[0])
    parser.add_argument("mode", choices=("build", "run"))
    parser.add_argument("--out", required=True)
    parser.add_argument("--a", help="run: the first build's bundles")
    parser.add_argument("--b", help="run: the second build's bundles")
    parser.add_argument("--variants", default=",".join(variants))
    parser.add_argument("--config", default="", help="build: preset overrides for every bundle, key=value,...")
    for name, (typ, default, text) in extra.items():
        parser.add_argument(f"--{name}", type=typ, default=default, help=text)
    args = parser.parse_args(argv)
    chosen = list(variants)
    pick(parser, chosen, args.variants, "variants", known=known)
    options = {name: getattr(args, name) for name in extra}
    if args.mode == "build":
        from build_suite import parse_config

        build(args.out, chosen, parse_config(args.config) or None, **options)
    elif not (args.a and args.b):
        parser.error("run needs --a and --b")
    else:
        run(args.a, args.b, args.out, chosen, **options)
    return 0


def pick(parser, names: list, given: str, what: str, known: list | None = None) -> None:
    """Narrow `names` in place to the comma-separated `given`, in its order; a name not in
    `known` (default: `names`) is the parser's error."""
    chosen = [c for c in given.split(",") if c]
    known = names if known is None else known
    unknown = sorted(set(chosen) - set(known))
    if unknown:
        parser.error(f"unknown {what} {unknown}; expected some of {known}")
    names[:] = chosen


def results_doc(out_dir: str, method: str, **fields) -> dict:
    """The results document of a run on this GPU (its name, the torch and triton versions, the
    date, how it was measured, and `fields`), with an empty "cases" list to fill; makes out_dir."""
    import datetime

    import torch
    import triton

    os.makedirs(out_dir, exist_ok=True)
    return {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "date": datetime.date.today().isoformat(), **fields, "method": method, "cases": []}
