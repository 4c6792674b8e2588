"""The named pipelines, "triton" and "cpu": the one place that says which passes run, in which
order, with which options, and how the kernels are launched.

A preset is an ordered list of stages over one `PresetOptions` (as Triton's backends list their
`add_stages` over one options object). The options come from the L0 module itself, read from the
parsed IR (the function's types, the linear recurrence's attributes), and the target:

    options = options_for(module, "triton", "cuda:90")     # block sizes, warps, stages, ...
    pipeline_text("triton", options)                        # every pass with its options
    builtin.module(attn-verify,attn-fuse-online-softmax,attn-chunk-recurrence{...},attn-tile{...},
                   canonicalize,cse,attn-lower-to-triton{assume-aligned=true input-precision=ieee})

`ae-opt --pipeline=NAME` runs exactly that text; the backends run the same stages one at a time,
because they read the L1 kernels between the two (argument specs, call-time tables), and the
Triton backend runs the last stage twice, with assume-aligned true and false, for the bundle's two
variants. `ae-opt` prints the aligned one, which the runtime launches on the usual layouts.
"""
from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Literal

from .core import abi
from .core.context import CompileError

PRESETS = ("cpu", "triton")
TARGETS = {"cpu": "host", "triton": "cuda:90"}

# --- Triton launch defaults ----------------------------------------------------------------------

# (block_m, block_n, num_warps, num_stages) by head dim (padded to a power of two); 16-bit inputs
# run tt.dot on wgmma. At D = 128, 128x128 tiles run out of shared memory, so 128x64 with 8 warps
# and 3 stages; at D = 64, 128x128 with 4 warps (FlexAttention's choice) spills registers once a
# score_mod adds live values, so 128x64. The H200 runs behind these choices are in
# bench/results/h200-catalogue-*.json and h200-verify-*.json.
_CUDA_16BIT = {64: (128, 64, 4, 3), 128: (128, 64, 8, 3), 256: (64, 32, 4, 3)}
# Masks that cut more KV tiles per query block than a causal diagonal does (2 at 128 x 64: a band
# cuts 4, a stride all): at D = 128 on an H200 (bf16, B*L = 16384,
# bench/results/h200-attention-configs-2026-12-03-catalogue.json, medians of three alternating
# rounds) 64x64 tiles with 4 warps ran the sliding window at 280 / 281 TFLOP/s (L 2048 / 8192)
# against 232 / 230 at 128x64, causal + sliding 202 / 204 against 170 / 170 and the dilated mask
# 187 / 210 against 161 / 190, where causal ran 297 / 368 against 375 / 449 and prefix-LM 380 /
# 444 against 385 / 453. D = 64 and MI300 keep their tiles (not measured).
CUT_TILES_AT = (128, 64)
CUT_TILES_MAX = 2.5
_CUDA_16BIT_CUT = {**_CUDA_16BIT, 128: (64, 64, 4, 3)}
_CUDA_FP32 = {64: (128, 32, 4, 3), 128: (32, 64, 4, 3), 256: (32, 32, 4, 3)}
# MI300 (gfx942): mfma 32x32 tiles; one LDS buffer per operand leaves room for 128x64 at D=128.
_HIP_16BIT = {64: (128, 64, 4, 2), 128: (128, 64, 4, 2), 256: (64, 32, 4, 2)}
_HIP_FP32 = {64: (64, 32, 4, 2), 128: (64, 32, 4, 2), 256: (32, 32, 4, 2)}


def _pow2(n: int) -> int:
    return max(16, 1 << (max(n, 1) - 1).bit_length())


def _table(dk: int, dv: int, dtype: str, target: str, tables: tuple) -> tuple[int, dict]:
    """(the head dim a launch table is indexed by, the one of `tables` -- cuda 16-bit, cuda fp32,
    hip 16-bit, hip fp32 -- for this dtype and target)."""
    wide = dtype in ("bfloat16", "float16", "bf16", "f16")
    return max(_pow2(dk), _pow2(dv), 64), tables[2 * target.startswith("hip") + (not wide)]


