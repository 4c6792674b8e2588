"""Run the benchmark suite on one GPU: ae-mlir's prebuilt bundles against torch SDPA, FlexAttention
and fla, then plot.

    python bench/run_suite.py --bundles bench/bundles --out DIR [--parts catalogue,verify,linear]
                              [--budget 420] [--filter TEXT] [--workers N] [--no-warm]
    python bench/run_suite.py --dry-run [--out DIR]      # here, without a GPU (see dry_run)

The GPU side needs torch and triton, and fla-core for the linear part; of ae-mlir it imports the
runtime, the variant catalogue, block_mask and the frontend's tracer, never MLIR. Parts (one JSON
each in DIR, rewritten after every case so that a run cut short keeps what it measured):

  catalogue  every ae_mlir.variants entry, bf16, B*L=16k, H=16, D=128, L 2048/8192, against a
             float32 materialized reference over sampled query rows; timed beside FlexAttention
             (softmax entries) and SDPA (where it computes the same attention)
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
import math
import os
import statistics
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
import warm  # noqa: E402

T0 = time.monotonic()  # a child process takes its parent's (CLOCK_MONOTONIC is system-wide)
BENCH = {"warmup": 25, "rep": 100}  # triton.testing.do_bench, milliseconds, median
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


class Gpu:
    dry = False

    def __init__(self):
        import torch

        self.torch = torch
        self.device = torch.device("cuda")

    def sync(self) -> None:
        self.torch.cuda.synchronize()

    def bench(self, fn) -> float:
        from triton.testing import do_bench

        return float(do_bench(fn, warmup=BENCH["warmup"], rep=BENCH["rep"], return_mode="median"))

    def wall_ms(self, fn, reps: int = 5) -> float:
        """Median wall time with the device drained before and after: for host-driven work (tile
        classification launches many small kernels), where GPU event time would miss the gaps."""
        times = []
        for _ in range(reps):
            self.sync()
            start = time.perf_counter()
            fn()
            self.sync()
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times)

    def outputs(self, bundle) -> dict:
        from ae_mlir import runtime

        made = [self.torch.empty(s.shape, dtype=runtime.torch_dtype(s.dtype), device=self.device)
                for s in bundle.outputs]
        return {"out": made[0], "lse": made[1] if len(made) > 1 else None}

    def launch(self, bundle, *args, out, lse):
        from ae_mlir import runtime

        return runtime.launch(bundle, *args, out=out, lse=lse)

    def kernel_info(self, bundle, args, outs) -> dict:
        from ae_mlir import runtime

        variant = runtime.choose_variant(bundle, runtime.bind(bundle, *args, **outs))
        info = {"block_m": bundle.block_m, "block_n": bundle.block_n, "num_warps": bundle.num_warps,
                "num_stages": bundle.num_stages, "grid": bundle.grid,
                "kernel_variant": "aligned" if variant.aligned else "generic"}
        if not self.dry:
            kernel = runtime.compile_ttir(variant.ttir, runtime.current_target(), bundle.num_warps, bundle.num_stages)
            info.update(registers=getattr(kernel, "n_regs", None), spills=getattr(kernel, "n_spills", None),
                        shared_bytes=kernel.metadata.shared)
        if bundle.stages:
            # The kernels launched before this one (a split linear recurrence's chunk states).
            info["stages"] = []
            for stage in bundle.stages:
                entry = {"name": stage.name, "grid": stage.grid, "num_warps": stage.num_warps,
                         "num_stages": stage.num_stages}
                if not self.dry:
                    kernel = runtime.compile_ttir(stage.variants[info["kernel_variant"]].ttir,
                                                  runtime.current_target(), stage.num_warps, stage.num_stages)
                    entry.update(registers=getattr(kernel, "n_regs", None), spills=getattr(kernel, "n_spills", None),
                                 shared_bytes=kernel.metadata.shared)
                info["stages"].append(entry)
        return info

    def rows(self, length: int):
        return suite.sample_rows(length)

    def ref_heads(self, heads: int) -> list[int]:
        return suite.reference_heads(heads)

    def sdpa_reference(self, q, k, v, causal: bool):
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(SDPBackend.MATH):
            return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)

    def sdpa(self, backend: str, causal: bool, gqa: bool):
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        chosen = getattr(SDPBackend, backend)

        def run(q, k, v):
            with sdpa_kernel(chosen):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)

        return run

    def flex(self, attn, shape, batch=None):
        return suite.flex_callable(attn, shape, self.device, batch)

    def block_mask_ms(self, attn, shape, batch=None) -> float | None:
        from torch.nn.attention.flex_attention import create_block_mask

        return self.wall_ms(lambda: create_block_mask(attn.mask_mod, batch, None, shape.seq_q, shape.seq_k,
                                                      device=self.device))

    def fla(self, variant: str):
        return suite.fla_op(variant)


class DryRun(Gpu):
    """Runs every case's code on the CPU at full size with the same inputs, captures, call-time
    tables, references and bookkeeping, but binds each ae-mlir launch (argument checks, kernel
    variant choice, argument list) instead of running it and stands zeros in for the peers."""

    dry = True

    def __init__(self):
        import torch

        self.torch = torch
        self.device = torch.device("cpu")

    def sync(self) -> None:
        pass

    def bench(self, fn) -> float:
        fn()
        return 1.0

    def launch(self, bundle, *args, out, lse):
        from ae_mlir import runtime

        tensors = runtime.bind(bundle, *args, out=out, lse=lse)
        variant = runtime.choose_variant(bundle, tensors)
        values = runtime.argument_values(variant, tensors, runtime.device_tables(bundle, self.device))
        if len(values) != len(variant.args):
            raise AssertionError(f"{len(values)} arguments for {len(variant.args)} kernel parameters")
        return [tensors[s.role].zero_() for s in bundle.outputs]

    def rows(self, length: int):
        return suite.sample_rows(length, edge=2, spread=4)

    def ref_heads(self, heads: int) -> list[int]:
        return [heads - 1]

    def sdpa_reference(self, q, k, v, causal: bool):
        return self.torch.zeros(*q.shape[:3], v.shape[-1])

    def sdpa(self, backend: str, causal: bool, gqa: bool):
        return lambda q, k, v: self.torch.zeros(*q.shape[:3], v.shape[-1], dtype=q.dtype)

    def flex(self, attn, shape, batch=None):
        # FlexAttention's BlockMask evaluates the mod under vmap: check it does, where it is cheap.
        if attn.mask_mod is not None and shape.seq_q <= 2048:
            from torch.nn.attention.flex_attention import create_block_mask

            create_block_mask(attn.mask_mod, batch, None, shape.seq_q, shape.seq_k, device="cpu")
        return lambda q, k, v: self.torch.zeros(*q.shape[:3], v.shape[-1], dtype=q.dtype)

    def block_mask_ms(self, attn, shape, batch=None) -> float | None:
        return super().block_mask_ms(attn, shape, batch) if shape.seq_q <= 2048 else None

    def fla(self, variant: str):
        return lambda q, k, v, g: self.torch.zeros(*q.shape[:3], v.shape[-1], dtype=q.dtype)


# --- one case -----------------------------------------------------------------------------------------


def _error_text(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0][:400] if lines else ''}"


def measure(eng, fn, flops: float, error) -> dict:
    """Run once (that call compiles or autotunes where the callable does), check, then time."""
    try:
        start = time.monotonic()
        out = fn()
        eng.sync()
        result = {"first_call_s": round(time.monotonic() - start, 3), "max_abs_err": error(out)}
        del out
        ms = eng.bench(fn)
        result.update(ms=ms, tflops=flops / (ms * 1e-3) / 1e12)
        return result
    except Exception as err:
        return {"error": _error_text(err)}


def kernel_info(eng, bundle, args, outs) -> dict:
    try:
        return eng.kernel_info(bundle, args, outs)
    except Exception as err:
        return {"kernel_info_error": _error_text(err)}


def _speedups(results: dict) -> dict:
    mine = results.get("ae_mlir", {})
    if not isinstance(mine, dict) or "ms" not in mine:
        return {}
    return {peer: r["ms"] / mine["ms"] for peer, r in results.items()
            if peer != "ae_mlir" and isinstance(r, dict) and "ms" in r}


def softmax_case(case, bundle, eng, budget: Budget) -> dict:
    import torch

    from ae_mlir import block_mask, runtime
    from ae_mlir.core.regions import ScalarProgram

    attn, shape = suite.softmax_problem(case, eng.device)
    q, k, v = suite.softmax_inputs(shape, case.dtype, eng.device)
    normalize = attn.normalize if isinstance(attn.normalize, str) else attn.normalize.name
    gqa = shape.kv_heads != shape.heads
    rec = {"case": case.name, "part": case.part, "variant": case.variant, "dtype": case.dtype, "B": shape.batch,
           "H": shape.heads, "Hkv": shape.kv_heads, "L": shape.seq_q, "Dk": shape.dim_qk, "Dv": shape.dim_v,
           "normalize": normalize}
    captures = attn._build(q, k, v)[1]
    tables = runtime.call_time_tables(bundle, q, k, v, *captures)
    outs = eng.outputs(bundle)
    # The runtime adds the call-time tables itself, as `ae.attention` calls it.
    args = (q, k, v, *captures)
    batch = suite.mask_batch(case.variant, shape)
    kept = suite.kept_fraction(attn.mask_mod, shape.seq_q, shape.seq_k, eng.device, batch=batch)
    flops = suite.softmax_flops(shape, kept)
    rec.update(kept_fraction=kept, flops=flops, closure_tensors=len(captures), call_time_tables=bool(tables))
    if case.part == "verify":
        rows = None
        ref = eng.sdpa_reference(q, k, v, causal=case.variant == "causal")
        rec["reference"] = "float32 SDPA (math backend), all rows"
    else:
        rows = eng.rows(shape.seq_q)
        ref = suite.attention_reference(attn, q, k, v, rows)
        rec["reference"] = f"float32 materialized attention, {len(rows)} query rows"
    rec["reference_max_abs"] = float(ref.abs().max())
    rec["reference_finite"] = bool(torch.isfinite(ref).all())

    def error(o):
        picked = o if rows is None else o[:, :, rows.to(o.device)]
        return float((picked.float() - ref).abs().max())

    results = {"ae_mlir": measure(eng, lambda: eng.launch(bundle, *args, **outs)[0], flops, error)}
    rec.update(kernel_info(eng, bundle, args, outs))
    causal = case.variant == "causal" if case.part == "verify" else suite.SDPA_EQUIVALENT.get(case.variant)
    if causal is None:
        results["sdpa"] = "n/a: SDPA has no equivalent of this variant"
    else:
        for name, backend in (("sdpa_flash", "FLASH_ATTENTION"), ("sdpa_cudnn", "CUDNN_ATTENTION")):
            fn = eng.sdpa(backend, causal, gqa)
            results[name] = measure(eng, lambda fn=fn: fn(q, k, v), flops, error)
    if normalize != "softmax":
        results["flex_attention"] = f"n/a: FlexAttention has no {normalize} normalizer"
    elif not budget.allow("flex"):
        results["flex_attention"] = {"skipped": "time budget"}
    else:
        start = time.monotonic()
        try:
            flex = eng.flex(attn, shape, batch)
            results["flex_attention"] = measure(eng, lambda: flex(q, k, v), flops, error)
        except Exception as err:
            results["flex_attention"] = {"error": _error_text(err)}
        results["flex_attention"]["compile_s"] = round(time.monotonic() - start, 2)
        budget.observe("flex", time.monotonic() - start)
    if tables:
        # What the call-time tables cost when the closure tensors change (uncached) and when they
        # do not (the cache hit every later call takes), beside FlexAttention's create_block_mask.
        bm, bn = bundle.block_m, bundle.block_n
        program = bundle.meta[runtime.MASK_PROGRAM]
        uncached = eng.wall_ms(lambda: block_mask.classify_program(
            ScalarProgram.from_json(program), [q, k, v, *captures], shape.seq_q, shape.seq_k, bm, bn, eng.device))
        classification = {"ms": uncached,
                          "cached_ms": eng.wall_ms(lambda: runtime.call_time_tables(bundle, q, k, v, *captures)),
                          "flex_create_block_mask_ms": eng.block_mask_ms(attn, shape, batch)}
        if "ms" in results["ae_mlir"]:
            classification["fraction_of_attention"] = uncached / results["ae_mlir"]["ms"]
        rec["classification"] = classification
    rec["results"] = results
    rec["speedup"] = _speedups(results)
    return rec


def linear_case(case, bundle, eng, budget: Budget) -> dict:
    import torch

    data = suite.linear_inputs(case, eng.device)
    q, k, v, g = data["ae"]
    fq, fk, fv, fg = data["fla"]
    decay = suite.LINEAR_DECAYS[case.variant]
    flops = suite.linear_flops(case)
    rec = {"case": case.name, "part": case.part, "variant": case.variant, "decay": decay, "dtype": case.dtype,
           "B": case.batch, "H": case.heads, "L": case.seq, "Dk": case.dim, "Dv": case.dim, "chunk": suite.CHUNK,
           "layout": "[B, T, H, D] storage (fla's); ae-mlir reads [B, H, T, D] views of it", "flops": flops}
    heads = eng.ref_heads(case.heads)
    picked = torch.tensor(heads, device=eng.device)
    g_ref = g[picked] if decay == "head" else g[:, picked]
    ref = suite.linear_reference(q[:, picked], k[:, picked], v[:, picked], g_ref, decay)
    rec.update(reference=f"float32 chunked recurrence, heads {heads}", reference_max_abs=float(ref.abs().max()),
               reference_finite=bool(torch.isfinite(ref).all()))

    def error(o):
        return float((o[:, picked].float() - ref).abs().max())

    outs = eng.outputs(bundle)

    # As ae.linear_attention does (and so timed): a per-token g whose tokens are not adjacent in
    # memory is copied, or every kernel would take its general variant.
    copied = decay == "token" and g.stride(-1) != 1

    def ae():
        return eng.launch(bundle, q, k, v, g.contiguous() if copied else g, **outs)[0]

    results = {"ae_mlir": measure(eng, ae, flops, error)}
    rec.update(kernel_info(eng, bundle, (q, k, v, g.contiguous() if copied else g), outs))
    peer = f"fla_chunk_{case.variant}"
    try:
        op = eng.fla(case.variant)
    except ImportError as err:
        op = None
        results[peer] = {"error": _error_text(err)}
    if op is not None and not budget.allow("fla"):
        results[peer] = {"skipped": "time budget"}
    elif op is not None:
        results[peer] = measure(eng, lambda: op(fq, fk, fv, fg), flops, lambda o: error(o.transpose(1, 2)))
        budget.observe("fla", results[peer].get("first_call_s", 0.0))
        if "ms" in results[peer] and "ms" in results["ae_mlir"]:
            theirs = op(fq, fk, fv, fg).transpose(1, 2)
            rec["max_abs_diff_ae_vs_fla"] = float((ae().float() - theirs.float()).abs().max())
    rec["results"] = results
    rec["speedup"] = _speedups(results)
    return rec


# --- the run ---------------------------------------------------------------------------------------


def _finite(x):
    """JSON without NaN/Infinity tokens (strict parsers reject them): non-finite floats as strings."""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def write_json(path: str, doc: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(_finite(doc), f, indent=1)
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


def summary_line(rec: dict) -> str:
    if "results" not in rec:
        return f"{rec['case']}: {rec.get('error') or rec.get('skipped')}"
    parts = []
    for name, r in rec["results"].items():
        if isinstance(r, str):
            continue
        if "tflops" in r:
            text = f"{name} {r['tflops']:.1f} TF/s err {r['max_abs_err']:.1e}"
            if name in rec["speedup"]:
                text += f" (ae {rec['speedup'][name]:.2f}x)"
        else:
            text = f"{name} {r.get('error') or r.get('skipped')}"
        parts.append(text)
    extra = ""
    if "classification" in rec:
        c = rec["classification"]
        extra = f" | tables {c['ms']:.2f} ms uncached, {c['cached_ms']:.3f} ms cached"
    return f"{rec['case']}: " + " | ".join(parts) + extra


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
                rec = (linear_case if part == "linear" else softmax_case)(case, bundle, eng, budget)
            except Exception as err:
                rec = {"case": case.name, "error": _error_text(err),
                       "traceback": traceback.format_exc(limit=-4).strip().splitlines()}
        records.append(rec)
        write_json(path, dict(header, part=part, cases=records))
        log(f"{part} {i}/{len(todo)} {summary_line(rec)}")
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
        log(f"plot failed: {_error_text(err)}")


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
                    problems += _record_problems(rec)
    plot(args.out)
    if not os.path.exists(os.path.join(args.out, "suite.png")):
        problems.append("no plot was written")
    problems += _check_warm(bundles, todo, args.bundles)
    loaded = [m for m in sys.modules if (m == "mlir" or m.startswith("mlir.")) and sys.modules[m] is not None]
    if loaded:
        problems.append(f"the GPU side imported MLIR modules: {loaded}")
    del sys.modules["mlir"]
    problems += _check_references()
    log(f"dry run: {len(problems)} problem(s); records in {args.out}")
    for p in problems:
        print("  " + p)
    return 1 if problems else 0


def _record_problems(rec: dict) -> list:
    if "results" not in rec:
        return [f"{rec['case']}: {rec.get('error') or rec.get('skipped')}"]
    out = [f"{rec['case']}: {name}: {r['error']}" for name, r in rec["results"].items()
           if isinstance(r, dict) and "error" in r]
    if not rec.get("reference_finite", True):
        out.append(f"{rec['case']}: the float32 reference is not finite")
    return out


def _check_warm(bundles: dict, todo: list, directory: str) -> list:
    problems = []
    first = next((c for c in todo if not isinstance(bundles[c], str)), None)
    if first is not None:
        task = (f"ae {first.name}", warm.compile_ae,
                (os.path.join(directory, first.bundle_file), expected_variant(first, bundles[first]), "cuda:90"))
        stats = warm.run_pool([task], 1, time.monotonic() + 300, log)
        if stats["done"] != 1:
            problems.append(f"warm-up pool: {stats}")
    try:
        for variant in suite.LINEAR_DECAYS:
            suite.fla_op(variant)
    except ImportError as err:
        log(f"fla is not importable here ({err}); its autotuner split is not checked")
        return problems
    tuners = warm.fla_autotuners()
    covered = {id(t): set() for t in tuners}
    shares = 14
    for part in range(shares):
        warm.partition_fla(part, shares)
        for t in tuners:
            covered[id(t)] |= {str(c) for c in t.configs}
    uncovered = [t for t in tuners if covered[id(t)] != {str(c) for c in t.__dict__["_all_configs"]}]
    log(f"fla: {len(tuners)} autotuners, {sum(len(t.__dict__['_all_configs']) for t in tuners)} configs "
        f"(CPU-side lists), split {shares} ways")
    if not tuners or uncovered:
        problems.append(f"fla autotuner split: {len(tuners)} found, {len(uncovered)} not covered")
    return problems


def _check_references() -> list:
    import torch
    import torch.nn.functional as F

    import ae_mlir as ae
    from ae_mlir.variants import CATALOGUE, Shape, build

    problems = []
    for name in CATALOGUE:
        attn, shape = build(name, Shape(2, 4, 300, 300, 32, 32), seed=suite.SEED)
        q, k, v = suite.softmax_inputs(shape, "float32", "cpu")
        got = suite.attention_reference(attn, q, k, v, torch.arange(300))
        for backend in ("cpu", "reference"):
            want = attn(q, k, v, backend=backend).float()
            err = float((got - want).abs().max()) / max(1.0, float(want.abs().max()))
            if err < 1e-5:
                continue
            message = f"reference {name}: relative error {err:.1e} against ae-mlir's {backend} backend"
            if backend == "cpu":
                problems.append(message)
            else:
                # The executor evaluates float32 mods in float64 (with float32-rounded constants);
                # where a mod floors a float, as t5_bias does at |q - kv| = 16, 32, 64, it then
                # disagrees with float32 torch, the CPU backend and the Triton kernels alike.
                log(f"note: {message}, while the float32 CPU backend agrees")
        if attn.mask_mod is not None:
            b, h, qi, ki = (torch.arange(n).view(*s) for n, s in ((1, (1, 1, 1, 1)), (1, (1, 1, 1, 1)),
                                                                 (300, (1, 1, 300, 1)), (300, (1, 1, 1, 300))))
            brute = int(attn.mask_mod(b, h, qi, ki).expand(1, 1, 300, 300).sum()) / 300**2
            if brute != suite.kept_fraction(attn.mask_mod, 300, 300, "cpu", block=64):
                problems.append(f"kept fraction {name}: blockwise count differs from the brute-force one")
    try:
        from fla.ops.gla.naive import naive_recurrent_gla
        from fla.ops.retention.naive import naive_retention
        from fla.ops.simple_gla.naive import naive_recurrent_simple_gla
    except ImportError:
        naive = None
    else:
        naive = {"retention": lambda q, k, v, g: naive_retention(q.transpose(1, 2), k.transpose(1, 2),
                                                                 v.transpose(1, 2)).transpose(1, 2),
                 "simple_gla": lambda q, k, v, g: naive_recurrent_simple_gla(q, k, v, g)[0],
                 "gla": lambda q, k, v, g: naive_recurrent_gla(q, k, v, g)[0]}
    for variant, decay in suite.LINEAR_DECAYS.items():
        case = suite.Case("linear", variant, 2, 3, 150, 16, "float32")
        data = suite.linear_inputs(case, "cpu")
        q, k, v, g = data["ae"]
        if decay != "head":
            # Stronger gates than the benchmark's, so that decay errors would show.
            g = F.logsigmoid(torch.randn(g.shape, generator=torch.Generator().manual_seed(5)))
        got = suite.linear_reference(q, k, v, g, decay)
        lin = ae.linear_attention(decay=decay, chunk_size=suite.CHUNK)
        checks = {"ae-mlir's reference executor": lin(q, k, v, g, backend="reference").float()}
        if naive is not None:
            fg = None if decay == "head" else g.transpose(1, 2)
            checks[f"fla's naive {variant}"] = naive[variant](*data["fla"][:3], fg).transpose(1, 2).float()
        for label, want in checks.items():
            err = float((got - want).abs().max()) / max(1.0, float(want.abs().max()))
            if not err < 1e-4:
                problems.append(f"linear reference {variant}: relative error {err:.1e} against {label}")
    log(f"references checked against ae-mlir's CPU backend and reference executor{' and fla' if naive else ''}")
    return problems


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
