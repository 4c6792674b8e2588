"""Run the benchmark suite on one GPU: ae-mlir's prebuilt bundles against torch SDPA, FlexAttention
and fla, then plot.

    python bench/run_suite.py --bundles bench/bundles --out DIR [--parts catalogue,verify,linear]
                              [--budget 420] [--filter TEXT] [--workers N] [--no-warm]
    python bench/run_suite.py --dry-run [--out DIR]      # here, without a GPU (see dry_run)

The GPU side needs torch and triton, and fla-core for the linear part; of ae-mlir it imports the
runtime, the variant catalogue, block_mask and the frontend's tracer, never MLIR. Parts (one JSON
each in DIR, rewritten after every case so that a run cut short keeps what it measured):

  catalogue  every ae_mlir.variants entry, bf16, B*L=16k, H=16, D=128 (full and causal at D=64
             too), L 2048/8192, against a float32 materialized reference over sampled query rows;
             timed beside FlexAttention (softmax entries) and SDPA (where it computes the same
             attention)
  verify     full and causal softmax, bf16 and fp16, B=2 H=4, L 128/1000/4096, D 64/128, against
             float32 SDPA; timed beside SDPA flash, SDPA cuDNN and FlexAttention
  linear     ae.linear_attention (RetNet, simple GLA, GLA decays) beside fla's chunk_retention,
             chunk_simple_gla and chunk_gla, against a float32 chunked reference on 4 heads

Timeline: a warm-up compiles everything in parallel worker processes (bench/warm.py); then each
part runs in a child process of its own; then the plot (DIR/suite.png) and DIR/run.json (versions,
warm-up and per-part outcome). A time budget (--budget seconds from start) gives each part the
time until the deadline less what the later parts plan to need; within a part, compiles run in
case order while the time left covers every remaining case's own measurements, and those cut are
recorded as skipped (verify's FlexAttention compiles are not planned for, so they go first).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

# Only light modules at the top: the warm-up workers are spawned and re-import this file first.
import suite  # noqa: E402
import suite_cases  # noqa: E402
from suite_engines import BENCH, DryRun, Gpu  # noqa: E402
import suite_checks  # noqa: E402
import warm  # noqa: E402

T0 = time.monotonic()  # a child process takes its parent's (CLOCK_MONOTONIC is system-wide)
FLA_TUNE = {"warmup": 5, "rep": 20}  # fla's autotuning benchmark (all configs; Triton's default is 25/100)
# Seconds a case needs besides compiles (inputs, reference, kernel loads, timings), by part; and
# the compiles that the parts after a part are planned to need (verify's FlexAttention compiles
# are optional: nothing is kept back for them).
BASE_COST = {"verify": 1.0, "catalogue": 2.0, "linear": 1.5}
COMPILE_COST = {"flex": 4.0, "fla": 4.0}
RESERVED_COMPILE = {"catalogue": "flex", "linear": "fla"}
MARGIN = 10.0
# How long a part may overrun its end (a case that started in time finishing) before it is killed.
GRACE = 45.0


def log(message: str) -> None:
    print(f"[{time.monotonic() - T0:6.1f}s] {message}", flush=True)


def planned_seconds(cases: list) -> float:
    """What the cases need: their own work and the compiles reserved for them."""
    total = 0.0
    for case in cases:
        total += BASE_COST[case.part]
        if case.part in RESERVED_COMPILE:
            total += COMPILE_COST[RESERVED_COMPILE[case.part]]
    return total


class Budget:
    """A part's deadline: each compile (FlexAttention, fla's autotuning) runs only if, after it,
    the time left still covers the remaining cases' own work; so compiles go in case order until
    time runs short, and no case loses its ae-mlir measurement to one. The time the later parts
    need is kept back by the parent, which sets `end`."""

    def __init__(self, end: float, todo: list):
        self.end = end
        self.pending = list(todo)
        self.estimate = dict(COMPILE_COST)

    def left(self) -> float:
        return self.end - time.monotonic()

    def start(self, case) -> None:
        self.pending.remove(case)

    def can_run(self, case) -> bool:
        return self.left() > BASE_COST[case.part]

    def allow(self, kind: str) -> bool:
        return self.left() - self.estimate[kind] > sum(BASE_COST[c.part] for c in self.pending) + MARGIN

    def observe(self, kind: str, seconds: float) -> None:
        self.estimate[kind] = 0.5 * self.estimate[kind] + 0.5 * seconds


# --- engines: the GPU, and a stand-in that checks everything but the launches -----------------------


def write_json(path: str, doc: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(suite_cases.finite(doc), f, indent=1)
    os.replace(tmp, path)


def load_bundles(directory: str, todo: list) -> dict:
    """Each case's bundle, or the reason there is none (the case then records it as its error)."""
    from ae_mlir import runtime

    found = {}
    for case in todo:
        path = os.path.join(directory, case.bundle_file)
        if not os.path.exists(path):
            found[case] = f"no bundle {case.bundle_file}: run bench/build_suite.py"
            continue
        try:
            bundle = runtime.Bundle.load(path)
        except runtime.BundleError as err:
            found[case] = f"bundle {case.bundle_file}: {err}"
            continue
        if bundle.meta.get("case") != case.as_dict():
            found[case] = f"bundle {case.bundle_file} was built for {bundle.meta.get('case')}"
            continue
        found[case] = bundle
    return found


