"""Past 2^31 elements: one causal attention whose q, k, v and out each hold 2^31 elements, run from
a bundle, checked against a chunked float32 reference on sampled heads, and run twice to check
that the GPU path is deterministic (bit-identical outputs).

    python bench/large_offsets.py --build bench/bundles/large.json      # here (MLIR, no GPU)
    python bench/large_offsets.py --run bench/bundles/large.json --out DIR   # on the GPU
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SHAPE = (8, 32, 65536, 128)  # 2^31 elements per tensor


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def build(path: str) -> None:
    import torch

    import ae_mlir as ae
    from ae_mlir.backends.triton import compile_bundle

    meta = torch.empty(SHAPE, dtype=torch.bfloat16, device="meta")
    compile_bundle(ae.attention(mask_mod=causal), meta, meta, meta).save(path)


def run(path: str, out_dir: str) -> None:
    import torch
    import triton

    from ae_mlir import runtime

    bundle = runtime.Bundle.load(path)
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(SHAPE, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
    assert q.numel() >= 2**31
    out, lse = runtime.launch(bundle, q, k, v)
    again, _ = runtime.launch(bundle, q, k, v)
    torch.cuda.synchronize()
    errors = []
    # The last batch and head sit past 2^31 elements from the base pointer: check them and others.
    for b, h in ((SHAPE[0] - 1, SHAPE[1] - 1), (SHAPE[0] // 2, 3), (0, 0)):
        rows = torch.arange(SHAPE[2] - 512, SHAPE[2], device="cuda")
        s = (q[b, h, rows].float() @ k[b, h].float().T) / SHAPE[3] ** 0.5
        s = s.masked_fill(rows[:, None] < torch.arange(SHAPE[2], device="cuda")[None, :], float("-inf"))
        ref = torch.softmax(s, dim=-1) @ v[b, h].float()
        errors.append(float((out[b, h, rows].float() - ref).abs().max()))
    record = {
        "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "shape": list(SHAPE),
        "elements_per_tensor": q.numel(), "max_abs_err_sampled": max(errors),
        "deterministic": bool(torch.equal(out, again)),
        "ms": triton.testing.do_bench(lambda: runtime.launch(bundle, q, k, v, out=out, lse=lse)),
    }
    print(json.dumps(record))
    with open(os.path.join(out_dir, "large_offsets.json"), "w") as f:
        json.dump(record, f, indent=1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build")
    p.add_argument("--run")
    p.add_argument("--out", default=".")
    args = p.parse_args()
    if args.build:
        build(args.build)
    if args.run:
        run(args.run, args.out)


if __name__ == "__main__":
    main()
