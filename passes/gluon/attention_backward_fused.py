"""The Hopper backward of softmax attention in one kernel of five tile products: the dK/dV
kernel of `attention_backward.py` also forms each query block's dQ share, dS K, and adds it into
a float32 buffer through TMA's reduce-add, as FlashAttention-3 does. The two-kernel form
recomputes S and dP for dQ: seven products where this does five, at the price of the adds
(their order, so dQ's last bits, varies between runs), of zeroing the buffer and of converting
it. `attn-lower-to-gluon{backward=true reduce-dq=true}` emits it between the two other kernels
of this module, `attention_backward_delta` (delta, and the sums zeroed) and
`attention_backward_convert` (dQ from the sums), the backward's default at D = 128
(launch_defaults.reduced_dq).

A program owns 128 keys of one KV head (two consumer warpgroups of 64). Per query block of 64
rows each consumer computes S^T, dP^T, P^T and dS^T for its keys and adds P^T dO into dV and
dS^T Q into dK, as the dK/dV kernel does; then it stores dS^T to shared memory, and once both
halves are there (an mbarrier both consumers arrive on) it computes its half of dQ's columns,
dS (64 x 128 keys) times those columns of K, stages them in shared memory and hands them to a
TMA reduce-add into the buffer (two staging buffers a consumer, blocks alternating).
Per-element atomics from the registers in place of the reduce-adds ran at 0.80-0.84x of this
kernel's speed on an H100 (bench/RESULTS.md).

Keys past the sequence's end are masked here (the dK/dV kernel did not need to: it does not
store their rows), because P there would be exp2(-lse) and its dS would reach dQ.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma, warpgroup_mma, \
    warpgroup_mma_wait

from .attention_backward import HALF_N, TILE_M, _loader, _row_stat, kv_walk, store_dkdv, transposed_grads
from .pipeline import NUM_STAGES, async_reduce_add, matrix, rings


@gluon.jit
def _fused_step(HALF_INDEX: gl.constexpr, k_smem, v_smem, q_smem, do_smem, ds_smem, q_ready, do_ready, q_empty,
                do_empty, ds_ready, lse_ptr, delta_ptr, dq_desc, dq_smem, lse_strides, delta_strides, batch, head,
                q_first, t, k_rows, dk, dv, seq_q, seq_k, qk_scale, sm_scale, causal, closures, MASK: gl.constexpr,
                st_layout: gl.constexpr, op_layout: gl.constexpr, dq_layout: gl.constexpr):
    slot = t % NUM_STAGES
    phase = (t // NUM_STAGES) & 1
    k_tile = matrix(k_smem.index(HALF_INDEX))
    v_tile = matrix(v_smem.index(HALF_INDEX))
    q_tile = matrix(q_smem.index(slot))
    do_tile = matrix(do_smem.index(slot))
    pt, dst = transposed_grads(k_tile, v_tile, q_tile, do_tile, q_ready, do_ready, slot, phase, lse_ptr, delta_ptr,
                               lse_strides, delta_strides, batch, head, q_first, k_rows, seq_q, seq_k, qk_scale,
                               sm_scale, causal, closures, MASK, st_layout)
    dst = dst.to(do_tile.dtype)
    pt_op = gl.convert_layout(pt.to(do_tile.dtype), op_layout)
    dst_op = gl.convert_layout(dst, op_layout)
    dv_tok = warpgroup_mma(pt_op, do_tile, dv, is_async=True)
    dk_tok = warpgroup_mma(dst_op, q_tile, dk, is_async=True)
    # dS^T for the other consumer's dQ columns. The slot was last read two blocks ago, by
    # products both consumers waited for before arriving on the previous block's barrier.
    ds_slot = ds_smem.index(slot * 2 + HALF_INDEX)
    ds_slot.store(dst)
    fence_async_shared()
    mbarrier.arrive(ds_ready.index(slot), count=1)
    dv, dk, pt_op, dst_op = warpgroup_mma_wait(0, deps=(dv_tok, dk_tok, pt_op, dst_op))
    mbarrier.arrive(q_empty.index(slot), count=1)
    mbarrier.arrive(do_empty.index(slot), count=1)

    mbarrier.wait(ds_ready.index(slot), phase)
    HEAD_DIM: gl.constexpr = k_smem.shape[4]
    COLUMNS: gl.constexpr = HEAD_DIM // 2
    dq = gl.zeros([TILE_M, COLUMNS], gl.float32, dq_layout)
    for half in gl.static_range(2):
        ds_half = ds_smem.index(slot * 2 + half).permute((1, 0))
        k_columns = matrix(k_smem.index(half)).slice(HALF_INDEX * COLUMNS, COLUMNS, dim=1)
        dq = warpgroup_mma(ds_half, k_columns, dq, use_acc=half > 0, is_async=True)
    dq = warpgroup_mma_wait(0, deps=(dq, ))
    # The staging buffer this block fills was handed to TMA two blocks ago: wait for that
    # reduction to have read it.
    tma.store_wait(1)
    staging = dq_smem.index(HALF_INDEX * NUM_STAGES + slot)
    matrix(staging).store(dq)
    fence_async_shared()
    async_reduce_add(dq_desc, [batch, head, q_first, HALF_INDEX * COLUMNS], staging)
    return dk, dv


@gluon.jit
def _fused_consumer(HALF_INDEX: gl.constexpr, k_smem, v_smem, q_smem, do_smem, ds_smem, kv_bar, q_ready, do_ready,
                    q_empty, do_empty, ds_ready, lse_ptr, delta_ptr, dq_desc, dq_smem, dk_ptr, dv_ptr, lse_strides,
                    delta_strides, dk_strides, dv_strides, batch, kv_head, kv_first, first_block,
                    n_blocks, masked, group, seq_q, seq_k, qk_scale, sm_scale, causal, closures):
    HEAD_DIM: gl.constexpr = k_smem.shape[4]
    st_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, TILE_M, 16])
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, HEAD_DIM, 16])
    dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, HEAD_DIM // 2, 16])
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    k_rows = kv_first + HALF_INDEX * HALF_N + gl.arange(0, HALF_N, layout=gl.SliceLayout(1, st_layout))
    dk = gl.zeros([HALF_N, HEAD_DIM], gl.float32, acc_layout)
    dv = gl.zeros([HALF_N, HEAD_DIM], gl.float32, acc_layout)
    mbarrier.wait(kv_bar, 0)
    for g in range(group):
        head = kv_head * group + g
        for i in range(masked):
            dk, dv = _fused_step(HALF_INDEX, k_smem, v_smem, q_smem, do_smem, ds_smem, q_ready, do_ready, q_empty,
                                 do_empty, ds_ready, lse_ptr, delta_ptr, dq_desc, dq_smem, lse_strides, delta_strides,
                                 batch, head, (first_block + i) * TILE_M, g * n_blocks + i, k_rows, dk,
                                 dv, seq_q, seq_k, qk_scale, sm_scale, causal, closures, "keys", st_layout, op_layout,
                                 dq_layout)
        for i in range(masked, n_blocks):
            dk, dv = _fused_step(HALF_INDEX, k_smem, v_smem, q_smem, do_smem, ds_smem, q_ready, do_ready, q_empty,
                                 do_empty, ds_ready, lse_ptr, delta_ptr, dq_desc, dq_smem, lse_strides, delta_strides,
                                 batch, head, (first_block + i) * TILE_M, g * n_blocks + i, k_rows, dk,
                                 dv, seq_q, seq_k, qk_scale, sm_scale, causal, closures, "", st_layout, op_layout,
                                 dq_layout)
    # The shared memory must outlive the reductions that read it.
    tma.store_wait(0)
    store_dkdv(HALF_INDEX, dk, dv, dk_ptr, dv_ptr, dk_strides, dv_strides, batch, kv_head, kv_first, seq_k, sm_scale,
               acc_layout)


@gluon.jit
def _fused_lower(k_smem, v_smem, q_smem, do_smem, ds_smem, kv_bar, q_ready, do_ready, q_empty, do_empty, ds_ready,
                 lse_ptr, delta_ptr, dq_desc, dq_smem, dk_ptr, dv_ptr, lse_strides, delta_strides, dk_strides,
                 dv_strides, batch, kv_head, kv_first, first_block, n_blocks, masked, group, seq_q, seq_k, qk_scale,
                 sm_scale, causal, closures):
    _fused_consumer(0, k_smem, v_smem, q_smem, do_smem, ds_smem, kv_bar, q_ready, do_ready, q_empty, do_empty,
                    ds_ready, lse_ptr, delta_ptr, dq_desc, dq_smem, dk_ptr, dv_ptr, lse_strides, delta_strides,
                    dk_strides, dv_strides, batch, kv_head, kv_first, first_block, n_blocks, masked, group, seq_q,
                    seq_k, qk_scale, sm_scale, causal, closures)


@gluon.jit
def _fused_upper(k_smem, v_smem, q_smem, do_smem, ds_smem, kv_bar, q_ready, do_ready, q_empty, do_empty, ds_ready,
                 lse_ptr, delta_ptr, dq_desc, dq_smem, dk_ptr, dv_ptr, lse_strides, delta_strides, dk_strides,
                 dv_strides, batch, kv_head, kv_first, first_block, n_blocks, masked, group, seq_q, seq_k, qk_scale,
                 sm_scale, causal, closures):
    _fused_consumer(1, k_smem, v_smem, q_smem, do_smem, ds_smem, kv_bar, q_ready, do_ready, q_empty, do_empty,
                    ds_ready, lse_ptr, delta_ptr, dq_desc, dq_smem, dk_ptr, dv_ptr, lse_strides, delta_strides,
                    dk_strides, dv_strides, batch, kv_head, kv_first, first_block, n_blocks, masked, group, seq_q,
                    seq_k, qk_scale, sm_scale, causal, closures)


@gluon.jit
def attention_backward_fused(q_desc, k_desc, v_desc, do_desc, dq_sums_desc, lse_ptr, lse_stride0, lse_stride1,
                             delta_ptr, delta_stride0, delta_stride1, dk_ptr, dk_stride0, dk_stride1, dk_stride2,
                             dv_ptr, dv_stride0, dv_stride1, dv_stride2, closures, KV_HEADS: gl.constexpr,
                             GROUP: gl.constexpr, SEQ_Q: gl.constexpr, SEQ_K: gl.constexpr, QK_SCALE: gl.constexpr,
                             SM_SCALE: gl.constexpr, CAUSAL: gl.constexpr):
    batch, kv_head, kv_first, first_block, n_blocks, masked = kv_walk(KV_HEADS, GROUP, SEQ_Q, SEQ_K, CAUSAL)
    # The last program's keys may run past the end: all its blocks are masked.
    if kv_first + 2 * HALF_N > SEQ_K:
        masked = n_blocks

    k_smem = gl.allocate_shared_memory(k_desc.dtype, [2] + k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [2] + v_desc.block_type.shape, v_desc.layout)
    q_smem, do_smem, q_ready, do_ready, q_empty, do_empty = rings(q_desc, do_desc, 2)
    ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([HALF_N, TILE_M], k_desc.dtype)
    ds_smem = gl.allocate_shared_memory(k_desc.dtype, [2 * NUM_STAGES, HALF_N, TILE_M], ds_layout)
    ds_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(ds_ready.index(i), count=2)
    # Each consumer's dQ columns, staged for TMA's reduce-add in two buffers (blocks alternate).
    dq_smem = gl.allocate_shared_memory(dq_sums_desc.dtype, [2 * NUM_STAGES] + dq_sums_desc.block_type.shape,
                                        dq_sums_desc.layout)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)

    consumer_args = (k_smem, v_smem, q_smem, do_smem, ds_smem, kv_bar, q_ready, do_ready, q_empty, do_empty,
                     ds_ready, lse_ptr, delta_ptr, dq_sums_desc, dq_smem, dk_ptr, dv_ptr, (lse_stride0, lse_stride1),
                     (delta_stride0, delta_stride1), (dk_stride0, dk_stride1, dk_stride2),
                     (dv_stride0, dv_stride1, dv_stride2), batch, kv_head, kv_first, first_block, n_blocks, masked,
                     GROUP, SEQ_Q, SEQ_K, QK_SCALE, SM_SCALE, CAUSAL, closures)
    loader_args = (q_desc, k_desc, v_desc, do_desc, k_smem, v_smem, q_smem, do_smem, kv_bar, q_ready, do_ready,
                   q_empty, do_empty, batch, kv_head, kv_first, first_block, n_blocks, GROUP)
    gl.warp_specialize([
        (_fused_lower, consumer_args),
        (_fused_upper, consumer_args),
        (_loader, loader_args),
    ], [4, 1], [240, 24])


SUM_ROWS = 64  # query rows per program of the delta and convert kernels
SUM_ROWS_C = gl.constexpr(SUM_ROWS)
SUM_LAYOUT = gl.constexpr(gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0]))


@gluon.jit
def _row_block(HEADS: gl.constexpr, SEQ_Q: gl.constexpr, HEAD_DIM: gl.constexpr):
    # (batch, head, rows, columns) of this program's SUM_ROWS query rows of one head.
    n_blocks = gl.cdiv(SEQ_Q, SUM_ROWS_C)
    item = gl.program_id(0)
    flat = item // n_blocks
    rows = (item % n_blocks) * SUM_ROWS_C + gl.arange(0, SUM_ROWS_C, layout=gl.SliceLayout(1, SUM_LAYOUT))
    cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, SUM_LAYOUT))
    return flat // HEADS, flat % HEADS, rows, cols


@gluon.jit
def _rows_of(ptr, strides, batch, head, rows, cols):
    return ptr + batch.to(gl.int64) * strides[0] + head.to(gl.int64) * strides[1] + \
        rows.to(gl.int64)[:, None] * strides[2] + cols[None, :]


@gluon.jit
def attention_backward_delta(o_ptr, o_stride0, o_stride1, o_stride2, do_ptr, do_stride0, do_stride1, do_stride2,
                             dlse_ptr, dlse_stride0, dlse_stride1, delta_ptr, delta_stride0, delta_stride1,
                             dq_sums_ptr, dq_sums_stride0, dq_sums_stride1, dq_sums_stride2, HEADS: gl.constexpr,
                             SEQ_Q: gl.constexpr, HEAD_DIM: gl.constexpr):
    # delta = rowsum(dO * O) - dlse, which the fused kernel reads, and its dQ sums zeroed.
    batch, head, rows, cols = _row_block(HEADS, SEQ_Q, HEAD_DIM)
    keep = rows < SEQ_Q
    o = gl.load(_rows_of(o_ptr, (o_stride0, o_stride1, o_stride2), batch, head, rows, cols), mask=keep[:, None],
                other=0.0)
    d_o = gl.load(_rows_of(do_ptr, (do_stride0, do_stride1, do_stride2), batch, head, rows, cols),
                  mask=keep[:, None], other=0.0)
    delta = gl.sum(o.to(gl.float32) * d_o.to(gl.float32), axis=1) - _row_stat(
        dlse_ptr, (dlse_stride0, dlse_stride1), batch, head, rows, SEQ_Q)
    gl.store(delta_ptr + batch.to(gl.int64) * delta_stride0 + head.to(gl.int64) * delta_stride1 + rows, delta,
             mask=keep)
    gl.store(_rows_of(dq_sums_ptr, (dq_sums_stride0, dq_sums_stride1, dq_sums_stride2), batch, head, rows, cols),
             gl.zeros([SUM_ROWS_C, HEAD_DIM], gl.float32, SUM_LAYOUT), mask=keep[:, None])


@gluon.jit
def attention_backward_convert(dq_sums_ptr, dq_sums_stride0, dq_sums_stride1, dq_sums_stride2, dq_ptr, dq_stride0,
                               dq_stride1, dq_stride2, HEADS: gl.constexpr, SEQ_Q: gl.constexpr,
                               HEAD_DIM: gl.constexpr, SM_SCALE: gl.constexpr):
    # dQ = the sums times the softmax scale, in q's type.
    batch, head, rows, cols = _row_block(HEADS, SEQ_Q, HEAD_DIM)
    keep = rows < SEQ_Q
    sums = gl.load(_rows_of(dq_sums_ptr, (dq_sums_stride0, dq_sums_stride1, dq_sums_stride2), batch, head, rows,
                            cols), mask=keep[:, None], other=0.0)
    gl.store(_rows_of(dq_ptr, (dq_stride0, dq_stride1, dq_stride2), batch, head, rows, cols),
             (sums * SM_SCALE).to(dq_ptr.dtype.element_ty), mask=keep[:, None])


# The form's kernels in launch order, and each one's (role, strides) pointers after its
# descriptors; only the fused kernel takes descriptors (q, k, v and do as the dK/dV kernel's, and
# the dQ sums').
KERNELS = ("delta", "dkdvdq", "convert")
# The roles held in float32 whatever q's type: the dQ sums, as descriptors and as pointers.
_FLOAT32 = ("dq_sums", )
_POINTERS = {"delta": (("out", 3), ("do", 3), ("dlse", 2), ("delta", 2), ("dq_sums", 3)),
             "dkdvdq": (("lse", 2), ("delta", 2), ("dk", 3), ("dv", 3)),
             "convert": (("dq_sums", 3), ("dq", 3))}
_ROW_STATS = ("lse", "dlse", "delta")


def kernel_function(kernel: str, mod=None):
    """The kernel's jit function; with a score mod (score_mod.ScoreMod), its copy that applies it."""
    from .score_mod import applying

    return applying({"delta": attention_backward_delta, "dkdvdq": attention_backward_fused,
                     "convert": attention_backward_convert}[kernel], mod)


