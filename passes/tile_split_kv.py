"""The split-KV form of `attn-tile` (flash-decoding): when (batch, head, query block) programs are
too few to fill a GPU -- a few query tokens against a long KV cache -- each query block's KV tiles
are dealt out to `splits` programs, and a second kernel merges their partial results.

    @f_partial(q, k, v, c0.., w0, w1, w2) -> (w0, w1, w2)   grid [B, H, ceil(Lq / block_m) * splits]
    @f_combine(w0, w1, w2, out[, lse]) -> (out[, lse])      grid [B, H, ceil(Lq / block_m)]

(with pack-gqa, Hkv for H and block_m / group query rows a block: tile_pack_gqa)

Program p of the first kernel takes query block p / splits and the p % splits-th contiguous run
of that block's KV tiles (its rows of the tile tables are those tiles' lists; with per-entry key
lengths, the p % splits-th share of the block's tiles below the entry's length); it writes its
unnormalized accumulator (w0: [B, splits, H, Lq, Dv]), row max and row sum (w1, w2:
[B, splits, H, Lq rounded up to 16], so every stride is a multiple of 16 as the aligned kernel
variant assumes) in the normalizer's own domain. The combine kernel merges the splits as the
online softmax merges KV tiles: with m the largest row max seen, both the running and the incoming
accumulator and sum are rescaled to m with the normalizer's rescale region, then finalize and lse
run once. The arithmetic is that of one program walking every tile, regrouped.

Applies to normalizers that keep a row max and sum (softmax and online normalizers with a
statistic) and masks classified at compile time; `attn-tile` builds the one-kernel form for the
others whatever kv-splits says.
"""
from __future__ import annotations

from ..core import abi
from .l1_builders import index, program_id, tensor_type
from .tile_tables import Classification

ROW, TILE = (0,), (0, 1)


