"""Score mods on the CPU: ae-mlir's kernels for plain causal attention, ALiBi, a relative-bias table,
T5's bucketed bias, a cosine of the distance and soft-capping, fp32 B=1 H=4 L=1024 D=64, beside
eager torch (the scores materialized, the mod applied, masked softmax, P V) on the same cores,
forward alone and forward + backward. T5 is also called with per-entry lengths (all of them L),
and the table and T5 are also read at the queries' positions in a cache (q_idx + offset[b], the
offsets 0 here): not a function of the distance alone, so the frontend does not compose them per
distance, and the kernels read the table stepping back along the keys and T5 with a log per
score.

    python bench/cpu_mods.py [--rounds 15] [--cases causal,t5,...] [--out DIR]

Every case compiles once (a warm call), then in each round each implementation runs on fresh
random inputs (never zeros), the cases in turn; printed and written (with `--out`): the medians in
ms and eager torch's time over ae-mlir's. The backward takes a random dO. torch's OpenMP wait
policy is left as the environment has it (recorded).
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import subprocess
import time

import torch

import ae_mlir as ae
from ae_mlir.variants import T5_BUCKETS, T5_MAX_DISTANCE
from harness import cpu_description

HEADS, SEQ, DIM = 4, 1024, 64


def _cases() -> dict:
    gen = torch.Generator().manual_seed(0)
    slopes = torch.rand(HEADS, generator=gen)
    table = torch.randn(HEADS, 2 * SEQ - 1, generator=gen)
    rows = torch.arange(SEQ)
    distance = rows.view(1, -1) - rows.view(-1, 1)  # kv_idx - q_idx
    causal = lambda b, h, i, j: i >= j  # noqa: E731
    relative = (lambda s, b, h, i, j: s + table[h, i - j + SEQ - 1], lambda s: s + table[:, (SEQ - 1 - distance)])
    buckets = torch.randn(HEADS, T5_BUCKETS, generator=gen)
    half, exact = T5_BUCKETS // 2, T5_BUCKETS // 4

    def t5_bucket(distance):
        n = distance.abs()
        far = exact + (torch.log(torch.clamp(n, min=1) / exact) / math.log(T5_MAX_DISTANCE / exact)
                       * (half - exact) + 1e-4).long()
        return torch.where(distance > 0, half, 0) + torch.where(n < exact, n, torch.clamp(far, max=half - 1))

    t5 = (lambda s, b, h, i, j: s + buckets[h, t5_bucket(j - i)], lambda s: s + buckets[:, t5_bucket(distance)])
    offset = torch.zeros(1, dtype=torch.int64)
    return {
        "causal": (None, lambda s: s, {}),
        "alibi": (lambda s, b, h, i, j: s + slopes[h] * (j - i), lambda s: s + slopes.view(-1, 1, 1) * distance, {}),
        "relative_bias": (*relative, {}),
        "relative_bias_offset": (lambda s, b, h, i, j: s + table[h, i + offset[b] - j + SEQ - 1], relative[1], {}),
        "t5": (*t5, {}),
        "t5_lengths": (*t5, {"kv_len": torch.full((1,), SEQ, dtype=torch.int32)}),
        "t5_offset": (lambda s, b, h, i, j: s + buckets[h, t5_bucket(j - i - offset[b])], t5[1], {}),
        "cosine": (lambda s, b, h, i, j: s + 0.5 * torch.cos(0.05 * (j - i)),
                   lambda s: s + 0.5 * torch.cos(0.05 * distance), {}),
        "softcap": (lambda s, b, h, i, j: 30.0 * torch.tanh(s / 30.0), lambda s: 30.0 * torch.tanh(s / 30.0), {}),
    }, causal, rows.view(-1, 1) >= rows.view(1, -1)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--out", default=None)
    parser.add_argument("--cases", default=None, help="comma-separated case names (default: all)")
    args = parser.parse_args(argv)
    cases, causal, mask = _cases()
    if args.cases:
        unknown = set(args.cases.split(",")) - set(cases)
        if unknown:
            parser.error(f"unknown cases {', '.join(sorted(unknown))}; the cases are {', '.join(cases)}")
        cases = {name: case for name, case in cases.items() if name in args.cases.split(",")}
    impls = {}
    for name, (score_mod, eager_mod, call_args) in cases.items():
        attn = ae.attention(score_mod=score_mod, mask_mod=causal)

        def eager(q, k, v, eager_mod=eager_mod):
            s = eager_mod((q @ k.transpose(-1, -2)) * DIM ** -0.5)
            return torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1) @ v

        impls[name] = {"ae_mlir": lambda q, k, v, attn=attn, args=call_args: attn(q, k, v, backend="cpu", **args),
                       "torch_eager": eager}
    times = {(case, impl, part): [] for case in impls for impl in ("ae_mlir", "torch_eager")
             for part in ("forward", "forward_backward")}
    for round_ in range(args.rounds + 1):
        for case, pair in impls.items():
            for impl, fn in pair.items():
                q, k, v = (torch.randn(1, HEADS, SEQ, DIM, requires_grad=True) for _ in range(3))
                d_out = torch.randn(1, HEADS, SEQ, DIM)
                start = time.perf_counter()
                with torch.no_grad():
                    fn(q, k, v)
                middle = time.perf_counter()
                fn(q, k, v).backward(d_out)
                end = time.perf_counter()
                if round_:  # the first round compiles and warms up
                    times[(case, impl, "forward")].append((middle - start) * 1e3)
                    times[(case, impl, "forward_backward")].append((end - middle) * 1e3)
    rows = []
    for case in impls:
        for part in ("forward", "forward_backward"):
            ours = statistics.median(times[(case, "ae_mlir", part)])
            eager = statistics.median(times[(case, "torch_eager", part)])
            rows.append({"case": case, "part": part, "ae_mlir_ms": ours, "torch_eager_ms": eager,
                         "speed_vs_eager": eager / ours})
            print(f"{case:21s} {part:17s} ae-mlir {ours:7.2f} ms  eager torch {eager:7.2f} ms  {eager / ours:5.2f}x")
    if args.out:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
        doc = {"date": datetime.date.today().isoformat(), "machine": cpu_description(), "torch": torch.__version__,
               "torch_threads": torch.get_num_threads(), "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "unset"),
               "commit": commit, "rounds": args.rounds, "method": __doc__, "cases": rows,
               "ms": {"/".join(key): t for key, t in times.items()}}
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "cpu-mods.json"), "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
