"""The main job on a small CPU default: causal attention compiled by ae-mlir, checked and timed.

Prints the start of the L0 `attn` module, runs the compiled kernel on CPU tensors, compares it
with PyTorch in float64, then times causal and full (unmasked) attention against torch's
scaled_dot_product_attention on the same tensors and cores: the two are called in turn,
`--repeats` times, and the medians and the median of the per-round ratios are printed.

The kernels run on torch's own OpenMP threads (`ae_mlir.backends.cpu_threads`), so the demo
leaves torch's wait policy as the environment has it (unset: libgomp's threads spin a while after
each call) and prints it.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

import ae_mlir as ae


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def _seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _compare(name: str, attn, is_causal: bool, q, k, v, args) -> None:
    """Check `attn` against torch in float64, then time it and SDPA alternately."""
    out = attn(q, k, v, backend=args.backend)
    expected = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(),
                                                                is_causal=is_causal)
    error = (out.double() - expected).abs().max().item()
    print(f"{name}: max |ae-mlir - torch float64| = {error:.2e}")
    if not error < 1e-4:
        raise SystemExit(f"{name}: mismatch against PyTorch")

    def ours():
        attn(q, k, v, backend=args.backend)

    def sdpa():
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=is_causal)

    sdpa()
    rounds = [(_seconds(ours), _seconds(sdpa)) for _ in range(args.repeats)]
    t_ae = statistics.median(a for a, _ in rounds)
    t_torch = statistics.median(t for _, t in rounds)
    ratio = statistics.median(t / a for a, t in rounds)
    flops = 4 * q.shape[0] * q.shape[1] * q.shape[2] * k.shape[2] * q.shape[3] * (0.5 if is_causal else 1.0)
    print(f"  ae-mlir    : {t_ae * 1e3:9.2f} ms  {flops / t_ae / 1e9:7.2f} GFLOP/s")
    print(f"  torch SDPA : {t_torch * 1e3:9.2f} ms  {flops / t_torch / 1e9:7.2f} GFLOP/s")
    print(f"  speed vs SDPA (median of {args.repeats} rounds): {ratio:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--backend", default=None, help="cpu (default for CPU tensors) or reference")
    args = parser.parse_args()

    torch.manual_seed(0)
    shape = (args.batch, args.heads, args.seq, args.dim)
    q, k, v = (torch.randn(shape) for _ in range(3))
    attn = ae.attention(mask_mod=causal)
    text = attn.mlir(q, k, v)
    print(f"L0 attn module for causal attention {shape}, fp32 ({len(text.splitlines())} lines):")
    print("\n".join(text.splitlines()[:6]) + "\n  ...")
    print(f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}, torch threads {torch.get_num_threads()}")
    _compare("causal", attn, True, q, k, v, args)
    _compare("full", ae.attention(), False, q, k, v, args)


if __name__ == "__main__":
    main()
