"""Which tiles each of `attn-tile-backward`'s kernels walks, and which of them with the mask:
the compile-time classification's lists, adjusted for ragged edges, and transposed for the dK/dV
kernel."""
from __future__ import annotations


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


def transposed(lists: list[list[int]], nn: int) -> list[list[int]]:
    out = [[] for _ in range(nn)]
    for m, row in enumerate(lists):
        for n in row:
            out[n].append(m)
    return out
