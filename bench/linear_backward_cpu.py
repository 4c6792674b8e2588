"""Linear attention training step on this machine's CPU: forward + backward of
`ae.linear_attention` through the backward's kernel runs (`linear_kernel_backward`) against the
torch recomputation of the chunked recurrence that the reference backend differentiates
(`linear_backward`), fp32, the two called in turn, median of the rounds; gradients compared.

    python bench/linear_backward_cpu.py [--batch 1 --heads 4 --seq 1024 --dim 64 --rounds 7] [--out DIR]

Sets OMP_WAIT_POLICY=PASSIVE unless the environment sets it (see examples/causal_demo.py).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

import ae_mlir as ae  # noqa: E402
from ae_mlir.frontend import linear_kernel_backward  # noqa: E402
from harness import cpu_description  # noqa: E402

DECAYS = ("head", "token", "token_dim")


def _inputs(decay, b, h, length, d):
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(b, h, length, d, generator=gen).requires_grad_() for _ in range(3))
    shape = {"head": (h,), "token": (b, h, length), "token_dim": (b, h, length, d)}[decay]
    g = (-0.5 * torch.rand(shape, generator=gen) - 0.01).requires_grad_()
    return q, k, v, g, torch.randn(b, h, length, d, generator=gen)


def _seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", default=None, help="write linear-backward-cpu.json here")
    args = parser.parse_args()
    kernels_apply = linear_kernel_backward.applies
    doc = {"cpu": cpu_description(), "threads": torch.get_num_threads(),
           "torch": torch.__version__, "omp_wait_policy": os.environ["OMP_WAIT_POLICY"],
           "shape": vars(args), "cases": []}
    for decay in DECAYS:
        q, k, v, g, d_out = _inputs(decay, args.batch, args.heads, args.seq, args.dim)
        lin = ae.linear_attention(decay=decay)

        def step():
            return torch.autograd.grad(lin(q, k, v, g), (q, k, v, g), d_out)

        def recomputed():
            linear_kernel_backward.applies = lambda call, x: False
            try:
                return step()
            finally:
                linear_kernel_backward.applies = kernels_apply

        ours, theirs = step(), recomputed()
        rounds = [(_seconds(step), _seconds(recomputed)) for _ in range(args.rounds)]
        rec = {"decay": decay, "kernels_ms": 1e3 * statistics.median(a for a, _ in rounds),
               "recomputation_ms": 1e3 * statistics.median(b for _, b in rounds),
               "speedup": statistics.median(b / a for a, b in rounds),
               "max_rel_grad_diff": [float((a - b).abs().max() / b.abs().max()) for a, b in zip(ours, theirs)]}
        doc["cases"].append(rec)
        print(f"{decay:10s} kernels {rec['kernels_ms']:8.1f} ms  torch recomputation {rec['recomputation_ms']:8.1f} ms"
              f"  {rec['speedup']:.1f}x  (gradients within {max(rec['max_rel_grad_diff']):.1e})", flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "linear-backward-cpu.json"), "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
