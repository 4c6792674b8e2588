"""Tile classification: which KV tiles each query block visits, with or without the mask.

For every (query block, KV tile) pair a mask is either empty (no pair kept: the tile is skipped),
full (every pair kept and the tile not ragged: no mask evaluation) or partial. The kernels walk
two lists per query block, partial tiles then full ones, stored as tables:

    partial_count [.., NM] i32, partial_index [.., NM, W] i32, full_count, full_index

A mask read at call time that also reads the batch or head index has a table per batch entry or
head: the tables take two leading axes, [B or 1, H or 1] (`table_lead`), which the kernels index
with their program's entry and head. FlexAttention's BlockMask has the same axes.

It needs only torch: the tile pass classifies positional masks with it at compile time, and the
runtime (`ae_mlir.block_mask`) masks that read closure tensors at call time, on the tensors' own
device, as FlexAttention's BlockMask does.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BlockTables:
    partial_count: object  # torch.int32 [Bt, Ht, NM]
    partial_index: object  # torch.int32 [Bt, Ht, NM, W]
    full_count: object
    full_index: object

    def as_lists(self) -> tuple[list[list[int]], list[list[int]]]:
        """(partial, full) block lists of the first (b, h) slice, for compile-time tables."""
        def lists(count, index):
            return [index[0, 0, m, : int(count[0, 0, m])].tolist() for m in range(count.shape[2])]

        return lists(self.partial_count, self.partial_index), lists(self.full_count, self.full_index)

    def tensors(self) -> list:
        return [self.partial_count, self.partial_index, self.full_count, self.full_index]


def table_lead(reads_batch: bool, reads_head: bool, batch: int, heads: int) -> list[int]:
    """The leading axes of a call-time mask's tables: none for a mask of positions and closure
    tensors alone (one table for every program), else [B or 1, H or 1] as it reads b and h. The
    kernels' argument types and the runtime's classification both follow this rule."""
    if not (reads_batch or reads_head):
        return []
    return [batch if reads_batch else 1, heads if reads_head else 1]


def _pack(flags, device, full_width: bool):
    """Per-row block lists from a [Bt, Ht, NM, NN] bool tensor, as (count, index) tables; the
    index table is NN wide with `full_width` (a kernel's fixed argument shape), else as narrow as
    the longest list."""
    import torch

    count = flags.sum(dim=-1, dtype=torch.int32)
    width = flags.shape[-1] if full_width else max(1, int(count.max()) if count.numel() else 1)
    # Stable sort puts the chosen block numbers first, in increasing order.
    order = torch.argsort((~flags).to(torch.int8), dim=-1, stable=True)[..., :width]
    index = torch.where(torch.arange(width, device=device) < count.unsqueeze(-1), order,
                        torch.zeros_like(order)).to(torch.int32)
    return count.contiguous(), index.contiguous()


# The most mask entries (b, h, query, key) one evaluation of `keep` covers. A query block at a
# time launched a few dozen torch kernels per block, so classifying took 29 ms at L 8192 on an
# H200 (64 blocks of 128 rows), where the work itself is a few passes over 67M entries; at this
# budget the int64 index intermediates of one evaluation take 128 MiB.
GRID_BUDGET = 1 << 24


def _word(block_n: int):
    """(bytes, torch dtype) of the widest integer whose bytes a row of block_n flags divides into."""
    import torch

    width = next(w for w in (8, 4, 2, 1) if block_n % w == 0)
    return width, {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}[width]


def classify(keep, batch: int, heads: int, seq_q: int, seq_k: int, block_m: int, block_n: int,
             device="cpu", full_width: bool = False, layout: str = "forward", known=None) -> BlockTables:
    """Classify tiles of the mask `keep(b, h, q_idx, kv_idx) -> bool tensor`: `tile_flags`, then
    `tables_from_flags` at the same blocks."""
    flags = tile_flags(keep, batch, heads, seq_q, seq_k, block_m, block_n, device, known)
    return tables_from_flags(flags, (block_m, block_n), seq_q, seq_k, block_m, block_n, full_width, layout)


def tile_flags(keep, batch: int, heads: int, seq_q: int, seq_k: int, block_m: int, block_n: int,
               device="cpu", known=None) -> tuple:
    """(any_kept, all_kept): bool [batch, heads, NM, NN], whether the mask `keep(b, h, q_idx,
    kv_idx) -> bool tensor` keeps any and every pair of each block_m x block_n tile; positions
    past the lengths count for neither (a ragged last KV tile may read all_kept: the tables
    decide what ragged tiles are).

    `keep` is called on broadcastable int64 index tensors, over as many whole query blocks of
    rows at once as GRID_BUDGET allows (at least one; a ragged last block alone), and over slabs
    of the batch entries and heads where one block of rows of all of them would exceed it, so
    memory stays O(max(GRID_BUDGET, block_m * seq_k)). `batch` / `heads` of 1 mean the mask does
    not depend on that index.

    `known` = (always, never), bool [batch, heads, NM, NN] tiles the mask is known to keep every
    pair of or none of (`core.interval_eval.tile_bounds`): then only the other tiles are
    evaluated, element by element.
    """
    import torch

    nm, nn = -(-seq_q // block_m), -(-seq_k // block_n)
    if known is not None:
        always, never = known
        any_kept, all_kept = ~never, always.clone()
        _classify_open(keep, ~(always | never), any_kept, all_kept, seq_q, seq_k, (block_m, block_n))
        return any_kept, all_kept
    any_kept = torch.zeros(batch, heads, nm, nn, dtype=torch.bool, device=device)
    all_kept = torch.zeros_like(any_kept)
    kv = torch.arange(seq_k, device=device).view(1, 1, 1, seq_k)
    row_entries = block_m * max(seq_k, 1)
    per_head = max(1, min(heads, GRID_BUDGET // row_entries))
    per_entry = max(1, min(batch, GRID_BUDGET // (per_head * row_entries))) if per_head == heads else 1
    for b0 in range(0, batch, per_entry):
        for h0 in range(0, heads, per_head):
            b = torch.arange(b0, min(b0 + per_entry, batch), device=device).view(-1, 1, 1, 1)
            h = torch.arange(h0, min(h0 + per_head, heads), device=device).view(1, -1, 1, 1)
            slab = (slice(b0, b0 + per_entry), slice(h0, h0 + per_head))
            _classify_slab(keep, b, h, kv, seq_q, (block_m, block_n), any_kept[slab], all_kept[slab])
    return any_kept, all_kept


def pool_flags(flags: tuple, factor_m: int, factor_n: int) -> tuple:
    """`tile_flags` of tiles factor_m x factor_n times as large, from those of the small ones: a
    tile keeps some pair where one of its small tiles does, every pair where all of them do
    (small tiles past the grid's edge count for neither, as positions past the lengths do)."""
    import torch

    any_kept, all_kept = flags
    if factor_m == factor_n == 1:
        return flags
    *lead, nm, nn = any_kept.shape
    big_m, big_n = -(-nm // factor_m), -(-nn // factor_n)
    pad = (0, big_n * factor_n - nn, 0, big_m * factor_m - nm)
    shape = (*lead, big_m, factor_m, big_n, factor_n)
    any_big = torch.nn.functional.pad(any_kept, pad, value=False).view(shape).any(dim=5).any(dim=3)
    all_big = torch.nn.functional.pad(all_kept, pad, value=True).view(shape).all(dim=5).all(dim=3)
    return any_big, all_big


def tables_from_flags(flags: tuple, flag_blocks: tuple[int, int], seq_q: int, seq_k: int, block_m: int,
                      block_n: int, full_width: bool = False, layout: str = "forward") -> BlockTables:
    """The tables of block_m x block_n tiles from `tile_flags` taken at `flag_blocks` (which
    divide block_m and block_n: one evaluation of a mask serves the forward's tiles and both
    backward kernels').

    `layout` "forward" lists KV blocks per query block, a ragged last KV tile partial; the
    backward kernels' "dq" also makes the tiles of a ragged last query block partial (their
    masked form drops the padded rows), and "dkdv" lists those per KV block instead (NM and NN
    swapped in the tables).
    """
    if layout not in ("forward", "dq", "dkdv"):
        raise ValueError(f"layout must be forward, dq or dkdv, got {layout!r}")
    if block_m % flag_blocks[0] or block_n % flag_blocks[1]:
        raise ValueError(f"tiles {block_m}x{block_n} are not made of the flags' {flag_blocks[0]}x{flag_blocks[1]}")
    any_kept, all_kept = pool_flags(flags, block_m // flag_blocks[0], block_n // flag_blocks[1])
    device = any_kept.device
    nm, nn = any_kept.shape[-2:]
    all_kept = all_kept.clone()
    if seq_k % block_n:
        all_kept[..., nn - 1] = False
    if layout != "forward" and seq_q % block_m:
        all_kept[..., nm - 1, :] = False
    full = any_kept & all_kept
    partial = any_kept & ~all_kept
    if layout == "dkdv":
        full, partial = full.transpose(-1, -2).contiguous(), partial.transpose(-1, -2).contiguous()
    pc, pi = _pack(partial, device, full_width)
    fc, fi = _pack(full, device, full_width)
    return BlockTables(pc, pi, fc, fi)


def _classify_open(keep, open_tiles, any_kept, all_kept, seq_q: int, seq_k: int, blocks: tuple[int, int]) -> None:
    """Fill `any_kept` / `all_kept` at the `open_tiles` ([B, H, NM, NN] bool) by evaluating the
    mask on each one's pairs, as many tiles a pass as GRID_BUDGET allows; positions past the
    lengths (a ragged last block) count for neither."""
    import torch

    block_m, block_n = blocks
    coords = open_tiles.nonzero()
    device = open_tiles.device
    rows = torch.arange(block_m, device=device).view(1, -1, 1)
    cols = torch.arange(block_n, device=device).view(1, 1, -1)
    per_pass = max(1, GRID_BUDGET // (block_m * block_n))
    for start in range(0, coords.shape[0], per_pass):
        tile = coords[start:start + per_pass]
        b, h, m, n = (tile[:, i].view(-1, 1, 1) for i in range(4))
        q, kv = m * block_m + rows, n * block_n + cols
        inside = (q < seq_q) & (kv < seq_k)
        kept = torch.as_tensor(keep(b, h, q.clamp(max=seq_q - 1), kv.clamp(max=seq_k - 1)), device=device)
        kept = kept.to(torch.bool)
        where = tuple(tile.T)
        any_kept[where] = (kept & inside).flatten(1).any(dim=1)
        all_kept[where] = (kept | ~inside).flatten(1).all(dim=1)


def _classify_slab(keep, b, h, kv, seq_q: int, blocks: tuple[int, int], any_kept, all_kept) -> None:
    """Fill `any_kept` / `all_kept` ([len(b), len(h), NM, NN] views) for the entries `b` and heads
    `h` (index tensors), as many whole query blocks of rows a pass as GRID_BUDGET allows."""
    import torch

    block_m, block_n = blocks
    entries, heads, nm, nn = any_kept.shape
    seq_k = kv.shape[-1]
    per_pass = max(1, GRID_BUDGET // (entries * heads * block_m * max(seq_k, 1)))
    whole = seq_q // block_m
    passes = [(m, min(per_pass, whole - m), block_m) for m in range(0, whole, per_pass)]
    if whole < nm:
        passes.append((whole, 1, seq_q - whole * block_m))
    # Up to 8 flags at a time, as the bytes of one integer: element-wise any/all over the bools
    # took most of the classification's time (on a CPU twice the mask's own evaluation).
    width, dtype = _word(block_n)
    all_set = int.from_bytes(b"\x01" * width, "little")
    for m, count, rows in passes:
        first = m * block_m
        q = torch.arange(first, first + count * rows, device=kv.device).view(1, 1, count * rows, 1)
        kept = torch.as_tensor(keep(b, h, q, kv), device=kv.device).to(torch.bool)
        kept = kept.expand(entries, heads, count * rows, seq_k)
        padded = torch.zeros(entries, heads, count * rows, nn * block_n, dtype=torch.bool, device=kv.device)
        padded[..., :seq_k] = kept
        words = padded.view(dtype).view(entries, heads, count, rows, nn, block_n // width)
        any_kept[:, :, m:m + count] = (words != 0).any(dim=5).any(dim=3)
        all_kept[:, :, m:m + count] = (words == all_set).all(dim=5).all(dim=3)


def cut_per_block(tables: BlockTables) -> float:
    """The tiles the mask cuts (partial tiles, which evaluate it per element) per query block that
    visits any: a causal diagonal cuts 2 of its 128 x 64 tiles, a band's two edges 4."""
    visits = int(((tables.partial_count + tables.full_count) > 0).sum())
    return float(tables.partial_count.sum()) / visits if visits else 0.0


def unmasked(seq_q: int, seq_k: int, block_m: int, block_n: int, device="cpu") -> BlockTables:
    """Tables without a mask: every tile full, except a ragged last KV tile (bounds only)."""
    import torch

    return classify(lambda b, h, q, kv: torch.ones((), dtype=torch.bool), 1, 1, seq_q, seq_k,
                    block_m, block_n, device)