def stale_bundles(bundles: dict) -> list:
    """Cases whose bundle was built by other compiler sources than this tree's: they still run, but
    measure that other code (build_suite.py rebuilds them)."""
    from ae_mlir import disk_cache

    current = disk_cache.compiler_fingerprint()
    return [c.name for c, b in bundles.items() if not isinstance(b, str) and b.meta.get("compiler") != current]


def expected_variant(case, bundle) -> str:
    """The kernel variant the launch will pick, from shapes and strides alone (meta tensors)."""
    import torch

    from ae_mlir import runtime

    if case.part == "linear":
        q, k, v = suite.linear_meta(case)[:3]
    else:
        q, k, v = suite.meta_like(suite.softmax_problem(case, "cpu")[1], case.dtype)
    # The variant depends on the streams' layouts only (q, k, v, outputs, workspace), so meta
    # tensors stand in for them and closure tensors and tile tables are left out.
    def meta(spec):
        return torch.empty(spec.shape, dtype=runtime.torch_dtype(spec.dtype), device="meta")

    tensors = {"q": q, "k": k, "v": v}
    tensors.update({spec.role: meta(spec) for spec in list(bundle.outputs) + list(bundle.workspace)})
    chosen = runtime.choose_variant(bundle, tensors)
    return "aligned" if chosen.aligned else "generic"


def warm_tasks(todo: list, bundles: dict, directory: str, target: str, workers: int) -> list:
    """fla's config shares first (the longest tasks), then FlexAttention compiles, then ae-mlir's."""
    tasks = []
    linear = [c.as_dict() for c in todo if c.part == "linear"]
    if linear:
        tasks += [(f"fla {i + 1}/{workers}", warm.compile_fla, (i, workers, linear)) for i in range(workers)]
    for case in todo:
        if case.part != "linear" and suite.softmax_problem(case, "cpu")[0].normalize == "softmax":
            tasks.append((f"flex {case.name}", warm.compile_flex, (case.as_dict(),)))
    for case in todo:
        bundle = bundles[case]
        if not isinstance(bundle, str):
            path = os.path.join(directory, case.bundle_file)
            tasks.append((f"ae {case.name}", warm.compile_ae, (path, expected_variant(case, bundle), target)))
    return tasks


def run_part(part: str, todo: list, bundles: dict, eng, budget: Budget, out_dir: str, header: dict) -> list:
    path = os.path.join(out_dir, f"{part}.json")
    records = []
    for i, case in enumerate(todo, 1):
        budget.start(case)
        bundle = bundles[case]
        if isinstance(bundle, str):
            rec = {"case": case.name, "error": bundle}
        elif not budget.can_run(case):
            rec = {"case": case.name, "skipped": "time budget"}
        else:
            try:
                rec = (suite_cases.linear_case if part == "linear" else suite_cases.softmax_case)(case, bundle, eng, budget)
            except Exception as err:
                rec = {"case": case.name, "error": suite_cases.error_text(err),
                       "traceback": traceback.format_exc(limit=-4).strip().splitlines()}
        records.append(rec)
        write_json(path, dict(header, part=part, cases=records))
        log(f"{part} {i}/{len(todo)} {suite_cases.summary_line(rec)}")
    return records


def environment(eng) -> dict:
    import platform

    import torch
    import triton

    env = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "python": platform.python_version(), "torch": torch.__version__, "triton": triton.__version__,
           "benchmark": f"triton.testing.do_bench median, warmup {BENCH['warmup']} ms, rep {BENCH['rep']} ms",
           "flops": "softmax: 4*B*H*Lq*Lk*D * exact kept fraction; linear: see suite.linear_flops",
           "speedup": "peer ms / ae-mlir ms (above 1: ae-mlir is faster)"}
    if eng.dry:
        env["gpu"] = "none (dry run)"
        return env
    from ae_mlir import runtime

    env.update(gpu=torch.cuda.get_device_name(), target=runtime.current_target(), cuda=torch.version.cuda,
               cudnn=torch.backends.cudnn.version())
    from importlib import metadata

    try:
        # The installed version, without importing fla: its import defines ~200 Triton kernels.
        env["fla"] = metadata.version("fla-core")
    except metadata.PackageNotFoundError:
        env["fla"] = "not installed"
    env["fla_autotune"] = (f"all of fla's configs; each timed with do_bench warmup {FLA_TUNE['warmup']} ms, "
                           f"rep {FLA_TUNE['rep']} ms")
    return env


