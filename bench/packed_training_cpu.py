"""A training step's attention on a packed batch through the CPU backend: forward and backward of a
prefix-LM mask whose prefix is a closure tensor per sequence (fp32, four sequences of L tokens,
H 4, D 64), fresh random inputs per step, the median of 10 steps after a warm-up step (which
compiles). Run it under two builds alternately to compare them:

    for tree in OLD NEW; do PYTHONPATH=$tree python bench/packed_training_cpu.py 1024 [--fresh-offsets]; done

`--fresh-offsets` gives every step a new offsets tensor (the same lengths), as a training loop's
new batches have them: the tile tables are classified at every step.
"""
from __future__ import annotations

import statistics
import sys
import time


def main(argv=None) -> int:
    import torch

    import ae_mlir as ae

    argv = sys.argv[1:] if argv is None else argv
    fresh = "--fresh-offsets" in argv
    argv = [a for a in argv if a != "--fresh-offsets"]
    length = int(argv[0]) if argv else 1024
    sequences, heads, dim = 4, 4, 64
    torch.manual_seed(0)
    prefix = torch.tensor([length // 4, 0, length // 2, 17])
    attn = ae.attention(mask_mod=lambda b, h, q_idx, kv_idx: (kv_idx <= q_idx) | (kv_idx < prefix[b]), layout="blhd")
    offsets = torch.arange(0, sequences + 1, dtype=torch.int32) * length

    def step():
        q, k, v = (torch.randn(sequences * length, heads, dim, requires_grad=True) for _ in range(3))
        cu = offsets.clone() if fresh else offsets
        out = attn(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, backend="cpu")
        out.backward(torch.randn_like(out))

    step()
    times = []
    for _ in range(10):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    print(f"packed prefix-LM forward + backward, 4 x {length}{', fresh offsets' if fresh else ''}: "
          f"{statistics.median(times) * 1e3:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
