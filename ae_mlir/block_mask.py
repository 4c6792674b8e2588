"""Call-time tile classification of masks that read closure tensors.

A kernel whose mask reads closure tensors takes its four tile tables as arguments (see
`core.block_tables`; one per batch entry or head where the mask reads b or h: a batch of rows
each packing its own documents) and carries the mask as a JSON `ScalarProgram`. At each call
the runtime evaluates that program with torch on the tensors' own device, reading the closure
tensors from the kernel's operands, as FlexAttention's BlockMask does: no user Python is needed,
so a bundle built ahead of time classifies on its own.
"""
from __future__ import annotations

import functools
import math

from .core.block_tables import table_lead, tables_from_flags, tile_flags
from .core.interval_eval import gathers_in_bounds, tile_bounds
from .core.memo import kept
from .core.regions import ScalarProgram
from .core.scalar_eval import bind_externals, evaluate

# The tiles whose flags (`core.block_tables.tile_flags`) a cached evaluation of the mask keeps: a
# training step's three tile shapes (the forward's, the dQ kernel's, the dK/dV kernel's: 64x64,
# 64x64 and 32x64 for a document mask on CUDA; 128x64, 128x64 and 64x128 for a causal-like one)
# are all made of 32x32 tiles, so one evaluation serves the step. With three evaluations (and the
# intervals on the GPU) a training step with new document ids took 23.8 ms on an H100 at L 2048,
# with one 4.7, where the same step on unchanged ids took 1.1 (bench/RESULTS.md).
FLAG_TILE = 32


@functools.lru_cache(maxsize=64)
def _program(program_json: str) -> tuple[ScalarProgram, str]:
    """The program, and its text with each closure tensor named by its place among the tensors it
    reads rather than by its kernel argument: the forward and backward kernels of a packed batch
    take the same tensors at other positions, and the cache names the tensors themselves."""
    from dataclasses import replace

    program = ScalarProgram.from_json(program_json)
    reads = iter(range(len(program.sources)))
    sources = tuple(("operand", next(reads)) if s[0] == "operand" else s for s in program.sources)
    return program, replace(program, sources=sources).to_json()


def mask_flags(program: ScalarProgram, operands: list, seq_q: int, seq_k: int, block_m: int, block_n: int,
               device, batch: int | None = None) -> tuple:
    """(flags, lead): `core.block_tables.tile_flags` of the mask `program` at block_m x block_n
    tiles, whose outer values are `operands` (the kernel's inputs, q [B, H, Lq, D] first) or
    constants, with the leading axes `table_lead` gives where the mask reads b or h (`batch`
    entries where q's shape does not say: packed sequences), [1, 1] where it reads neither."""
    externals = bind_externals(program, operands, device)
    batch, heads = batch or operands[0].shape[0], operands[0].shape[1]
    lead = table_lead(program.uses_arg(0), program.uses_arg(1), batch, heads)
    grid = tuple(lead or [1, 1])
    # Tiles the mask's intervals decide need no element-wise evaluation: of document ids, all but
    # those on a document's edge.
    known = _bounds(program, externals, grid, seq_q, seq_k, block_m, block_n, device)
    shapes = [operands[s[1]].shape if s[0] == "operand" else None for s in program.sources]
    in_bounds = gathers_in_bounds(program, shapes, grid, seq_q, seq_k)
    flags = tile_flags(lambda b, h, q, kv: evaluate(program, [b, h, q, kv], externals, device, in_bounds),
                       *grid, seq_q, seq_k, block_m, block_n, device, known=known)
    return flags, lead


# The most mask entries (B or 1) x (H or 1) x Lq x Lk a GPU evaluates element by element rather
# than first through the mask's intervals. The intervals' small tile-grid tensors cost the GPU a
# launch per torch op (about 200 for a document mask), the entries a few passes of memory each:
# on an H100 (bench/classify_masks.py, a training step's tables, 2026-12-05) element by element
# took 2.5 ms against 5.6 at 4M entries, 5.8 against 7.2 at 67M and 5.3 against 8.2 at 34M, but
# 12.9 against 7.8 at 134M. The CPU always takes the intervals (4-20x faster there).
GPU_ELEMENT_WISE_MAX = 3 << 25


def _bounds(program, externals, grid, seq_q, seq_k, block_m, block_n, device):
    """`tile_bounds` of the mask, or None where a GPU evaluates it element by element sooner."""
    import torch

    if torch.device(device).type != "cpu" and grid[0] * grid[1] * seq_q * seq_k <= GPU_ELEMENT_WISE_MAX:
        return None
    return tile_bounds(program, externals, grid, seq_q, seq_k, block_m, block_n, device)


def classify_program(program: ScalarProgram, operands: list, seq_q: int, seq_k: int, block_m: int,
                     block_n: int, device, layout: str = "forward", batch: int | None = None) -> list:
    """The four tables (partial count/index, full count/index; [NM] and [NM, NN] int32, or per
    KV block for the "dkdv" layout: see `core.block_tables.tables_from_flags`) of the mask
    `program` (`mask_flags`), with leading axes where it reads b or h."""
    flags, lead = mask_flags(program, operands, seq_q, seq_k, block_m, block_n, device, batch)
    return _tables(flags, lead, (block_m, block_n), seq_q, seq_k, block_m, block_n, layout)


def _tables(flags, lead, flag_blocks, seq_q, seq_k, block_m, block_n, layout) -> list:
    tables = tables_from_flags(flags, flag_blocks, seq_q, seq_k, block_m, block_n, full_width=True, layout=layout)
    return [t if lead else t.reshape(t.shape[2:]) for t in tables.tensors()]


_CACHE: dict = {}
_FLAGS: dict = {}


def call_time_tables(program_json: str, operands: list, seq_q: int, seq_k: int, block_m: int, block_n: int,
                     device, layout: str = "forward", batch: int | None = None) -> list:
    """`classify_program`, cached per program, shape, blocks, device and the memory and versions
    of the closure tensors it reads, so calling the same attention again (the common case: the
    same document ids for many layers, and a training step's forward and backward) costs
    nothing; changing a closure tensor in place bumps its version and reclassifies. The memory
    (address, sizes, strides), not the Python object, names a tensor: autograd hands the kernels
    a new detached view of the same tensor at each call, which shares its version counter.

    The mask is evaluated once for all tile shapes made of the same FLAG_TILE-sized tiles: the
    tables of the other shapes of the same closure tensors pool its flags."""
    program, text = _program(program_json)
    reads = tuple(operands[s[1]] for s in program.sources if s[0] == "operand")
    key = (text, tuple(operands[0].shape[:2]), batch, seq_q, seq_k, str(device),
           tuple((str(t.device), t.data_ptr(), tuple(t.shape), t.stride(), t.dtype, t._version) for t in reads))
    grain = (math.gcd(block_m, FLAG_TILE), math.gcd(block_n, FLAG_TILE))

    def flags():
        return reads, mask_flags(program, operands, seq_q, seq_k, *grain, device, batch)

    def tables():
        found, lead = kept(_FLAGS, key + grain, flags, 64)[1]
        return reads, _tables(found, lead, grain, seq_q, seq_k, block_m, block_n, layout)

    # An entry holds the closure tensors: while it lives, no other tensor can take their memory.
    return kept(_CACHE, key + (block_m, block_n, layout), tables, 64)[1]
