"""Where a short decoding call's time goes: the wall time of `runtime.launch` per call, the GPU
time of the same kernels replayed from a CUDA graph, and a profile of the Python launch path.

    python bench/launch_overhead.py build --out bench/bundles/launch     # here
    python bench/launch_overhead.py run --bundles bench/bundles/launch --out DIR   # on the GPU
"""
from __future__ import annotations

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import harness  # noqa: E402

HEADS, KV_HEADS, DIM = 32, 8, 128
CASES = [(1, 8192, False), (1, 8192, True)]  # (batch, Lk, with kv_len)


def _name(batch, seq, lengths) -> str:
    return f"b{batch}_l{seq}" + ("_kv_len" if lengths else "")


def build(out: str) -> None:
    import torch

    import ae_mlir as ae
    from ae_mlir.backends import triton as tb

    os.makedirs(out, exist_ok=True)
    for batch, seq, lengths in CASES:
        q = torch.empty(batch, HEADS, 1, DIM, dtype=torch.bfloat16, device="meta")
        kv = torch.empty(batch, KV_HEADS, seq, DIM, dtype=torch.bfloat16, device="meta")
        n = torch.empty(batch, dtype=torch.int32, device="meta") if lengths else None
        bundle = tb.compile_bundle(ae.attention(), q, kv, kv, target="cuda:90", kv_len=n)
        bundle.save(os.path.join(out, _name(batch, seq, lengths) + ".json"))


def run(bundles: str, out_dir: str) -> None:
    import torch
    import triton

    from ae_mlir import runtime

    os.makedirs(out_dir, exist_ok=True)
    results = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
               "cases": []}
    for batch, seq, lengths in CASES:
        name = _name(batch, seq, lengths)
        bundle = runtime.Bundle.load(os.path.join(bundles, name + ".json"))
        q = torch.randn(batch, HEADS, 1, DIM, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(batch, KV_HEADS, seq, DIM, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        extra = [torch.full((batch,), seq, dtype=torch.int32, device="cuda")] if lengths else []

        def call():
            return runtime.launch(bundle, q, k, v, *extra)

        call()
        torch.cuda.synchronize()
        wall = triton.testing.do_bench(call, warmup=50, rep=300, return_mode="median")
        host = harness.host_profile(call, calls=2000)
        gpu = triton.testing.do_bench(harness.graphed(call), warmup=50, rep=300, return_mode="median")
        rec = {"case": name, "wall_us": wall * 1e3, "host_loop_us": host["host_us"], "graph_replay_us": gpu * 1e3,
               "profile": host["top"]}
        results["cases"].append(rec)
        print(json.dumps({key: value for key, value in rec.items() if key != "profile"}), flush=True)
        print(json.dumps(rec["profile"]), flush=True)
    harness.save(results, out_dir, "launch_overhead.json")


def main(argv=None) -> int:
    return harness.main(__doc__, build, run, "launch", argv)


if __name__ == "__main__":
    sys.exit(main())