# Streaming processors of the targets' GPUs (H100/H200: 132 SMs; MI300X: 304 CUs). When the
# (batch, head, query block) programs are fewer, split-KV attention splits each program's KV tiles
# so that the split programs fill one wave (the most that fit, at least two splits) and no split
# walks more than _MAX_TILES_PER_SPLIT tiles (4 MB of bf16 K and V at D = 128). On an H200 (bf16
# decoding, GQA 32/8, D 128, bench/results/h200-decoding-2026-12-01-splits2.json and -one-wave):
# B=1 Lk=131072 ran 3.62 TB/s at 16 splits (one wave) against 3.45 at 33 and 2.87 at 66; B=8
# Lk=32768 4.16 at 4 splits against 4.05 at 2 (one wave) and 3.89 at 5; one wave alone left B=8
# caches filled 30-100% (per-entry kv_len) unbalanced, 2.64 TB/s against 3.41 at 5 splits, and
# paged caches (a table read per tile) want more programs in flight: B=1 pages of 256 ran 3.31
# TB/s at 33 splits, 2.39 at 16. So keys that vary per entry or come through a table get two
# waves (bench/results/h200-serving-2026-12-01-run2.json and -one-wave.json).
# Only decoding shapes (Lq <= 16) split: a split call launches two kernels and allocates
# workspaces, which on an H200 cost more than they saved at B=2 H=4 L=1000 (about 210 us
# against 25 us unsplit, bench/results/h200-verify-2026-12-01.json).
_PROCESSORS = {"cuda": 132, "hip": 304}
_MIN_TILES_PER_SPLIT = 8
_MAX_TILES_PER_SPLIT = 128
_MAX_SPLITS = 128
_SPLIT_MAX_LQ = 16


