"""`attn-tile`: `attn.online_attention` becomes an L1 kernel function over (batch, head, query block).

L1 is target-neutral and made of upstream dialects plus one `attn.program_id` op:

* The function keeps the inputs, takes the outputs as destinations (`%out`, then `%lse` when
  present) and returns them updated; `attn.grid = [B, H, ceil(Lq / block_m)]` says how many
  programs run it, each reading its coordinates with `attn.program_id`.
* A program loads its Q tile once (`tensor.extract_slice` + `tensor.pad` with zeros at the ragged
  edge; a static slice alone when every tile is whole and `whole-tiles` is on), then walks KV tiles in two `scf.for` loops carrying the row state (max, sum, accumulator):
  first the partial tiles, which evaluate the mask, then the full tiles, which do not. Which tiles
  are partial, full or skipped entirely is decided here at compile time for positional masks and
  recorded in per-query-block tables (`arith.constant` tensors), as FlexAttention's BlockMask does.
* Tiles are tensors: `linalg.matmul` for Q K^T and P V (f32 accumulation), `linalg.generic` for the
  elementwise work (scale, score_mod, mask, the normalizer's regions), `linalg.reduce` for row max
  and row sum.

Both backends lower exactly this form, so tiling, fusion and tile classification are shared.
The kernel is built with the bindings' builders (`l1_builders`) at the fused op's location; the
mods' ops are cloned into it and keep theirs, so diagnostics about them name the user's lines.
The row state's step per KV tile is `tile_online_state`'s.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..core import abi
from ..core.regions import from_region
from . import ModulePass, option
from .kv_len import bound_table, consecutive, constant_table, entry_length, trip_count
from .l1_builders import f32, index, program_id, tensor_type
from .l1_ops import TILE_VIEWS, kernel_function, ops_named, shape
from .tile_online_state import LOG2E, TILE, OnlineRowState
from .tile_pack_gqa import pack, packable, store_head_rows
from .tile_sources import RowSources
from .tile_split_kv import build_split, splittable
from .tile_tables import (Classification, call_time_table_types, classify_blocks, heavy_blocks_attributes,
                          listed_block, table_constants, table_row)
from .tile_varlen import packing_ops, sequences_source

REGION_NAMES = ("score_mod", "mask", "prob", "rescale", "finalize", "lse")


class _Kernel(RowSources, OnlineRowState):
    """Builds one L1 kernel function with the bindings' builders, at the fused op's location."""

    def __init__(self, op, func, block_m: int, block_n: int, whole_tiles: bool = True, prescale_q: bool = False,
                 mirror_reads: bool = False, raw_row_max: bool = False):
        super().__init__(op, func)
        self.mirror_reads = mirror_reads
        self.raw_row_max = raw_row_max
        self.bm = block_m
        self.bn = block_n
        self.whole_tiles = whole_tiles
        q, k, v = op.operands[0], op.operands[1], op.operands[2]
        self.b, self.h, self.lq, self.dk = shape(q)
        _, self.hkv, self.lk, _ = shape(k)
        self.dv = shape(v)[3]
        self.elt = q.type.element_type
        self.with_lse = len(op.results) > 1
        self.stat = op.attributes["stat"].value
        self.log2 = bool(op.attributes["log2_domain"].value)
        self.scale = float(op.attributes["scale"].value)
        self.regions = {name: op.regions[i] if list(op.regions[i].blocks) else None
                        for i, name in enumerate(REGION_NAMES)}
        # Without a score_mod the log2-domain normalizers take the scale times log2(e).
        fold = self.log2 and self.regions["score_mod"] is None
        self.score_scale = self.scale * LOG2E if fold else self.scale
        # f32 queries only: a 16-bit Q tile times the scale would round twice.
        self.prescale_q = prescale_q and str(self.elt) == "f32"
        # Softmax needs the row sum; a normalizer without a statistic needs it only if its
        # finalize reads it (RetNet's abs-sum division does, sigmoid's identity does not).
        self.tracks_sum = self.stat == "max" or from_region(self.regions["finalize"]).uses_arg(1)
        self.group = self.h // self.hkv
        # Packed GQA: a program takes a KV head and its `group` query heads, block_m / group query
        # rows of each, as the rows of one tile (row r: head r // rows, query row r % rows), so K
        # and V are read once per KV head rather than once per query head.
        self.packed = False
        self.rows = block_m
        # Per-entry key lengths (attn.mask's kv_len): `keys` is the program's entry's length
        # once visit_kv_tiles has read it, else the static Lk.
        self.kv_len = op.operands[3] if len(op.operands) > 3 else None
        self.keys = self.lk
        # Packed variable-length batches (tile_varlen): q's source and the ops packing the results.
        self.q_seq = sequences_source(q)
        self.packing = packing_ops(op) if self.q_seq is not None else None
        self.spans: dict = {}
        # The mask program of call-time tables (build sets it): their rows are per entry and head
        # where it reads b or h.
        self.program = None

    # --- the kernel ----------------------------------------------------------------------
    def build(self, classification: Classification) -> None:
        from mlir import ir
        from mlir.dialects import func

        nm, nn = -(-self.lq // self.rows), -(-self.lk // self.bn)
        inputs = [a.type for a in self.func_block.arguments]
        table_types = call_time_table_types(classification.program, self.b, self.h, nm, nn) \
            if classification.at_call_time else []
        self.program = classification.program
        result_types = [r.type for r in (self.packing_results() or self.op.results)]
        attributes = self.attributes([self.b, self.hkv if self.packed else self.h, nm])
        attributes.update({key: ir.Attribute.parse(text) for key, text in classification.kernel_attributes()})
        if classification.at_call_time and self.q_seq is not None:
            attributes[abi.CALL_TIME_GRID] = ir.DenseI64ArrayAttr.get([self.b, self.lq, self.lk])
        if not classification.at_call_time and self.kv_len is None and self.q_seq is None:
            attributes.update(heavy_blocks_attributes(classification.partial, classification.full))
        mirrored = self.mirrored_positions()
        if mirrored:
            tables = abi.call_time_table_roles(len(inputs) - len(abi.INPUTS)) if table_types else []
            attributes.update(self.roles(abi.input_roles(len(inputs)) + tables + [abi.mirrored(i) for i in mirrored]
                                         + list(abi.output_roles(False)[:len(result_types)])))
        mirror_types = [inputs[len(abi.INPUTS) + i] for i in mirrored]
        entry = self.function(self.func.attributes["sym_name"].value,
                              inputs + table_types + mirror_types + result_types, result_types, attributes)
        args = self.kernel_args
        table_args = args[len(inputs):len(inputs) + len(table_types)]
        self.take_mirrors(mirrored, args[len(inputs) + len(table_types):])
        destinations = args[len(inputs) + len(table_types) + len(mirror_types):]
        with ir.InsertionPoint(entry):
            pm = self.start_program()
            q_tile = self.load_block(args[0], [self.pb], self.dk)
            state = self.visit_kv_tiles(q_tile, args, pm, classification.partial, classification.full, table_args)
            rows = self.rows_to_store()
            results = [self.store_block(self.finalized(state), destinations[0], [self.pb], rows)]
            if self.with_lse:
                results.append(self.store_block(self.lse_of(state), destinations[1], [self.pb], rows))
            func.ReturnOp(results)

    def mirrored_positions(self) -> list[int]:
        """With `mirror_reads`, the closure tensors c<i> the score_mod or mask reads stepping back
        along the keys, the tiles' last axis (passes/mirror_reads.py)."""
        from .mirror_reads import mirrored_positions

        if not self.mirror_reads:
            return []
        def position(arg):
            return arg.arg_number - len(abi.INPUTS) if arg.owner == self.func_block else None

        return mirrored_positions((self.regions["score_mod"], self.regions["mask"]), -1, position)

    def take_mirrors(self, mirrored: list[int], args: list) -> None:
        """Read c<i> for each of `mirrored` from its mirrored copy, the kernel arguments `args` in
        that order, where a read steps back along the keys (KernelBuilder.mirror_axis)."""
        self.mirrors = {self.kernel_args[len(abi.INPUTS) + i]: arg for i, arg in zip(mirrored, args)}

    def attributes(self, grid: list[int]) -> dict:
        from mlir import ir

        i64 = ir.IntegerType.get_signless(64)
        return {abi.GRID: ir.DenseI64ArrayAttr.get(grid), abi.BLOCK_M: ir.IntegerAttr.get(i64, self.bm),
                abi.BLOCK_N: ir.IntegerAttr.get(i64, self.bn)}

    def start_program(self, query_block=None):
        """The program's coordinates: sets pb, ph (and the KV head hk) and m0, the first query row
        of `query_block` (default: program id 2); returns the query block."""
        from mlir.dialects import arith

        self.pb, self.ph = program_id(0), program_id(1)
        self.spans = {}
        pm = query_block if query_block is not None else program_id(2)
        if self.packed:
            self.hk = self.ph
        else:
            self.hk = arith.divui(self.ph, index(self.group)) if self.group > 1 else self.ph
        self.m0 = arith.muli(pm, index(self.rows))
        return pm

    def row_position(self, i):
        """(head, query row) of tile row `i` (an index value inside a linalg.generic)."""
        from mlir.dialects import arith

        if not self.packed:
            return self.ph, arith.addi(self.m0, i)
        g = arith.divui(i, index(self.rows))
        row = arith.subi(i, arith.muli(g, index(self.rows)))
        return arith.addi(arith.muli(self.hk, index(self.group)), g), arith.addi(self.m0, row)

    def visit_kv_tiles(self, q_tile, args, table_row_id, partial, full, table_args, state=None, deal=None) -> list:
        """The two scf.for loops over the KV tiles of row `table_row_id` of the tile tables: partial
        ones with the mask, then full ones; returns the row state after both. With `deal` =
        (split, splits), each list's tiles in reach of the entry's length are dealt out at run
        time and this program takes the split-th contiguous share."""
        from mlir import ir
        from mlir.dialects import arith, scf, tensor

        state = state or self.initial_state()
        if self.prescale_q:
            q_tile = self.generic([(q_tile, TILE)], q_tile.type,
                                  lambda a: arith.mulf(a[0], f32(self.score_scale)))
        reach = inside = None
        if self.kv_len is not None:
            self.keys = entry_length(self.kernel_arg(self.kv_len, "kv_len"), self.pb, self.lk)
            reach = arith.divui(arith.addi(self.keys, index(self.bn - 1)), index(self.bn))
        for operand in self.op.operands[1:3]:
            # Read the sequences' spans here, where both loops see them.
            if sequences_source(operand) is not None:
                self.span(sequences_source(operand), self.lk)
        if self.q_seq is not None:
            # A query block past its sequence's end stores nothing: it visits no KV tile.
            lo, hi = self.span(self.q_seq, self.lq)
            inside = arith.cmpi(arith.CmpIPredicate.slt, arith.addi(lo, self.m0), hi)
            reach = arith.select(inside, reach if reach is not None else index(-(-self.lk // self.bn)), index(0))
        for masked, lists, position in ((True, partial, 0), (False, full, 2)):
            if table_args:
                count_tab, index_tab = table_args[position], table_args[position + 1]
            elif not any(lists):
                continue
            else:
                count_tab, index_tab = (arith.constant(attr.type, attr) for attr in
                                        (ir.Attribute.parse(text) for text in table_constants(lists)[:2]))
            row = table_row(self.program if table_args else None, self.pb, self.ph, table_row_id)
            count = arith.index_cast(ir.IndexType.get(), tensor.extract(count_tab, row))
            if table_args and inside is not None:
                # Call-time tables of packed sequences list no tile past a sequence's keys
                # (tile_tables.bounded_by_lengths): only a query block past its end visits none.
                count = arith.select(inside, count, index(0))
            elif reach is not None:
                bounds = None if consecutive(lists) else constant_table(bound_table(lists, -(-self.lk // self.bn)))
                count = trip_count(count, index_tab, bounds, table_row_id, reach)
            start = index(0)
            if deal is not None:
                split, splits = deal
                share = arith.divui(arith.addi(count, index(splits - 1)), index(splits))
                start = arith.muli(split, share)
                count = arith.minsi(arith.addi(start, share), count)
            loop = scf.ForOp(start, count, index(1), state)
            with ir.InsertionPoint(loop.body):
                nb = listed_block(index_tab, row + [loop.induction_variable], bool(table_args))
                scf.YieldOp(self.kv_step(q_tile, self.hk, nb, list(loop.inner_iter_args), masked))
            state = list(loop.results)
        return state

    def store_block(self, tile, dest, lead: list, rows):
        """The first `rows` query rows of a [block_m(, width)] tile written into
        dest[lead..., head, m0:(, :)]: the program's head, or packed, its group's heads."""
        from mlir import ir
        from mlir.dialects import tensor

        if self.packed:
            return store_head_rows(self, tile, dest, lead, rows)
        dynamic = ir.ShapedType.get_dynamic_size()
        width = list(tile.type.shape[1:])
        elt = tile.type.element_type
        rank = 1 + len(width)
        valid = tensor.ExtractSliceOp(tensor_type([dynamic] + width, elt), tile, [], [rows], [], [0] * rank,
                                      [dynamic] + width, [1] * rank).result
        coords = lead + [self.ph, self.m0]
        if self.q_seq is not None:
            # Straight into the packed result, at the sequence's rows.
            from mlir.dialects import arith

            coords = [index(0), self.ph, arith.addi(self.span(self.q_seq, self.lq)[0], self.m0)]
        return tensor.InsertSliceOp(valid, dest, coords, [rows], [], [dynamic] * len(coords) + [0] * len(width),
                                    [1] * (len(coords) - 1) + [dynamic] + width, [1] * (len(coords) + len(width))).result

@dataclass(frozen=True)
class AttnTile(ModulePass):
    name: ClassVar[str] = "attn-tile"
    summary: ClassVar[str] = ("Tile attn.online_attention into an L1 kernel: a program per (batch, head, "
                              "query block), an scf.for over KV tiles carrying the row state, "
                              "compile-time tile classification of positional masks")

    block_m: int = option(64, "query rows per program")
    block_n: int = option(64, "keys per KV tile")
    call_time_tables: bool = option(False, "classify masks that read closure tensors, b or h at call time: "
                                           "the kernel takes the tile tables as four extra arguments after "
                                           "the inputs (partial count/index, full count/index; per batch "
                                           "entry and head where the mask reads b or h) "
                                           "and carries the mask as JSON in attn.mask_program")
    kv_splits: int = option(1, "programs per query block, each taking a contiguous run of its KV tiles, "
                               "and a combine kernel after them (flash-decoding); normalizers without a "
                               "row max and sum and masks classified at call time are not split")
    pack_gqa: bool = option(False, "GQA: a program per KV head takes block-m / group query rows of each "
                                   "of its query heads as one tile, reading K and V once per KV head "
                                   "(when block-m is a multiple of the group; masks classified at call "
                                   "time are not packed)")
    whole_tiles: bool = option(True, "load a tile whose rows all exist (L a multiple of the block) as a static "
                                     "slice, without padding: no row masks or bounds checks in the lowerings")
    prescale_q: bool = option(False, "multiply the Q tile by the score scale once per program instead of each "
                                     "tile's scores (f32 queries; the cpu preset: one pass less over every "
                                     "score tile of a program's loop)")
    mirror_reads: bool = option(False, "read a closure tensor whose reads step back along the keys (a table at "
                                       "q_idx - kv_idx + c) from its copy reversed along the last dimension, "
                                       "an input of role c<i>_mirrored after the others, forwards "
                                       "(passes/mirror_reads.py)")
    raw_row_max: bool = option(False, "on tiles no mask or length cuts and without a score_mod, take the online "
                                      "softmax's row max of the unscaled Q K^T product and scale it once per "
                                      "row (the triton preset: the scaled scores then feed only the exponent, "
                                      "where the multiply fuses; the CPU's separate passes would gain one)")

    def __post_init__(self):
        for opt, value in (("block-m", self.block_m), ("block-n", self.block_n)):
            if value < 1 or value & (value - 1):
                raise ValueError(f"{opt} must be a positive power of two, got {value}")
        if self.kv_splits < 1:
            raise ValueError(f"kv-splits must be at least 1, got {self.kv_splits}")

    def apply(self, module_op) -> None:
        for op in ops_named(module_op, "attn.online_attention"):
            self._tile(op)

    def _tile(self, op) -> None:
        from mlir import ir

        func = kernel_function(op, "tiled", views=TILE_VIEWS)
        kernel = _Kernel(op, func, self.block_m, self.block_n, self.whole_tiles, self.prescale_q, self.mirror_reads,
                         self.raw_row_max)
        # Packed sequences take neither form: a sequence's rows are not a batch entry's.
        varlen = kernel.q_seq is not None
        nn = -(-kernel.lk // self.block_n)
        wants_packing = self.pack_gqa and packable(kernel, self.block_m) and not varlen
        # The tile loops bound per-entry lengths with compile-time lists only, but for packed
        # sequences, whose call-time tables the classifier bounds by each sequence's keys and
        # queries, as the backward's are (b is a sequence there, classified over the kernel's
        # CALL_TIME_GRID; both kernels then read one mask program, which a training step
        # evaluates once). Lengths or offsets that are no function argument are reported where the
        # kernel reads them (kernel_arg). Decoding shapes: a mask that reads b or h keeps every
        # tile partial and takes the KV splits or the packed heads, which call-time tables (one
        # row per program) rule out; a few query rows against a long cache gain more from filling
        # the GPU.
        bounds = {}
        if varlen and kernel.kv_len is not None and all(
                isinstance(value.owner, ir.Block) for value in (kernel.kv_len, kernel.q_seq[1])):
            bounds = {"lengths": ir.BlockArgument(kernel.kv_len).arg_number,
                      "query_offsets": ir.BlockArgument(kernel.q_seq[1]).arg_number}
        classification = classify_blocks(kernel.regions["mask"], kernel.lq, kernel.lk, self.block_m, self.block_n,
                                         self.call_time_tables and (bool(bounds) if varlen else kernel.kv_len is None),
                                         per_slice_ok=not (wants_packing or min(self.kv_splits, nn) > 1),
                                         **bounds)
        if wants_packing and not classification.at_call_time:
            pack(kernel)
            classification = classify_blocks(kernel.regions["mask"], kernel.lq, kernel.lk, kernel.rows,
                                             self.block_n)
        splits = min(self.kv_splits, nn)
        with op.location:
            if splits > 1 and splittable(kernel, classification) and not varlen:
                build_split(kernel, classification, splits)
            else:
                kernel.build(classification)
        func.operation.erase()
