"""Autotuning: a small search over the kernels' launch configuration per compiled module (variant
and shapes) and target, the choice kept on disk. On GPUs (Triton) it covers block sizes, warps
and pipeline stages (on Hopper, TMA tile loads on or off); on the CPU the tiles (rows per program, keys per KV tile), timed by the
wall clock (`median_wall_ms`).

`ae.attention(..., autotune=True)` and `ae.linear_attention(..., autotune=True)` ask for it; the
default (`autotune=False`) launches the presets' committed defaults (`ae_mlir.presets`). A tuned
call compiles each candidate of `candidates(problem, target)` (the default first), launches each
on the call's own tensors (`median_ms`), takes the fastest and records it in
`<cache_dir>/tuned/<key>.json` with every candidate's time:

    {"target": "cuda:90", "candidates": [{}, {"block_n": 128, ...}, ...],
     "ms": [0.412, 0.398, ...], "chosen": {"block_n": 128, ...}}

Later calls (and later processes) launch the chosen bundle without tuning again. The choice is
also recorded for the module's shape bucket (`shape_bucket`: the same variant with every
dimension rounded up to a power of two): a module of the bucket that has no record of its own
takes that choice without a search (`adopt`), so a new sequence length costs one compile, not a
search; a choice that does not compile for it is searched anew. A record with
candidates but no choice is what `backends.triton_tuning.prepare_tuning` leaves on a machine that
compiles but has no GPU: the candidates' bundles sit in the same cache, so a GPU machine without
the MLIR bindings tunes from them (ship the cache directory). Without the bindings and without
such a record, a call launches the default and says so once. Each line of the search is reported through
`ae_mlir.progress` while it runs.

This module is part of the runtime: torch and triton only, never the MLIR bindings; the candidates
are derived from the `presets.Problem` the compile side read.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

from . import launch_defaults, linear_defaults, progress
from .disk_cache import atomic_write, cache_dir
from .launch_defaults import _pow2
from .presets import Problem, options_for, takes_host_tma

# Candidates by head dim (padded to a power of two) for 16-bit inputs on CUDA, as overrides of
# (block_m, block_n, num_warps, num_stages); the preset's default is always tried first. They
# span the tiles FlashAttention-2/FlexAttention use on Hopper and the ones the committed defaults
# were picked from (launch_defaults.py's H200 notes).
_CUDA_16BIT = {
    64: [(128, 128, 4, 3), (128, 128, 8, 3), (128, 64, 8, 3), (128, 32, 4, 3), (64, 64, 4, 3), (64, 128, 4, 3),
         (128, 64, 4, 4), (128, 64, 4, 2)],
    128: [(128, 128, 8, 2), (128, 64, 4, 3), (128, 32, 4, 3), (64, 64, 4, 3), (64, 128, 4, 2), (128, 64, 8, 4),
          (128, 64, 8, 2), (128, 32, 8, 4)],
    256: [(128, 64, 8, 2), (128, 64, 8, 3), (128, 32, 8, 3), (64, 64, 4, 2), (64, 32, 4, 3), (64, 64, 4, 3)],
}
_CUDA_FP32 = {d: [(64, 32, 4, 3), (32, 32, 4, 3), (64, 64, 4, 2), (32, 64, 4, 2)] for d in (64, 128, 256)}
_HIP = {d: [(128, 64, 4, 2), (64, 64, 4, 2), (64, 32, 4, 2), (128, 32, 4, 2), (64, 64, 8, 2)] for d in (64, 128, 256)}
# Linear attention: (block_v, block_k, num_warps, num_stages) of the split recurrence's kernels.
_LINEAR = [(64, 64, 4, 2), (32, 64, 4, 3), (64, 64, 8, 3), (128, 64, 4, 3), (64, 32, 4, 3)]
# The CPU's candidate rows per program and keys per KV tile.
_CPU_BLOCKS = (32, 64, 128)
# Shared memory a candidate may plan for: K and V tiles per stage and the Q tile (bytes). Per
# block, the H100/H200 (sm_90) have 227 KiB, the A100 (sm_80) 163 KiB, sm_86/89 99 KiB, and
# MI300 64 KiB of LDS.
_SHARED_KIB = {90: 200, 80: 160}
_SHARED_KIB_OTHER_CUDA = 96
_LDS_KIB = 64
# A candidate replaces the default only when faster by more than this fraction. On an H200
# (bench/results/h200-autotune-2026-12-02.json) retention's search put a candidate 2.7% ahead of
# the default, and the same run then timed it 16% behind; timings there moved 22-41% between
# two measurements of one bundle.
_MARGIN = 0.03
# The backward kernels' candidates (attn-tile-backward), (block_m, block_n, num_warps,
# num_stages) for the dQ kernel (query rows resident, keys a step) and for the dK/dV kernel
# (query rows a step, keys resident), by head dim, for 16-bit inputs on CUDA: the configs the
# per-kernel sweeps on an H200 ranked best (bench/backward.py sweep; launch_defaults.py's notes).
# At D = 128 the dK/dV kernel's 32x128 and 64x128 tiles on 4 warps spilled there (2.3-3.0 ms
# against 1.1-1.2, bench/results/h200-autotune-backward-2026-12-04.json): not tried.
# fp32 and MI300 try smaller tiles. The two kernels are searched in turn (`choose_in_turn`): the
# dQ kernel's candidates with the dK/dV kernel at its default, then the dK/dV kernel's with the
# dQ kernel's choice.
_BWD_DQ_16BIT = {64: [(128, 64, 4, 3), (64, 64, 4, 3), (64, 64, 4, 2), (128, 32, 4, 3), (128, 64, 8, 2)],
                 128: [(128, 64, 8, 3), (64, 64, 4, 3), (64, 64, 4, 2), (128, 32, 4, 3), (64, 128, 8, 2)],
                 256: [(64, 32, 4, 2), (64, 64, 4, 2), (32, 64, 4, 2), (64, 32, 8, 2), (32, 32, 4, 2), (64, 64, 8, 2),
                       (128, 64, 8, 2), (128, 32, 8, 2)]}
_BWD_DKDV_16BIT = {64: [(32, 128, 4, 3), (32, 64, 4, 3), (64, 64, 4, 3), (64, 128, 8, 3)],
                   128: [(64, 128, 8, 3), (32, 64, 4, 3), (64, 64, 4, 3), (32, 64, 4, 2), (64, 64, 8, 2)],
                   256: [(32, 64, 4, 2), (64, 64, 8, 2), (32, 32, 4, 2), (64, 32, 4, 2), (32, 128, 8, 2), (16, 64, 4, 2),
                         (64, 64, 8, 3), (32, 64, 8, 2)]}
_BWD_SMALL = [(32, 32, 4, 2), (64, 32, 4, 2), (32, 64, 4, 2), (16, 32, 4, 2)]
_BWD_HIP = [(64, 64, 4, 1), (64, 32, 4, 1), (32, 32, 4, 1), (32, 64, 4, 1)]
# Queries at most this long (decoding) are not tuned: their split count, not their tiles, sets
# their speed (launch_defaults.kv_splits), and one launch takes microseconds.
_MIN_TUNED_LQ = 17


def candidates(problem: Problem, target: str) -> list[dict]:
    """The configurations a tuned call tries for `problem` on `target` ("host" for the CPU), as
    preset overrides: {} (the preset's default) first, then those that differ from it."""
    if problem.lq < _MIN_TUNED_LQ:
        return [{}]
    if target == "host":
        found, default = _cpu_candidates(problem)
    elif problem.linear:
        found, default = _linear_candidates(problem, target)
    else:
        found, default = _softmax_candidates(problem, target)
    kept = _unique([{}] + [c for c in found if any(default.get(k) != v for k, v in c.items())])
    if target != "host" and not problem.linear and launch_defaults.has_tma(target):
        # TMA tile loads won or lost 2-11% by shape and config on an H200 (launch_defaults.has_tma,
        # host_tma), so every candidate is tried the other way too.
        other = not default.get("tensor_descriptors", False)
        kept += [dict(c, tensor_descriptors=other) for c in kept]
    if target == "cuda:90" and problem.simple_mask is not None:
        # attn-lower-to-gluon's kernel takes none of those options: the Triton IR candidates are
        # tried without it, and it is tried on the grid its default schedule does not take and
        # (at D = 128, the kernel with the two consumer warpgroups that schedule takes) with
        # ping-pong on a program per query block. At D = 64 its two-warpgroup form is tried on
        # both grids: on an H100 (bf16, B 8, H 16, L 2048, causal) it ran 343 TFLOP/s persistent
        # against the three warpgroups' 253-304, though the Triton IR kernel's 359 led both
        # (bench/results/h100-warp-specialized-2026-12-07-warpgroups.json).
        on = options_for("triton", problem, target).warp_specialize
        persistent = options_for("triton", problem, target, warp_specialize=True).persistent
        schedules = [{"warp_specialize": True, "persistent": not persistent}]
        if problem.dk == 128:
            schedules.append({"warp_specialize": True, "persistent": False, "pingpong": True})
        if problem.dk == 64:
            schedules += [{"warp_specialize": True, "warpgroups": 2, "persistent": grid} for grid in (True, False)]
        kept = _unique([{}] + [dict(c, warp_specialize=False) for c in kept if c]
                       + [{"warp_specialize": not on}] + schedules)
    return kept


def backward_candidates(problem: Problem, target: str, default: dict, closure_grads: bool = True) -> list[list[dict]]:
    """The backward kernels' configurations a tuned call tries on a GPU target, as groups searched
    in turn (`choose_in_turn`): the warp-specialized kernels or not where they are the default,
    then the Triton IR dQ kernel's, then its dK/dV kernel's, each as
    overrides of `default` (the backward config the call launches untuned) that keep the other
    kernel's options, {} (keep what is chosen) first. The warp-specialized kernels compute no
    closure tensor's gradient: not a candidate where `closure_grads` are asked of a mod's reads."""
    if problem.lq < _MIN_TUNED_LQ or problem.linear:
        return [[{}]]
    d = max(_pow2(problem.dk), _pow2(problem.dv), 64)
    if target.startswith("hip"):
        dq, dkdv = _BWD_HIP, _BWD_HIP
    elif problem.dtype in ("bf16", "f16") and d in _BWD_DQ_16BIT:
        dq, dkdv = _BWD_DQ_16BIT[d], _BWD_DKDV_16BIT[d]
    else:
        dq, dkdv = _BWD_SMALL, _BWD_SMALL
    lq, lk = _pow2(problem.lq), _pow2(problem.lk)
    # An override of the dQ kernel's options alone would make the dK/dV kernel follow them
    # (launch_defaults.backward_overrides): its candidates name the dK/dV kernel's default too.
    keep = {k: default[k] for k in ("dkdv_block_m", "dkdv_block_n", "dkdv_num_warps", "dkdv_num_stages")}
    groups = []
    for prefix, table in (("", dq), ("dkdv_", dkdv)):
        group = [{f"{prefix}block_m": min(bm, lq), f"{prefix}block_n": min(bn, lk), f"{prefix}num_warps": warps,
                  f"{prefix}num_stages": stages} for bm, bn, warps, stages in table]
        group = [dict(c, **keep) if not prefix else c for c in group
                 if any(default.get(k) != v for k, v in c.items())]
        groups.append(_unique([{}] + group))
    gluon = launch_defaults.warp_specialized(target, problem.gluon_backward, problem.lq, problem.dk, backward=True,
                                             score_mod=problem.score_mod, adds_bias=problem.mod_adds_bias)
    if not problem.gluon_backward_serves(closure_grads):
        return groups
    if gluon or launch_defaults.warp_specialized(target, problem.gluon_backward, problem.lq, problem.dk,
                                                 backward=True):
        # attn-lower-to-gluon's backward takes none of those options: it is tried against the
        # Triton IR kernels first (whichever is the default; with a score_mod, the latter), and
        # their tiles are then searched without it.
        groups = [[{}, {"warp_specialize": not gluon}]] + [[{}] + [dict(c, warp_specialize=False) for c in group[1:]]
                                                           for group in groups]
    return groups


def _cpu_candidates(problem: Problem) -> tuple[list[dict], dict]:
    # The CPU's tiles: rows per program and keys per KV tile. Linear attention's one-kernel
    # recurrence has no launch configuration to tune there.
    if problem.linear:
        return [], {}
    default = launch_defaults.cpu_config(problem.lq, problem.lk, not problem.masked, problem.dtype)

    lq, lk = launch_defaults.next_pow2(problem.lq), launch_defaults.next_pow2(problem.lk)
    return [{"block_m": min(m, lq), "block_n": min(n, lk)} for m in _CPU_BLOCKS for n in _CPU_BLOCKS], default


def _linear_candidates(problem: Problem, target: str) -> tuple[list[dict], dict]:
    found = []
    for block_v, block_k, warps, stages in _LINEAR:
        if target.startswith("hip"):
            stages = min(stages, 2)
        found.append({"block_v": block_v, "block_k": block_k, "num_warps": warps, "num_stages": stages})
    return found, linear_defaults.linear_config(problem, target)


def _softmax_candidates(problem: Problem, target: str) -> tuple[list[dict], dict]:
    hip = target.startswith("hip")
    wide = problem.dtype in ("bf16", "f16")
    d = max(_pow2(problem.dk), _pow2(problem.dv), 64)
    table = _HIP if hip else (_CUDA_16BIT if wide else _CUDA_FP32)
    bytes_per = 2 if wide else 4
    found = []
    for block_m, block_n, warps, stages in table.get(d, []):
        block_m, block_n = min(block_m, _pow2(problem.lq)), min(block_n, _pow2(problem.lk))
        # MI300 keeps one LDS buffer per operand at two stages (launch_defaults.py).
        buffers = max(stages - 1, 1) if hip else stages
        shared = (buffers * block_n * (problem.dk + problem.dv) + block_m * problem.dk) * bytes_per
        if shared <= _shared_limit(target):
            found.append({"block_m": block_m, "block_n": block_n, "num_warps": warps, "num_stages": stages})
    default = launch_defaults.default_config(problem.lq, problem.lk, problem.dk, problem.dv, problem.dtype, target,
                                     problem.batch_heads, problem.group, problem.uneven_keys, problem.cut_tiles,
                                     plain=problem.plain)
    if takes_host_tma(problem, target):
        default = dict(default, tensor_descriptors=True)
    return found, default


def _shared_limit(target: str) -> int:
    backend, _, arch = target.partition(":")
    if backend == "hip":
        return _LDS_KIB * 1024
    return _SHARED_KIB.get(int(arch) if arch.isdigit() else 0, _SHARED_KIB_OTHER_CUDA) * 1024


def _unique(configs: list[dict]) -> list[dict]:
    seen, kept = set(), []
    for config in configs:
        key = tuple(sorted(config.items()))
        if key not in seen:
            seen.add(key)
            kept.append(config)
    return kept


# A static shape in MLIR's text: `tensor<1x4x500x64xf32>`, its dimensions "1x4x500x64x".
_SHAPE = re.compile(r"\b(tensor|memref)<((?:(?:\d+|\?)x)+)")


def shape_bucket(module_text: str) -> str:
    """`module_text` with every static dimension of its tensor types rounded up to a power of two:
    the modules of one variant whose shapes round alike (lengths 1500 and 2048; batch 3 and 4)
    share this text, and so a tuning choice. Everything else (the variant's ops, its constants,
    the softmax scale, which follows the head dim unless given) must match."""
    def rounded(match: re.Match) -> str:
        dims = match.group(2).split("x")[:-1]
        return f"{match.group(1)}<" + "".join(f"{d if d == '?' else launch_defaults.next_pow2(int(d))}x"
                                              for d in dims)

    return _SHAPE.sub(rounded, module_text)


def record_path(key: str) -> Path:
    return cache_dir() / "tuned" / f"{key}.json"


_RECORDS: dict = {}


def load(key: str) -> dict | None:
    """The tuning record of a module (by its tuning key), from memory or disk; None if absent or
    not a record this module wrote (unreadable, or a choice that is not among its candidates),
    which is tuned again."""
    record = _RECORDS.get(key)
    if record is not None:
        return record
    try:
        record = json.loads(record_path(key).read_text())
    except (OSError, ValueError):
        return None
    if not _valid(record):
        return None
    _RECORDS[key] = record
    return record


def _valid(record) -> bool:
    if not isinstance(record, dict):
        return False
    configs = record.get("candidates")
    if not isinstance(configs, list) or not configs or not all(isinstance(c, dict) for c in configs):
        return False
    chosen = record.get("chosen")
    return chosen is None or chosen in configs


def save(key: str, record: dict) -> None:
    _RECORDS[key] = record
    try:
        atomic_write(record_path(key), json.dumps(record, indent=1))
    except OSError:
        # A read-only cache directory costs a new search next process, nothing more.
        pass


def median_ms(launch) -> float:
    """Median milliseconds of `launch()` as `triton.testing.do_bench` measures it (L2 flushed
    before each launch, the launch path's own time included, as a caller sees it), after a first
    launch that also compiles; about 50 ms of launches per candidate."""
    import triton.testing

    return float(triton.testing.do_bench(launch, warmup=10, rep=50, return_mode="median"))


def median_wall_ms(launch, budget_ms: float = 300.0) -> float:
    """Median wall-clock milliseconds of `launch()` (a CPU kernel), after a first launch, over
    as many launches as fit in about `budget_ms` (3 to 15)."""
    import time

    start = time.perf_counter()
    launch()
    first = (time.perf_counter() - start) * 1e3
    times = []
    for _ in range(max(3, min(15, int(budget_ms / max(first, 1e-3))))):
        start = time.perf_counter()
        launch()
        times.append((time.perf_counter() - start) * 1e3)
    times.sort()
    return times[len(times) // 2]


def search(name: str, configs: list[dict], launches: list, timer=None) -> tuple[dict, list[float]]:
    """(the fastest configuration, every candidate's median ms) over `configs`, where
    `launches[i]()` runs candidate i once, timed by `timer(launch)` (`median_ms`). A candidate
    that fails to launch (out of shared memory or registers on this GPU) is recorded as inf and
    skipped; the default (the first) must launch, and is kept unless another candidate is faster
    by more than `_MARGIN`."""
    timer = timer or median_ms
    times = []
    for i, (config, launch) in enumerate(zip(configs, launches)):
        try:
            ms = timer(launch)
        except Exception as err:  # noqa: BLE001 -- a candidate this GPU cannot run is skipped
            if i == 0:
                raise
            ms = math.inf
            progress.emit(f"ae-mlir: autotuning '{name}' {i + 1}/{len(configs)} {_describe(config)}: "
                          f"cannot launch ({type(err).__name__})")
        else:
            progress.emit(f"ae-mlir: autotuning '{name}' {i + 1}/{len(configs)} {_describe(config)}: {ms:.3f} ms")
        times.append(ms)
    best = min(range(len(configs)), key=lambda i: times[i])
    if times[best] > times[0] * (1 - _MARGIN):
        best = 0
    progress.emit(f"ae-mlir: autotuned '{name}': {_describe(configs[best])}, {times[best]:.3f} ms "
                  f"(default {times[0]:.3f} ms)")
    return configs[best], times


def choose(key: str, name: str, target: str, configs: list[dict], launcher, timer=None,
           bucket: str | None = None) -> dict:
    """Search `configs` (the default first) for module `name` and record the choice under `key`
    and its shape bucket's key `bucket`: `launcher(config)` compiles (or fetches) a candidate and
    returns a function that launches it once (`compiled`); a single candidate is chosen without
    timing."""
    return choose_in_turn(key, name, target, [configs], launcher, timer, bucket)


def choose_in_turn(key: str, name: str, target: str, groups: list[list[dict]], launcher, timer=None,
                   bucket: str | None = None) -> dict:
    """`choose` over groups of candidates searched one after another, as one kernel's options are
    searched while another's stay put: each group's overrides are applied over the choice so far
    ({} first: keep it). The record lists every candidate timed, in order."""
    chosen, tried, times = {}, [], []
    for group in groups:
        kept, launches = compiled(name, _unique([dict(chosen, **c) for c in group]), launcher)
        if len(kept) > 1:
            chosen, ms = search(name, kept, launches, timer)
            times += ms
        else:
            chosen = kept[0]
            times.append(None)  # the only candidate left: not timed
        tried += kept
    record = {"target": target, "candidates": tried, "chosen": chosen}
    if len(tried) > 1:
        record["ms"] = times
    save(key, record)
    if bucket is not None and len(tried) > 1:
        save(bucket, dict(record, tuned_as=key))
    return record["chosen"]


def bucket_choice(bucket: str) -> dict | None:
    """The choice recorded for shape bucket `bucket` by a search of another module, or None."""
    record = load(bucket)
    return None if record is None else record.get("chosen")


def adopt(key: str, name: str, bucket: str) -> None:
    """Record the bucket's choice as module `name`'s own (under `key`), once it has compiled for
    it, so that later calls launch it without looking further."""
    record = load(bucket)
    save(key, {"target": record["target"], "candidates": record["candidates"], "chosen": record["chosen"],
               "adopted_from": bucket})
    progress.emit(f"ae-mlir: autotune: '{name}' takes {_describe(record['chosen'])}, the choice searched for "
                  f"another shape of its bucket (no search)")


def compiled(name: str, configs: list[dict], compile) -> tuple[list[dict], list]:
    """(the candidates that compile, what `compile(config)` returned for each). One other than
    the default (the first) that the compiler rejects is left out, said in a progress line; the
    default must compile."""
    kept, results = [], []
    for i, config in enumerate(configs):
        try:
            results.append(compile(config))
        except Exception as err:  # noqa: BLE001 -- a candidate the compiler rejects is left out
            if i == 0:
                raise
            progress.emit(f"ae-mlir: autotuning '{name}' {_describe(config)}: cannot compile ({type(err).__name__})")
            continue
        kept.append(config)
    return kept, results


_UNTUNED: set = set()


def can_compile(key: str) -> bool:
    """Whether this process can compile a module's Triton candidates (has the MLIR bindings); if
    not, says once per module (`key`) that its call launches the default configuration."""
    try:
        import mlir  # noqa: F401
    except ImportError:
        if key not in _UNTUNED:
            _UNTUNED.add(key)
            progress.emit("ae-mlir: autotune=True, but this module has no tuning record and the MLIR bindings are "
                          "not installed to compile candidates; launching the default configuration "
                          "(ae_mlir.backends.triton_tuning.prepare_tuning prepares a cache on a machine that has them)")
        return False
    return True


def _describe(config: dict) -> str:
    if not config:
        return "default"
    return " ".join(f"{k}={v}" for k, v in config.items())
