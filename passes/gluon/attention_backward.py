"""The Hopper backward of softmax attention (no mask or the causal one): two
kernels written in Gluon like the forward (`attention_forward.py`), FlashAttention-3's dK/dV
kernel with dQ in a kernel of its own instead of its atomics, launched in that order.

dQ: a program owns 128 query rows of one head (two consumer warpgroups of 64). A loader warp
copies their Q and dO once, then each KV tile of 64 keys into a two-slot ring (TMA; mbarriers say
ready and empty). Each consumer first writes delta = rowsum(dO * O) - dlse for its rows (what
the dK/dV kernel reads), then per tile computes S = Q K^T and dP = dO V^T on the tensor cores,
P = exp2(S scale - lse) and dS = P (dP - delta) in registers, and adds dS K into dQ.

dK/dV: a program owns 128 keys of one KV head (two consumer warpgroups of 64, dK and dV in
registers) and walks the query blocks of 64 rows of the heads that read that KV head (the GQA
group, summed in registers: no atomics, the same bits on every run). The loader copies the K and
V rows once, then each block's Q and dO into the ring; per block each consumer computes
S^T = K Q^T and dP^T = V dO^T, P^T and dS^T = P^T (dP^T - delta), and adds P^T dO into dV and
dS^T Q into dK, P^T and dS^T entering those products from registers.

lse is the forward's natural-log logsumexp of the scaled scores; dQ and dK come out scaled by the
softmax scale. Rows and keys past the sequence ends are read as zeros by TMA: they add nothing
and are not stored, so only the causal diagonal's blocks are masked, and dQ's ragged last tile
(P would be exp2(-lse) there, which overflows for rows whose scores all sit far below zero).
With a score mod (`score_mod.instantiate` binds it), P = exp(mod(x) - lse) with x the scaled
score, dS is with respect to x, dS = P (dP - delta) mod'(x), and the dK/dV kernels also mask the
rows past the queries' end (a mod need not be finite at the zeros TMA reads there).
Causal: a dK/dV program starts its walk at the first query block that sees its keys.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from .pipeline import NUM_STAGES, load_kv_ring, matrix, query_item, rings

HALF = 64      # K/V rows per consumer warpgroup; a program covers 2 * HALF rows
BLOCK_M = 64   # query rows per step
HALF_N = gl.constexpr(HALF)
TILE_M = gl.constexpr(BLOCK_M)
BLOCK_N = 2 * HALF
NUM_WARPS = 4
MAX_REGISTERS = 168
LOG2E = gl.constexpr(1.4426950408889634)
# No score mod: `score_mod.instantiate` binds these four in copies of the kernels that take one.
MODDED = gl.constexpr(False)
# Whether the mod's derivative with respect to the score is 1 (an additive bias: ALiBi, a bias
# table): then P itself is dS's factor, and no second tile of it is held across dP's product
# (ptxas spilled 272 bytes in the dK/dV kernel with one held, 28 without).
UNIT_GRAD = gl.constexpr(False)


@gluon.jit
def score_mod(x, b, h, q, kv, closures):
    return x


@gluon.jit
def score_mod_grad(x, g, b, h, q, kv, closures):
    return g


@gluon.jit
def _loader(q_desc, k_desc, v_desc, do_desc, k_smem, v_smem, q_smem, do_smem, kv_bar, q_ready, do_ready, q_empty,
            do_empty, batch, kv_head, kv_first, first_block, n_blocks, group):
    mbarrier.expect(kv_bar, 2 * k_desc.block_type.nbytes + 2 * v_desc.block_type.nbytes)
    for half in gl.static_range(2):
        tma.async_copy_global_to_shared(k_desc, [batch, kv_head, kv_first + half * HALF_N, 0], kv_bar,
                                        k_smem.index(half))
        tma.async_copy_global_to_shared(v_desc, [batch, kv_head, kv_first + half * HALF_N, 0], kv_bar,
                                        v_smem.index(half))
    for t in range(group * n_blocks):
        head = kv_head * group + t // n_blocks
        row = (first_block + t % n_blocks) * TILE_M
        slot = t % NUM_STAGES
        phase = (t // NUM_STAGES) & 1
        mbarrier.wait(q_empty.index(slot), phase ^ 1)
        mbarrier.expect(q_ready.index(slot), q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [batch, head, row, 0], q_ready.index(slot), q_smem.index(slot))
        mbarrier.wait(do_empty.index(slot), phase ^ 1)
        mbarrier.expect(do_ready.index(slot), do_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(do_desc, [batch, head, row, 0], do_ready.index(slot), do_smem.index(slot))


@gluon.jit
def _row_stat(ptr, strides, batch, head, rows, seq_q):
    return gl.load(ptr + batch.to(gl.int64) * strides[0] + head.to(gl.int64) * strides[1] + rows,
                   mask=rows < seq_q, other=0.0)


@gluon.jit
def transposed_grads(k_tile, v_tile, q_tile, do_tile, q_ready, do_ready, slot, phase, lse_ptr, delta_ptr,
                     lse_strides, delta_strides, batch, head, q_first, k_rows, seq_q, seq_k, qk_scale, sm_scale,
                     causal, closures, MASK: gl.constexpr, st_layout: gl.constexpr):
    # P^T and dS^T (float32) of one query block against a consumer's keys, the products S^T and
    # dP^T in flight together. MASK "diagonal": the causal diagonal's block; "keys": the causal
    # mask where `causal`, and keys past `seq_k`; "": none. With a score mod, dS^T is with
    # respect to the scores before it.
    zero = gl.zeros([HALF_N, TILE_M], gl.float32, st_layout)
    mbarrier.wait(q_ready.index(slot), phase)
    st_tok = warpgroup_mma(k_tile, q_tile.permute((1, 0)), zero, use_acc=False, is_async=True)
    mbarrier.wait(do_ready.index(slot), phase)
    dpt_tok = warpgroup_mma(v_tile, do_tile.permute((1, 0)), zero, use_acc=False, is_async=True)
    # The query rows' statistics load while the products run.
    q_rows = q_first + gl.arange(0, TILE_M, layout=gl.SliceLayout(0, st_layout))
    lse = _row_stat(lse_ptr, lse_strides, batch, head, q_rows, seq_q) * LOG2E
    delta = _row_stat(delta_ptr, delta_strides, batch, head, q_rows, seq_q)
    st = warpgroup_mma_wait(1, deps=(st_tok, ))
    if MODDED:
        x = st * sm_scale
        pt = gl.exp2(score_mod(x, batch, head, q_rows[None, :], k_rows[:, None], closures) * LOG2E - lse[None, :])
        # Rows past the queries' end hold TMA's zeros, where a mod may not be finite: nothing
        # from them may reach dK or dV.
        pt = gl.where((q_rows < seq_q)[None, :], pt, 0.0)
    else:
        pt = gl.exp2(st * qk_scale - lse[None, :])
    if MASK == "diagonal":
        pt = gl.where(q_rows[None, :] >= k_rows[:, None], pt, 0.0)
    if MASK == "keys":
        visible = (k_rows < seq_k)[:, None] & ((q_rows[None, :] >= k_rows[:, None]) | (causal == 0))
        pt = gl.where(visible, pt, 0.0)
    if MODDED and not UNIT_GRAD:
        # The mod's derivative is linear in the gradient it is handed: its factor, taken at 1
        # here, frees x before dP^T is waited for and shares the mod's recomputed values. Where
        # P is 0 so is dS^T, also where P is masked and the factor may not be finite.
        pt_factor = gl.where(pt == 0.0, 0.0,
                             pt * score_mod_grad(x, 1.0, batch, head, q_rows[None, :], k_rows[:, None], closures))
        pt = pt.to(k_tile.dtype)
    else:
        pt_factor = pt
    dpt = warpgroup_mma_wait(0, deps=(dpt_tok, ))
    return pt, pt_factor * (dpt - delta[None, :])


@gluon.jit
def _dkdv_step(k_tile, v_tile, q_smem, do_smem, q_ready, do_ready, q_empty, do_empty, lse_ptr, delta_ptr,
               lse_strides, delta_strides, batch, head, q_first, t, k_rows, dk, dv, seq_q, seq_k, qk_scale, sm_scale,
               closures, MASK: gl.constexpr, st_layout: gl.constexpr, op_layout: gl.constexpr):
    # One query block's share of dK and dV. Rows past a sequence's end need no mask (but with a
    # score mod, transposed_grads'): TMA reads their Q and dO as zeros, so their products add
    # nothing to dK and dV, and dK/dV rows past the keys' end are not stored; only the causal
    # diagonal is masked (MASK "diagonal").
    slot = t % NUM_STAGES
    phase = (t // NUM_STAGES) & 1
    q_tile = matrix(q_smem.index(slot))
    do_tile = matrix(do_smem.index(slot))
    pt, dst = transposed_grads(k_tile, v_tile, q_tile, do_tile, q_ready, do_ready, slot, phase, lse_ptr, delta_ptr,
                               lse_strides, delta_strides, batch, head, q_first, k_rows, seq_q, seq_k, qk_scale,
                               sm_scale, 1, closures, MASK, st_layout)
    pt_op = gl.convert_layout(pt.to(do_tile.dtype), op_layout)
    dst_op = gl.convert_layout(dst.to(do_tile.dtype), op_layout)
    dv_tok = warpgroup_mma(pt_op, do_tile, dv, is_async=True)
    dk_tok = warpgroup_mma(dst_op, q_tile, dk, is_async=True)
    dv, dk, pt_op, dst_op = warpgroup_mma_wait(0, deps=(dv_tok, dk_tok, pt_op, dst_op))
    mbarrier.arrive(q_empty.index(slot), count=1)
    mbarrier.arrive(do_empty.index(slot), count=1)
    return dk, dv


# KV heads per section of a causal GQA dK/dV grid (kv_walk).
GQA_SECTION = gl.constexpr(8)


@gluon.jit
def kv_walk(KV_HEADS: gl.constexpr, GROUP: gl.constexpr, SEQ_Q: gl.constexpr, SEQ_K: gl.constexpr,
            CAUSAL: gl.constexpr):
    # (batch, KV head, first key, first query block, query blocks, diagonal blocks) of a dK/dV
    # program: a 1-D grid whose programs walk a KV head's blocks in turn (in order: the first
    # keys, which the most causal queries see, first), so the programs in flight share its
    # queries through L2. Sections of heads (the forward's order) in this kernel and the dQ one
    # ran 1-4% slower on an H100 (bench/results/h100-gluon-backward-2026-12-06-sections.json), so
    # a section is one head; all heads in one section ran 1.7-1.8x slower. Causal GQA is the
    # exception: a program walks its KV head's GROUP query heads, so the heaviest programs are
    # GROUP times longer and, head after head, the last head's started last and ran past every
    # other program. Sections of 8 KV heads (heaviest blocks first within each) took it from
    # 1.169 to 1.016 ms at B 8, H 16 over 4 KV heads, L 2048, D 128; one section of all, 1.055
    # (h100-backward-2026-12-06-gqa-sections.json).
    n_kv = gl.cdiv(SEQ_K, 2 * HALF_N)
    section: gl.constexpr = GQA_SECTION if CAUSAL and GROUP > 1 else 1
    kv_block, batch, kv_head = query_item(gl.program_id(0), n_kv, KV_HEADS, gl.num_programs(0) // n_kv, section,
                                          False)
    kv_first = kv_block * (2 * HALF_N)
    blocks = gl.cdiv(SEQ_Q, TILE_M)
    if CAUSAL:
        first_block = kv_first // TILE_M
        n_blocks = blocks - first_block
        # The first two query blocks of a head's walk cross the program's 128 keys' diagonal.
        diagonal = gl.minimum(n_blocks, 2 * HALF_N // TILE_M)
    else:
        first_block = 0
        n_blocks = blocks
        diagonal = 0
    return batch, kv_head, kv_first, first_block, n_blocks, diagonal


@gluon.jit
def store_dkdv(HALF_INDEX: gl.constexpr, dk, dv, dk_ptr, dv_ptr, dk_strides, dv_strides, batch, kv_head, kv_first,
               seq_k, sm_scale, acc_layout: gl.constexpr):
    # A consumer's 64 rows of dK (scaled by the softmax scale) and dV; rows past the keys' end
    # are not stored.
    HEAD_DIM: gl.constexpr = dk.shape[1]
    dtype: gl.constexpr = dk_ptr.dtype.element_ty
    rows = kv_first + HALF_INDEX * HALF_N + gl.arange(0, HALF_N, layout=gl.SliceLayout(1, acc_layout))
    cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, acc_layout))
    keep = (rows < seq_k)[:, None]
    dk_base = dk_ptr + batch.to(gl.int64) * dk_strides[0] + kv_head.to(gl.int64) * dk_strides[1]
    gl.store(dk_base + rows.to(gl.int64)[:, None] * dk_strides[2] + cols[None, :], (dk * sm_scale).to(dtype),
             mask=keep)
    dv_base = dv_ptr + batch.to(gl.int64) * dv_strides[0] + kv_head.to(gl.int64) * dv_strides[1]
    gl.store(dv_base + rows.to(gl.int64)[:, None] * dv_strides[2] + cols[None, :], dv.to(dtype), mask=keep)


@gluon.jit
def _consumer(HALF_INDEX: gl.constexpr, k_smem, v_smem, q_smem, do_smem, kv_bar, q_ready, do_ready, q_empty,
              do_empty, lse_ptr, delta_ptr, dk_ptr, dv_ptr, lse_strides, delta_strides, dk_strides, dv_strides, batch,
              kv_head, kv_first, first_block, n_blocks, diagonal, group, seq_q, seq_k, qk_scale, sm_scale, closures):
    HEAD_DIM: gl.constexpr = k_smem.shape[4]
    st_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, TILE_M, 16])
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, HEAD_DIM, 16])
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    k_rows = kv_first + HALF_INDEX * HALF_N + gl.arange(0, HALF_N, layout=gl.SliceLayout(1, st_layout))
    k_tile = matrix(k_smem.index(HALF_INDEX))
    v_tile = matrix(v_smem.index(HALF_INDEX))
    dk = gl.zeros([HALF_N, HEAD_DIM], gl.float32, acc_layout)
    dv = gl.zeros([HALF_N, HEAD_DIM], gl.float32, acc_layout)
    mbarrier.wait(kv_bar, 0)
    for g in range(group):
        head = kv_head * group + g
        for i in range(diagonal):
            dk, dv = _dkdv_step(k_tile, v_tile, q_smem, do_smem, q_ready, do_ready, q_empty, do_empty, lse_ptr,
                                delta_ptr, lse_strides, delta_strides, batch, head, (first_block + i) * TILE_M,
                                g * n_blocks + i, k_rows, dk, dv, seq_q, seq_k, qk_scale, sm_scale, closures,
                                "diagonal", st_layout, op_layout)
        for i in range(diagonal, n_blocks):
            dk, dv = _dkdv_step(k_tile, v_tile, q_smem, do_smem, q_ready, do_ready, q_empty, do_empty, lse_ptr,
                                delta_ptr, lse_strides, delta_strides, batch, head, (first_block + i) * TILE_M,
                                g * n_blocks + i, k_rows, dk, dv, seq_q, seq_k, qk_scale, sm_scale, closures, "",
                                st_layout, op_layout)
    store_dkdv(HALF_INDEX, dk, dv, dk_ptr, dv_ptr, dk_strides, dv_strides, batch, kv_head, kv_first, seq_k, sm_scale,
               acc_layout)


# Partition functions take no constexpr arguments, so each warpgroup's half is its own function.
@gluon.jit
def _consumer_lower(k_smem, v_smem, q_smem, do_smem, kv_bar, q_ready, do_ready, q_empty, do_empty, lse_ptr,
                    delta_ptr, dk_ptr, dv_ptr, lse_strides, delta_strides, dk_strides, dv_strides, batch, kv_head, kv_first,
                    first_block, n_blocks, diagonal, group, seq_q, seq_k, qk_scale, sm_scale, closures):
    _consumer(0, k_smem, v_smem, q_smem, do_smem, kv_bar, q_ready, do_ready, q_empty, do_empty, lse_ptr, delta_ptr,
              dk_ptr, dv_ptr, lse_strides, delta_strides, dk_strides, dv_strides, batch, kv_head, kv_first, first_block, n_blocks,
              diagonal, group, seq_q, seq_k, qk_scale, sm_scale, closures)


@gluon.jit
def _consumer_upper(k_smem, v_smem, q_smem, do_smem, kv_bar, q_ready, do_ready, q_empty, do_empty, lse_ptr,
                    delta_ptr, dk_ptr, dv_ptr, lse_strides, delta_strides, dk_strides, dv_strides, batch, kv_head, kv_first,
                    first_block, n_blocks, diagonal, group, seq_q, seq_k, qk_scale, sm_scale, closures):
    _consumer(1, k_smem, v_smem, q_smem, do_smem, kv_bar, q_ready, do_ready, q_empty, do_empty, lse_ptr, delta_ptr,
              dk_ptr, dv_ptr, lse_strides, delta_strides, dk_strides, dv_strides, batch, kv_head, kv_first, first_block, n_blocks,
              diagonal, group, seq_q, seq_k, qk_scale, sm_scale, closures)


@gluon.jit
def attention_backward_dkdv(q_desc, k_desc, v_desc, do_desc, lse_ptr, lse_stride0, lse_stride1, delta_ptr,
                            delta_stride0, delta_stride1, dk_ptr, dk_stride0, dk_stride1, dk_stride2, dv_ptr,
                            dv_stride0, dv_stride1, dv_stride2, closures, KV_HEADS: gl.constexpr, GROUP: gl.constexpr,
                            SEQ_Q: gl.constexpr, SEQ_K: gl.constexpr, QK_SCALE: gl.constexpr,
                            SM_SCALE: gl.constexpr, CAUSAL: gl.constexpr):
    batch, kv_head, kv_first, first_block, n_blocks, diagonal = kv_walk(KV_HEADS, GROUP, SEQ_Q, SEQ_K, CAUSAL)

    k_smem = gl.allocate_shared_memory(k_desc.dtype, [2] + k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [2] + v_desc.block_type.shape, v_desc.layout)
    q_smem, do_smem, q_ready, do_ready, q_empty, do_empty = rings(q_desc, do_desc, 2)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)

    shared = (k_smem, v_smem, q_smem, do_smem, kv_bar, q_ready, do_ready, q_empty, do_empty)
    consumer_args = shared + (lse_ptr, delta_ptr, dk_ptr, dv_ptr, (lse_stride0, lse_stride1), (delta_stride0, delta_stride1),
                              (dk_stride0, dk_stride1, dk_stride2), (dv_stride0, dv_stride1, dv_stride2), batch,
                              kv_head, kv_first, first_block, n_blocks, diagonal, GROUP, SEQ_Q, SEQ_K, QK_SCALE,
                              SM_SCALE, closures)
    loader_args = (q_desc, k_desc, v_desc, do_desc) + shared + (batch, kv_head, kv_first, first_block, n_blocks,
                                                                GROUP)
    gl.warp_specialize([
        (_consumer_lower, consumer_args),
        (_consumer_upper, consumer_args),
        (_loader, loader_args),
    ], [4, 1], [240, 24])



DQ_BLOCK_N = 64  # keys per dQ tile: S and dP of 64 x 64 beside dQ's 64 x D accumulator
DQ_TILE_N = gl.constexpr(DQ_BLOCK_N)


@gluon.jit
def _dq_loader(q_desc, k_desc, v_desc, do_desc, q_smem, do_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty,
               v_empty, batch, head, kv_head, q_first, n_tiles):
    mbarrier.expect(q_bar, 2 * q_desc.block_type.nbytes + 2 * do_desc.block_type.nbytes)
    for half in gl.static_range(2):
        tma.async_copy_global_to_shared(q_desc, [batch, head, q_first + half * HALF_N, 0], q_bar, q_smem.index(half))
        tma.async_copy_global_to_shared(do_desc, [batch, head, q_first + half * HALF_N, 0], q_bar,
                                        do_smem.index(half))
    load_kv_ring(k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, batch, kv_head, n_tiles, 0)


@gluon.jit
def _dq_step(q_tile, do_tile, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, j, batch, head, s_rows, lse, delta,
             dq, seq_k, qk_scale, sm_scale, causal, closures, MASKED: gl.constexpr, s_layout: gl.constexpr,
             op_layout: gl.constexpr):
    # One KV tile's share of dQ. Only the causal diagonal's tiles and a ragged last tile are
    # masked (MASKED): a key past the end is read as zeros, so its dP is 0, but P there would be
    # exp2(-lse), which overflows where the row's scores are all far below zero.
    slot = j % NUM_STAGES
    phase = (j // NUM_STAGES) & 1
    k_tile = matrix(k_smem.index(slot))
    v_tile = matrix(v_smem.index(slot))
    zero = gl.zeros([HALF_N, DQ_TILE_N], gl.float32, s_layout)
    mbarrier.wait(k_ready.index(slot), phase)
    s_tok = warpgroup_mma(q_tile, k_tile.permute((1, 0)), zero, use_acc=False, is_async=True)
    mbarrier.wait(v_ready.index(slot), phase)
    dp_tok = warpgroup_mma(do_tile, v_tile.permute((1, 0)), zero, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(1, deps=(s_tok, ))
    k_cols = j * DQ_TILE_N + gl.arange(0, DQ_TILE_N, layout=gl.SliceLayout(0, s_layout))
    if MODDED:
        x = s * sm_scale
        p = gl.exp2(score_mod(x, batch, head, s_rows[:, None], k_cols[None, :], closures) * LOG2E - lse[:, None])
    else:
        p = gl.exp2(s * qk_scale - lse[:, None])
    if MASKED:
        visible = (k_cols < seq_k)[None, :] & ((s_rows[:, None] >= k_cols[None, :]) | (causal == 0))
        p = gl.where(visible, p, 0.0)
    if MODDED and not UNIT_GRAD:
        # As in transposed_grads: the derivative's factor at 1, where P is not 0.
        p = gl.where(p == 0.0, 0.0, p * score_mod_grad(x, 1.0, batch, head, s_rows[:, None], k_cols[None, :], closures))
    dp = warpgroup_mma_wait(0, deps=(dp_tok, ))
    mbarrier.arrive(v_empty.index(slot), count=1)
    ds_op = gl.convert_layout((p * (dp - delta[:, None])).to(q_tile.dtype), op_layout)
    dq_tok = warpgroup_mma(ds_op, k_tile, dq, is_async=True)
    dq, ds_op = warpgroup_mma_wait(0, deps=(dq_tok, ds_op))
    mbarrier.arrive(k_empty.index(slot), count=1)
    return dq


@gluon.jit
def _dq_consumer(HALF_INDEX: gl.constexpr, q_smem, do_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty,
                 v_empty, o_ptr, lse_ptr, dlse_ptr, dq_ptr, delta_ptr, o_strides, lse_strides, dlse_strides,
                 dq_strides, delta_strides, batch, head, q_first, n_tiles, n_plain, seq_q, seq_k, qk_scale, sm_scale,
                 causal, closures):
    HEAD_DIM: gl.constexpr = q_smem.shape[4]
    dtype: gl.constexpr = q_smem.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, DQ_TILE_N, 16])
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, HEAD_DIM, 16])
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    first_row = q_first + HALF_INDEX * HALF_N
    q_tile = matrix(q_smem.index(HALF_INDEX))
    do_tile = matrix(do_smem.index(HALF_INDEX))
    mbarrier.wait(q_bar, 0)

    # delta = rowsum(dO * O) - dlse (FlashAttention's preprocess), from dO in shared memory.
    rows = first_row + gl.arange(0, HALF_N, layout=gl.SliceLayout(1, acc_layout))
    cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, acc_layout))
    o_base = o_ptr + batch.to(gl.int64) * o_strides[0] + head.to(gl.int64) * o_strides[1]
    o = gl.load(o_base + rows.to(gl.int64)[:, None] * o_strides[2] + cols[None, :], mask=(rows < seq_q)[:, None],
                other=0.0)
    d_o = do_tile.load(acc_layout)
    delta = gl.sum(d_o.to(gl.float32) * o.to(gl.float32), axis=1) - _row_stat(dlse_ptr, dlse_strides, batch, head,
                                                                             rows, seq_q)
    delta_base = delta_ptr + batch.to(gl.int64) * delta_strides[0] + head.to(gl.int64) * delta_strides[1]
    gl.store(delta_base + rows, delta, mask=rows < seq_q)

    s_rows = first_row + gl.arange(0, HALF_N, layout=gl.SliceLayout(1, s_layout))
    lse = _row_stat(lse_ptr, lse_strides, batch, head, s_rows, seq_q) * LOG2E
    delta = gl.convert_layout(delta, gl.SliceLayout(1, s_layout))
    dq = gl.zeros([HALF_N, HEAD_DIM], gl.float32, acc_layout)
    for j in range(n_plain):
        dq = _dq_step(q_tile, do_tile, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, j, batch, head, s_rows, lse,
                      delta, dq, seq_k, qk_scale, sm_scale, causal, closures, False, s_layout, op_layout)
    for j in range(n_plain, n_tiles):
        dq = _dq_step(q_tile, do_tile, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, j, batch, head, s_rows, lse,
                      delta, dq, seq_k, qk_scale, sm_scale, causal, closures, True, s_layout, op_layout)

    dq_base = dq_ptr + batch.to(gl.int64) * dq_strides[0] + head.to(gl.int64) * dq_strides[1]
    gl.store(dq_base + rows.to(gl.int64)[:, None] * dq_strides[2] + cols[None, :], (dq * sm_scale).to(dtype),
             mask=(rows < seq_q)[:, None])


@gluon.jit
def _dq_consumer_lower(q_smem, do_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty, o_ptr, lse_ptr,
                       dlse_ptr, dq_ptr, delta_ptr, o_strides, lse_strides, dlse_strides, dq_strides, delta_strides,
                       batch, head, q_first, n_tiles, n_plain, seq_q, seq_k, qk_scale, sm_scale, causal, closures):
    _dq_consumer(0, q_smem, do_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty, o_ptr, lse_ptr,
                 dlse_ptr, dq_ptr, delta_ptr, o_strides, lse_strides, dlse_strides, dq_strides, delta_strides, batch,
                 head, q_first, n_tiles, n_plain, seq_q, seq_k, qk_scale, sm_scale, causal, closures)


@gluon.jit
def _dq_consumer_upper(q_smem, do_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty, o_ptr, lse_ptr,
                       dlse_ptr, dq_ptr, delta_ptr, o_strides, lse_strides, dlse_strides, dq_strides, delta_strides,
                       batch, head, q_first, n_tiles, n_plain, seq_q, seq_k, qk_scale, sm_scale, causal, closures):
    _dq_consumer(1, q_smem, do_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty, o_ptr, lse_ptr,
                 dlse_ptr, dq_ptr, delta_ptr, o_strides, lse_strides, dlse_strides, dq_strides, delta_strides, batch,
                 head, q_first, n_tiles, n_plain, seq_q, seq_k, qk_scale, sm_scale, causal, closures)


@gluon.jit
def attention_backward_dq(q_desc, k_desc, v_desc, do_desc, o_ptr, o_stride0, o_stride1, o_stride2, lse_ptr,
                          lse_stride0, lse_stride1, dlse_ptr, dlse_stride0, dlse_stride1, dq_ptr, dq_stride0,
                          dq_stride1, dq_stride2, delta_ptr, delta_stride0, delta_stride1, closures,
                          HEADS: gl.constexpr, GROUP: gl.constexpr, SEQ_Q: gl.constexpr, SEQ_K: gl.constexpr,
                          QK_SCALE: gl.constexpr, SM_SCALE: gl.constexpr, CAUSAL: gl.constexpr):
    # A 1-D grid of (query block, batch entry, head) items, a head's blocks adjacent.
    n_q = gl.cdiv(SEQ_Q, 2 * HALF_N)
    block_m, batch, head = query_item(gl.program_id(0), n_q, HEADS, gl.num_programs(0) // n_q, 1, CAUSAL)
    q_first = block_m * (2 * HALF_N)
    # The tiles before n_plain need no mask: with causal, the keys before the block's first row.
    if CAUSAL:
        n_tiles = gl.cdiv(gl.minimum(q_first + 2 * HALF_N, SEQ_K), DQ_TILE_N)
        n_plain = q_first // DQ_TILE_N
    else:
        n_tiles = gl.cdiv(SEQ_K, DQ_TILE_N)
        n_plain = SEQ_K // DQ_TILE_N

    q_smem = gl.allocate_shared_memory(q_desc.dtype, [2] + q_desc.block_type.shape, q_desc.layout)
    do_smem = gl.allocate_shared_memory(do_desc.dtype, [2] + do_desc.block_type.shape, do_desc.layout)
    k_smem, v_smem, k_ready, v_ready, k_empty, v_empty = rings(k_desc, v_desc, 2)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)

    shared = (q_smem, do_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty)
    consumer_args = shared + (o_ptr, lse_ptr, dlse_ptr, dq_ptr, delta_ptr, (o_stride0, o_stride1, o_stride2),
                              (lse_stride0, lse_stride1), (dlse_stride0, dlse_stride1),
                              (dq_stride0, dq_stride1, dq_stride2), (delta_stride0, delta_stride1), batch, head,
                              q_first, n_tiles, n_plain, SEQ_Q, SEQ_K, QK_SCALE, SM_SCALE, CAUSAL, closures)
    loader_args = (q_desc, k_desc, v_desc, do_desc) + shared + (batch, head, head // GROUP, q_first, n_tiles)
    gl.warp_specialize([
        (_dq_consumer_lower, consumer_args),
        (_dq_consumer_upper, consumer_args),
        (_dq_loader, loader_args),
    ], [4, 1], [240, 24])


# Each kernel's arguments after its four descriptors (q, k, v, do): (role, strides) pointers; the
# row statistics are float32, the rest of q's type.
_POINTERS = {"dq": (("out", 3), ("lse", 2), ("dlse", 2), ("dq", 3), ("delta", 2)),
             "dkdv": (("lse", 2), ("delta", 2), ("dk", 3), ("dv", 3))}
_ROW_STATS = ("lse", "dlse", "delta")
DESCRIPTORS = ("q", "k", "v", "do")
KERNELS = ("dq", "dkdv")


def kernel_function(kernel: str, mod=None):
    """The kernel's jit function; with a score mod (score_mod.ScoreMod), its copy that applies it."""
    from .score_mod import applying

    return applying({"dq": attention_backward_dq, "dkdv": attention_backward_dkdv}[kernel], mod)