def shorten_fla_tuning() -> None:
    """fla tunes every config with Triton's 25 + 100 ms benchmark: about a minute per op and head
    dim here. 5 + 20 ms still takes tens of runs of kernels this size and picks the same configs."""
    import functools

    from triton.testing import do_bench

    for variant in suite.LINEAR_DECAYS:
        suite.fla_op(variant)
    for tuner in warm.fla_autotuners():
        tuner.__dict__["do_bench"] = functools.partial(do_bench, warmup=FLA_TUNE["warmup"], rep=FLA_TUNE["rep"])


def select(parts: list, text: str) -> list:
    return [c for c in suite.cases(parts) if text in c.name]


def plot(out_dir: str) -> None:
    try:
        import plot_results

        log(f"plot: {plot_results.plot(out_dir)}")
    except ImportError as err:
        log(f"no plot ({err})")
    except Exception as err:
        log(f"plot failed: {suite_cases.error_text(err)}")


def run_children(args, parts: list, todo: list, deadline: float) -> dict:
    """Each part in its own process: a CUDA fault or a hang in one part cannot take the others
    down. A part gets the time up to `deadline` less what the parts after it plan to need, and is
    killed GRACE seconds after that (its JSON keeps the cases it finished)."""
    import subprocess

    outcome = {}
    for i, part in enumerate(parts):
        later = [c for c in todo if c.part in parts[i + 1:]]
        end = deadline - planned_seconds(later)
        command = [sys.executable, os.path.abspath(__file__), "--child", "--parts", part, "--filter", args.filter,
                   "--bundles", args.bundles, "--out", args.out, "--clock", repr(T0), "--end", repr(end)]
        if args.dry_run:
            command.append("--dry-run")
        start = time.monotonic()
        log(f"{part}: {sum(c.part == part for c in todo)} cases, until {end - T0:.0f}s")
        # FlexAttention's compiles come from the warm-up's cache: no pool of Inductor compile
        # processes to start in each part.
        env = dict(os.environ, TORCHINDUCTOR_COMPILE_THREADS="1")
        try:
            limit = min(deadline, end + GRACE) - time.monotonic()
            code = subprocess.run(command, env=env, timeout=max(20.0, limit)).returncode
        except subprocess.TimeoutExpired:
            code = f"killed {GRACE:.0f}s after its end"
        outcome[part] = {"exit": code, "seconds": round(time.monotonic() - start, 1)}
        if code != 0:
            log(f"{part}: exit {code}")
    return outcome


def run_child(args) -> int:
    """One part, in this process, on the GPU or (--dry-run) the CPU stand-in."""
    global T0
    T0 = args.clock
    if args.dry_run:
        sys.modules["mlir"] = None  # as on the GPU machine: any import of MLIR fails
    import torch

    part = args.parts
    todo = select([part], args.filter)
    eng = DryRun() if args.dry_run else Gpu()
    header = dict(environment(eng), part_end_s=round(args.end - T0, 1))
    bundles = load_bundles(args.bundles, todo)
    if part == "linear" and not args.dry_run:
        try:
            shorten_fla_tuning()
        except ImportError as err:
            log(f"fla is not importable ({err}); its cases will record the error")
    # The float32 references must be float32, not TF32.
    torch.backends.cuda.matmul.allow_tf32 = False
    with torch.no_grad():
        run_part(part, todo, bundles, eng, Budget(args.end, todo), args.out, header)
    loaded = [m for m in sys.modules if (m == "mlir" or m.startswith("mlir.")) and sys.modules[m] is not None]
    if loaded:
        print(f"the {part} part imported MLIR modules: {loaded}", flush=True)
        return 3
    return 0


def run(args) -> int:
    import torch

    if not torch.cuda.is_available():
        print("run_suite.py needs a GPU (or --dry-run)", file=sys.stderr)
        return 1
    from ae_mlir import runtime

    parts = args.parts.split(",")
    todo = select(parts, args.filter)
    os.makedirs(args.out, exist_ok=True)
    doc = dict(environment(Gpu()), budget_s=args.budget, parts=parts)
    log(f"{doc['gpu']}, torch {doc['torch']}, triton {doc['triton']}, fla {doc.get('fla')}; "
        f"{len(todo)} cases, budget {args.budget:.0f}s")
    bundles = load_bundles(args.bundles, todo)
    doc["stale_bundles"] = stale_bundles(bundles)
    if doc["stale_bundles"]:
        log(f"warning: {len(doc['stale_bundles'])} bundles were built from other compiler sources")
    if not args.no_warm:
        tasks = warm_tasks(todo, bundles, args.bundles, runtime.current_target(), args.workers)
        log(f"warm-up: {len(tasks)} compile tasks on {args.workers} workers")
        doc["warm_up"] = warm.run_pool(tasks, args.workers, T0 + args.warm_share * args.budget, log)
    doc["parts_run"] = run_children(args, parts, todo, T0 + args.budget)
    plot(args.out)
    doc["seconds"] = round(time.monotonic() - T0, 1)
    write_json(os.path.join(args.out, "run.json"), doc)
    log(f"done; results in {args.out}")
    return 0


