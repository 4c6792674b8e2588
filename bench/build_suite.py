"""Build the Triton bundles of every benchmark case (needs the MLIR bindings, no GPU).

    python bench/build_suite.py [--out bench/bundles] [--parts verify,catalogue,linear] [--force]
                                [--config block_v=128,block_k=32]

One JSON bundle per case of bench/suite.py, for the H200's target (cuda:90) and the backend's
default block sizes, i.e. what `ae.attention(...)(q, k, v)` would compile on that GPU; `--config`
overrides preset options for every case (to compare launch configurations across runs). A bundle
whose case and compiler fingerprint match is kept, so a rebuild after a compiler change redoes
everything and a rebuild after nothing redoes nothing. bench/run_suite.py runs them.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

import suite  # noqa: E402


def build_one(case: suite.Case, target: str, config: dict | None = None):
    from ae_mlir.backends.triton import build_bundle, call_time_tiles, compile_bundle

    if case.part == "linear":
        text = suite.linear_attention(case).mlir(*suite.linear_meta(case))
        bundle = build_bundle(text, target, config)
        bundle.meta["l0"] = text
        return bundle
    attn, shape = suite.softmax_problem(case, "cpu")
    if not config:
        # What a call on the GPU launches: a mask read at call time may choose its tiles from its
        # tables on the call's tensors (the case's own inputs, made again there from its seed).
        inputs = suite.softmax_inputs(shape, case.dtype, "cpu", empty=True)
        text = attn.mlir(*inputs)
        config = call_time_tiles(text, target, [*inputs, *attn._build(*inputs)[1]]) or None
    return compile_bundle(attn, *suite.meta_like(shape, case.dtype), target=target, config=config)


def parse_config(text: str) -> dict:
    """`key=value,...` as preset overrides: integers, or true/false."""
    config = {}
    for item in filter(None, text.split(",")):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--config: expected key=value, got {item!r}")
        lowered = value.lower()
        config[key] = lowered == "true" if lowered in ("true", "false") else int(value)
    return config


def up_to_date(path: str, case: suite.Case, fingerprint: str, config: dict) -> bool:
    from ae_mlir import runtime

    if not os.path.exists(path):
        return False
    try:
        meta = runtime.Bundle.load(path).meta
    except runtime.BundleError:
        return False
    return (meta.get("case") == case.as_dict() and meta.get("compiler") == fingerprint
            and meta.get("config", {}) == config)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.path.join(HERE, "bundles"))
    p.add_argument("--target", default="cuda:90")
    p.add_argument("--parts", default=",".join(suite.PARTS))
    p.add_argument("--force", action="store_true", help="rebuild bundles that are up to date")
    p.add_argument("--config", default="", help="preset overrides for every case, key=value,...")
    args = p.parse_args(argv)
    config = parse_config(args.config)
    from ae_mlir import disk_cache

    fingerprint = disk_cache.compiler_fingerprint()
    os.makedirs(args.out, exist_ok=True)
    todo = suite.cases(args.parts.split(","))
    wanted = {c.bundle_file for c in suite.cases()}
    start = time.time()
    built = failed = 0
    for i, case in enumerate(todo, 1):
        path = os.path.join(args.out, case.bundle_file)
        if not args.force and up_to_date(path, case, fingerprint, config):
            continue
        t = time.time()
        try:
            bundle = build_one(case, args.target, config or None)
        except Exception as err:
            # run_suite.py records a missing bundle as that case's error; the rest still run.
            failed += 1
            print(f"[{i}/{len(todo)}] {case.name}: FAILED {type(err).__name__}: {err}", flush=True)
            continue
        bundle.meta.update(case=case.as_dict(), compiler=fingerprint, config=config)
        bundle.save(path)
        built += 1
        print(f"[{i}/{len(todo)}] {case.name}: {bundle.block_m}x{bundle.block_n}, {bundle.num_warps} warps, "
              f"{bundle.num_stages} stages, grid {bundle.grid}, {time.time() - t:.1f}s", flush=True)
    stale = [f for f in os.listdir(args.out) if f.endswith(".json") and f not in wanted]
    for name in stale:
        os.remove(os.path.join(args.out, name))
    paths = [os.path.join(args.out, c.bundle_file) for c in todo]
    files = [f for f in paths if os.path.exists(f)]
    size = sum(os.path.getsize(f) for f in files)
    print(f"{len(files)}/{len(todo)} bundles in {args.out} ({built} built, {failed} failed, {len(stale)} stale "
          f"removed), {size / 2**20:.1f} MiB, {time.time() - start:.0f}s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