def pointer_args(kernel: str) -> tuple:
    return _POINTERS[kernel]


def descriptor_roles(kernel: str) -> tuple:
    """The roles of the kernel's descriptor arguments, in order."""
    from .attention_backward import DESCRIPTORS

    return DESCRIPTORS + ("dq_sums", ) if kernel == "dkdvdq" else ()


def descriptor_blocks(kernel: str, dim: int) -> list:
    """The TMA block shapes of the kernel's descriptors, in descriptor_roles' order."""
    from .attention_backward import descriptor_blocks as two_kernel_blocks

    if kernel != "dkdvdq":
        return []
    return two_kernel_blocks("dkdv", dim) + [[1, 1, TILE_M.value, dim // 2]]


def descriptors(kernel: str, element: str, dim: int) -> list:
    """(role, element, TMA block) of the kernel's descriptor arguments, in order."""
    return [(role, "fp32" if role in _FLOAT32 else element, block)
            for role, block in zip(descriptor_roles(kernel), descriptor_blocks(kernel, dim))]


def grid(kernel: str, batch: int, heads: int, kv_heads: int, seq_q: int, seq_k: int) -> tuple:
    from .attention_backward import grid as two_kernel_grid

    if kernel == "dkdvdq":
        return two_kernel_grid("dkdv", batch, heads, kv_heads, seq_q, seq_k)
    return (-(-seq_q // SUM_ROWS) * batch * heads, 1, 1)


def kernel_constants(kernel: str, heads: int, kv_heads: int, seq_q: int, seq_k: int, dim: int, scale: float,
                     causal: bool) -> dict:
    from .attention_backward import kernel_constants as two_kernel_constants

    if kernel == "dkdvdq":
        return two_kernel_constants("dkdv", heads, kv_heads, seq_q, seq_k, scale, causal)
    constants = {"HEADS": heads, "SEQ_Q": seq_q, "HEAD_DIM": dim}
    return dict(constants, SM_SCALE=scale) if kernel == "convert" else constants


def compile_ttgir(kernel: str, element: str, dim: int, constants: dict, mod=None) -> str:
    """The kernel instantiated with `constants` (and a score mod) and compiled for sm90: its Triton
    GPU IR."""
    from .attention_backward import MAX_REGISTERS, NUM_WARPS
    from .compile import backward_ttgir
    from .score_mod import closure_pointees

    return backward_ttgir(kernel_function(kernel, mod), element, descriptors(kernel, element, dim), _POINTERS[kernel],
                          _ROW_STATS, constants, NUM_WARPS, MAX_REGISTERS if kernel == "dkdvdq" else 0,
                          float32=_FLOAT32, closures=closure_pointees(mod))
