"""How a kernel's programs fill a GPU of `multiprocessors` programs at once (one a multiprocessor):
the share of the last wave a grid leaves idle, and for causal attention the time of the most
loaded multiprocessor under the two grids attn-lower-to-gluon builds.

The model counts key tiles: a causal query block's program visits as many as its block index + 1,
a full one all of them. The per-block grid is started in order and each program goes to the
first free multiprocessor (the hardware's scheduler, greedy); its causal programs are ordered as
the pass orders them, every head's heaviest block first across sections of heads that fill the
GPU (`section_heads`). The persistent grid's programs take fixed items: program p the p-th item of
even rounds and the p-th from the end of odd ones, over items ordered head by head, each head's
blocks longest first (passes/gluon/attention_forward.py `_round_item`, pipeline.query_item).
"""
from __future__ import annotations

import heapq


def section_heads(wave: int, blocks: int, batch_heads: int) -> int:
    """The heads of a section attn-lower-to-triton and attn-lower-to-gluon order causal programs
    in: the least power of two of heads whose `blocks` programs each fill `wave` programs, at most
    the `batch_heads` there are; 1 (head after head) without a wave."""
    if not wave:
        return 1
    heads = 1
    while heads * blocks < wave:
        heads *= 2
    return min(heads, batch_heads)


def wave_fill(programs: int, multiprocessors: int) -> float:
    """The share of its waves' slots a grid of `programs` equal programs keeps busy."""
    waves = -(-programs // multiprocessors)
    return programs / (waves * multiprocessors)


def per_block_makespan(batch_heads: int, blocks: int, multiprocessors: int) -> int:
    """The causal per-block grid's longest multiprocessor, in key tiles (greedy, sectioned order)."""
    section = section_heads(multiprocessors, blocks, batch_heads)
    loads = [0] * multiprocessors
    for first in range(0, batch_heads, section):
        count = min(section, batch_heads - first)
        for rank in range(blocks):
            for _ in range(count):
                heapq.heapreplace(loads, loads[0] + blocks - rank)
    return max(loads)


def persistent_makespan(batch_heads: int, blocks: int, multiprocessors: int) -> int:
    """The causal persistent grid's longest program, in key tiles (fixed alternating rounds)."""
    items = batch_heads * blocks
    programs = min(items, multiprocessors)
    longest = 0
    for me in range(programs):
        load, item, k = 0, me, 0
        while item < items:
            load += blocks - item % blocks
            k += 1
            item = k * programs + me + (k % 2) * (programs - 1 - 2 * me)
        longest = max(longest, load)
    return longest
