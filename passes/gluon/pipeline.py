"""Gluon helpers the kernels of this package share: a TMA block as a wgmma operand, the two-slot
rings a loader warp fills for the consumer warpgroups, and the query-block programs' decode."""
from __future__ import annotations

from triton._C.libtriton import ir
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language._core import builtin
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

STAGES = 2     # ring depth (the forward at D 128: 2 x 2 x 32 KiB of K and V beside 32 KiB of Q)
NUM_STAGES = gl.constexpr(STAGES)


@gluon.jit
def matrix(block):
    # A [1, 1, rows, D] TMA block as the [rows, D] operand wgmma reads.
    return block.reshape([block.shape[2], block.shape[3]])


@gluon.jit
def rings(a_desc, b_desc, CONSUMERS: gl.constexpr):
    # Two NUM_STAGES-slot rings of a's and b's blocks in shared memory; each slot has a ready
    # mbarrier (one arrival: the loader's, with the bytes it expects) and an empty one (each
    # consumer warpgroup's arrival).
    a_smem = gl.allocate_shared_memory(a_desc.dtype, [NUM_STAGES] + a_desc.block_type.shape, a_desc.layout)
    b_smem = gl.allocate_shared_memory(b_desc.dtype, [NUM_STAGES] + b_desc.block_type.shape, b_desc.layout)
    a_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    b_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    a_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    b_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(a_ready.index(i), count=1)
        mbarrier.init(b_ready.index(i), count=1)
        mbarrier.init(a_empty.index(i), count=CONSUMERS)
        mbarrier.init(b_empty.index(i), count=CONSUMERS)
    return a_smem, b_smem, a_ready, b_ready, a_empty, b_empty


@gluon.jit
def load_kv_ring(k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, batch, kv_head, n_tiles, first):
    # K and V tiles 0..n_tiles-1 of a KV head into the ring from position `first` on, each into
    # its slot once the consumers have released it (an empty barrier's phase), each slot's ready
    # barrier expecting its bytes.
    rows: gl.constexpr = k_desc.block_type.shape[2]
    for j in range(n_tiles):
        r = first + j
        slot = r % NUM_STAGES
        phase = (r // NUM_STAGES) & 1
        mbarrier.wait(k_empty.index(slot), phase ^ 1)
        mbarrier.expect(k_ready.index(slot), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [batch, kv_head, j * rows, 0], k_ready.index(slot), k_smem.index(slot))
        mbarrier.wait(v_empty.index(slot), phase ^ 1)
        mbarrier.expect(v_ready.index(slot), v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(v_desc, [batch, kv_head, j * rows, 0], v_ready.index(slot), v_smem.index(slot))


@gluon.jit
def query_item(item, n_blocks, heads, batch_heads, section, reverse):
    # (block, batch, head) of work item `item`, the batch's heads taken in sections of `section`
    # (the last may hold fewer), each section rank-major: every head's first block comes before
    # any head's second, so a grid started in this order runs its heaviest programs first while
    # the K and V in flight stay those of a few heads (core/grid_schedule.py); a section of one
    # head keeps a head's blocks adjacent. `reverse`: rank 0 is the last block (a causal query
    # block's longest).
    per_section = n_blocks * section
    number = item // per_section
    first = number * section
    count = gl.minimum(section, batch_heads - first)
    within = item - number * per_section
    rank = within // count
    flat = first + within - rank * count
    block = rank
    if reverse:
        block = n_blocks - 1 - rank
    return block, flat // heads, flat % heads


@builtin
def async_reduce_add(tensor_desc, coord, src, _semantic=None):
    # TMA's reduce-add of a shared-memory block into global memory (cp.reduce.async.bulk.tensor):
    # Triton 3.6 builds the op (ttng.async_tma_reduce) but its Gluon has no function for it. Like
    # a TMA store it is waited for with tma.store_wait, and reads past the tensor's edges are
    # dropped.
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle)
