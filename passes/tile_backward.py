"""`attn-tile-backward`: the backward of a softmax attention, of one whose normalizer acts
element by element (sigmoid, relu, none), or of a user's online normalizer (tile_backward_online;
with a running max, tile_backward_running_max), as two L1 kernels, FlashAttention-2's split: one
program per (batch, KV head, KV block) accumulates dK and dV over the query blocks that see its
keys, one program per (batch, head, query block) accumulates dQ over its KV blocks.

It runs after `attn-differentiate`, and takes the forward function @f (shapes, scale, the
score_mod and mask regions) and @f_grad (the chain rule through the score_mod,
attn.score_mod_grad) and replaces both with

    @f_bwd_dq(q, k, v, c0.., out, do, lse, dlse, dq, delta) -> (dq, delta)
                                                    grid [B, H, ceil(Lq / block_m)], launched first
    @f_bwd_dkdv(q, k, v, c0.., do, lse, delta, dk, dv) -> (dk, dv)
                                                    grid [B, Hkv, ceil(Lk / block_n)]

(the element-wise normalizers' kernels take neither out, lse, dlse nor delta: abi's
ELEMENTWISE_BACKWARD_KERNELS; their P = f(s) and dS = f'(s) dP need no row statistic; a user
normalizer's dQ kernel writes its rows' rscale and delta: ONLINE_BACKWARD_KERNELS, and with a
running max also the rows' max, the key that attains it and the max's gradient:
ONLINE_MAX_BACKWARD_KERNELS)

each naming its arguments' roles in `attn.arg_roles`. `out` and `lse` are the forward's output
and logsumexp, `do` and `dlse` their gradients (dlse zeros where the caller has none). The dQ
kernel also writes delta = rowsum(dO * O) - dlse per query row (FlashAttention's preprocess, done
where the program has its dO rows loaded), which the dK/dV kernel reads. Both kernels recompute
the scores of a tile, P = exp(score_mod(s) - lse), dP = dO V^T and dS = score_mod_grad(s,
P (dP - delta)); dQ += dS K; the dK/dV kernel computes the tile transposed, P^T from K Q^T and
dS^T from V dO^T, for dV += P^T dO and dK += dS^T Q; the softmax scale is applied to dK and dQ
once at the end. Recomputing P and dP in the dQ kernel costs two more tile products than an
atomic dQ would; in exchange every gradient is a plain sum in a fixed order, the same bits on
every run and on the CPU, whose programs run on threads that cannot share an accumulator.

Tiles are classified as in `attn-tile` (positional masks at compile time, tables as constants;
the dK/dV kernel reads the transposed lists), with the tiles on a ragged edge of either sequence
partial: their masked form also drops padded query rows. With `call-time-tables`, a mask that
reads closure tensors or the batch entry or head (not with per-entry lengths of an unpacked
batch) is classified at each call as the forward's is: each kernel takes its four tables as
arguments (abi.backward_table_roles, the dK/dV kernel's per KV block; per entry and head where the
mask reads b or h) and carries the mask program. A packed batch's program is bounded by each
sequence's keys and queries (tile_tables.bounded_by_lengths; b is the sequence, over the grid the
kernels record in attn.call_time_grid), so a tile the tables call full holds no row of the next
sequence. Without it, such masks visit every tile with the mask.

The gradients of the float closure tensors the score_mod reads (attn.closure_grad: learnable bias
tables, ALiBi slopes) are sums over every score that reads an element. The dQ kernel, which visits
each score once, adds each tile's contributions into them with attn.scatter_add: one more
destination dc<i> per closure tensor c<i>, after dq and delta, starting at zero (option
`closure-grads`; without it, when no gradient of a closure tensor is wanted, no dc<i>). Programs add
into the same elements, so the sums are atomic on GPUs and their order varies from run to run
(FlexAttention's captured-buffer gradients are atomic too); the lowerings reduce what a tile adds
to one element first where the index does not depend on the row or column.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..core import abi
from . import ModulePass, option
from .differentiate import CLOSURE_ARGS, GRAD_SUFFIX
from .kv_len import entry_length
from .l1_builders import (convert, f32, index, index_value, matmul, program_id, tensor_type, transpose,
                          zeros)
from .l1_ops import fail, ops_named, shape
from .tile_backward_frame import BackwardFrame
from .tile_backward_lists import transposed
from .tile_backward_rows import Rows
from .tile_backward_tiles import ROW, TILE
from .tile_paged import paged_source
from .tile_varlen import sequences_source


class _Backward(BackwardFrame):
    """Builds both kernels of one forward/grad function pair."""

    def __init__(self, forward, grad, aggregate, block_m: int, block_n: int, whole_tiles: bool = True,
                 closure_grads: bool = False, call_time_tables: bool = False, mirror_reads: bool = False):
        super().__init__(aggregate, forward)
        self.mirror_reads = mirror_reads
        self.whole_tiles = whole_tiles
        self.call_time_tables = call_time_tables
        # A mask classified at call time: its program, and the kernel's four table arguments.
        self.program = None
        self.table_args: list = []
        self.with_closure_grads = closure_grads
        self.grad = grad
        self.grad_block = grad.regions[0].blocks[0]
        # The grad function's closure parameters stand for these forward arguments.
        self.closure_args = [int(a) for a in grad.attributes[CLOSURE_ARGS]]
        self.bm, self.bn = block_m, block_n
        score = next(op.operation for op in forward.regions[0].blocks[0].operations
                     if op.operation.name == "attn.score")
        q, k, v = score.operands[0], score.operands[1], aggregate.operands[1]
        if paged_source(k) is not None or paged_source(v) is not None:
            raise fail(aggregate, "has no backward kernels for a paged KV cache (attn.gather_pages)")
        # Packed sequences (attn.unpack_sequences): q, k, v are views of packed arguments.
        self.sources = [sequences_source(t) for t in (q, k, v)]
        if any(self.sources) and not all(self.sources):
            raise fail(aggregate, "needs q, k and v all packed (attn.unpack_sequences) or none")
        self.b, self.h, self.lq, self.dk = shape(q)
        _, self.hkv, self.lk, _ = shape(k)
        self.dv = shape(v)[3]
        self.group = self.h // self.hkv
        self.elt = q.type.element_type
        self.len_q, self.len_k = self.lq, self.lk  # index values per program for packed sequences
        self.inputs = [a.type for a in self.func_block.arguments]
        self.n_closures = len(self.inputs) - 3
        self.score_mod = self.mask = self.score_mod_grad = self.kv_len = None
        self.kind, self.stat = "softmax", "max"
        # (region, rank, groups) per closure gradient, and the closure tensors' positions c<i>.
        self.closure_grads, self.closure_positions = [], []
        for op in grad.regions[0].blocks[0].operations:
            name = op.operation.name
            if name == "attn.normalize_grad":
                self.kind = op.operation.attributes["kind"].value
                # Softmax's P comes from the saved logsumexp, the others' P = f(s) element by element.
                if self.kind not in abi.BACKWARD_NORMALIZERS:
                    raise fail(op.operation, f"has no backward kernels for normalize '{self.kind}' yet "
                                             f"({', '.join(abi.BACKWARD_NORMALIZERS)} only)")
                self.stat = op.operation.attributes["stat"].value
                if self.kind == "online":
                    self.prob, self.finalize, self.prob_grad, self.finalize_grad = list(op.operation.regions)
            elif name == "attn.score_mod_grad":
                self.score_mod_grad = op.operation.regions[0]
            elif name == "attn.closure_grad" and self.with_closure_grads:
                self.closure_grads.append(self._closure_grad(op.operation))
        for op in forward.regions[0].blocks[0].operations:
            name = op.operation.name
            if name == "attn.score":
                self.scale = float(op.operation.attributes["scale"].value)
            elif name == "attn.score_mod":
                self.score_mod = op.operation.regions[0]
            elif name == "attn.mask":
                self.mask = op.operation.regions[0]
                # Per-entry key lengths, read once per program as attn-tile does.
                self.kv_len = op.operation.operands[0] if len(op.operation.operands) else None

    def _closure_grad(self, op):
        """(region, rank, groups) of an attn.closure_grad; records which closure tensor it differentiates."""
        from mlir import ir

        param = ir.BlockArgument(op.operands[2]).arg_number
        self.closure_positions.append(self.closure_args[param - 2] - len(abi.INPUTS))
        rank = len(op.results[0].type.shape)
        terminator = list(op.regions[0].blocks[0].operations)[-1].operation
        return op.regions[0], rank, len(terminator.operands) // (rank + 1)

    def mirrored_positions(self, axis: int) -> list[int]:
        """The closure tensors c<i> some mod region reads stepping back along `axis` (-2: the
        queries, the dK/dV kernel's tile rows; -1: the keys, the dQ kernel's), which that kernel
        reads mirrored (passes/mirror_reads.py)."""
        from .mirror_reads import mirrored_positions

        def position(arg):
            if arg.owner == self.grad_block:
                return self.closure_args[arg.arg_number - 2] - len(abi.INPUTS)
            return arg.arg_number - len(abi.INPUTS) if arg.owner == self.func_block else None

        return mirrored_positions((self.score_mod, self.score_mod_grad, self.mask), axis, position)

    @property
    def closure_roles(self) -> list[str]:
        """The dQ kernel's closure-gradient destinations, dc<i>, in the order it writes them."""
        return [abi.closure_grad(i) for i in self.closure_positions]

    def kernel_arg(self, value, what: str):
        from mlir import ir

        if isinstance(value.owner, ir.Block) and value.owner == self.grad_block:
            number = ir.BlockArgument(value).arg_number
            if number >= 2:
                return self.kernel_args[self.closure_args[number - 2]]
        return super().kernel_arg(value, what)

    def packed_arg(self, i: int):
        """Kernel argument of q, k or v (i = 0, 1, 2): the tensor, or a packed sequence's packed one."""
        if self.sources[i] is None:
            return self.kernel_args[i]
        return self.kernel_arg(self.sources[i][0], "the packed q, k and v")

    def sides(self, pb):
        """(q-side Rows, k-side Rows) of the program of batch entry `pb`; sets the lengths the
        tile masks compare with."""
        keys = None if self.kv_len is None else entry_length(self.kernel_arg(self.kv_len, "kv_len"), pb, self.lk)
        q_rows = Rows(self, self.sources[0], pb, self.lq)
        k_rows = Rows(self, self.sources[1], pb, self.lk, keys)
        self.len_q, self.len_k = q_rows.length, k_rows.length
        return q_rows, k_rows

    # --- helpers of both kernels (the tile math: tile_backward_tiles) ---------------------------
    def to_input_type(self, tile):
        if self.elt == tile.type.element_type:
            return tile
        shape_ = list(tile.type.shape)
        return self.generic([(tile, TILE)], tensor_type(shape_, self.elt), lambda a: convert(a[0], self.elt))

    def scaled(self, acc, factor: float):
        from mlir.dialects import arith

        return self.generic([(acc, TILE)], tensor_type(list(acc.type.shape), self.elt),
                            lambda a: convert(arith.mulf(a[0], f32(factor)), self.elt))

    # --- the kernels ---------------------------------------------------------------------------
    def build_dkdv(self, name: str, partial, full) -> None:
        from mlir import ir
        from mlir.dialects import arith, func

        bm, bn = self.bm, self.bn
        nn = -(-self.lk // bn)
        lists = (transposed(partial, nn), transposed(full, nn))
        entry, args = self.signature(name, "dkdv", [self.b, self.hkv, nn], lists)
        d_out, lse, delta, dk_dest, dv_dest = (args.get(r) for r in ("do", "lse", "delta", "dk", "dv"))
        # A user normalizer's rows, which its dQ kernel wrote.
        online_rows = {r: args[r] for r in abi.backward_roles("dkdv", self.kind, self.stat)[0][1:]} \
            if self.kind == "online" else {}
        q, k, v = (self.packed_arg(i) for i in range(3))
        with ir.InsertionPoint(entry):
            pb, phk, pn = (program_id(axis) for axis in range(3))
            q_rows, k_rows = self.sides(pb)
            n0 = arith.muli(pn, index(bn))
            k_tile = k_rows.load(k, phk, n0, bn, self.dk)
            v_tile = k_rows.load(v, phk, n0, bn, self.dv)
            reach = None
            if q_rows.dynamic or k_rows.dynamic:
                # A KV block past the entry's keys visits no query block; the others, those below
                # its queries.
                inside = arith.cmpi(arith.CmpIPredicate.slt, n0, index_value(k_rows.length))
                reach = arith.select(inside, q_rows.reach(bm), index(0))

            def head_step(g, state):
                h = arith.addi(arith.muli(phk, index(self.group)), g) if self.group > 1 else phk

                def step(mb, acc, masked):
                    m0 = arith.muli(mb, index(bm))
                    q_tile = q_rows.load(q, h, m0, bm, self.dk)
                    do_tile = q_rows.load(d_out, h, m0, bm, self.dv)
                    neg_lse2 = delta_row = None
                    if self.row_statistic:
                        neg_lse2 = self.log2_offsets(q_rows.load(lse, h, m0, bm, None))
                        delta_row = q_rows.load(delta, h, m0, bm, None)
                    qk_t = matmul(k_tile, transpose(q_tile), zeros([bn, bm]))
                    dp_t = matmul(v_tile, transpose(do_tile), zeros([bn, bm]))
                    if self.kind == "online":
                        rows = {r: q_rows.load(t, h, m0, bm, None) for r, t in online_rows.items()}
                        if self.stat == "max":
                            p_t, ds_t, _ = self.max_tile_gradients(qk_t, dp_t, rows, pb, h, m0, n0, masked,
                                                                   keys_first=True)
                        else:
                            p_t, ds_t = self.online_gradients(qk_t, dp_t, rows, pb, h, m0, n0, masked)
                    else:
                        p_t, ds_t = self.tile_gradients(qk_t, dp_t, neg_lse2, delta_row, pb, h, m0, n0, masked,
                                                        keys_first=True)
                    dv_acc = matmul(self.to_input_type(p_t), do_tile, acc[1])
                    dk_acc = matmul(self.to_input_type(ds_t), q_tile, acc[0])
                    return [dk_acc, dv_acc]

                return self.walk(lists, (pb, h, pn), state, step, reach)

            state = [zeros([bn, self.dk]), zeros([bn, self.dv])]
            if self.group > 1:
                from .l1_builders import for_loop

                state = for_loop(self.group, state, head_step)
            else:
                state = head_step(None, state)
            dk_tile = self.scaled(state[0], self.scale)
            dv_tile = self.scaled(state[1], 1.0)
            func.ReturnOp([k_rows.store(dk_tile, dk_dest, phk, n0, bn),
                           k_rows.store(dv_tile, dv_dest, phk, n0, bn)])

    def build_dq(self, name: str, partial, full) -> None:
        from mlir import ir
        from mlir.dialects import arith, func

        bm, bn = self.bm, self.bn
        nm = -(-self.lq // bm)
        f32_type = ir.F32Type.get()
        entry, args = self.signature(name, "dq", [self.b, self.h, nm], (partial, full))
        out, d_out, lse, d_lse, dq_dest, delta_dest = (args.get(r) for r in ("out", "do", "lse", "dlse", "dq",
                                                                               "delta"))
        q, k, v = (self.packed_arg(i) for i in range(3))
        with ir.InsertionPoint(entry):
            pb, ph, pm = (program_id(axis) for axis in range(3))
            q_rows, k_rows = self.sides(pb)
            hk = arith.divui(ph, index(self.group)) if self.group > 1 else ph
            m0 = arith.muli(pm, index(bm))
            q_tile = q_rows.load(q, ph, m0, bm, self.dk)
            do_tile = q_rows.load(d_out, ph, m0, bm, self.dv)
            neg_lse2 = delta_row = None
            if self.row_statistic:
                neg_lse2 = self.log2_offsets(q_rows.load(lse, ph, m0, bm, None))
                # FlashAttention's preprocess, here where this program's dO rows are loaded
                # anyway: delta = rowsum(dO * O) - dlse, which the dK/dV kernel reads back.
                o_tile = q_rows.load(out, ph, m0, bm, self.dv)
                products = self.generic([(do_tile, TILE), (o_tile, TILE)], tensor_type([bm, self.dv]),
                                        lambda a: arith.mulf(convert(a[0], f32_type), convert(a[1], f32_type)))
                d_lse_row = q_rows.load(d_lse, ph, m0, bm, None)
                delta_row = self.generic([(self.row_sum(products), ROW), (d_lse_row, ROW)], tensor_type([bm]),
                                         lambda a: arith.subf(a[0], a[1]), rank=1)
            reach = None
            if q_rows.dynamic or k_rows.dynamic:
                inside = arith.cmpi(arith.CmpIPredicate.slt, m0, index_value(q_rows.length))
                reach = arith.select(inside, k_rows.reach(bn), index(0))

            if self.kind == "online":
                build = self.max_dq if self.stat == "max" else self.online_dq
                dests = [args[r] for r in abi.backward_roles("dq", self.kind, self.stat)[1]]
                build(q_tile, do_tile, (q_rows, k_rows), (k, v), (pb, ph, hk, pm, m0), (partial, full), dests,
                      [args[r] for r in self.closure_roles], reach)
                return

            def step(nb, acc, masked):
                n0 = arith.muli(nb, index(bn))
                k_tile, qk, dp = self.key_tile_products(q_tile, do_tile, k_rows, (k, v), hk, n0)
                if not self.closure_grads:
                    _, ds = self.tile_gradients(qk, dp, neg_lse2, delta_row, pb, ph, m0, n0, masked)
                    return [matmul(self.to_input_type(ds), k_tile, acc[0])]
                # Every score is visited by exactly one dQ program, so this kernel scatters the
                # closure tensors' gradients (the dK/dV one does not).
                _, ds, dm = self.tile_gradients(qk, dp, neg_lse2, delta_row, pb, ph, m0, n0, masked,
                                                with_modded=True)
                closures = self.scatter_closure_grads(qk, dm, acc[1:], pb, ph, m0, n0, masked)
                return [matmul(self.to_input_type(ds), k_tile, acc[0])] + closures

            closure_dests = [args[role] for role in self.closure_roles]
            acc, *closures = self.walk((partial, full), (pb, ph, pm), [zeros([bm, self.dk])] + closure_dests, step, reach)
            results = [q_rows.store(self.scaled(acc, self.scale), dq_dest, ph, m0, bm)]
            if self.row_statistic:
                results.append(q_rows.store(delta_row, delta_dest, ph, m0, bm))
            func.ReturnOp(results + closures)


@dataclass(frozen=True)
class AttnTileBackward(ModulePass):
    name: ClassVar[str] = "attn-tile-backward"
    summary: ClassVar[str] = ("Tile the backward of a softmax, element-wise-normalized or user-normalized "
                              "attention (after attn-differentiate) into two "
                              "L1 kernels: dK/dV per KV block, dQ per query block")

    block_m: int = option(64, "query rows per tile of the dQ kernel")
    block_n: int = option(64, "keys per tile of the dQ kernel")
    dkdv_block_m: int = option(0, "query rows per tile of the dK/dV kernel (0: block-m)")
    dkdv_block_n: int = option(0, "keys per tile of the dK/dV kernel (0: block-n)")
    whole_tiles: bool = option(True, "load a tile whose rows all exist (L a multiple of the block) as a static "
                                     "slice, without padding: no row masks or bounds checks in the lowerings")
    closure_grads: bool = option(True, "the dQ kernel also writes the gradients of the float closure tensors the "
                                       "score_mod reads (dc<i>); false leaves them out (none is wanted)")
    call_time_tables: bool = option(False, "a mask that reads closure tensors, b or h is classified at each "
                                           "call: each kernel takes its four tile tables as arguments (roles "
                                           "dq_* and dkdv_*) and carries the mask program, as attn-tile's do")
    mirror_reads: bool = option(False, "each kernel reads a closure tensor whose reads step back along its "
                                       "tiles' rows (the dK/dV kernel's run over queries: a relative-position "
                                       "table at kv_idx - q_idx + c; the dQ kernel's over keys: at q_idx - "
                                       "kv_idx + c) from its copy reversed along the last dimension, an input "
                                       "of role c<i>_mirrored, forwards (passes/mirror_reads.py)")

    def __post_init__(self):
        for opt, value in (("block-m", self.block_m), ("block-n", self.block_n),
                           ("dkdv-block-m", self.dkdv_block_m or 1), ("dkdv-block-n", self.dkdv_block_n or 1)):
            if value < 1 or value & (value - 1):
                raise ValueError(f"{opt} must be a positive power of two, got {value}")

    def apply(self, module_op) -> None:
        for aggregate in ops_named(module_op, "attn.aggregate"):
            forward = aggregate.parent
            while forward.name != "func.func":
                forward = forward.parent
            name = abi.name(forward)
            grads = [f for f in abi.functions(module_op) if abi.name(f) == name + GRAD_SUFFIX]
            if not grads:
                raise fail(aggregate, f"has no derivative @{name}{GRAD_SUFFIX}: run attn-differentiate first")
            grad = grads[0]
            dkdv = _Backward(forward, grad, aggregate, self.dkdv_block_m or self.block_m,
                             self.dkdv_block_n or self.block_n, self.whole_tiles,
                             call_time_tables=self.call_time_tables, mirror_reads=self.mirror_reads)
            dq = _Backward(forward, grad, aggregate, self.block_m, self.block_n, self.whole_tiles,
                           self.closure_grads, self.call_time_tables, self.mirror_reads)
            with aggregate.location:
                dq.build_dq(abi.backward_kernel_name(name, "dq"), *dq.lists())
                dkdv.build_dkdv(abi.backward_kernel_name(name, "dkdv"), *dkdv.lists())
            grad.erase()
            forward.erase()
