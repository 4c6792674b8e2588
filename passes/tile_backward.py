"""`attn-tile-backward`: the backward of a softmax attention as two L1 kernels, FlashAttention-2's
split: one program per (batch, KV head, KV block) accumulates dK and dV over the query blocks
that see its keys, one program per (batch, head, query block) accumulates dQ over its KV blocks.

It runs after `attn-differentiate`, and takes the forward function @f (shapes, scale, the
score_mod and mask regions) and @f_grad (the chain rule through the score_mod,
attn.score_mod_grad) and replaces both with

    @f_bwd_dkdv(q, k, v, c0.., do, lse, delta, dk, dv) -> (dk, dv)   grid [B, Hkv, ceil(Lk / block_n)]
    @f_bwd_dq(q, k, v, c0.., do, lse, delta, dq) -> dq               grid [B, H, ceil(Lq / block_m)]

each naming its arguments' roles in `attn.arg_roles`. The caller supplies `lse`, the forward's
logsumexp, and `delta` = rowsum(dO * O) - dlse per query row (FlashAttention's preprocess: O(L D)
work, left to the caller). Both kernels recompute the scores of a tile, P = exp(score_mod(s) - lse),
dP = dO V^T and dS = score_mod_grad(s, P (dP - delta)); dV += P^T dO, dK += dS^T Q, dQ += dS K,
with the softmax scale applied to dK and dQ once at the end. Recomputing P and dP in the dQ
kernel costs two more tile products than an atomic dQ would; in exchange every gradient is a
plain sum in a fixed order, the same bits on every run and on the CPU, whose programs run on
threads that cannot share an accumulator.

Tiles are classified as in `attn-tile` (positional masks at compile time, tables as constants;
the dK/dV kernel reads the transposed lists), with the tiles on a ragged edge of either sequence
partial: their masked form also drops padded query rows. Masks that read closure tensors or the
batch/head visit every tile with the mask. Gradients of closure tensors are not computed here
(attn.closure_grad needs a scatter): the caller computes those.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..core import abi
from . import ModulePass, option
from .differentiate import CLOSURE_ARGS, GRAD_SUFFIX
from .l1_builders import KernelBuilder, convert, f32, index, matmul, program_id, tensor_type, transpose, zeros
from .l1_ops import fail, ops_named, shape
from .tile_tables import classify_blocks, table_constants

ROW, TILE = (0,), (0, 1)


def _ragged_partial(partial: list[list[int]], full: list[list[int]], lq: int, lk: int, bm: int, bn: int):
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


def _transposed(lists: list[list[int]], nn: int) -> list[list[int]]:
    out = [[] for _ in range(nn)]
    for m, row in enumerate(lists):
        for n in row:
            out[n].append(m)
    return out


class _Backward(KernelBuilder):
    """Builds both kernels of one forward/grad function pair."""

    def __init__(self, forward, grad, aggregate, block_m: int, block_n: int):
        super().__init__(aggregate, forward)
        self.grad = grad
        self.grad_block = grad.regions[0].blocks[0]
        # The grad function's closure parameters stand for these forward arguments.
        self.closure_args = [int(a) for a in grad.attributes[CLOSURE_ARGS]]
        self.bm, self.bn = block_m, block_n
        q, k, v = (self.func_block.arguments[i] for i in range(3))
        self.b, self.h, self.lq, self.dk = shape(q)
        _, self.hkv, self.lk, _ = shape(k)
        self.dv = shape(v)[3]
        self.group = self.h // self.hkv
        self.elt = q.type.element_type
        self.inputs = [a.type for a in self.func_block.arguments]
        self.n_closures = len(self.inputs) - 3
        self.score_mod = self.mask = self.score_mod_grad = None
        for op in grad.regions[0].blocks[0].operations:
            name = op.operation.name
            if name == "attn.normalize_grad":
                kind = op.operation.attributes["kind"].value
                if kind != "softmax":
                    raise fail(op.operation, f"has no backward kernels for normalize '{kind}' yet (softmax only)")
            elif name == "attn.score_mod_grad":
                self.score_mod_grad = op.operation.regions[0]
        for op in forward.regions[0].blocks[0].operations:
            name = op.operation.name
            if name == "attn.score":
                self.scale = float(op.operation.attributes["scale"].value)
            elif name == "attn.score_mod":
                self.score_mod = op.operation.regions[0]
            elif name == "attn.mask":
                self.mask = op.operation.regions[0]

    def kernel_arg(self, value, what: str):
        from mlir import ir

        if isinstance(value.owner, ir.Block) and value.owner == self.grad_block:
            number = ir.BlockArgument(value).arg_number
            if number >= 2:
                return self.kernel_args[self.closure_args[number - 2]]
        return super().kernel_arg(value, what)

    def lists(self):
        classification = classify_blocks(self.mask, self.lq, self.lk, self.bm, self.bn)
        return _ragged_partial(classification.partial, classification.full, self.lq, self.lk, self.bm, self.bn)

    # --- shared tile math ----------------------------------------------------------------------
    def tile_gradients(self, q_tile, k_trans, v_trans, do_tile, lse_row, delta_row, pb, h, m0, n0, masked: bool):
        """(P, dS) of one [block_m, block_n] tile, f32; dS is with respect to the scaled scores."""
        from mlir import ir
        from mlir.dialects import arith, linalg, math

        bm, bn = self.bm, self.bn
        tile_t = tensor_type([bm, bn])
        qk = matmul(q_tile, k_trans, zeros([bm, bn]))
        dp = matmul(do_tile, v_trans, zeros([bm, bn]))

        def positions():
            i, j = linalg.IndexOp(0).result, linalg.IndexOp(1).result
            qi, kj = arith.addi(m0, i), arith.addi(n0, j)
            # Padded rows and columns read the last valid index, as in the forward.
            return qi, kj, arith.minsi(qi, index(self.lq - 1)), arith.minsi(kj, index(self.lk - 1))

        def keep(qi, kj, qc, kc):
            inside = arith.andi(arith.cmpi(arith.CmpIPredicate.slt, qi, index(self.lq)),
                                arith.cmpi(arith.CmpIPredicate.slt, kj, index(self.lk)))
            if self.mask is not None:
                inside = arith.andi(inside, self.inline(self.mask, [pb, h, qc, kc]))
            return inside

        def probs(a):
            x = arith.mulf(a[0], f32(self.scale))
            qi, kj, qc, kc = positions()
            if self.score_mod is not None:
                x = self.inline(self.score_mod, [x, pb, h, qc, kc])
            p = math.exp(arith.subf(x, a[1]))
            return arith.select(keep(qi, kj, qc, kc), p, f32(0.0)) if masked else p

        p = self.generic([(qk, TILE), (lse_row, ROW)], tile_t, probs)

        def d_scores(a):
            d_mod = arith.mulf(a[1], arith.subf(a[2], a[3]))
            if self.score_mod_grad is None:
                return d_mod
            qi, kj, qc, kc = positions()
            x = arith.mulf(a[0], f32(self.scale))
            ds = self.inline(self.score_mod_grad, [x, d_mod, pb, h, qc, kc])
            # A masked pair's local derivative may be inf or NaN: select, do not multiply.
            return arith.select(keep(qi, kj, qc, kc), ds, f32(0.0)) if masked else ds

        ds = self.generic([(qk, TILE), (p, TILE), (dp, TILE), (delta_row, ROW)], tile_t, d_scores)
        return p, ds

    def to_input_type(self, tile):
        if self.elt == tile.type.element_type:
            return tile
        shape_ = list(tile.type.shape)
        return self.generic([(tile, TILE)], tensor_type(shape_, self.elt), lambda a: convert(a[0], self.elt))

    def scaled(self, acc, factor: float):
        from mlir.dialects import arith

        return self.generic([(acc, TILE)], tensor_type(list(acc.type.shape), self.elt),
                            lambda a: convert(arith.mulf(a[0], f32(factor)), self.elt))

    def store_rows(self, tile, dest, pb, ph, r0, length: int, rows: int, width: int):
        from mlir import ir
        from mlir.dialects import arith, tensor

        valid = arith.minsi(arith.subi(index(length), r0), index(rows))
        dynamic = ir.ShapedType.get_dynamic_size()
        piece = tensor.ExtractSliceOp(tensor_type([dynamic, width], self.elt), tile, [], [valid], [], [0, 0],
                                      [dynamic, width], [1, 1]).result
        return tensor.InsertSliceOp(piece, dest, [pb, ph, r0], [valid], [], [dynamic] * 3 + [0],
                                    [1, 1, dynamic, width], [1] * 4).result

    def tables(self, lists: list[list[int]]):
        from mlir import ir
        from mlir.dialects import arith

        counts, indices, _ = table_constants(lists)
        return [arith.constant(attr.type, attr) for attr in (ir.Attribute.parse(t) for t in (counts, indices))]

    def walk(self, lists_pair, block_id, state: list, step) -> list:
        """Loops over the block ids `block_id`'s partial then full lists name (each list a
        constant table), `step(other_block, state, masked)` building one iteration."""
        from mlir import ir
        from mlir.dialects import arith, scf, tensor

        for masked, lists in zip((True, False), lists_pair):
            if not any(lists):
                continue
            count_tab, index_tab = self.tables(lists)
            count = arith.index_cast(ir.IndexType.get(), tensor.extract(count_tab, [block_id]))
            loop = scf.ForOp(index(0), count, index(1), state)
            with ir.InsertionPoint(loop.body):
                raw = tensor.extract(index_tab, [block_id, loop.induction_variable])
                other = arith.index_cast(ir.IndexType.get(), raw)
                scf.YieldOp(step(other, list(loop.inner_iter_args), masked))
            state = list(loop.results)
        return state

    def signature(self, name: str, outputs: list[tuple[str, object]], grid: list[int]):
        from mlir import ir

        i64 = ir.IntegerType.get_signless(64)
        row_t = tensor_type([self.b, self.h, self.lq])
        do_t = tensor_type([self.b, self.h, self.lq, self.dv], self.elt)
        roles = abi.input_roles(len(self.inputs)) + list(abi.BACKWARD_INPUTS) + [role for role, _ in outputs]
        types = self.inputs + [do_t, row_t, row_t] + [t for _, t in outputs]
        attributes = {abi.GRID: ir.DenseI64ArrayAttr.get(grid), abi.BLOCK_M: ir.IntegerAttr.get(i64, self.bm),
                      abi.BLOCK_N: ir.IntegerAttr.get(i64, self.bn),
                      abi.ARG_ROLES: ir.ArrayAttr.get([ir.StringAttr.get(r) for r in roles])}
        entry = self.function(name, types, [t for _, t in outputs], attributes)
        n = len(self.inputs)
        return entry, self.kernel_args[n:n + 3], self.kernel_args[n + 3:]

    # --- the kernels ---------------------------------------------------------------------------
    def build_dkdv(self, name: str, partial, full) -> None:
        from mlir import ir
        from mlir.dialects import arith, func

        bm, bn = self.bm, self.bn
        nn = -(-self.lk // bn)
        k_t = tensor_type([self.b, self.hkv, self.lk, self.dk], self.elt)
        v_t = tensor_type([self.b, self.hkv, self.lk, self.dv], self.elt)
        entry, (d_out, lse, delta), (dk_dest, dv_dest) = self.signature(
            name, [("dk", k_t), ("dv", v_t)], [self.b, self.hkv, nn])
        q, k, v = self.kernel_args[:3]
        lists = (_transposed(partial, nn), _transposed(full, nn))
        with ir.InsertionPoint(entry):
            pb, phk, pn = (program_id(axis) for axis in range(3))
            n0 = arith.muli(pn, index(bn))
            k_tile = self.load_tile(k, [pb, phk], n0, self.lk, bn, self.dk)
            v_tile = self.load_tile(v, [pb, phk], n0, self.lk, bn, self.dv)
            k_trans, v_trans = transpose(k_tile), transpose(v_tile)

            def head_step(g, state):
                h = arith.addi(arith.muli(phk, index(self.group)), g) if self.group > 1 else phk

                def step(mb, acc, masked):
                    m0 = arith.muli(mb, index(bm))
                    q_tile = self.load_tile(q, [pb, h], m0, self.lq, bm, self.dk)
                    do_tile = self.load_tile(d_out, [pb, h], m0, self.lq, bm, self.dv)
                    lse_row = self.load_tile(lse, [pb, h], m0, self.lq, bm, None)
                    delta_row = self.load_tile(delta, [pb, h], m0, self.lq, bm, None)
                    p, ds = self.tile_gradients(q_tile, k_trans, v_trans, do_tile, lse_row, delta_row, pb, h,
                                                m0, n0, masked)
                    dv_acc = matmul(transpose(self.to_input_type(p)), do_tile, acc[1])
                    dk_acc = matmul(transpose(self.to_input_type(ds)), q_tile, acc[0])
                    return [dk_acc, dv_acc]

                return self.walk(lists, pn, state, step)

            state = [zeros([bn, self.dk]), zeros([bn, self.dv])]
            if self.group > 1:
                from .l1_builders import for_loop

                state = for_loop(self.group, state, head_step)
            else:
                state = head_step(None, state)
            dk_tile = self.scaled(state[0], self.scale)
            dv_tile = self.scaled(state[1], 1.0)
            func.ReturnOp([self.store_rows(dk_tile, dk_dest, pb, phk, n0, self.lk, bn, self.dk),
                           self.store_rows(dv_tile, dv_dest, pb, phk, n0, self.lk, bn, self.dv)])

    def build_dq(self, name: str, partial, full) -> None:
        from mlir import ir
        from mlir.dialects import arith, func

        bm, bn = self.bm, self.bn
        nm = -(-self.lq // bm)
        q_t = tensor_type([self.b, self.h, self.lq, self.dk], self.elt)
        entry, (d_out, lse, delta), (dq_dest,) = self.signature(name, [("dq", q_t)], [self.b, self.h, nm])
        q, k, v = self.kernel_args[:3]
        with ir.InsertionPoint(entry):
            pb, ph, pm = (program_id(axis) for axis in range(3))
            hk = arith.divui(ph, index(self.group)) if self.group > 1 else ph
            m0 = arith.muli(pm, index(bm))
            q_tile = self.load_tile(q, [pb, ph], m0, self.lq, bm, self.dk)
            do_tile = self.load_tile(d_out, [pb, ph], m0, self.lq, bm, self.dv)
            lse_row = self.load_tile(lse, [pb, ph], m0, self.lq, bm, None)
            delta_row = self.load_tile(delta, [pb, ph], m0, self.lq, bm, None)

            def step(nb, acc, masked):
                n0 = arith.muli(nb, index(bn))
                k_tile = self.load_tile(k, [pb, hk], n0, self.lk, bn, self.dk)
                v_tile = self.load_tile(v, [pb, hk], n0, self.lk, bn, self.dv)
                _, ds = self.tile_gradients(q_tile, transpose(k_tile), transpose(v_tile), do_tile, lse_row,
                                            delta_row, pb, ph, m0, n0, masked)
                return [matmul(self.to_input_type(ds), k_tile, acc[0])]

            (acc,) = self.walk((partial, full), pm, [zeros([bm, self.dk])], step)
            func.ReturnOp([self.store_rows(self.scaled(acc, self.scale), dq_dest, pb, ph, m0, self.lq, bm, self.dk)])


@dataclass(frozen=True)
class AttnTileBackward(ModulePass):
    name: ClassVar[str] = "attn-tile-backward"
    summary: ClassVar[str] = ("Tile the backward of a softmax attention (after attn-differentiate) into two "
                              "L1 kernels: dK/dV per KV block, dQ per query block")

    block_m: int = option(64, "query rows per tile")
    block_n: int = option(64, "keys per tile")

    def __post_init__(self):
        for opt, value in (("block-m", self.block_m), ("block-n", self.block_n)):
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
            builder = _Backward(forward, grad, aggregate, self.block_m, self.block_n)
            partial, full = builder.lists()
            with aggregate.location:
                builder.build_dkdv(abi.backward_kernel_name(name, "dkdv"), partial, full)
                builder.build_dq(abi.backward_kernel_name(name, "dq"), partial, full)
            grad.erase()
            forward.erase()