def pointer_args(kernel: str) -> tuple:
    """(role, number of strides) of the kernel's pointer arguments, in order."""
    return _POINTERS[kernel]


def descriptor_blocks(kernel: str, dim: int) -> list:
    """The TMA block shapes of the q, k, v and do descriptors, in the kernel's argument order."""
    if kernel == "dq":
        return [[1, 1, HALF, dim], [1, 1, DQ_BLOCK_N, dim], [1, 1, DQ_BLOCK_N, dim], [1, 1, HALF, dim]]
    return [[1, 1, BLOCK_M, dim], [1, 1, HALF, dim], [1, 1, HALF, dim], [1, 1, BLOCK_M, dim]]


def grid(kernel: str, batch: int, heads: int, kv_heads: int, seq_q: int, seq_k: int) -> tuple:
    """Programs, on one axis: 128 query rows of a head (dQ) or 128 key rows of a KV head (dK/dV)."""
    if kernel == "dq":
        return (-(-seq_q // (2 * HALF)) * batch * heads, 1, 1)
    return (-(-seq_k // BLOCK_N) * batch * kv_heads, 1, 1)


def kernel_constants(kernel: str, heads: int, kv_heads: int, seq_q: int, seq_k: int, scale: float,
                     causal: bool) -> dict:
    """The kernel's constexpr arguments for one instantiation."""
    return {"HEADS" if kernel == "dq" else "KV_HEADS": heads if kernel == "dq" else kv_heads,
            "GROUP": heads // kv_heads, "SEQ_Q": seq_q, "SEQ_K": seq_k,
            "QK_SCALE": scale * 1.4426950408889634, "SM_SCALE": scale, "CAUSAL": causal}


def compile_ttgir(kernel: str, element: str, dim: int, constants: dict, mod=None) -> str:
    """The kernel ("dq" or "dkdv") instantiated with `constants` (and a score mod) and compiled for
    sm90: its Triton GPU IR. `element` is Triton's name of q's type (bf16, fp16)."""
    from .compile import backward_ttgir
    from .score_mod import closure_pointees

    descriptors = [(role, element, block) for role, block in zip(DESCRIPTORS, descriptor_blocks(kernel, dim))]
    return backward_ttgir(kernel_function(kernel, mod), element, descriptors, _POINTERS[kernel], _ROW_STATS, constants,
                          NUM_WARPS, MAX_REGISTERS, closures=closure_pointees(mod))
