"""Tile classification for `attn-tile`: which KV tiles each query block visits, with or without
the mask, and how the kernel learns it.

* A mask that reads only q_idx, kv_idx and constants is evaluated here, on the index grid, with
  the shared scalar evaluator; the kernel carries the lists as constant tables.
* A mask that also reads closure tensors is classified at call time when asked: the kernel takes
  the four tables as arguments and carries the mask's program as JSON (`attn.mask_program`),
  which the runtime evaluates on the closure tensors it is launched with. Where the mask reads b
  or h too (document ids per batch row), the tables have a batch and a head axis
  (`core.block_tables.table_lead`) and a program reads its own entry's and head's rows
  (`call_time_table_types`, `table_row`).
* Otherwise every tile is partial; without a mask only the ragged last tile is.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..core import abi
from ..core.block_tables import classify, cut_per_block, table_lead, unmasked
from ..core.interval_eval import tile_bounds
from ..core.regions import ScalarProgram, from_region
from ..core.scalar_eval import bind_externals, evaluate



@dataclass
class Classification:
    """Per query block: the KV blocks to visit with the mask (partial) and without it (full).
    With `program`, the lists are not known yet: the kernel reads them from arguments and the
    runtime computes them from this mask program."""

    partial: list[list[int]]
    full: list[list[int]]
    program: ScalarProgram | None = None

    @property
    def at_call_time(self) -> bool:
        return self.program is not None

    def kernel_attributes(self) -> list[tuple[str, str]]:
        """(name, attribute text) pairs the kernel function carries: none for compile-time
        tables; the call-time marker and the mask program otherwise."""
        if self.program is None:
            return []
        return [(abi.CALL_TIME_TABLES, "unit"), (abi.MASK_PROGRAM, string_attribute(self.program.to_json()))]


def heavy_blocks(partial: list[list[int]], full: list[list[int]]) -> str | None:
    """abi.HEAVY_BLOCKS of a kernel walking these lists per block: "first" or "last" where the
    tile counts fall or rise along the blocks (a causal mask's), None where they are equal or go
    both ways."""
    counts = [len(p) + len(f) for p, f in zip(partial, full)]
    pairs = list(zip(counts, counts[1:]))
    if all(a == b for a, b in pairs):
        return None
    if all(a >= b for a, b in pairs):
        return "first"
    if all(a <= b for a, b in pairs):
        return "last"
    return None


def heavy_blocks_attributes(partial: list[list[int]], full: list[list[int]]) -> dict:
    """{abi.HEAVY_BLOCKS: its string attribute} of a kernel walking these lists, or {} where
    heavy_blocks finds neither end heavier."""
    from mlir import ir

    heavy = heavy_blocks(partial, full)
    return {} if heavy is None else {abi.HEAVY_BLOCKS: ir.StringAttr.get(heavy)}


def heavy_blocks_of(func_op) -> str | None:
    """The abi.HEAVY_BLOCKS a kernel function carries ("first", "last"), or None."""
    from mlir import ir

    if abi.HEAVY_BLOCKS not in func_op.attributes:
        return None
    return ir.StringAttr(func_op.attributes[abi.HEAVY_BLOCKS]).value


def string_attribute(text: str) -> str:
    """`text` as an MLIR string attribute; JSON from `to_json` is ASCII without newlines, so
    quotes and backslashes are all that need escaping."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def classify_blocks(mask_region, lq: int, lk: int, bm: int, bn: int, at_call_time: bool = False,
                    per_slice_ok: bool = True, lengths: int | None = None,
                    query_offsets: int | None = None) -> Classification:
    """Classify every (query block, KV block) pair as skipped, full or partial (see the module
    docstring for which masks are classified when); without `per_slice_ok` a mask that reads b or
    h is not classified at call time (kernel forms whose programs cannot take per-slice tables).
    `lengths` (packed sequences): the position of the function argument holding each entry's key
    count, which a call-time mask is bounded by, and `query_offsets` that of the queries' offsets,
    which bound its rows too (`bounded_by_lengths`)."""
    if mask_region is None:
        return Classification(*unmasked(lq, lk, bm, bn).as_lists())
    program = from_region(mask_region)
    if not _is_positional(program):
        if at_call_time and _classifiable_at_call_time(program) and (per_slice_ok or not per_slice(program)):
            if lengths is not None:
                program = bounded_by_lengths(program, lengths, query_offsets)
            return Classification([], [], program)
        nm, nn = -(-lq // bm), -(-lk // bn)
        return Classification([list(range(nn)) for _ in range(nm)], [[] for _ in range(nm)])
    return Classification(*_positional_tables(program, lq, lk, bm, bn).as_lists())


def bounded_by_lengths(program: ScalarProgram, lengths: int, query_offsets: int | None = None) -> ScalarProgram:
    """`program` and kv_idx < lengths[b], with `lengths` (int32 [B]) the function's argument at
    that position: the tables a call classifies from it list no tile past an entry's last key,
    so a kernel walking them needs no bound on its trip count (whose lists need not be runs).
    With `query_offsets` (the position of int32 [B + 1] offsets), also q_idx < offsets[b + 1] -
    offsets[b]: a packed sequence's rows past its end are the next sequence's, which a tile the
    tables call full would read unmasked (the backward's dK/dV kernel walks query blocks)."""
    from dataclasses import replace

    from ..core.regions import ScalarOp

    ops, sources = list(program.ops), list(program.sources)

    def add(name, operands, attributes, result_type, operand_types) -> str:
        ops.append(ScalarOp(name, operands, attributes, (result_type,), operand_types))
        return f"v{len(ops) - 1}_0"

    def external(position: int) -> str:
        sources.append(("operand", position))
        return f"ext{len(sources) - 1}"

    def element(tensor: str, at: str) -> str:
        return add("arith.index_cast", (add("tensor.extract", (tensor, at), (), "i32", ("tensor<?xi32>", "index")),),
                   (), "index", ("i32",))

    def below(position: str, bound: str) -> str:
        return add("arith.cmpi", (position, bound), (("predicate", "2 : i64"),), "i1", ("index", "index"))

    kept = add("arith.andi", (program.result, below("arg3", element(external(lengths), "arg0"))), (), "i1",
               ("i1", "i1"))
    if query_offsets is not None:
        offsets = external(query_offsets)
        one = add("arith.constant", (), (("value", "1 : index"),), "index", ())
        first, end = element(offsets, "arg0"), element(offsets, add("arith.addi", ("arg0", one), (), "index",
                                                                         ("index", "index")))
        rows = add("arith.subi", (end, first), (), "index", ("index", "index"))
        kept = add("arith.andi", (kept, below("arg2", rows)), (), "i1", ("i1", "i1"))
    return replace(program, ops=tuple(ops), result=kept, results=(kept,), sources=tuple(sources), externals=())


def _positional_tables(program: ScalarProgram, lq: int, lk: int, bm: int, bn: int):
    """The tile tables of a mask of positions alone, evaluated here on the index grid."""
    constants = bind_externals(program, [])
    known = tile_bounds(program, constants, (1, 1), lq, lk, bm, bn)
    return classify(lambda b, h, q, kv: evaluate(program, [b, h, q, kv], constants), 1, 1, lq, lk, bm, bn,
                    known=known)


def call_time_program(mask_region) -> ScalarProgram | None:
    """The program of a mask that is classified at call time (it reads closure tensors), else
    None."""
    if mask_region is None:
        return None
    program = from_region(mask_region)
    return program if not _is_positional(program) and _classifiable_at_call_time(program) else None


def cut_tiles(mask_region, lq: int, lk: int, bm: int, bn: int) -> float:
    """How many of its KV tiles a mask of positions alone cuts (partial tiles, which evaluate the
    mask per element) per query block that visits any, at bm x bn tiles; 0 without a mask or for
    one read at call time (closure tensors, b or h)."""
    if mask_region is None:
        return 0.0
    program = from_region(mask_region)
    if not _is_positional(program):
        return 0.0
    # The presets ask once per compile, the same masks again and again; at L = 8192 a mask takes
    # seconds to evaluate on the grid.
    key = (program.to_json(), lq, lk, bm, bn)
    if key not in _CUT_TILES:
        _CUT_TILES[key] = cut_per_block(_positional_tables(program, lq, lk, bm, bn))
    return _CUT_TILES[key]


_CUT_TILES: dict = {}


def _is_positional(program: ScalarProgram) -> bool:
    """True when the mask reads only q_idx, kv_idx and constants (no b, h or closure tensors)."""
    if program.uses_arg(0) or program.uses_arg(1):
        return False
    return all(source[0] == "constant" for source in program.sources)


def _classifiable_at_call_time(program: ScalarProgram) -> bool:
    """The runtime classifies from kernel operands and constants (per (b, h) slice where the
    mask reads them)."""
    return all(source[0] in ("operand", "constant") for source in program.sources)


def call_time_table_types(program: ScalarProgram, batch: int, heads: int, blocks: int, others: int) -> list:
    """The types of the four call-time tables of a kernel walking `others` blocks per block of its
    grid's last axis: [lead.., blocks] counts and [lead.., blocks, others] indices, with the lead
    axes `table_lead` gives for a mask that reads b or h."""
    from mlir import ir

    from .l1_builders import tensor_type

    lead = table_lead(program.uses_arg(0), program.uses_arg(1), batch, heads)
    i32 = ir.IntegerType.get_signless(32)
    return [tensor_type(lead + [blocks], i32), tensor_type(lead + [blocks, others], i32)] * 2


def listed_block(index_table, indices: list, call_time: bool):
    """The block number at `indices` of an index table, as an index value. A call-time table's
    read carries abi.BOUNDS [0, others - 1] (call_time_table_types: its last axis has one entry
    per block of the walked axis), so the index analysis (passes/index_bounds.py) bounds the
    positions the mods see from its blocks as it does from a constant table's elements (a
    constant table's last axis is its longest list, not the block count)."""
    from mlir import ir
    from mlir.dialects import arith, tensor

    raw = tensor.extract(index_table, indices)
    if call_time:
        raw.owner.attributes[abi.BOUNDS] = ir.DenseI64ArrayAttr.get([0, index_table.type.shape[-1] - 1])
    return arith.index_cast(ir.IndexType.get(), raw)


def per_slice(program: ScalarProgram | None) -> bool:
    """Whether a call-time mask's tables are per batch entry or head (it reads b or h)."""
    return program is not None and (program.uses_arg(0) or program.uses_arg(1))


def table_row(program: ScalarProgram | None, batch, head, block) -> list:
    """The indices of `block`'s row in a kernel's call-time tables, as a program of entry `batch`
    and head `head` (index values) reads them; just the block for compile-time tables and masks
    that read neither b nor h."""
    from .l1_builders import index

    if not per_slice(program):
        return [block]
    return [batch if program.uses_arg(0) else index(0), head if program.uses_arg(1) else index(0), block]


def table_constants(values: list[list[int]]) -> tuple[str, str, str]:
    """(counts constant, indices constant, their types) for per-query-block block lists."""
    nm = len(values)
    width = max([1] + [len(v) for v in values])
    counts = ", ".join(str(len(v)) for v in values)
    rows = ", ".join("[" + ", ".join(str(x) for x in v + [0] * (width - len(v))) + "]" for v in values)
    return (f"dense<[{counts}]> : tensor<{nm}xi32>", f"dense<[{rows}]> : tensor<{nm}x{width}xi32>",
            f"tensor<{nm}xi32>|tensor<{nm}x{width}xi32>")
