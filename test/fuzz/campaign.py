"""A fuzzing campaign at the configs users get: N random programs compiled at the default config
of each target (cuda:90 and hip:gfx942), attention, linear attention, attention's backward
kernels and attention on packed batches (one kernel for two batches of other totals) and their
backward kernels, each run as interpreted Triton IR against the float64 reference (the backward:
against float64 autograd, with the closure tensors learnable; a packed batch's, over its
sequences unpacked). Programs go round-robin over the (kind,
target) cells of the kinds asked for (`--kinds`; attention and linear by default) in batches of 20; a
failure is counted (an assertion is a mismatch, any other exception a crash) and the run goes
on. The record is rewritten after each batch, so a stopped run leaves an honest count.

    nice -n 10 python test/fuzz/campaign.py -n 10000 --seed 1 --minutes 600

writes bench/results/fuzz-defaults-<date>.json. With --minutes, no batch starts after the time
limit and the record says how many programs ran.
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
import sys
import time
import warnings
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from hypothesis import given, seed, settings  # noqa: E402
from linear_programs import linear_programs  # noqa: E402
from programs import gluon_programs, programs  # noqa: E402
from test_differential import (FUZZ, TARGETS, check_backward, check_packed, check_packed_backward,  # noqa: E402
                               check_triton)
from test_linear_differential import check_triton_linear  # noqa: E402

KINDS = ("attention", "linear", "backward", "packed", "packed_backward")
CELLS = [(kind, target) for kind in KINDS for target in TARGETS]
KEEP_FAILURES = 50  # the first failures' programs and messages go in the record
BATCH = 20


def _versions() -> dict:
    versions = {name: _version(name) for name in ("torch", "numpy", "hypothesis", "triton", "mlir")}
    versions["python"] = platform.python_version()
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=HERE, capture_output=True, text=True)
    versions["ae_mlir_commit"] = commit.stdout.strip() or None
    return versions


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=10000, help="programs in all (a quarter per cell)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--minutes", type=float, default=None, help="stop running programs after this")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--kinds", default="attention,linear",
                        help="which programs, comma-separated: " + ", ".join(KINDS))
    parser.add_argument("--tma", action="store_true",
                        help="attention programs for cuda:90 only, with TMA tile loads (tensor_descriptors, "
                             "an autotuning choice there) over the default config")
    parser.add_argument("--gluon", action="store_true",
                        help="attention (and backward, with --kinds) programs for cuda:90 only, those "
                             "attn-lower-to-gluon takes (plain or causal, 16-bit, D 64/128; the backward's half with a "
                             "score_mod, closure tensors read included), its kernels run in the Gluon emulator "
                             "(warp_specialize on)")
    parser.add_argument("--persistent", type=int, default=0, metavar="N",
                        help="with --gluon --kinds attention: the forward kernel's persistent grid of N programs, "
                             "each taking several query blocks")
    parser.add_argument("--wave", type=int, default=0, metavar="N",
                        help="with --gluon: a GPU of N multiprocessors (wave_programs): the forward's default "
                             "schedule, the persistent grid or a program per block with causal blocks in sections "
                             "of heads, chosen for it")
    parser.add_argument("--warpgroups", type=int, default=0, metavar="N",
                        help="with --gluon --kinds attention: the forward kernel's consumer warpgroups, 2 (which "
                             "both head dims take; D 64's default is 3)")
    args = parser.parse_args(argv)
    if args.warpgroups and (not args.gluon or args.warpgroups != 2 or set(args.kinds.split(",")) != {"attention"}):
        parser.error("--warpgroups takes 2, with --gluon --kinds attention")
    if args.wave and (not args.gluon or args.wave < 1 or args.persistent):
        parser.error("--wave takes a positive count, with --gluon and without --persistent")
    if args.persistent and (not args.gluon or args.persistent < 1 or set(args.kinds.split(",")) != {"attention"}):
        parser.error("--persistent takes a positive count, with --gluon --kinds attention")
    kinds = [k for k in args.kinds.split(",") if k]
    if not kinds or set(kinds) - set(KINDS):
        parser.error(f"--kinds takes {', '.join(KINDS)}, got {args.kinds!r}")
    cells = [cell for cell in CELLS if cell[0] in kinds]
    if args.tma:
        cells = [("attention", "cuda:90")]
    if args.gluon:
        cells = [(kind, "cuda:90") for kind in kinds if kind in ("attention", "backward")]
    config = {"tensor_descriptors": True} if args.tma else {"warp_specialize": True} if args.gluon else None
    if args.persistent:
        config.update(persistent=True, wave_programs=args.persistent)
    if args.wave:
        config.update(wave_programs=args.wave)
    if args.warpgroups:
        config.update(warpgroups=args.warpgroups)
    date = datetime.date.today().isoformat()
    out = args.out or HERE.parent.parent / "bench" / "results" / f"fuzz-defaults-{date}.json"
    warnings.filterwarnings("ignore")
    record = {
        "what": "random programs at the default config of each target, interpreted Triton IR vs the "
                "float64 reference (backward kernels: vs float64 autograd)", "config_overrides": config, "cells": [f"{kind} {target}" for kind, target in cells],
        "command": " ".join(["python", "test/fuzz/campaign.py"] + (sys.argv[1:] if argv is None else argv)),
        "n_requested": args.n, "seed": args.seed, "minutes_limit": args.minutes, "programs_run": 0,
        "per_cell": {f"{kind} {target}": 0 for kind, target in cells}, "mismatches": 0, "crashes": 0,
        "failures": [], "date": date, "machine": "a 2-core x86-64 CPU (shared)", "versions": _versions(),
    }
    start = time.time()

    def save():
        record["wall_s"] = round(time.time() - start, 1)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(record, indent=2) + "\n")

    def run_batch(number: int, count: int):
        kind, target = cells[number % len(cells)]
        cell = f"{kind} {target}"

        @seed(args.seed * 1_000_003 + number)
        @settings(FUZZ, max_examples=count)
        @given(linear_programs() if kind == "linear" else gluon_programs(score_mods=kind == "backward") if args.gluon
               else programs(max_seq=200))
        def run(program):
            try:
                if kind == "attention":
                    check_triton(program, target, config, "ttgir" if args.gluon else None)
                elif kind == "backward":
                    # The Gluon backward computes no closure tensor's gradient (the Triton IR one does).
                    check_backward(program, target, dict(config, closure_grads=False) if args.gluon else None)
                elif kind == "packed":
                    check_packed(program, target)
                elif kind == "packed_backward":
                    check_packed_backward(program, target)
                else:
                    check_triton_linear(program, target)
            except Exception as e:  # every failure is counted; none stops the campaign
                key = "mismatches" if isinstance(e, AssertionError) else "crashes"
                record[key] += 1
                if len(record["failures"]) < KEEP_FAILURES:
                    record["failures"].append({"cell": cell, "kind": key, "program": str(program),
                                               "error": f"{type(e).__name__}: {str(e)[:2000]}"})
            record["programs_run"] += 1
            record["per_cell"][cell] += 1

        run()
        save()

    # Batches of BATCH programs, one cell each in turn, each seeded by (seed, batch number): the
    # cells stay even, and a time limit stops between batches.
    for number in range(-(-args.n // BATCH)):
        if args.minutes is not None and time.time() - start > 60 * args.minutes:
            break
        run_batch(number, min(BATCH, args.n - number * BATCH))
    save()
    print(json.dumps({k: record[k] for k in ("programs_run", "mismatches", "crashes", "wall_s")}))
    return 1 if record["mismatches"] or record["crashes"] else 0


if __name__ == "__main__":
    sys.exit(main())
