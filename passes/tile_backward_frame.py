"""The frame of `attn-tile-backward`'s two kernels: which tiles each block visits (its lists of
partial and full tiles, at compile time as constant tables or at call time as the kernel's table
arguments), the loops that walk them, and each kernel's signature by role (abi)."""
from __future__ import annotations

from ..core import abi
from .kv_len import bound_table, consecutive, constant_table, trip_count
from .l1_builders import index, tensor_type
from .l1_ops import shape
from .tile_backward_lists import ragged_partial
from .tile_backward_running_max import RunningMaxGradients
from .tile_tables import (Classification, call_time_table_types, classify_blocks, heavy_blocks_attributes,
                          listed_block, table_constants, table_row)


class BackwardFrame(RunningMaxGradients):
    """What both kernels' builders share beyond the tile math: the block lists, their walks and the
    kernel signatures. Reads the forward's facts that `tile_backward._Backward` gathers (block
    sizes, shapes, mask, sources, closure positions)."""

    def lists(self):
        """(partial, full) tile lists, indexed by query block."""
        # Packed sequences' tables are per sequence, bounded by its keys and its queries; per-entry
        # lengths of an unpacked batch take compile-time lists, as attn-tile's do.
        packed = self.sources[0] is not None
        at_call_time = self.call_time_tables and (packed or self.kv_len is None)
        bounds = {}
        if packed and self.kv_len is not None:
            from mlir import ir

            bounds = {"lengths": ir.BlockArgument(self.kv_len).arg_number,
                      "query_offsets": ir.BlockArgument(self.sources[0][1]).arg_number}
        classification = classify_blocks(self.mask, self.lq, self.lk, self.bm, self.bn, at_call_time=at_call_time,
                                         **bounds)
        if classification.at_call_time:
            # The kernel walks the tables it is given (signature, walk); the runtime classifies
            # with the ragged edges partial, as ragged_partial does here.
            self.program = classification.program
            return [], []
        if self.sources[0] is not None or self.kv_len is not None:
            # A packed sequence or an entry's keys may end inside any tile: every tile drops the
            # rows past its end. (Walking a packed batch's whole tiles unmasked, where that is
            # exact, ran 3-4% slower on an H200 at 8 x 2048 and mixed lengths: bench/RESULTS.md.)
            return [sorted(p + f) for p, f in zip(classification.partial, classification.full)], \
                [[] for _ in classification.full]
        return ragged_partial(classification.partial, classification.full, self.lq, self.lk, self.bm, self.bn)

    def tables(self, lists: list[list[int]]):
        from mlir import ir
        from mlir.dialects import arith

        counts, indices, _ = table_constants(lists)
        return [arith.constant(attr.type, attr) for attr in (ir.Attribute.parse(t) for t in (counts, indices))]

    def walk(self, lists_pair, at, state: list, step, reach=None) -> list:
        """Loops over the block ids that the partial then full lists of block `at` = (batch entry,
        head, block id; index values) name (each list a constant table, or the kernel's call-time
        table arguments, which may be per entry and head), `step(other_block, state, masked)`
        building one iteration; with `reach` (an index value), only over the listed blocks below
        it (compile-time lists only)."""
        from mlir import ir
        from mlir.dialects import arith, scf, tensor

        for masked, lists, position in zip((True, False), lists_pair, (0, 2)):
            if self.table_args:
                count_tab, index_tab = self.table_args[position:position + 2]
            elif not any(lists):
                continue
            else:
                count_tab, index_tab = self.tables(lists)
            row = table_row(self.program if self.table_args else None, *at)
            count = arith.index_cast(ir.IndexType.get(), tensor.extract(count_tab, row))
            if reach is not None and self.table_args:
                # Call-time tables of packed sequences list no tile past a sequence's end
                # (tile_tables.bounded_by_lengths): only a block past its end visits none.
                count = arith.select(arith.cmpi(arith.CmpIPredicate.sgt, reach, index(0)), count, index(0))
            elif reach is not None:
                width = max(n for row in lists for n in row) + 1
                bounds = None if consecutive(lists) else constant_table(bound_table(lists, width))
                count = trip_count(count, index_tab, bounds, at[2], arith.minsi(reach, index(width)))
            loop = scf.ForOp(index(0), count, index(1), state)
            with ir.InsertionPoint(loop.body):
                other = listed_block(index_tab, row + [loop.induction_variable], bool(self.table_args))
                scf.YieldOp(step(other, list(loop.inner_iter_args), masked))
            state = list(loop.results)
        return state

    def signature(self, name: str, part: str, grid: list[int], lists):
        """The kernel `part` of abi.BACKWARD_KERNELS, walking `lists` (partial, full) per block of
        its grid's last axis: its entry block, and its arguments after q, k, v and the closure
        tensors, by role."""
        from mlir import ir

        i64 = ir.IntegerType.get_signless(64)
        # Packed sequences' gradients and statistics are packed as their inputs are.
        (bq, lq), (bk, lk) = ((self.b, self.lq), (self.b, self.lk)) if self.sources[0] is None else (
            (1, shape(self.sources[0][0])[2]), (1, shape(self.sources[1][0])[2]))
        row_t = tensor_type([bq, self.h, lq])
        types = {role: row_t for role in abi.ROW_STATS}
        types.update({"out": tensor_type([bq, self.h, lq, self.dv], self.elt), "dq": tensor_type([bq, self.h, lq, self.dk], self.elt),
                 "dk": tensor_type([bk, self.hkv, lk, self.dk], self.elt),
                 "dv": tensor_type([bk, self.hkv, lk, self.dv], self.elt)})
        types["do"] = types["out"]
        ins, outs = abi.backward_roles(part, self.kind, self.stat)
        if part == "dq":
            outs = outs + tuple(self.closure_roles)
            types.update({abi.closure_grad(i): tensor_type(list(self.inputs[len(abi.INPUTS) + i].shape))
                          for i in self.closure_positions})
        self.mirror_axis = -2 if part == "dkdv" else -1
        mirrored = self.mirrored_positions(self.mirror_axis) if self.mirror_reads else []
        ins = ins + tuple(abi.mirrored(i) for i in mirrored)
        types.update({abi.mirrored(i): self.inputs[len(abi.INPUTS) + i] for i in mirrored})
        if self.program is not None:
            # [blocks] counts and [blocks, other blocks] indices, blocks along the grid's last axis.
            blocks, others = (-(-self.lq // self.bm), -(-self.lk // self.bn))[::1 if part == "dq" else -1]
            tables = abi.backward_table_roles(part)
            types.update(zip(tables, call_time_table_types(self.program, self.b, self.h, blocks, others)))
            ins = ins + tables
        roles = abi.input_roles(len(self.inputs)) + list(ins) + list(outs)
        attributes = {abi.GRID: ir.DenseI64ArrayAttr.get(grid), abi.BLOCK_M: ir.IntegerAttr.get(i64, self.bm),
                      abi.BLOCK_N: ir.IntegerAttr.get(i64, self.bn), **self.roles(roles)}
        if self.program is not None:
            attributes.update({key: ir.Attribute.parse(text) for key, text in
                               Classification([], [], self.program).kernel_attributes()})
            if self.sources[0] is not None:
                attributes[abi.CALL_TIME_GRID] = ir.DenseI64ArrayAttr.get([self.b, self.lq, self.lk])
        elif self.sources[0] is None and self.kv_len is None:
            attributes.update(heavy_blocks_attributes(*lists))
        entry = self.function(name, self.inputs + [types[r] for r in ins + outs], [types[r] for r in outs], attributes)
        args = dict(zip(ins + outs, self.kernel_args[len(self.inputs):]))
        if self.program is not None:
            self.table_args = [args[r] for r in abi.backward_table_roles(part)]
        self.mirrors = {self.kernel_args[len(abi.INPUTS) + i]: args[abi.mirrored(i)] for i in mirrored}
        return entry, args
