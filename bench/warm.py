"""Compile ahead of the measurement, in parallel worker processes, everything it would otherwise
compile one item at a time: ae-mlir's Triton IR, FlexAttention's torch.compile, fla's autotuned
Triton kernels. The workers fill Triton's and Inductor's on-disk caches; the measuring process then
loads from them. Nothing is timed while the workers run, so their GPU use disturbs no measurement.

fla autotunes each kernel over up to 48 configs per key and compiles every one: on one process
that alone is minutes. Each worker takes every n-th config of every fla autotuner and runs fla's
ops once with a benchmark that only launches, so between them the workers compile every config;
the measuring process then autotunes over all configs, loading each from the cache.
"""
from __future__ import annotations

import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import suite  # noqa: E402


def init_worker() -> None:
    # fla's autotune results go to Triton's on-disk autotune cache unless this is 0; the workers'
    # launch-only "timings" must never be taken for real ones.
    os.environ["FLA_CACHE_RESULTS"] = "0"
    # One compile at a time per worker: the pool is the parallelism, and 14 workers each with a
    # pool of 16 Inductor compile processes would exhaust memory. Ignored by Inductor's cache key.
    os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = "1"


def compile_ae(path: str, variant: str, target: str) -> str:
    from ae_mlir import runtime

    bundle = runtime.Bundle.load(path)
    runtime.compile_variant(bundle.variants[variant], target, bundle.num_warps, bundle.num_stages)
    return os.path.basename(path)


def compile_flex(case_fields: dict) -> str:
    import torch

    case = suite.Case(**case_fields)
    attn, shape = suite.softmax_problem(case, "cuda")
    q, k, v = suite.softmax_inputs(shape, case.dtype, "cuda", empty=True)
    with torch.no_grad():
        suite.flex_callable(attn, shape, "cuda", suite.mask_batch(case.variant, shape))(q, k, v)
    torch.cuda.synchronize()
    return case.name


def fla_autotuners() -> list:
    """Every Triton autotuner of the fla modules imported so far (unwrapping @triton.heuristics)."""
    from triton.runtime.autotuner import Autotuner

    found = {}
    for name, module in list(sys.modules.items()):
        if not name.startswith("fla.") or module is None:
            continue
        for obj in list(vars(module).values()):
            while obj is not None and hasattr(obj, "fn"):
                if isinstance(obj, Autotuner):
                    found[id(obj)] = obj
                obj = obj.fn
    return list(found.values())


def _launch_once(kernel_call, quantiles):
    kernel_call()
    return [1.0] * len(quantiles)


def partition_fla(part: int, parts: int) -> int:
    """Restrict every fla autotuner to its share of configs and make its benchmark launch once;
    returns the number of configs this worker will compile per tuning key."""
    count = 0
    for tuner in fla_autotuners():
        # A worker may take a second part: split the full list again and tune every key afresh.
        configs = tuner.__dict__.setdefault("_all_configs", list(tuner.configs))
        mine = configs[part::parts] or [configs[part % len(configs)]]
        tuner.configs = mine
        tuner.cache.clear()
        tuner.__dict__["do_bench"] = _launch_once
        count += len(mine)
    return count


def compile_fla(part: int, parts: int, case_fields: list[dict]) -> str:
    import torch

    for variant in suite.LINEAR_DECAYS:
        suite.fla_op(variant)
    configs = partition_fla(part, parts)
    with torch.no_grad():
        for fields in case_fields:
            case = suite.Case(**fields)
            q, k, v, g = suite.linear_inputs(case, "cuda")["fla"]
            suite.fla_op(case.variant)(q, k, v, g)
    torch.cuda.synchronize()
    return f"fla part {part + 1}/{parts} ({configs} configs)"


def run_pool(tasks: list, workers: int, deadline: float, log) -> dict:
    """Run (label, fn, args) tasks on `workers` spawned processes until done or `deadline`
    (time.monotonic()); returns counts. Workers still busy at the deadline are terminated: what
    they had not compiled is compiled on demand later."""
    import concurrent.futures as cf
    import multiprocessing

    start = time.monotonic()
    # spawn, not fork: the parent holds a CUDA context, which a forked child cannot use.
    pool = cf.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                                  initializer=init_worker)
    futures = {pool.submit(fn, *args): label for label, fn, args in tasks}
    done = failed = 0
    errors = []
    try:
        for future in cf.as_completed(futures, timeout=max(1.0, deadline - time.monotonic())):
            label = futures[future]
            try:
                future.result()
                done += 1
            except Exception as err:
                failed += 1
                errors.append(f"{label}: {type(err).__name__}: {str(err).strip()[-300:]}")
                log(f"warm-up {label} failed: {errors[-1]}")
            if (done + failed) % 10 == 0 or done + failed == len(tasks):
                log(f"warm-up {done + failed}/{len(tasks)} ({failed} failed)")
        pool.shutdown(wait=True)
        timed_out = False
    except cf.TimeoutError:
        timed_out = True
        log(f"warm-up deadline reached after {done + failed}/{len(tasks)} tasks; stopping the workers")
        # ProcessPoolExecutor cannot stop running tasks; its worker processes are ours to end.
        processes = list(getattr(pool, "_processes", {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            process.terminate()
        for process in processes:
            process.join(timeout=10)
    return {"tasks": len(tasks), "done": done, "failed": failed, "timed_out": timed_out,
            "seconds": round(time.monotonic() - start, 1), "errors": errors}
