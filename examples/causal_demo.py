"""The main job on a small CPU default: causal attention compiled by ae-mlir, checked and timed.

Prints the L0 `attn` module, the tiled L1 kernel's loop structure, then runs the compiled kernel
on CPU tensors, compares it with PyTorch and prints the time of both.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import ae_mlir as ae


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def _median_seconds(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--backend", default=None, help="cpu (default for CPU tensors) or reference")
    args = parser.parse_args()

    torch.manual_seed(0)
    shape = (args.batch, args.heads, args.seq, args.dim)
    q, k, v = (torch.randn(shape) for _ in range(3))
    attn = ae.attention(mask_mod=causal)
    text = attn.mlir(q, k, v)
    print(f"L0 attn module for causal attention {shape}, fp32 ({len(text.splitlines())} lines):")
    print("\n".join(text.splitlines()[:6]) + "\n  ...")

    out = attn(q, k, v, backend=args.backend)
    expected = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
    error = (out.double() - expected).abs().max().item()
    print(f"max |ae-mlir - torch float64| = {error:.2e}")
    if not error < 1e-4:
        raise SystemExit("mismatch against PyTorch")

    flops = 4 * args.batch * args.heads * args.seq * args.seq * args.dim * 0.5
    t_ae = _median_seconds(lambda: attn(q, k, v, backend=args.backend), args.repeats)
    t_torch = _median_seconds(
        lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True), args.repeats)
    print(f"ae-mlir    : {t_ae * 1e3:9.2f} ms  {flops / t_ae / 1e9:7.2f} GFLOP/s")
    print(f"torch SDPA : {t_torch * 1e3:9.2f} ms  {flops / t_torch / 1e9:7.2f} GFLOP/s")


if __name__ == "__main__":
    main()
