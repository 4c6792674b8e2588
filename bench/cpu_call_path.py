"""Where a CPU attention call's time goes beside its kernel, on this machine, fp32 B=1 H=4 D=64.

    python bench/cpu_call_path.py [--seq 512] [--rounds 150] [--out DIR]

For full and causal attention, in random order each round (fresh inputs drawn once, never zeros):
`api`, a call through `ae.attention`; `kernel`, the compiled kernel called directly with the
call's tensors (its argument checks, its threads: what a call costs without the frontend);
`ranges`, the same kernel with its programs handed out from Python in ranges, one foreign call
per piece (`cpu_threads.run`) instead of claimed inside the kernel (`attn-cpu-claim-programs`);
`sdpa`, torch's scaled_dot_product_attention. Prints and writes (with `--out`) the medians, the
API's time over the kernel's, and each one's speed relative to SDPA (the median of per-round
ratios). torch's OpenMP wait policy is left as the environment has it (recorded).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import statistics

import sys  # noqa: E402

import torch  # noqa: E402

import ae_mlir as ae  # noqa: E402
from ae_mlir.backends import cpu, cpu_cache, cpu_threads  # noqa: E402
from harness import cpu_description  # noqa: E402

# The demo's mask and timer, so that both time the same thing.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
from causal_demo import _seconds, causal  # noqa: E402


def measure(seq: int, rounds: int, masked: bool) -> dict:
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, seq, 64, generator=gen) for _ in range(3))
    attn = ae.attention(mask_mod=causal if masked else None)
    attn(q, k, v)
    kernel = cpu.compile_module(attn.mlir(q, k, v))
    claiming = kernel._claiming

    def through_ranges():
        kernel._claiming = None
        try:
            kernel([q, k, v])
        finally:
            kernel._claiming = claiming

    calls = {"api": lambda: attn(q, k, v), "kernel": lambda: kernel([q, k, v]), "ranges": through_ranges,
             "sdpa": lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=masked)}
    want = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=masked)
    error = (attn(q, k, v).double() - want).abs().max().item()
    times = {name: [] for name in calls}
    names = list(calls)
    for _ in range(rounds):
        random.shuffle(names)
        for name in names:
            times[name].append(_seconds(calls[name]))
    medians = {name: statistics.median(t) * 1e3 for name, t in times.items()}
    speed = {name: statistics.median(s / t for s, t in zip(times["sdpa"], times[name])) for name in calls}
    return {"max_error_vs_float64": error, "median_ms": medians,
            "api_over_kernel_us": (medians["api"] - medians["kernel"]) * 1e3, "speed_vs_sdpa": speed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=150)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    results = {"command": f"python bench/cpu_call_path.py --seq {args.seq} --rounds {args.rounds}",
               "date": datetime.date.today().isoformat(), "machine": cpu_description(),
               "threads": cpu_threads.thread_count(), "vector_bits": cpu_cache.vector_bits(),
               "torch": torch.__version__, "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "unset")}
    for label, masked in (("full", False), ("causal", True)):
        results[label] = found = measure(args.seq, args.rounds, masked)
        m, s = found["median_ms"], found["speed_vs_sdpa"]
        print(f"{label:6s} L {args.seq}: api {m['api']:.3f} ms, kernel {m['kernel']:.3f}, ranges {m['ranges']:.3f}, "
              f"sdpa {m['sdpa']:.3f}; api over kernel {found['api_over_kernel_us']:.0f} us; vs SDPA api "
              f"{s['api']:.3f}x, kernel {s['kernel']:.3f}x, ranges {s['ranges']:.3f}x "
              f"(max error {found['max_error_vs_float64']:.1e})")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        path = os.path.join(args.out, f"cpu-call-path-{results['date']}-L{args.seq}.json")
        with open(path, "w") as f:
            json.dump(results, f, indent=1)
        print("wrote", path)


if __name__ == "__main__":
    main()