# --- the dry run -------------------------------------------------------------------------------------


def dry_run(args) -> int:
    """Everything the GPU run does that can be checked without a GPU, so that its one call does
    not go to a bug: (1) the GPU side loads no MLIR; (2) every bundle exists, loads and was built
    for its case; (3) every case runs, in the same child processes as on the GPU, through the
    same code at full size on the CPU, with its inputs, closure tensors, call-time tile tables,
    FLOP count, float32 reference (checked finite) and JSON records, each launch bound as
    runtime.launch binds it (argument count, shapes, dtypes, kernel variant) but not run, and the
    peers stubbed; (4) the plot; (5) the warm-up pool compiles a bundle's Triton IR in a spawned
    worker, and fla's autotuners are found and split into shares that cover every config; (6) the
    references agree with ae-mlir's CPU backend (float32, the kernels' arithmetic) and its float64
    reference executor, and for linear attention with the executor and fla's naive
    implementations."""
    problems = []
    heavy = sorted({"torch", "triton"} & set(sys.modules))
    if heavy:
        problems.append(f"run_suite.py imports {heavy} at top level: the spawned workers would too")
    sys.modules["mlir"] = None
    parts = args.parts.split(",")
    todo = select(parts, args.filter)
    args.out = args.out or tempfile.mkdtemp(prefix="ae-suite-dry-")
    os.makedirs(args.out, exist_ok=True)
    bundles = load_bundles(args.bundles, todo)
    problems += [b for b in bundles.values() if isinstance(b, str)]
    problems += [f"{name}: stale bundle (run bench/build_suite.py)" for name in stale_bundles(bundles)]
    generic = [c.name for c, b in bundles.items() if not isinstance(b, str) and expected_variant(c, b) == "generic"]
    log(f"{len(todo)} cases; the general (unaligned) kernel variant for {len(generic)}: {', '.join(generic)}")
    for part, result in run_children(args, parts, todo, time.monotonic() + 3600).items():
        if result["exit"] != 0:
            problems.append(f"{part}: the child process exited {result['exit']}")
        path = os.path.join(args.out, f"{part}.json")
        if os.path.exists(path):
            with open(path) as f:
                for rec in json.load(f)["cases"]:
                    problems += suite_checks.record_problems(rec)
    plot(args.out)
    if not os.path.exists(os.path.join(args.out, "suite.png")):
        problems.append("no plot was written")
    problems += suite_checks.check_warm(bundles, todo, args.bundles, expected_variant, log)
    loaded = [m for m in sys.modules if (m == "mlir" or m.startswith("mlir.")) and sys.modules[m] is not None]
    if loaded:
        problems.append(f"the GPU side imported MLIR modules: {loaded}")
    del sys.modules["mlir"]
    problems += suite_checks.check_references(log)
    log(f"dry run: {len(problems)} problem(s); records in {args.out}")
    for p in problems:
        print("  " + p)
    return 1 if problems else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bundles", default=os.path.join(HERE, "bundles"))
    p.add_argument("--out", default=None, help="results directory (default bench/results/<date>)")
    p.add_argument("--parts", default="catalogue,verify,linear",
                   help="in this order; the catalogue first, so that its compile costs are known before "
                        "verify's optional FlexAttention compiles")
    p.add_argument("--filter", default="", help="only cases whose name contains this")
    p.add_argument("--budget", type=float, default=420.0, help="seconds from start for the whole run")
    p.add_argument("--warm-share", type=float, default=0.4, help="at most this share of the budget for warm-up")
    p.add_argument("--workers", type=int, default=max(1, min(14, (os.cpu_count() or 4) - 2)))
    p.add_argument("--no-warm", action="store_true", help="compile on demand in the parts instead")
    p.add_argument("--dry-run", action="store_true", help="check everything but the GPU work, here")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--clock", type=float, default=None, help=argparse.SUPPRESS)
    p.add_argument("--end", type=float, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return run_child(args)
    if args.dry_run:
        return dry_run(args)
    args.out = args.out or os.path.join(HERE, "results", datetime.date.today().isoformat())
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
