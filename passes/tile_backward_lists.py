"""Which tiles each of `attn-tile-backward`'s kernels walks, and which of them with the mask:
the compile-time classification's lists, adjusted for ragged edges and packed sequences."""
from __future__ import annotations

from .tile_tables import Classification


def ragged_partial(partial: list[list[int]], full: list[list[int]], lq: int, lk: int, bm: int, bn: int):
    """The lists with every tile on a ragged edge (last query or KV block cut short) moved to partial."""
    nm, nn = len(partial), -(-lk // bn)
    ragged_m = lq % bm != 0
    ragged_n = lk % bn != 0
    new_partial, new_full = [], []
    for m in range(nm):
        edge = [n for n in full[m] if (ragged_m and m == nm - 1) or (ragged_n and n == nn - 1)]
        new_partial.append(sorted(partial[m] + edge))
        new_full.append([n for n in full[m] if n not in edge])
    return new_partial, new_full


def packed_whole(classification: Classification, bm: int, bn: int, part: str):
    """A packed sequence's tile lists: the mask's whole tiles stay whole (no mask, no bounds)
    where the sequence's end cannot change their gradients, for softmax without a score_mod.
    Rows past the end load as zeros (q, dO, lse and delta alike), so their every pair has
    P = exp2(0) = 1 and dS = 1 * (0 - 0) = 0: the dK/dV kernel's whole tiles add exactly nothing for
    them, and its own keys past the end are never stored. The dQ kernel's keys past the end
    could meet an overflowing P (exp2 of minus a very negative lse) times a zero key, NaN, so there
    a whole tile stays whole only if it ends before the query block begins; for a query block
    holding rows of the sequence every such key lies inside it."""
    if part == "dkdv":
        return classification.partial, classification.full
    partial, full = [], []
    for m, (cut, whole) in enumerate(zip(classification.partial, classification.full)):
        before = [n for n in whole if (n + 1) * bn <= m * bm]
        partial.append(sorted(cut + [n for n in whole if n not in before]))
        full.append(before)
    return partial, full


def transposed(lists: list[list[int]], nn: int) -> list[list[int]]:
    out = [[] for _ in range(nn)]
    for m, row in enumerate(lists):
        for n in row:
            out[n].append(m)
    return out