def _pad16(n: int) -> int:
    return -(-n // 16) * 16


def split_lists(lists: list[list[int]], nn: int, splits: int) -> list[list[int]]:
    """Per (query block, split), in that order: the KV blocks of the query block's list that fall
    in the split's contiguous run of ceil(nn / splits) blocks."""
    per = -(-nn // splits)
    return [[n for n in row if n // per == s] for row in lists for s in range(splits)]


def splittable(kernel, classification: Classification) -> bool:
    """Whether the split form applies: a row max and sum to merge, tile lists known now."""
    return kernel.stat == "max" and kernel.tracks_sum and not classification.at_call_time


def build_split(kernel, classification: Classification, splits: int) -> None:
    """Both kernels of the split form of `kernel` (tile._Kernel, entered at the op's location)."""
    name = kernel.func.attributes["sym_name"].value
    workspace = _workspace_types(kernel, splits)
    _build_partial(kernel, name + "_partial", classification, splits, workspace)
    _build_combine(kernel, name + "_combine", splits, workspace)


def _workspace_types(kernel, splits: int) -> list:
    rows = _pad16(kernel.lq)
    return [tensor_type([kernel.b, splits, kernel.h, kernel.lq, kernel.dv]),
            tensor_type([kernel.b, splits, kernel.h, rows]), tensor_type([kernel.b, splits, kernel.h, rows])]


def _build_partial(kernel, name: str, classification: Classification, splits: int, workspace: list) -> None:
    from mlir import ir
    from mlir.dialects import arith, func

    nm, nn = -(-kernel.lq // kernel.rows), -(-kernel.lk // kernel.bn)
    inputs = [a.type for a in kernel.func_block.arguments]
    mirrored = kernel.mirrored_positions()
    mirror_types = [inputs[len(abi.INPUTS) + i] for i in mirrored]
    attributes = kernel.attributes([kernel.b, _grid_heads(kernel), nm * splits])
    attributes.update(kernel.roles(abi.input_roles(len(inputs)) + [abi.mirrored(i) for i in mirrored]
                             + [abi.workspace(i) for i in range(3)]))
    entry = kernel.function(name, inputs + mirror_types + workspace, workspace, attributes)
    args = kernel.kernel_args
    kernel.take_mirrors(mirrored, args[len(inputs):len(inputs) + len(mirror_types)])
    w_acc, w_max, w_sum = args[len(inputs) + len(mirror_types):]
    with ir.InsertionPoint(entry):
        program = program_id(2)
        block = arith.divui(program, index(splits))
        split = arith.subi(program, arith.muli(block, index(splits)))
        kernel.start_program(block)
        q_tile = kernel.load_block(args[0], [kernel.pb], kernel.dk)
        if kernel.kv_len is None:
            partial = split_lists(classification.partial, nn, splits)
            full = split_lists(classification.full, nn, splits)
            m, l, acc = kernel.visit_kv_tiles(q_tile, args, program, partial, full, [])
        else:
            # With per-entry lengths the tiles in reach are known at run time only: each split
            # takes its share of them, not of the Lk keys the cache could hold.
            m, l, acc = kernel.visit_kv_tiles(q_tile, args, block, classification.partial, classification.full, [],
                                              deal=(split, splits))
        rows = arith.minsi(arith.subi(index(kernel.lq), kernel.m0), index(kernel.rows))
        lead = [kernel.pb, split]
        func.ReturnOp([kernel.store_block(acc, w_acc, lead, rows), kernel.store_block(m, w_max, lead, rows),
                       kernel.store_block(l, w_sum, lead, rows)])


def _grid_heads(kernel) -> int:
    return kernel.hkv if kernel.packed else kernel.h


def _build_combine(kernel, name: str, splits: int, workspace: list) -> None:
    from mlir import ir
    from mlir.dialects import arith, func, scf

    nm = -(-kernel.lq // kernel.rows)
    outputs = [r.type for r in kernel.op.results]
    roles = [abi.workspace(i) for i in range(3)] + list(abi.SOFTMAX_OUTPUTS[:len(outputs)])
    attributes = kernel.attributes([kernel.b, _grid_heads(kernel), nm])
    attributes.update(kernel.roles(roles))
    entry = kernel.function(name, workspace + outputs, outputs, attributes)
    w_acc, w_max, w_sum, *destinations = kernel.kernel_args
    with ir.InsertionPoint(entry):
        kernel.start_program()
        dv = kernel.dv
        loop = scf.ForOp(index(0), index(splits), index(1), kernel.initial_state())
        with ir.InsertionPoint(loop.body):
            lead = [kernel.pb, loop.induction_variable]
            acc_s = kernel.load_block(w_acc, lead, dv)
            m_s = kernel.load_block(w_max, lead, None)
            l_s = kernel.load_block(w_sum, lead, None)
            scf.YieldOp(_merge(kernel, list(loop.inner_iter_args), m_s, l_s, acc_s))
        state = list(loop.results)
        rows = arith.minsi(arith.subi(index(kernel.lq), kernel.m0), index(kernel.rows))
        results = [kernel.store_block(kernel.finalized(state), destinations[0], [kernel.pb], rows)]
        if kernel.with_lse:
            results.append(kernel.store_block(kernel.lse_of(state), destinations[1], [kernel.pb], rows))
        func.ReturnOp(results)


def _merge(kernel, state: list, m_s, l_s, acc_s) -> list:
    """The row state (m, l, acc) with one split's (m_s, l_s, acc_s) merged in."""
    from mlir.dialects import arith

    m, l, acc = state
    row_t = m.type
    m_new = kernel.generic([(m, ROW), (m_s, ROW)], row_t, lambda a: arith.maximumf(a[0], a[1]), rank=1)
    m_safe = kernel.safe_max(m_new)

    def rescale(old):
        return kernel.generic([(old, ROW), (m_safe, ROW)], row_t,
                              lambda a: kernel.inline(kernel.regions["rescale"], a), rank=1)

    alpha, beta = rescale(m), rescale(m_s)
    l_new = kernel.generic([(l, ROW), (alpha, ROW), (l_s, ROW), (beta, ROW)], row_t,
                           lambda a: arith.addf(arith.mulf(a[0], a[1]), arith.mulf(a[2], a[3])), rank=1)
    acc_new = kernel.generic([(acc, TILE), (alpha, ROW), (acc_s, TILE), (beta, ROW)], acc.type,
                             lambda a: arith.addf(arith.mulf(a[0], a[1]), arith.mulf(a[2], a[3])))
    return [m_new, l_new, acc_new]
