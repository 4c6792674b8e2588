"""A probe for a Hopper lowering written in Gluon: plain and causal attention forward (bf16, D 128)
with the structure FlashAttention-3 uses and Triton 3.6's own pipeliner does not produce.

Why: on the H200 the Triton IR kernels stop at 0.83-0.90x cuDNN on plain attention (issue 13);
the Triton compiler waits on each Q K^T product right after issuing it, so the softmax never
overlaps a tensor-core product. Here, per CTA of 128 query rows:
- one loader warp issues TMA loads of K and V tiles into a two-stage ring (mbarriers for ready and
  empty slots);
- two consumer warpgroups, 64 query rows each, each run the loop with the next tile's Q K^T issued
  before the previous tile's P V, so the exponentials of tile j run while P_{j-1} V_{j-1} is on
  the tensor cores (the accumulator is rescaled after that product lands).

This is a measurement, not a lowering: if it beats the Triton IR kernels, the attn-to-Gluon
lowering is worth building. `check` compiles it here for sm90 (no GPU) and prints registers and
spills; `run` (on the GPU) checks it against float32 SDPA and times it beside cuDNN, SDPA flash and
ae-mlir's bundles of the same shapes (`python bench/forward_ab.py build --out DIR --variants
full,causal`).

    python bench/gluon_attention.py check
    python3 bench/gluon_attention.py run --bundles DIR --out OUTDIR      # on the GPU
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

# Constants of the kernel as module globals: warp_specialize passes partition arguments as IR
# values, so a constexpr argument would arrive as a tensor.
HALF = 64      # query rows per consumer warpgroup
BLOCK_N = 128  # keys per tile
STAGES = 2     # K and V ring depth (2 x 2 x 32 KiB at D 128, plus 32 KiB of Q)
DIM = 128
HALF_M = gl.constexpr(HALF)
TILE_N = gl.constexpr(BLOCK_N)
NUM_STAGES = gl.constexpr(STAGES)
HEAD_DIM = gl.constexpr(DIM)


@gluon.jit
def _loader(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty,
            q_row, kv_row, n_tiles):
    mbarrier.expect(q_bar, 2 * q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [q_row, 0], q_bar, q_smem.index(0))
    tma.async_copy_global_to_shared(q_desc, [q_row + HALF_M, 0], q_bar, q_smem.index(1))
    for j in range(n_tiles):
        slot = j % NUM_STAGES
        phase = (j // NUM_STAGES) & 1
        mbarrier.wait(k_empty.index(slot), phase ^ 1)
        mbarrier.expect(k_ready.index(slot), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [kv_row + j * TILE_N, 0], k_ready.index(slot), k_smem.index(slot))
        mbarrier.wait(v_empty.index(slot), phase ^ 1)
        mbarrier.expect(v_ready.index(slot), v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(v_desc, [kv_row + j * TILE_N, 0], v_ready.index(slot), v_smem.index(slot))


@gluon.jit
def _scores(q, k_smem, k_ready, j, NUM_STAGES: gl.constexpr, s_layout: gl.constexpr,
            HALF_M: gl.constexpr, TILE_N: gl.constexpr):
    slot = j % NUM_STAGES
    mbarrier.wait(k_ready.index(slot), (j // NUM_STAGES) & 1)
    zero = gl.zeros([HALF_M, TILE_N], gl.float32, s_layout)
    return warpgroup_mma(q, k_smem.index(slot).permute((1, 0)), zero, use_acc=False, is_async=True)


@gluon.jit
def _softmax(s, m_i, l_i, qk_scale, j, first_row, seq_len, DIAGONAL: gl.constexpr, BOUNDED: gl.constexpr,
             s_layout: gl.constexpr, HALF_M: gl.constexpr, TILE_N: gl.constexpr):
    # DIAGONAL: the causal mask; BOUNDED: keys past seq_len (a ragged last tile, whose rows the
    # descriptor over every head's rows read from the next head, or as zeros past the tensor).
    if DIAGONAL:
        rows = first_row + gl.arange(0, HALF_M, layout=gl.SliceLayout(1, s_layout))
        cols = j * TILE_N + gl.arange(0, TILE_N, layout=gl.SliceLayout(0, s_layout))
        s = gl.where(cols[None, :] <= rows[:, None], s, -float("inf"))
    if BOUNDED:
        cols = j * TILE_N + gl.arange(0, TILE_N, layout=gl.SliceLayout(0, s_layout))
        s = gl.where(cols[None, :] < seq_len, s, -float("inf"))
    m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
    alpha = gl.exp2(m_i - m_new)
    p = gl.exp2(s * qk_scale - m_new[:, None])
    l_i = l_i * alpha + gl.sum(p, axis=1)
    return p, m_new, l_i, alpha


@gluon.jit
def _step(q, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, turns, me, pingpong, acc, p, m_i, l_i,
          qk_scale, j, first_row, seq_len, DIAGONAL: gl.constexpr, BOUNDED: gl.constexpr,
          NUM_STAGES: gl.constexpr, s_layout: gl.constexpr,
          o_layout: gl.constexpr, p_layout: gl.constexpr, HALF_M: gl.constexpr, TILE_N: gl.constexpr):
    prev = (j - 1) % NUM_STAGES
    p_op = gl.convert_layout(p.to(gl.bfloat16), p_layout)
    mbarrier.wait(v_ready.index(prev), ((j - 1) // NUM_STAGES) & 1)
    if pingpong:
        # The two warpgroups take turns issuing their products, so one's exponentials run while
        # the other's products hold the tensor cores (FlashAttention-3's ping-pong schedule).
        mbarrier.wait(turns.index(me), (j & 1) ^ (1 - me))
    s_tok = _scores(q, k_smem, k_ready, j, NUM_STAGES, s_layout, HALF_M, TILE_N)
    acc_tok = warpgroup_mma(p_op, v_smem.index(prev), acc, is_async=True)
    if pingpong:
        mbarrier.arrive(turns.index(1 - me), count=1)
    s = warpgroup_mma_wait(1, deps=(s_tok, ))
    mbarrier.arrive(k_empty.index(j % NUM_STAGES), count=1)
    p, m_i, l_i, alpha = _softmax(s, m_i, l_i, qk_scale, j, first_row, seq_len, DIAGONAL, BOUNDED, s_layout,
                                  HALF_M, TILE_N)
    acc, p_op = warpgroup_mma_wait(0, deps=(acc_tok, p_op))
    mbarrier.arrive(v_empty.index(prev), count=1)
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
    return acc, p, m_i, l_i


@gluon.jit
def _consumer(HALF_INDEX: gl.constexpr, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty,
              turns, o_ptr, lse_ptr, o_row, q_first, n_tiles, seq_len, qk_scale, causal, pingpong):
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, TILE_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    first_row = q_first + HALF_INDEX * HALF_M
    q = q_smem.index(HALF_INDEX)
    mbarrier.wait(q_bar, 0)

    m_i = gl.full([HALF_M], -float("inf"), gl.float32, gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([HALF_M], gl.float32, gl.SliceLayout(1, s_layout))
    acc = gl.zeros([HALF_M, HEAD_DIM], gl.float32, o_layout)

    s_tok = _scores(q, k_smem, k_ready, 0, NUM_STAGES, s_layout, HALF_M, TILE_N)
    s = warpgroup_mma_wait(0, deps=(s_tok, ))
    mbarrier.arrive(k_empty.index(0), count=1)
    # The last tile is masked: causal's diagonal (whose keys past seq_len only rows past it see),
    # or a ragged tile's keys past seq_len.
    masked_last = causal or seq_len % TILE_N != 0
    if n_tiles == 1 and causal:
        p, m_i, l_i, alpha = _softmax(s, m_i, l_i, qk_scale, 0, first_row, seq_len, True, False, s_layout,
                                      HALF_M, TILE_N)
    elif n_tiles == 1 and masked_last:
        p, m_i, l_i, alpha = _softmax(s, m_i, l_i, qk_scale, 0, first_row, seq_len, False, True, s_layout,
                                      HALF_M, TILE_N)
    else:
        p, m_i, l_i, alpha = _softmax(s, m_i, l_i, qk_scale, 0, first_row, seq_len, False, False, s_layout,
                                      HALF_M, TILE_N)
    whole = n_tiles - 1 if masked_last else n_tiles
    for j in range(1, whole):
        acc, p, m_i, l_i = _step(q, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, turns, HALF_INDEX,
                                 pingpong, acc, p, m_i, l_i, qk_scale, j, first_row, seq_len, False, False,
                                 NUM_STAGES, s_layout, o_layout, p_layout, HALF_M, TILE_N)
    if n_tiles > 1 and causal:
        acc, p, m_i, l_i = _step(q, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, turns, HALF_INDEX,
                                 pingpong, acc, p, m_i, l_i, qk_scale, n_tiles - 1, first_row, seq_len, True,
                                 False, NUM_STAGES, s_layout, o_layout, p_layout, HALF_M, TILE_N)
    elif n_tiles > 1 and masked_last:
        acc, p, m_i, l_i = _step(q, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, turns, HALF_INDEX,
                                 pingpong, acc, p, m_i, l_i, qk_scale, n_tiles - 1, first_row, seq_len, False,
                                 True, NUM_STAGES, s_layout, o_layout, p_layout, HALF_M, TILE_N)

    last = (n_tiles - 1) % NUM_STAGES
    mbarrier.wait(v_ready.index(last), ((n_tiles - 1) // NUM_STAGES) & 1)
    p_op = gl.convert_layout(p.to(gl.bfloat16), p_layout)
    acc = warpgroup_mma(p_op, v_smem.index(last), acc)
    mbarrier.arrive(v_empty.index(last), count=1)

    acc = acc / gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))[:, None]
    # Rows past seq_len (a ragged last block) are the next head's: not stored.
    local = HALF_INDEX * HALF_M + gl.arange(0, HALF_M, layout=gl.SliceLayout(1, o_layout))
    inside = q_first + local < seq_len
    rows = (o_row + local).to(gl.int64)
    cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
    gl.store(o_ptr + rows[:, None] * HEAD_DIM + cols[None, :], acc.to(gl.bfloat16), mask=inside[:, None])
    # The natural-log logsumexp of the scaled scores (m_i and l_i are in log2 units of them), as a
    # backward reads it.
    lse = (m_i + gl.log2(l_i)) * 0.6931471805599453
    stat_local = HALF_INDEX * HALF_M + gl.arange(0, HALF_M, layout=gl.SliceLayout(1, s_layout))
    gl.store(lse_ptr + o_row + stat_local, lse, mask=q_first + stat_local < seq_len)


@gluon.jit
def _consumer_upper(q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty, turns, o_ptr, lse_ptr,
                    o_row, q_first, n_tiles, seq_len, qk_scale, causal, pingpong):
    _consumer(1, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty, turns, o_ptr, lse_ptr, o_row,
              q_first, n_tiles, seq_len, qk_scale, causal, pingpong)


@gluon.jit
def _consumer_lower(q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty, turns, o_ptr, lse_ptr,
                    o_row, q_first, n_tiles, seq_len, qk_scale, causal, pingpong):
    _consumer(0, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty, turns, o_ptr, lse_ptr, o_row,
              q_first, n_tiles, seq_len, qk_scale, causal, pingpong)


@gluon.jit
def attention_forward(q_desc, k_desc, v_desc, o_ptr, lse_ptr, seq_len, qk_scale, CAUSAL: gl.constexpr,
                      PINGPONG: gl.constexpr, HEADS_FASTEST: gl.constexpr):
    # A head's query blocks run together, so the CTAs in flight share their K and V through L2
    # (with heads fastest, at L 2048 each CTA in flight read its own head's K and V from HBM);
    # the causal diagonal's longest rows start first (the tail is short tiles).
    if HEADS_FASTEST:
        bh = gl.program_id(0)
        slot = gl.program_id(1)
        blocks = gl.num_programs(1)
    else:
        slot = gl.program_id(0)
        bh = gl.program_id(1)
        blocks = gl.num_programs(0)
    if CAUSAL:
        block_m = blocks - 1 - slot
    else:
        block_m = slot
    q_first = block_m * (2 * HALF_M)
    row0 = bh * seq_len
    if CAUSAL:
        n_tiles = gl.cdiv(q_first + 2 * HALF_M, TILE_N)
    else:
        n_tiles = gl.cdiv(seq_len, TILE_N)

    dtype: gl.constexpr = q_desc.dtype
    q_smem = gl.allocate_shared_memory(dtype, [2] + q_desc.block_type.shape, q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES] + v_desc.block_type.shape, v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    turns = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    mbarrier.init(turns.index(0), count=1)
    mbarrier.init(turns.index(1), count=1)
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=2)
        mbarrier.init(v_empty.index(i), count=2)

    shared = (q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty)
    consumer_args = shared + (turns, o_ptr, lse_ptr, row0 + q_first, q_first, n_tiles, seq_len, qk_scale, CAUSAL,
                              PINGPONG)
    loader_args = (q_desc, k_desc, v_desc) + shared + (row0 + q_first, row0, n_tiles)
    gl.warp_specialize([
        (_consumer_lower, consumer_args),
        (_consumer_upper, consumer_args),
        (_loader, loader_args),
    ], [4, 1], [240, 24])


def _layouts(dtype):
    q_layout = gl.NVMMASharedLayout.get_default_for([HALF, 128], dtype)
    kv_layout = gl.NVMMASharedLayout.get_default_for([BLOCK_N, 128], dtype)
    return q_layout, kv_layout


MAXNREG = 168


def launch(q, k, v, out, lse, causal, pingpong=False, heads_fastest=False):
    """q, k, v, out: contiguous [B, H, L, 128] bf16 on the GPU; lse: [B, H, L] float32."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    batch, heads, length, dim = q.shape
    q_layout, kv_layout = _layouts(gl.bfloat16)
    flat = [t.view(batch * heads * length, dim) for t in (q, k, v)]
    q_desc = TensorDescriptor.from_tensor(flat[0], [HALF, dim], q_layout)
    k_desc = TensorDescriptor.from_tensor(flat[1], [BLOCK_N, dim], kv_layout)
    v_desc = TensorDescriptor.from_tensor(flat[2], [BLOCK_N, dim], kv_layout)
    blocks = -(-length // (2 * HALF))
    grid = (batch * heads, blocks) if heads_fastest else (blocks, batch * heads)
    attention_forward[grid](q_desc, k_desc, v_desc, out, lse, length, 1.0 / math.sqrt(dim) * 1.4426950408889634,
                            causal, pingpong, heads_fastest, num_warps=4, maxnreg=MAXNREG)


def _ptxas_report(ptx: str) -> str:
    import subprocess
    import tempfile

    import triton

    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.ptx")
        with open(path, "w") as fh:
            fh.write(ptx)
        done = subprocess.run([ptxas, "-arch=sm_90a", "-v", path, "-o", os.path.join(tmp, "kernel.cubin")],
                              capture_output=True, text=True)
    return (done.stdout + done.stderr).strip()


def check() -> int:
    """Compile both kernels for sm90 here and print their resource use."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    q_layout, kv_layout = _layouts(gl.bfloat16)
    q_ty = f"tensordesc<bf16[{HALF}, 128],{q_layout!r}>"
    kv_ty = f"tensordesc<bf16[{BLOCK_N}, 128],{kv_layout!r}>"
    for causal, pingpong in ((False, False), (True, False), (False, True)):
        signature = {"q_desc": q_ty, "k_desc": kv_ty, "v_desc": kv_ty, "o_ptr": "*bf16", "lse_ptr": "*fp32",
                     "seq_len": "i32",
                     "qk_scale": "fp32", "CAUSAL": "constexpr", "PINGPONG": "constexpr", "HEADS_FASTEST": "constexpr"}
        constexprs = {"CAUSAL": causal, "PINGPONG": pingpong, "HEADS_FASTEST": False}
        src = GluonASTSource(attention_forward, signature, constexprs)
        kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                                options={"num_warps": 4, "maxnreg": MAXNREG})
        print(f"causal={causal} pingpong={pingpong}: shared {kernel.metadata.shared} bytes, "
              f"{kernel.asm['ptx'].count('wgmma.mma_async')} wgmma in the PTX; ptxas says:")
        print(_ptxas_report(kernel.asm["ptx"]))
    return 0


def run(bundles: str | None, out_dir: str, rounds: int, graphs: bool) -> int:
    import torch
    import torch.nn.functional as F
    import triton
    from torch.nn.attention import SDPBackend, sdpa_kernel

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    sys.path.insert(0, os.path.dirname(__file__))
    import harness

    runtime = None
    if bundles:
        from ae_mlir import runtime
    results = []
    ragged = _check_ragged()
    _save(out_dir, results, ragged)
    for causal in (False, True):
        for batch, length in ((8, 2048), (2, 8192)):
            heads, dim = 16, 128
            gen = torch.Generator(device="cuda").manual_seed(length + causal)
            q, k, v = (torch.randn(batch, heads, length, dim, device="cuda", dtype=torch.bfloat16, generator=gen)
                       for _ in range(3))
            out = torch.empty_like(q)
            lse = torch.empty(q.shape[:3], device="cuda", dtype=torch.float32)
            ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
            errors, engines = {}, {}
            for name, pingpong, heads_fastest in (("gluon", False, False), ("gluon-pingpong", True, False),
                                                  ("gluon-heads-fastest", False, True)):
                out.fill_(float("nan"))
                launch(q, k, v, out, lse, causal, pingpong, heads_fastest)
                torch.cuda.synchronize()
                errors[name] = (out.float() - ref).abs().max().item()
                engines[name] = lambda p=pingpong, f=heads_fastest: launch(q, k, v, out, lse, causal, p, f)
            for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
                def call(backend=backend):
                    with sdpa_kernel(backend):
                        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                engines[name] = call
            if runtime is not None:
                variant = "causal" if causal else "full"
                bundle = runtime.Bundle.load(os.path.join(bundles, f"{variant}_{length}.json"))
                ours = runtime.launch(bundle, q, k, v)[0]
                engines["ae-mlir"] = lambda bundle=bundle: runtime.launch(bundle, q, k, v)
                errors["ae-mlir"] = (ours.float() - ref).abs().max().item()
            if graphs:
                engines.update({f"{name} graph": harness.graphed(fn) for name, fn in list(engines.items())})
            times = {name: [] for name in engines}
            for _ in range(rounds):
                for name, fn in engines.items():
                    times[name].append(triton.testing.do_bench(fn, warmup=25, rep=100))
            flops = 4 * batch * heads * length * length * dim * (0.5 if causal else 1.0)
            record = {"variant": "causal" if causal else "full", "B": batch, "L": length, "max_error": errors,
                      "ms": {name: statistics.median(ts) for name, ts in times.items()},
                      "rounds": {name: ts for name, ts in times.items()}}
            record["tflops"] = {name: flops / ms * 1e-9 for name, ms in record["ms"].items()}
            results.append(record)
            _save(out_dir, results, ragged)
            print(record["variant"], length, " ".join(f"err {name} {e:.2e}" for name, e in errors.items()),
                  " ".join(f"{name} {tf:.0f}" for name, tf in record["tflops"].items()), flush=True)
    return 0


def _check_ragged() -> list:
    """Outputs and logsumexp at lengths no multiple of the tiles (and shorter than one), against
    float32 SDPA and float32 logsumexp of the scaled scores; printed and returned."""
    import torch
    import torch.nn.functional as F

    checks = []
    for batch, heads, length in ((2, 4, 1000), (1, 3, 333), (1, 1, 64), (2, 2, 2112)):
        for causal in (False, True):
            gen = torch.Generator(device="cuda").manual_seed(length * 2 + causal)
            q, k, v = (torch.randn(batch, heads, length, DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
                       for _ in range(3))
            out = torch.full_like(q, float("nan"))
            lse = torch.full(q.shape[:3], float("nan"), device="cuda", dtype=torch.float32)
            launch(q, k, v, out, lse, causal)
            torch.cuda.synchronize()
            scores = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(DIM)
            if causal:
                scores = scores.masked_fill(torch.ones(length, length, device="cuda", dtype=torch.bool).triu(1),
                                            float("-inf"))
            want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
            check = {"B": batch, "H": heads, "L": length, "causal": causal,
                     "max_error": (out.float() - want).abs().max().item(),
                     "lse_max_error": (lse - torch.logsumexp(scores, dim=-1)).abs().max().item()}
            checks.append(check)
            print("ragged", check, flush=True)
    return checks


def _save(out_dir: str, results: list, ragged: list) -> None:
    """Written after every case: a hang of the probe (an mbarrier never arriving) keeps what ran."""
    import torch
    import triton

    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__}
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "gluon-attention.json"), "w") as fh:
        json.dump({"meta": meta, "ragged": ragged, "results": results}, fh, indent=1)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("check", "run"))
    parser.add_argument("--bundles", help="run: ae-mlir's forward_ab bundles of full and causal")
    parser.add_argument("--out", default="gluon-out")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--graphs", action="store_true", help="run: also time each engine replayed from a CUDA graph")
    args = parser.parse_args(argv)
    if args.mode == "check":
        return check()
    return run(args.bundles, args.out, args.rounds, args.graphs)


if __name__ == "__main__":
    sys.exit(main())
