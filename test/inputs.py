"""Fresh random test inputs (seeded, never zeros) shared by the test suites."""
from __future__ import annotations

import torch


def rand(*shape, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float32).to(dtype)


def qkv(b=1, h=2, hkv=None, lq=17, lk=None, dk=16, dv=None, dtype=torch.float32, seed=0):
    """q [b, h, lq, dk], k [b, hkv, lk, dk], v [b, hkv, lk, dv]; hkv, lk and dv default to h, lq, dk."""
    hkv = h if hkv is None else hkv
    lk = lq if lk is None else lk
    dv = dk if dv is None else dv
    return (rand(b, h, lq, dk, seed=seed, dtype=dtype), rand(b, hkv, lk, dk, seed=seed + 1, dtype=dtype),
            rand(b, hkv, lk, dv, seed=seed + 2, dtype=dtype))
