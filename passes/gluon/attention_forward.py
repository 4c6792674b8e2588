"""The Hopper forward kernel `attn-lower-to-gluon` instantiates, written in Gluon (Triton's
tile-level dialect with explicit layouts, shared memory, barriers and warp specialization).

Why Gluon and not Triton IR: Triton 3.6's pipeliner waits on each Q K^T product right after
issuing it, so the softmax never overlaps a tensor-core product, and the Triton IR kernels stop
at 0.8-0.9x cuDNN on plain attention. Gluon states the schedule FlashAttention-3 uses:

- one loader warp issues TMA copies of the Q tile and of each K and V tile into a two-slot ring
  (an mbarrier per slot says ready, another says empty);
- two consumer warpgroups of 64 query rows each (three at D = 64, whose products take half the
  time, as FlashAttention-3's 192-row tiles there) issue tile j's Q K^T before tile j-1's P V, so
  the exponentials of tile j run while P V is on the tensor cores; the accumulator is rescaled
  once that product lands.

The descriptors are over the whole [B, H, L, D] tensors (any 16-byte aligned strides): TMA fills
rows past a sequence's end with zeros, so ragged lengths read nothing of the next head; keys past
the end are masked to -inf in the last tile. Queries of head h read keys of head h // GROUP.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from .pipeline import NUM_STAGES, load_kv_ring, matrix, query_item, rings

# Partition functions receive their arguments as IR values (a constexpr argument would arrive as
# a tensor), so the tile sizes they need are module constants; the head dim and element type
# come from the shared-memory buffers' types.
HALF = 64      # query rows per consumer warpgroup; a program covers warpgroups(D) * HALF rows
BLOCK_N = 128  # keys per tile
HALF_M = gl.constexpr(HALF)
TILE_N = gl.constexpr(BLOCK_N)
NUM_WARPS = 4
# Registers per thread for the whole program, by consumer warpgroups; the warp_specialize calls
# below rebalance them (for each consumer warpgroup 240 of two, 160 of three; 24 for the loader).
MAX_REGISTERS = {2: 168, 3: 128}
LN2 = gl.constexpr(0.6931471805599453)


@gluon.jit
def _rounds(items, persistent):
    # How many work items this program takes: one a round, rounds of a grid's width (the last
    # may be partial), in `_round_item`'s order; one in a grid of every item.
    rounds = 1
    if persistent:
        me = gl.program_id(0)
        programs = gl.num_programs(0)
        full = items // programs
        last = me + (full % 2) * (programs - 1 - 2 * me)
        rounds = full + (last < items % programs).to(gl.int32)
    return rounds


@gluon.jit
def _round_item(k):
    # The program's item in round k. The rounds alternate direction (program p takes the p-th
    # item of even rounds and the p-th from the end of odd ones), so a program that took one of
    # a round's longer causal blocks takes a shorter one next: on an H100's 132 programs this
    # evens their loads, where taking the p-th of every round left some 17% over the mean
    # (items in order of a head's blocks, longest first, lengths repeating every 4 rounds).
    me = gl.program_id(0)
    programs = gl.num_programs(0)
    return k * programs + me + (k % 2) * (programs - 1 - 2 * me)


@gluon.jit
def _work_item(k, WARPGROUPS: gl.constexpr, items, n_blocks, heads, section, seq_k, causal):
    # Round k's item: its batch entry, head, first query row and key tiles (causal's stop at its
    # last row's diagonal).
    block, batch, head = query_item(_round_item(k), n_blocks, heads, items // n_blocks, section, causal)
    q_first = block * (WARPGROUPS * HALF_M)
    n_tiles = gl.cdiv(seq_k, TILE_N)
    if causal:
        n_tiles = gl.cdiv(gl.minimum(q_first + WARPGROUPS * HALF_M, seq_k), TILE_N)
    return batch, head, q_first, n_tiles


@gluon.jit
def _loader(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, v_ready, k_empty, v_empty,
            items, persistent, n_blocks, heads, section, group, seq_k, causal):
    # Each of the program's work items: its Q rows once the consumers are done with the last
    # item's, then its K and V tiles through the ring, whose position runs on across items.
    WARPGROUPS: gl.constexpr = q_smem.shape[0]
    ring = 0
    for k in range(_rounds(items, persistent)):
        batch, head, q_first, n_tiles = _work_item(k, WARPGROUPS, items, n_blocks, heads, section, seq_k, causal)
        mbarrier.wait(q_empty, (k & 1) ^ 1)
        mbarrier.expect(q_ready, WARPGROUPS * q_desc.block_type.nbytes)
        for i in gl.static_range(WARPGROUPS):
            tma.async_copy_global_to_shared(q_desc, [batch, head, q_first + i * HALF_M, 0], q_ready,
                                            q_smem.index(i))
        load_kv_ring(k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, batch, head // group,
                     n_tiles, ring)
        ring += n_tiles


@gluon.jit
def _tile(ring, j):
    return matrix(ring.index(j % NUM_STAGES))


@gluon.jit
def _scores(q, k_smem, k_ready, r, s_layout: gl.constexpr):
    # Q K^T of the K tile at ring position r.
    mbarrier.wait(k_ready.index(r % NUM_STAGES), (r // NUM_STAGES) & 1)
    zero = gl.zeros([HALF_M, TILE_N], gl.float32, s_layout)
    return warpgroup_mma(q, _tile(k_smem, r).permute((1, 0)), zero, use_acc=False, is_async=True)


@gluon.jit
def _softmax(s, m_i, l_i, qk_scale, j, first_row, seq_k, DIAGONAL: gl.constexpr, BOUNDED: gl.constexpr,
             s_layout: gl.constexpr):
    # DIAGONAL: the causal mask; BOUNDED: keys past seq_k (TMA read them as zeros).
    cols = j * TILE_N + gl.arange(0, TILE_N, layout=gl.SliceLayout(0, s_layout))
    if DIAGONAL:
        rows = first_row + gl.arange(0, HALF_M, layout=gl.SliceLayout(1, s_layout))
        s = gl.where(cols[None, :] <= rows[:, None], s, -float("inf"))
    if BOUNDED:
        s = gl.where(cols[None, :] < seq_k, s, -float("inf"))
    # m_i is in log2 units of the scaled scores, so each exponential is one exp2.
    m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
    alpha = gl.exp2(m_i - m_new)
    p = gl.exp2(s * qk_scale - m_new[:, None])
    l_i = l_i * alpha + gl.sum(p, axis=1)
    return p, m_new, l_i, alpha


@gluon.jit
def _step(q, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, turns, me, pingpong, acc, p, m_i, l_i,
          qk_scale, j, r, turn, first_row, seq_k, DIAGONAL: gl.constexpr, BOUNDED: gl.constexpr,
          s_layout: gl.constexpr, o_layout: gl.constexpr, p_layout: gl.constexpr, OVERLAP: gl.constexpr):
    # Tile j's scores and softmax (its K at ring position r), and tile j-1's P V (its V at r - 1).
    # With two warpgroups Q K^T of tile j is issued before P V of tile j-1, so tile j's
    # exponentials run while P V is on the tensor cores. Three warpgroups (D = 64) take the
    # products in order: holding P of tile j-1 through tile j's softmax spilled at their 160
    # registers, and the other warpgroups' products fill the tensor cores while one computes
    # exponentials. `turn` counts the program's steps, for the ping-pong's turns.
    prev = r - 1
    p_op = gl.convert_layout(p.to(v_smem.dtype), p_layout)
    mbarrier.wait(v_ready.index(prev % NUM_STAGES), (prev // NUM_STAGES) & 1)
    if OVERLAP:
        if pingpong:
            # The warpgroups take turns issuing their products, so one's exponentials run while
            # the other's products hold the tensor cores (FlashAttention-3's ping-pong schedule).
            mbarrier.wait(turns.index(me), (turn & 1) ^ (1 - me))
        s_tok = _scores(q, k_smem, k_ready, r, s_layout)
        acc_tok = warpgroup_mma(p_op, _tile(v_smem, prev), acc, is_async=True)
        if pingpong:
            mbarrier.arrive(turns.index(1 - me), count=1)
        s = warpgroup_mma_wait(1, deps=(s_tok, ))
        mbarrier.arrive(k_empty.index(r % NUM_STAGES), count=1)
        p, m_i, l_i, alpha = _softmax(s, m_i, l_i, qk_scale, j, first_row, seq_k, DIAGONAL, BOUNDED, s_layout)
        acc, p_op = warpgroup_mma_wait(0, deps=(acc_tok, p_op))
        mbarrier.arrive(v_empty.index(prev % NUM_STAGES), count=1)
    else:
        acc = warpgroup_mma(p_op, _tile(v_smem, prev), acc)
        mbarrier.arrive(v_empty.index(prev % NUM_STAGES), count=1)
        s = warpgroup_mma_wait(0, deps=(_scores(q, k_smem, k_ready, r, s_layout), ))
        mbarrier.arrive(k_empty.index(r % NUM_STAGES), count=1)
        p, m_i, l_i, alpha = _softmax(s, m_i, l_i, qk_scale, j, first_row, seq_k, DIAGONAL, BOUNDED, s_layout)
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
    return acc, p, m_i, l_i


@gluon.jit
def _query_block(index, WARPGROUPS: gl.constexpr, q, k_smem, v_smem, k_ready, v_ready, k_empty,
                 v_empty, q_empty, turns, first_row, n_tiles, ring, turn, seq_k, qk_scale, causal, pingpong,
                 s_layout: gl.constexpr, o_layout: gl.constexpr, p_layout: gl.constexpr):
    # This warpgroup's rows (from first_row) of one query block, whose K and V tiles sit in the
    # ring from position `ring` on: the unnormalized output, the row max and the row sum. Q is
    # released to the loader once the last Q K^T has landed, so the next block's copy overlaps
    # this one's end.
    HEAD_DIM: gl.constexpr = v_smem.shape[4]
    m_i = gl.full([HALF_M], -float("inf"), gl.float32, gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([HALF_M], gl.float32, gl.SliceLayout(1, s_layout))
    acc = gl.zeros([HALF_M, HEAD_DIM], gl.float32, o_layout)
    OVERLAP: gl.constexpr = WARPGROUPS == 2

    s = warpgroup_mma_wait(0, deps=(_scores(q, k_smem, k_ready, ring, s_layout), ))
    mbarrier.arrive(k_empty.index(ring % NUM_STAGES), count=1)
    # Tiles before `plain` take no mask. Causal masks the warpgroup's diagonal tile (whose keys
    # past seq_k only rows past it see), where its last row falls (first_row is a multiple of
    # HALF_M): with three warpgroups (192 rows over 128-key tiles) the block's later tiles may lie
    # wholly past this warpgroup's rows, and it releases them unread (`useful` tiles read). Else
    # only a ragged last tile is masked, to its keys before seq_k. The masked tile is a step of
    # its own, not a loop, which kept the two-warpgroup kernel free of spills.
    useful = n_tiles
    if causal:
        plain = first_row // TILE_N
        if WARPGROUPS == 3:
            useful = gl.minimum(plain + 1, n_tiles)
    elif seq_k % TILE_N != 0:
        plain = n_tiles - 1
    else:
        plain = n_tiles
    if plain > 0:
        p, m_i, l_i, alpha = _softmax(s, m_i, l_i, qk_scale, 0, first_row, seq_k, False, False, s_layout)
    elif causal:
        p, m_i, l_i, alpha = _softmax(s, m_i, l_i, qk_scale, 0, first_row, seq_k, True, False, s_layout)
    else:
        p, m_i, l_i, alpha = _softmax(s, m_i, l_i, qk_scale, 0, first_row, seq_k, False, True, s_layout)
    for j in range(1, plain):
        acc, p, m_i, l_i = _step(q, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, turns, index, pingpong,
                                 acc, p, m_i, l_i, qk_scale, j, ring + j, turn + j, first_row, seq_k, False,
                                 False, s_layout, o_layout, p_layout, OVERLAP)
    masked = gl.maximum(plain, 1)
    if masked < useful and causal:
        acc, p, m_i, l_i = _step(q, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, turns, index, pingpong,
                                 acc, p, m_i, l_i, qk_scale, masked, ring + masked, turn + masked, first_row,
                                 seq_k, True, False, s_layout, o_layout, p_layout, OVERLAP)
    elif masked < useful:
        acc, p, m_i, l_i = _step(q, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, turns, index, pingpong,
                                 acc, p, m_i, l_i, qk_scale, masked, ring + masked, turn + masked, first_row,
                                 seq_k, False, True, s_layout, o_layout, p_layout, OVERLAP)
    mbarrier.arrive(q_empty, count=1)

    last = ring + useful - 1
    mbarrier.wait(v_ready.index(last % NUM_STAGES), (last // NUM_STAGES) & 1)
    p_op = gl.convert_layout(p.to(v_smem.dtype), p_layout)
    acc = warpgroup_mma(p_op, _tile(v_smem, last), acc)
    mbarrier.arrive(v_empty.index(last % NUM_STAGES), count=1)
    if WARPGROUPS == 3:
        _release(k_ready, v_ready, k_empty, v_empty, last + 1, n_tiles - useful)
    return acc, m_i, l_i


@gluon.jit
def _release(k_ready, v_ready, k_empty, v_empty, first, count):
    # Ring positions first .. first + count - 1, which this warpgroup does not read, each slot
    # released once loaded: an arrival before the load would count toward its earlier phase.
    for r in range(first, first + count):
        slot = r % NUM_STAGES
        phase = (r // NUM_STAGES) & 1
        mbarrier.wait(k_ready.index(slot), phase)
        mbarrier.arrive(k_empty.index(slot), count=1)
        mbarrier.wait(v_ready.index(slot), phase)
        mbarrier.arrive(v_empty.index(slot), count=1)


@gluon.jit
def _consumer(index, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, v_ready, k_empty, v_empty,
              turns, o_ptr, lse_ptr, o_strides, lse_strides, items, persistent, n_blocks, heads, section, seq_q,
              seq_k, qk_scale, causal, pingpong):
    HEAD_DIM: gl.constexpr = v_smem.shape[4]
    WARPGROUPS: gl.constexpr = q_smem.shape[0]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, TILE_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    q = matrix(q_smem.index(index))
    ring = 0
    for k in range(_rounds(items, persistent)):
        batch, head, q_first, n_tiles = _work_item(k, WARPGROUPS, items, n_blocks, heads, section, seq_k, causal)
        first_row = q_first + index * HALF_M
        mbarrier.wait(q_ready, k & 1)
        # Steps before this block: one per K tile but each block's first (the ping-pong's turns).
        # With three warpgroups a ragged last block may leave one's rows wholly past the queries'
        # end (at L 2048, a third of the last 192-row block): it releases the block's tiles unread.
        if WARPGROUPS == 3 and first_row >= seq_q:
            mbarrier.arrive(q_empty, count=1)
            _release(k_ready, v_ready, k_empty, v_empty, ring, n_tiles)
            acc = gl.zeros([HALF_M, HEAD_DIM], gl.float32, o_layout)
            m_i = gl.zeros([HALF_M], gl.float32, gl.SliceLayout(1, s_layout))
            l_i = gl.full([HALF_M], 1.0, gl.float32, gl.SliceLayout(1, s_layout))
        else:
            acc, m_i, l_i = _query_block(index, WARPGROUPS, q, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty,
                                         q_empty, turns, first_row, n_tiles, ring, ring - k, seq_k, qk_scale,
                                         causal, pingpong, s_layout, o_layout, p_layout)
        ring += n_tiles

        acc = acc / gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))[:, None]
        rows = first_row + gl.arange(0, HALF_M, layout=gl.SliceLayout(1, o_layout))
        cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
        o_base = o_ptr + batch.to(gl.int64) * o_strides[0] + head.to(gl.int64) * o_strides[1]
        offsets = rows.to(gl.int64)[:, None] * o_strides[2] + cols[None, :]
        gl.store(o_base + offsets, acc.to(v_smem.dtype), mask=(rows < seq_q)[:, None])
        # The natural-log logsumexp of the scaled scores, as the backward reads it.
        lse = (m_i + gl.log2(l_i)) * LN2
        stat_rows = first_row + gl.arange(0, HALF_M, layout=gl.SliceLayout(1, s_layout))
        lse_base = lse_ptr + batch.to(gl.int64) * lse_strides[0] + head.to(gl.int64) * lse_strides[1]
        gl.store(lse_base + stat_rows, lse, mask=stat_rows < seq_q)


@gluon.jit
def attention_forward(q_desc, k_desc, v_desc, o_ptr, o_stride0, o_stride1, o_stride2, lse_ptr, lse_stride0,
                      lse_stride1, BATCH: gl.constexpr, HEADS: gl.constexpr, GROUP: gl.constexpr,
                      SEQ_Q: gl.constexpr, SEQ_K: gl.constexpr, QK_SCALE: gl.constexpr, CAUSAL: gl.constexpr,
                      PINGPONG: gl.constexpr, WARPGROUPS: gl.constexpr, PERSISTENT: gl.constexpr,
                      SECTION: gl.constexpr):
    # A program takes work items (query blocks of a batch entry and head), one a round of a grid's
    # width: one each in a grid of every item, several in a persistent grid.
    n_blocks = gl.cdiv(SEQ_Q, WARPGROUPS * HALF_M)
    items = n_blocks * BATCH * HEADS
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [WARPGROUPS] + q_desc.block_type.shape, q_desc.layout)
    k_smem, v_smem, k_ready, v_ready, k_empty, v_empty = rings(k_desc, v_desc, WARPGROUPS)
    q_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    turns = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_ready, count=1)
    mbarrier.init(q_empty, count=WARPGROUPS)
    mbarrier.init(turns.index(0), count=1)
    mbarrier.init(turns.index(1), count=1)

    shared = (q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, v_ready, k_empty, v_empty)
    consumer_args = shared + (turns, o_ptr, lse_ptr, (o_stride0, o_stride1, o_stride2), (lse_stride0, lse_stride1),
                              items, PERSISTENT, n_blocks, HEADS, SECTION, SEQ_Q, SEQ_K, QK_SCALE, CAUSAL, PINGPONG)
    loader_args = (q_desc, k_desc, v_desc) + shared + (items, PERSISTENT, n_blocks, HEADS, SECTION, GROUP, SEQ_K,
                                                       CAUSAL)
    # Each consumer warpgroup is told its rows by an argument: partition functions take no
    # constexprs, and the constant index reaches each partition as one.
    if WARPGROUPS == 3:
        gl.warp_specialize([(_consumer, (0, ) + consumer_args), (_consumer, (1, ) + consumer_args),
                            (_consumer, (2, ) + consumer_args), (_loader, loader_args)], [4, 4, 1], [160, 160, 24])
    else:
        gl.warp_specialize([(_consumer, (0, ) + consumer_args), (_consumer, (1, ) + consumer_args),
                            (_loader, loader_args)], [4, 1], [240, 24])


# The consumer warpgroups a program may take, by head dim: three (192 rows) hold P, S and the
# accumulator in 160 registers only at D = 64.
WARPGROUP_CHOICES = {64: (2, 3), 128: (2, )}


def warpgroups(dim: int, asked: int = 0) -> int:
    """Consumer warpgroups (of HALF query rows each) per program at head dim `dim`: `asked`, or
    (0) three at D = 64, whose products take half the time (FlashAttention-3's 192-row tiles),
    else two."""
    return asked or (3 if dim == 64 else 2)


def block_m(dim: int, asked: int = 0) -> int:
    """Query rows per program at head dim `dim` with `asked` consumer warpgroups (0: `warpgroups`')."""
    return HALF * warpgroups(dim, asked)


def descriptor_blocks(dim: int) -> list:
    """The TMA block shapes of the q, k and v descriptors, in the kernel's argument order."""
    return [[1, 1, HALF, dim], [1, 1, BLOCK_N, dim], [1, 1, BLOCK_N, dim]]


def kernel_constants(batch: int, heads: int, group: int, seq_q: int, seq_k: int, dim: int, scale: float,
                     causal: bool, pingpong: bool, persistent: bool, section: int = 1, consumers: int = 0) -> dict:
    """The kernel's constexpr arguments for one instantiation; `section`: heads per section of
    the work items' order (pipeline.query_item; 1: head after head); `consumers`: the consumer
    warpgroups (0: `warpgroups`' choice)."""
    return {"BATCH": batch, "HEADS": heads, "GROUP": group, "SEQ_Q": seq_q, "SEQ_K": seq_k,
            "QK_SCALE": scale * 1.4426950408889634, "CAUSAL": causal, "PINGPONG": pingpong,
            "WARPGROUPS": warpgroups(dim, consumers), "PERSISTENT": persistent, "SECTION": section}


def compile_ttgir(element: str, dim: int, constants: dict) -> str:
    """The kernel instantiated with `constants` (`kernel_constants`) and compiled for sm90: its
    Triton GPU IR, which the runtime compiles on the GPU. `element` is Triton's name of q's type
    (bf16, fp16)."""
    from .compile import descriptor_type, gluon_ttgir

    signature = {name: descriptor_type(element, block)
                 for name, block in zip(("q_desc", "k_desc", "v_desc"), descriptor_blocks(dim))}
    for name, elt, strides in (("o", element, 3), ("lse", "fp32", 2)):
        signature[f"{name}_ptr"] = f"*{elt}"
        signature.update({f"{name}_stride{d}": "i64" for d in range(strides)})
    # The aligned layout (abi.aligned_assumption, kernel_args.aligned_ok): 16-byte aligned
    # pointers, out's strides multiples of 16 elements, unit last strides (not arguments), so O's
    # stores are vectors. lse's row strides are any (a row statistic's: L = 1000 gives 1000).
    divisible = ["o_ptr", "o_stride0", "o_stride1", "o_stride2", "lse_ptr"]
    return gluon_ttgir(attention_forward, signature, constants, divisible, NUM_WARPS,
                       MAX_REGISTERS[constants["WARPGROUPS"]])
