"""ae-mlir's CPU forward against torch SDPA on the same cores, per input type, head dim, length and
mask, on this machine: fp32, bf16 and fp16, B=1 H=4, D in {64, 128}, L in {512, 1024}, full and
causal.

    python bench/cpu_dtypes.py [--rounds 9] [--out DIR]
    python bench/cpu_dtypes.py --block-m 64,128 [--dtypes bfloat16,float16]   # tiles A/B
    python bench/cpu_dtypes.py --amx [--rounds 15]       # bf16 kernels on AMX units against f32 ones

Each case compiles once (a warm call), then ae-mlir and SDPA are called in turn `--rounds` times
on fresh random inputs drawn once (never zeros); printed and written (with `--out`): the medians
and the median of the per-round ratios (SDPA's time over ae-mlir's). With `--block-m A,B` the
compiled kernel at A and at B query rows a program (the preset's KV tiles) are timed in turn
instead, and the ratio is A's time over B's. With `--amx` (bf16 only, a host with AMX-BF16) the
bf16 kernel compiled with its tile products on AMX units and with them in f32
(`AE_MLIR_CPU_AMX=0`) are timed in turn, with SDPA, and the ratio is the f32 kernel's time over
the AMX one's. torch's OpenMP wait policy is left as the environment has it (recorded).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys

import torch

import ae_mlir as ae
from harness import cpu_description

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
from causal_demo import _seconds, causal  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def measure(dtype, dim: int, seq: int, masked: bool, rounds: int) -> dict:
    gen = torch.Generator().manual_seed(dim + seq)
    q, k, v = (torch.randn(1, 4, seq, dim, generator=gen).to(dtype) for _ in range(3))
    attn = ae.attention(mask_mod=causal if masked else None)

    def ours():
        attn(q, k, v)

    def sdpa():
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=masked)

    ours()
    sdpa()
    times = [(_seconds(ours), _seconds(sdpa)) for _ in range(rounds)]
    return {"ae_ms": statistics.median(a for a, _ in times) * 1e3,
            "sdpa_ms": statistics.median(s for _, s in times) * 1e3,
            "speed_vs_sdpa": statistics.median(s / a for a, s in times)}


def compare_amx(dim: int, seq: int, masked: bool, rounds: int) -> dict:
    from ae_mlir.backends import cpu, cpu_cache

    gen = torch.Generator().manual_seed(dim + seq)
    q, k, v = (torch.randn(1, 4, seq, dim, generator=gen).to(torch.bfloat16) for _ in range(3))
    text = ae.attention(mask_mod=causal if masked else None).mlir(q, k, v)
    amx = cpu.compile_module(text)
    os.environ[cpu_cache.AMX_ENV] = "0"
    try:
        f32 = cpu.compile_module(text)
    finally:
        del os.environ[cpu_cache.AMX_ENV]
    if not amx.amx:
        raise SystemExit("--amx: this host's bf16 kernels do not take AMX (no AMX-BF16, or the OS refused it)")
    calls = [lambda: amx([q, k, v]), lambda: f32([q, k, v]),
             lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=masked)]
    for call in calls:
        call()
    times = [tuple(_seconds(call) for call in calls) for _ in range(rounds)]
    return {"amx_ms": statistics.median(t[0] for t in times) * 1e3,
            "f32_products_ms": statistics.median(t[1] for t in times) * 1e3,
            "sdpa_ms": statistics.median(t[2] for t in times) * 1e3,
            "amx_speedup": statistics.median(t[1] / t[0] for t in times),
            "amx_vs_sdpa": statistics.median(t[2] / t[0] for t in times)}


def compare_block_m(dtype, dim: int, seq: int, masked: bool, rounds: int, rows: tuple) -> dict:
    from ae_mlir import launch_defaults
    from ae_mlir.backends import cpu

    gen = torch.Generator().manual_seed(dim + seq)
    q, k, v = (torch.randn(1, 4, seq, dim, generator=gen).to(dtype) for _ in range(3))
    text = ae.attention(mask_mod=causal if masked else None).mlir(q, k, v)
    keys = launch_defaults.cpu_config(seq, seq, not masked)["block_n"]
    kernels = [cpu.compile_module(text, block_m=m, block_n=keys) for m in rows]
    calls = [lambda kernel=kernel: kernel([q, k, v]) for kernel in kernels]
    for call in calls:
        call()
    times = [tuple(_seconds(call) for call in calls) for _ in range(rounds)]
    return {f"block_m{m}_ms": statistics.median(t[i] for t in times) * 1e3 for i, m in enumerate(rows)} | {
        "ratio": statistics.median(t[0] / t[1] for t in times)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--dtypes", default="float32,bfloat16,float16")
    parser.add_argument("--block-m", default="", help="A,B: time the kernel at A and B query rows a program")
    parser.add_argument("--amx", action="store_true", help="bf16 kernels on AMX units against f32 products")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    rows = tuple(int(m) for m in args.block_m.split(",")) if args.block_m else ()
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                            cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    doc = {"date": datetime.date.today().isoformat(), "machine": cpu_description(),
           "cores": os.cpu_count(), "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
           "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "unset"),
           "commit": commit, "rounds": args.rounds, "method": __doc__, "cases": []}
    dtypes = ["bfloat16"] if args.amx else args.dtypes.split(",")
    for name in dtypes:
        for dim in (64, 128):
            for seq in (512, 1024):
                for masked in (False, True):
                    rec = dict(dtype=name, D=dim, L=seq, mask="causal" if masked else "full")
                    if args.amx:
                        rec.update(compare_amx(dim, seq, masked, args.rounds))
                        doc["cases"].append(rec)
                        print(f"bfloat16  D{dim:<4d} L{seq:<5d} {rec['mask']:7s} AMX {rec['amx_ms']:7.2f} ms  "
                              f"f32 products {rec['f32_products_ms']:7.2f} ms  SDPA {rec['sdpa_ms']:7.2f} ms  "
                              f"AMX {rec['amx_speedup']:.2f}x the f32 kernel's speed, {rec['amx_vs_sdpa']:.2f}x SDPA's",
                              flush=True)
                        continue
                    if rows:
                        rec.update(compare_block_m(DTYPES[name], dim, seq, masked, args.rounds, rows))
                        doc["cases"].append(rec)
                        print(name, dim, seq, rec["mask"], {k: round(v, 3) for k, v in rec.items() if k[0] in "br"},
                              flush=True)
                        continue
                    rec.update(measure(DTYPES[name], dim, seq, masked, args.rounds))
                    doc["cases"].append(rec)
                    print(f"{name:9s} D{dim:<4d} L{seq:<5d} {rec['mask']:7s} ae-mlir {rec['ae_ms']:7.2f} ms  "
                          f"SDPA {rec['sdpa_ms']:7.2f} ms  {rec['speed_vs_sdpa']:.2f}x", flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        name = "cpu-amx.json" if args.amx else "cpu-block-m.json" if rows else "cpu-dtypes.json"
        with open(os.path.join(args.out, name), "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