def kv_splits(programs: int, kv_tiles: int, target: str, uneven_keys: bool = False) -> int:
    """KV splits per query block (attn-tile kv-splits) for a grid of `programs` programs that each
    walk `kv_tiles` KV tiles: 1 once the grid fills the GPU; two waves with `uneven_keys`."""
    processors = _PROCESSORS["hip" if target.startswith("hip") else "cuda"]
    if programs >= processors:
        return 1
    if uneven_keys:
        wanted = -(-2 * processors // programs)
    else:
        wanted = max(2, processors // programs, -(-kv_tiles // _MAX_TILES_PER_SPLIT))
    return max(1, min(wanted, kv_tiles // _MIN_TILES_PER_SPLIT, _MAX_SPLITS))


# Queries at most this long (decoding) with GQA pack a KV head's query heads into one tile.
_PACK_GQA_MAX_LQ = 16


def default_config(lq: int, lk: int, dk: int, dv: int, dtype: str, target: str, batch_heads: int | None = None,
                   group: int = 1, uneven_keys: bool = False, cut_tiles: float = 0.0) -> dict:
    """Block sizes and launch options for one problem shape on `target` ("cuda:90", "hip:gfx942");
    with `batch_heads` (B * H), the KV splits and GQA packing too (`uneven_keys`, `cut_tiles`:
    see Problem)."""
    d, table = _table(dk, dv, dtype, target, (_CUDA_16BIT, _CUDA_FP32, _HIP_16BIT, _HIP_FP32))
    if table is _CUDA_16BIT and cut_tiles > CUT_TILES_MAX:
        table = _CUDA_16BIT_CUT
    block_m, block_n, warps, stages = table.get(d, (32, 32, 4, 2))
    block_m = min(block_m, _pow2(lq))
    block_n = min(block_n, _pow2(lk))
    if block_m * block_n <= 64 * 64:
        warps = 4
    config = {"block_m": block_m, "block_n": block_n, "num_warps": warps, "num_stages": stages}
    if batch_heads is None or lq > _SPLIT_MAX_LQ:
        return config
    rows, programs = block_m, batch_heads
    packed_m = max(block_m, _pow2(lq * group), 2 * group)
    # A packed tile holds at least two rows of each head (a [group, 1, D] slice has no tile layout
    # the lowering pads to) and no more rows than the target's tiles at this head dim.
    if group > 1 and lq <= _PACK_GQA_MAX_LQ and group & (group - 1) == 0 and packed_m <= table.get(d, (32,))[0]:
        block_m = config["block_m"] = packed_m
        rows, programs = block_m // group, batch_heads // group
        config["pack_gqa"] = True
    config["kv_splits"] = kv_splits(programs * -(-lq // rows), -(-lk // block_n), target, uneven_keys)
    return config


# The backward kernels (attn-tile-backward) hold more tiles live than the forward (Q, dO, K, V,
# dK and dV accumulators, P and dS), so smaller blocks; each kernel has its own config,
# (block_m, block_n, num_warps, num_stages) for dQ, then for dK/dV (block_m query rows a step,
# block_n keys resident). On an H200 (bf16, B8 H16 L2048, each kernel timed alone under 17
# configs, bench/results/h200-backward-sweep-2026-12-03-dq-tiles.json) dQ was fastest at 128x64
# with 3 stages (D = 128, 8 warps: full 0.71 ms against 0.81 at 64x64, causal level; D = 64, 4
# warps: full 0.38 against 0.41, causal 3% behind); dK/dV, which computes its tiles transposed, at
# 64 query rows on 128 keys with 8 warps and 3 stages at D = 128 (the 2026-12-01 sweep: causal
# 0.63 ms against 0.92 at 64x64, full level) and at 32x128 on 4 warps at D = 64 (full 0.57
# against 0.62 at 32x64, causal level). Other head dims, fp32 and MI300 keep one unmeasured config.
_CUDA_BWD_16BIT = {64: ((128, 64, 4, 3), (32, 128, 4, 3)), 128: ((128, 64, 8, 3), (64, 128, 8, 3)),
                   256: ((32, 32, 4, 1),) * 2}
_CUDA_BWD_FP32 = {64: ((32, 32, 4, 2),) * 2, 128: ((32, 32, 4, 2),) * 2, 256: ((16, 16, 4, 1),) * 2}
_HIP_BWD_16BIT = {64: ((64, 64, 4, 1),) * 2, 128: ((64, 32, 4, 1),) * 2, 256: ((32, 32, 4, 1),) * 2}
_HIP_BWD_FP32 = {64: ((32, 32, 4, 1),) * 2, 128: ((32, 32, 4, 1),) * 2, 256: ((16, 16, 4, 1),) * 2}


# The dK/dV kernel of a mask that cuts many tiles (CUT_TILES_MAX) at D = 128 on CUDA, 16-bit: on an
# H200 (bf16 B8 H16 L2048, each kernel alone, bench/results/h200-backward-sweep-2026-12-03-*.json)
# 32x64 tiles on 4 warps and 3 stages took the document mask's dK/dV from 0.44 to 0.30 ms, the
# sliding window's from 0.40 to 0.37 and the dilated mask's from 0.66 to 0.63.
_CUDA_BWD_CUT_DKDV = (32, 64, 4, 3)
# Their dQ kernel keeps 64x64 tiles on 4 warps: 128-row tiles cut more of a band (the same
# sweeps: the sliding window's dQ 0.27 ms at 64x64, 0.33 at 128x64; the document mask's 0.90, 1.04).
_CUDA_BWD_CUT_DQ = (64, 64, 4, 2)


def backward_config(lq: int, lk: int, dk: int, dv: int, dtype: str, target: str, cut_tiles: float = 0.0) -> dict:
    """Block sizes and launch options of the backward kernels for one problem shape (`cut_tiles`:
    see Problem)."""
    d, table = _table(dk, dv, dtype, target, (_CUDA_BWD_16BIT, _CUDA_BWD_FP32, _HIP_BWD_16BIT, _HIP_BWD_FP32))
    dq, dkdv = table.get(d, ((16, 16, 4, 1),) * 2)
    if table is _CUDA_BWD_16BIT and d == 128 and cut_tiles > CUT_TILES_MAX:
        dq, dkdv = _CUDA_BWD_CUT_DQ, _CUDA_BWD_CUT_DKDV
    config = {"block_m": min(dq[0], _pow2(lq)), "block_n": min(dq[1], _pow2(lk)), "num_warps": dq[2],
              "num_stages": dq[3], "dkdv_block_m": min(dkdv[0], _pow2(lq)), "dkdv_block_n": min(dkdv[1], _pow2(lk)),
              "dkdv_num_warps": dkdv[2], "dkdv_num_stages": dkdv[3]}
    _fit_dkdv_warps(config)
    return config


def _fit_dkdv_warps(config: dict) -> None:
    """8 dK/dV warps are for its 64x128 tiles; smaller ones (a short sequence's, or a user's) take 4."""
    rows, keys = config["dkdv_block_m"] or config["block_m"], config["dkdv_block_n"] or config["block_n"]
    if rows * keys < 64 * 128:
        config["dkdv_num_warps"] = min(config["dkdv_num_warps"], 4)


_SHARED = {"block_m": "dkdv_block_m", "block_n": "dkdv_block_n", "num_warps": "dkdv_num_warps",
           "num_stages": "dkdv_num_stages"}


def _backward_overrides(values: dict, typed: dict) -> None:
    """Apply a user's overrides to the backward's two configs: an override of a shared option
    (block_m, num_warps, ...) sets both kernels' unless the dK/dV kernel's own is given too (0:
    it follows the dQ kernel's); given no warps, smaller dK/dV tiles take 4 (_fit_dkdv_warps)."""
    values.update(typed)
    for shared, own in _SHARED.items():
        if shared in typed and own not in typed:
            values[own] = 0
    if not {"num_warps", "dkdv_num_warps"} & typed.keys():
        _fit_dkdv_warps(values)


# Linear attention (the split chunked recurrence, passes/chunk_recurrence.py): V and state-row
# blocks of 64 columns, as flash-linear-attention's chunk kernels use, and 4 warps: 8 warps left
# the output kernels slower and the stage count barely mattered in the per-kernel sweep,
# bench/results/h200-linear-configs-*.json (`python bench/linear_configs.py`).
# The cumulative-decay kernel takes one stage: GLA's (D 128, L 2048, B 8, H 16) ran 204 us in
# one, 407 in two and 446 in three (pipelining its loop over chunks only holds more registers);
# the per-token decays' took 25 us in each (passes/chunk/split.py, DECAY_CHUNKS).
_LINEAR = {"block_v": 64, "block_k": 64, "num_warps": 4, "num_stages": 3, "decays_num_stages": 1}


# GLA's chunk-state kernel walks the chunks in turn, a program per (batch, head, state-row block):
# below this many programs 32-row blocks won on an H200 (h200-linear-configs-2026-12-03-block-k):
# B 2 H 16 L 8192 184 against 304 us at D 64 (32 programs of 64 rows), 236 against 337 at D 128;
# B 8 H 16 L 2048 D 64 75 against 85 (128); at D 128 (256 programs) 64 rows kept ahead, 137 / 176.
_STATE_PROGRAMS = 256


def linear_config(problem: "Problem", target: str = "cuda:90") -> dict:
    """Launch options of a linear-attention bundle. block_m/block_n are the chunk's rows (what
    the runtime's 32-bit tile-offset check reads). The chunk-state V blocks stay 64 wide: that
    loop is bound by each step's latency, not by the programs in flight, so narrower blocks (more
    programs) only add work. With the "token_dim" decay the output kernel takes all of V (up to
    128 columns) in one program, chosen when it still computed the scores (not timed since the
    scores kernel does), and the chunk-state kernel 32 state rows per program where 64 would
    leave fewer than _STATE_PROGRAMS programs."""
    chunk, hip = problem.chunk_size, target.startswith("hip")
    config = dict(_LINEAR, block_m=chunk, block_n=chunk)
    if hip:
        # MI300's 64 KiB of LDS: three stages of the GLA chunk-state loop need 80 KiB.
        config["num_stages"] = 2
    elif problem.decay == "token" and problem.dk > config["block_v"]:
        # Simple GLA's output kernel loops over V blocks there (passes/chunk/step.py): 110-111 us
        # in two stages against 119-120 in three at D 128 on an H200, its chunk-state kernel 106
        # against 172 in three (L 8192; h200-linear-configs-2026-12-03-simple-gla-value-loop).
        # Retention's output kernel has the same loop but was not swept; it keeps three.
        config.update(num_stages=2, states_num_stages=3)
    if problem.decay == "token_dim":
        config["block_v"] = 128
        # GLA's chunk-state kernel at L 2048, D 128: 137 us in two stages against 164 in three;
        # within 4% either way in the other three suite cases.
        config["states_num_stages"] = 2
        programs = problem.batch_heads * -(-problem.dk // config["block_k"]) * -(-problem.dv // config["block_v"])
        if programs < _STATE_PROGRAMS:
            config["block_k"] = 32
    return config


# Whether 16-bit attention on NVIDIA GPUs takes the hardware's tanh approximation
# (attn-lower-to-triton{fast-tanh}: PTX tanh.approx.f32, 2^-11 relative error, as FlashAttention's
# soft-capping does) for the score_mod's f32 tanh: its error is below what rounding 16-bit inputs
# already puts in the scores; fp32 attention and AMD GPUs keep the exact expansion.
FAST_TANH = True


# Whether attn-tile and attn-tile-backward load the tiles of sequences that are a multiple of the
# block as static slices, without padding (row masks in Triton, bounds checks on the CPU). On the
# 2-core AVX2 CPU the causal demo (fp32 B1 H4 L1024 D64) ran 0.79x torch SDPA's speed with them
# against 0.69x without (medians of ratios over five alternating runs each, 2026-12-01); on an H200
# (bf16 B8 H16 L2048) the causal forward at D = 128 ran 363 TFLOP/s with them against 371-372
# without, and the backward within run-to-run noise (bench/results/h200-backward-2026-12-01-*), so
# the Triton preset keeps the masks.
WHOLE_TILES = {"cpu": True, "triton": False}


def has_tma(target: str) -> bool:
    """Whether `target` can load tiles through TMA tensor descriptors (`tensor_descriptors`):
    NVIDIA from sm90 (Hopper) on; AMD's gfx942 has none. The preset leaves them off: on an H200
    (bf16 B*L = 16384 H16, bench/results/h200-attention-configs-2026-12-03-tma.json) they ran
    full attention at D = 128 3.5% faster at L = 8192 (496 against 479 TFLOP/s, 504 at 128x128
    tiles) but 2% slower at L = 2048, causal 11% slower at L = 2048 (330 against 372) and D = 64
    2-6% slower at L = 2048: each program makes its descriptors on the device (a global write and
    a fence) before its first tile, which short KV loops do not repay. Autotuning tries them."""
    family, _, arch = target.partition(":")
    return family == "cuda" and arch.isdigit() and int(arch) >= 90


# --- CPU defaults --------------------------------------------------------------------------------

# Rows per program and keys per KV tile: a 64x64 f32 score tile (16 KiB) and the K, V and
# accumulator tiles stay in L1/L2 for head dims up to 128. Shorter sequences take the power of two
# at or above their length.
CPU_BLOCK_M = 64
CPU_BLOCK_N = 64


def cpu_config(lq: int, lk: int) -> dict:
    def pow2(n: int) -> int:
        return 1 << max(0, n - 1).bit_length()

    return {"block_m": min(CPU_BLOCK_M, pow2(lq)), "block_n": min(CPU_BLOCK_N, pow2(lk))}


# --- the problem an L0 module poses -------------------------------------------------------------


@dataclass(frozen=True)
class Problem:
    """What the presets read from an L0 module: sequence lengths, head dims, q's element type,
    and for linear attention the decay kind and chunk size."""

    lq: int
    lk: int
    dk: int
    dv: int
    dtype: str                 # MLIR's element type name: f32, f16, bf16
    decay: str | None = None   # set for an attn.linear_recurrence module ("none", "head", ...)
    chunk_size: int = 0
    batch_heads: int = 1       # B * H: with the query blocks, how many programs the kernel has
    group: int = 1             # H / Hkv: query heads per KV head (GQA)
    # Keys read through a page table, or per-entry lengths over more than one entry: programs'
    # work differs or waits on table reads, so decoding splits into more programs.
    uneven_keys: bool = False
    # The KV tiles the mask cuts per query block at CUT_TILES_AT (positional masks; 0 otherwise):
    # a causal diagonal cuts 2, the two edges of a band 4, a stride every one.
    cut_tiles: float = 0.0
    # The JSON program of a mask classified at call time (it reads closure tensors), whose cut
    # only a call's tables tell (backends.triton.call_time_tiles); None otherwise.
    call_time_mask: str | None = None

    @property
    def linear(self) -> bool:
        return self.decay is not None


def read_problem(module) -> Problem | None:
    """The problem of the module's attention function, or None where it has none (no function
    whose first three arguments are [B, H, L, D] tensors)."""
    from mlir import ir

    for func in abi.functions(module):
        types = abi.input_types(func)
        if len(types) < 3 or not all(isinstance(t, ir.RankedTensorType) and t.rank == 4 for t in types[:3]):
            continue
        q, k, v = types[:3]
        decay, chunk, keys, batch, queries = None, 0, k.shape[2], q.shape[0], q.shape[2]
        paged = lengths = packed = False
        mask = None
        for op in func.regions[0].blocks[0].operations:
            paged = paged or op.operation.name == "attn.gather_pages"
            packed = packed or op.operation.name == "attn.unpack_sequences"
            if op.operation.name == "attn.mask":
                lengths = lengths or len(op.operation.operands) > 0
                mask = op.operation.regions[0]
            if op.operation.name == "attn.linear_recurrence":
                decay = ir.StringAttr(op.operation.attributes["decay"]).value
                chunk = ir.IntegerAttr(op.operation.attributes["chunk_size"]).value
            elif op.operation.name == "attn.score":
                # With a paged cache k is a pool of pages, with packed sequences q, k and v are
                # packed rows: the scores see the logical batch, queries and keys.
                batch, _, queries, _ = ir.RankedTensorType(op.operation.operands[0].type).shape
                keys = ir.RankedTensorType(op.operation.operands[1].type).shape[2]
        cut, program = 0.0, None
        if mask is not None and decay is None and not paged and not lengths:
            from .passes.tile_tables import call_time_program, cut_tiles

            cut = cut_tiles(mask, queries, keys, *CUT_TILES_AT)
            # Packed sequences take no call-time tables (attn-tile).
            program = None if packed else call_time_program(mask)
        return Problem(queries, keys, q.shape[3], v.shape[3], str(q.element_type), decay, chunk,
                       batch * q.shape[1], q.shape[1] // k.shape[1], paged or (lengths and batch > 1), cut,
                       program.to_json() if program is not None else None)
    return None


# --- options and stages --------------------------------------------------------------------------


# The split recurrence's kernels (abi.CHUNK_STAGES) that launch with their own stage count, and
# the PresetOptions field holding it.
_OWN_STAGES = {"decays": "decays_num_stages", "states": "states_num_stages"}


@dataclass(frozen=True)
class PresetOptions:
    """Every choice a preset makes; `options_for` derives them, keyword overrides replace them."""

    target: str
    block_m: int = 64              # attn-tile: query rows per program (linear: the chunk)
    block_n: int = 64              # attn-tile: keys per KV tile
    call_time_tables: bool = True  # attn-tile: closure-reading masks classified per call
    kv_splits: int = 1             # attn-tile: programs per query block over its KV tiles (decoding)
    pack_gqa: bool = False         # attn-tile: a KV head's query heads in one tile (decoding)
    whole_tiles: bool = True       # attn-tile(-backward): whole tiles as static slices (see WHOLE_TILES)
    split: bool = False            # attn-chunk-recurrence: the split (multi-kernel) recurrence
    block_v: int = 64              # attn-chunk-recurrence: V columns per program
    block_k: int = 64              # attn-chunk-recurrence: state rows per chunk-state program
    canonicalize: bool = True      # triton: canonicalize,cse on L1 before attn-lower-to-triton
    assume_aligned: bool = True    # attn-lower-to-triton: the aligned variant
    input_precision: Literal["ieee", "tf32", "tf32x3"] = "ieee"   # attn-lower-to-triton
    tensor_descriptors: bool = False  # attn-lower-to-triton: TMA tile loads (see has_tma)
    fast_tanh: bool = False        # attn-lower-to-triton: tanh.approx.f32 (see FAST_TANH)
    unit_inner_stride: bool = True  # attn-lower-to-cpu
    vector_bits: int = 512         # attn-lower-to-cpu: register tiles for the host's vector width
    no_avx512_bf16: bool = False   # attn-lower-to-cpu: the host has AVX512-BF16 (cpu_target_features)
    num_warps: int = 4             # Triton launch
    num_stages: int = 2            # Triton launch
    linear: bool = False           # the module is linear attention (its launch config has block_v/k)
    backward: bool = False         # attn-differentiate + attn-tile-backward: the backward kernels
    dkdv_block_m: int = 0          # attn-tile-backward: the dK/dV kernel's blocks (0: block_m/n)
    dkdv_block_n: int = 0
    dkdv_num_warps: int = 0        # the dK/dV kernel's Triton launch (0: num_warps/num_stages)
    dkdv_num_stages: int = 0
    closure_grads: bool = True     # attn-tile-backward: the closure tensors' gradients (dc<i>)
    # The split recurrence's kernels with their own stage count (_OWN_STAGES; 0: num_stages).
    decays_num_stages: int = 0     # the cumulative-decay kernel
    states_num_stages: int = 0     # its chunk-state kernel (0: num_stages)

    def kernel_launch(self, kernel_name: str, chunk_stage: str | None = None) -> tuple[int, int]:
        """(num_warps, num_stages) the kernel of this name (and abi.CHUNK_STAGE) launches with:
        the backward's dK/dV kernel and the split recurrence's cumulative-decay and chunk-state
        kernels have their own."""
        if self.backward and abi.backward_part(kernel_name) == "dkdv":
            return self.dkdv_num_warps or self.num_warps, self.dkdv_num_stages or self.num_stages
        if self.linear and chunk_stage in _OWN_STAGES:
            return self.num_warps, getattr(self, _OWN_STAGES[chunk_stage]) or self.num_stages
        return self.num_warps, self.num_stages

    def launch_text(self) -> str:
        """The launch options as `--dump-pass-pipeline` prints them."""
        text = f"num-warps={self.num_warps} num-stages={self.num_stages}"
        if self.backward:
            warps, stages = self.kernel_launch(abi.backward_kernel_name("", "dkdv"))
            text += f" dkdv-num-warps={warps} dkdv-num-stages={stages}"
        if self.linear:
            for stage in _OWN_STAGES:
                text += f" {stage}-num-stages={self.kernel_launch('', stage)[1]}"
        return text

    def launch_config(self) -> dict:
        """The compile options a Triton bundle records (`meta["config"]`, its cache key)."""
        config = {"block_m": self.block_m, "block_n": self.block_n, "num_warps": self.num_warps,
                  "num_stages": self.num_stages}
        if self.kv_splits > 1:
            config["kv_splits"] = self.kv_splits
        if self.pack_gqa:
            config["pack_gqa"] = True
        if self.whole_tiles:  # the Triton preset's default is False
            config["whole_tiles"] = True
        if self.backward:
            config.update(dkdv_block_m=self.dkdv_block_m, dkdv_block_n=self.dkdv_block_n,
                          dkdv_num_warps=self.dkdv_num_warps, dkdv_num_stages=self.dkdv_num_stages)
            if not self.closure_grads:
                config["closure_grads"] = False
        if self.linear:
            config.update(block_v=self.block_v, block_k=self.block_k,
                          **{field: getattr(self, field) for field in _OWN_STAGES.values()})
        return config


def options_for(preset: str, problem: Problem | None, target: str | None = None, **overrides) -> PresetOptions:
    """The preset's options for `problem` on `target` (the preset's default target if None), with
    `overrides` (field names; strings are parsed by the field's type) applied last. Without a
    problem (a module that is not L0 attention) the block sizes are the passes' defaults."""
    _check_preset(preset)
    target = target or TARGETS[preset]
    if (preset == "cpu") != (target == "host"):
        raise CompileError(f"pipeline '{preset}' compiles for "
                           f"{'--target=host' if preset == 'cpu' else 'a cuda or hip target'}, got '{target}'")
    typed = _typed(overrides)
    values: dict = {"split": preset == "triton", "whole_tiles": WHOLE_TILES[preset]}
    if problem is not None and preset == "triton":
        values["fast_tanh"] = FAST_TANH and target.startswith("cuda") and problem.dtype in ("bf16", "f16")
    if preset == "cpu":
        from .backends.cpu_cache import host_has_avx512_bf16, host_vector_bits

        values["vector_bits"] = host_vector_bits()
        values["no_avx512_bf16"] = host_has_avx512_bf16()
    if problem is not None and preset == "cpu":
        values.update(cpu_config(problem.lq, problem.lk))
    elif problem is not None and problem.linear:
        values.update(linear_config(problem, target), linear=True)
    elif problem is not None:
        if typed.get("backward"):
            values.update(backward_config(problem.lq, problem.lk, problem.dk, problem.dv, problem.dtype, target,
                                          problem.cut_tiles))
        else:
            values.update(default_config(problem.lq, problem.lk, problem.dk, problem.dv, problem.dtype, target,
                                         problem.batch_heads, problem.group, problem.uneven_keys, problem.cut_tiles))
    if "dkdv_num_warps" in values:  # the Triton backward's two configs
        _backward_overrides(values, typed)
    else:
        values.update(typed)
        if "num_stages" in typed:  # the kernels with their own stage count follow, unless given it
            for own in _OWN_STAGES.values():
                values[own] = typed.get(own, 0)
    if values.get("tensor_descriptors") and not has_tma(target):
        raise CompileError(f"preset option 'tensor-descriptors' needs an NVIDIA target from sm90 on "
                           f"(TMA), got '{target}'")
    if values.get("fast_tanh") and not target.startswith("cuda"):
        raise CompileError(f"preset option 'fast-tanh' needs an NVIDIA target (PTX tanh.approx), got '{target}'")
    return PresetOptions(target=target, **values)


def _typed(overrides: dict) -> dict:
    hints = typing.get_type_hints(PresetOptions)
    # The target has its own flag and argument; whether the module is linear is read from it.
    fields = {f.name for f in dataclasses.fields(PresetOptions)} - {"target", "linear"}
    typed = {}
    for key, raw in overrides.items():
        name = key.replace("-", "_")
        if name not in fields:
            raise CompileError(f"the presets have no option '{key}' (their options: "
                               f"{', '.join(sorted(f.replace('_', '-') for f in fields))})")
        typ = hints[name]
        if typing.get_origin(typ) is Literal:
            if raw not in typing.get_args(typ):
                raise CompileError(f"preset option '{key}' must be one of {', '.join(typing.get_args(typ))}, "
                                   f"got '{raw}'")
            typed[name] = raw
        elif typ is bool and isinstance(raw, str):
            if raw.lower() not in ("true", "false"):
                raise CompileError(f"preset option '{key}' expects true or false, got '{raw}'")
            typed[name] = raw.lower() == "true"
        else:
            try:
                typed[name] = typ(raw)
            except ValueError:
                raise CompileError(f"preset option '{key}' expects an integer, got '{raw}'") from None
    return typed


@dataclass(frozen=True)
class Stage:
    """A named run of passes: what a backend runs before reading the module again."""

    name: str
    passes: tuple[str, ...]


def _flag(value: bool) -> str:
    return "true" if value else "false"


def stages(preset: str, o: PresetOptions) -> list[Stage]:
    """The preset's stages in order: "l1" (L0 -> L1 kernels), then "ttir" or "llvm"."""
    _check_preset(preset)
    fold = f"attn-fold-index-clamps{{padded-tiles={_flag(preset != 'cpu')}}}"
    if o.backward:
        to_l1 = ["attn-verify", "attn-differentiate",
                 f"attn-tile-backward{{block-m={o.block_m} block-n={o.block_n} dkdv-block-m={o.dkdv_block_m} "
                 f"dkdv-block-n={o.dkdv_block_n} whole-tiles={_flag(o.whole_tiles)} "
                 f"closure-grads={_flag(o.closure_grads)} "
                 f"call-time-tables={_flag(o.call_time_tables and preset == 'triton')}}}", fold]
    else:
        to_l1 = ["attn-verify", "attn-fuse-online-softmax",
                 f"attn-chunk-recurrence{{split={_flag(o.split)} block-v={o.block_v} block-k={o.block_k}}}",
                 f"attn-tile{{block-m={o.block_m} block-n={o.block_n} call-time-tables={_flag(o.call_time_tables)} "
                 f"kv-splits={o.kv_splits} pack-gqa={_flag(o.pack_gqa)} whole-tiles={_flag(o.whole_tiles)}}}", fold]
    if preset == "cpu":
        return [Stage("l1", tuple(to_l1)),
                Stage("llvm", (f"attn-lower-to-cpu{{unit-inner-stride={_flag(o.unit_inner_stride)} "
                               f"vector-bits={o.vector_bits} no-avx512-bf16={_flag(o.no_avx512_bf16)}}}",))]
    # Folding L1's one-trip loops and constant tables before the lowering shortens the Triton IR;
    # the lowering takes unfolded L1 too (the `canonicalize=false` option).
    if o.canonicalize:
        to_l1 += ["canonicalize", "cse"]
    return [Stage("l1", tuple(to_l1)),
            Stage("ttir", (f"attn-lower-to-triton{{assume-aligned={_flag(o.assume_aligned)} "
                           f"input-precision={o.input_precision} "
                           f"tensor-descriptors={_flag(o.tensor_descriptors)} "
                           f"fast-tanh={_flag(o.fast_tanh)}}}",))]


def pipeline_text(preset: str, options: PresetOptions, stage: str | None = None) -> str:
    """The textual pipeline of the whole preset, or of one of its stages."""
    chosen = [s for s in stages(preset, options) if stage is None or s.name == stage]
    if not chosen:
        raise CompileError(f"pipeline '{preset}' has no stage '{stage}'")
    return "builtin.module(" + ",".join(p for s in chosen for p in s.passes) + ")"


def outline(preset: str) -> str:
    """The preset's passes without the options that depend on the module (for --list-passes)."""
    return ",".join(p.split("{")[0] for s in stages(preset, PresetOptions(TARGETS[preset])) for p in s.passes)


def _check_preset(preset: str) -> None:
    if preset not in PRESETS:
        raise CompileError(f"unknown pipeline '{preset}' (expected one of {', '.join(PRESETS)})")
