"""Tile classification: which KV tiles each query block visits, with or without the mask.

For every (query block, KV tile) pair a mask is either empty (no pair kept: the tile is skipped),
full (every pair kept and the tile not ragged: no mask evaluation) or partial. The kernels walk
two lists per query block, partial tiles then full ones, stored as tables:

    partial_count [.., NM] i32, partial_index [.., NM, W] i32, full_count, full_index

This module needs only torch, so the runtime can classify masks that read closure tensors on the
tensors' own device at call time, as FlexAttention's BlockMask does; the compiler uses the same
code at compile time for masks that read only positions.
"""
from __future__ import annotations

from .core.block_tables import classify


_CACHE: dict = {}


def classify_cached(mask_mod, seq_q: int, seq_k: int, block_m: int, block_n: int, device) -> list:
    """Tables of a mask that reads closure tensors (not b or h), as kernel arguments.

    Cached per mask function, shape, device and the closure tensors' identities and versions, so
    calling the same attention again (the common case: same document ids for many layers) costs
    nothing; changing a closure tensor in place bumps its version and reclassifies.
    """
    import torch

    cells = [c.cell_contents for c in (getattr(mask_mod, "__closure__", None) or ())
             if isinstance(getattr(c, "cell_contents", None), torch.Tensor)]
    key = (mask_mod, seq_q, seq_k, block_m, block_n, str(device),
           tuple((id(t), t._version) for t in cells))
    tables = _CACHE.get(key)
    if tables is None:
        tables = classify(mask_mod, 1, 1, seq_q, seq_k, block_m, block_n, device, full_width=True)
        tables = [t.reshape(t.shape[2:]) for t in tables.tensors()]
        if len(_CACHE) > 64:
            _CACHE.clear()
        _CACHE[key] = tables
    return tables
