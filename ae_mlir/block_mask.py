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

from .core.block_tables import classify, table_lead
from .core.interval_eval import tile_bounds
from .core.memo import kept
from .core.regions import ScalarProgram
from .core.scalar_eval import bind_externals, evaluate


@functools.lru_cache(maxsize=64)
def _program(program_json: str) -> ScalarProgram:
    return ScalarProgram.from_json(program_json)


def classify_program(program: ScalarProgram, operands: list, seq_q: int, seq_k: int, block_m: int,
                     block_n: int, device, layout: str = "forward", batch: int | None = None) -> list:
    """The four tables (partial count/index, full count/index; [NM] and [NM, NN] int32, or per
    KV block for the "dkdv" layout: see `core.block_tables.classify`) of the mask `program`, whose
    outer values are `operands` (the kernel's inputs, q [B, H, Lq, D] first) or constants; with
    the leading axes `table_lead` gives where the mask reads b or h (`batch` entries where q's
    shape does not say: packed sequences)."""
    externals = bind_externals(program, operands, device)
    batch, heads = batch or operands[0].shape[0], operands[0].shape[1]
    lead = table_lead(program.uses_arg(0), program.uses_arg(1), batch, heads)
    grid = tuple(lead or [1, 1])
    # Tiles the mask's intervals decide need no element-wise evaluation: of document ids, all but
    # those on a document's edge.
    known = tile_bounds(program, externals, grid, seq_q, seq_k, block_m, block_n, device)
    tables = classify(lambda b, h, q, kv: evaluate(program, [b, h, q, kv], externals, device),
                      *grid, seq_q, seq_k, block_m, block_n, device, full_width=True, layout=layout, known=known)
    return [t if lead else t.reshape(t.shape[2:]) for t in tables.tensors()]


_CACHE: dict = {}


def call_time_tables(program_json: str, operands: list, seq_q: int, seq_k: int, block_m: int, block_n: int,
                     device, layout: str = "forward", batch: int | None = None) -> list:
    """`classify_program`, cached per program, shape, blocks, device and the memory and versions
    of the closure tensors it reads, so calling the same attention again (the common case: the
    same document ids for many layers, and a training step's forward and backward) costs
    nothing; changing a closure tensor in place bumps its version and reclassifies. The memory
    (address, sizes, strides), not the Python object, names a tensor: autograd hands the kernels
    a new detached view of the same tensor at each call, which shares its version counter."""
    program = _program(program_json)
    reads = tuple(operands[s[1]] for s in program.sources if s[0] == "operand")
    key = (program_json, tuple(operands[0].shape[:2]), batch, seq_q, seq_k, block_m, block_n, str(device), layout,
           tuple((str(t.device), t.data_ptr(), tuple(t.shape), t.stride(), t.dtype, t._version) for t in reads))
    # The entry holds the closure tensors: while it lives, no other tensor can take their memory.
    return kept(_CACHE, key, lambda: (reads, classify_program(program, operands, seq_q, seq_k, block_m, block_n,
                                                              device, layout, batch)), 64)[1]
