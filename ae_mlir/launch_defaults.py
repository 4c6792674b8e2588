"""The measured launch defaults the presets start from: block sizes, warps and stages per
target, head dim and dtype for the softmax forward and backward kernels (linear attention's are
in `linear_defaults`), the rules that adjust them (masks that cut many tiles, split-KV decoding,
packed GQA), and the switches whose choice a measurement settled (whole tiles, TMA loads, the
fast tanh). `presets` turns them into pass options; each table's comment names the run behind
it (bench/results/)."""
from __future__ import annotations

from .core import abi, grid_schedule

# --- Triton launch defaults ----------------------------------------------------------------------

# (block_m, block_n, num_warps, num_stages) by head dim (padded to a power of two); 16-bit inputs
# run tt.dot on wgmma. At D = 128, 128x128 tiles run out of shared memory, so 128x64 with 8 warps
# and 3 stages; at D = 64, 128x128 with 4 warps (FlexAttention's choice) spills registers once a
# score_mod adds live values, so 128x64. The H200 runs behind these choices are in
# bench/results/h200-catalogue-*.json and h200-verify-*.json.
# Head dims past 128 (the bucket of 256) take 128x64 tiles on 8 warps too: on an H200 (bf16,
# B*L = 16384, H 16, causal, `python bench/attention_configs.py` over ten tile choices, three
# alternating rounds, bench/results/h200-attention-configs-2026-12-04-wide-heads*.json) Dk = Dv =
# 256 ran 416 / 506 TFLOP/s (L 2048 / 8192) at 2 stages against 298 / 355 at the 64x32 tiles
# before (3 stages do not fit: 64 KiB of Q and 64 KiB of K and V a stage); Dk = 192, Dv = 128
# (MLA's, Dk + Dv <= 320) 350 / 419 at 3 stages against 314 / 353 (2 stages: 308 / 366). At
# D = 256 they win for masks that cut many tiles too (-masks.json): the sliding window 300 / 298
# against 198 / 199 at 64x32, causal + sliding 205 / 203 against 149 / 151 (64x64 on 4 warps:
# 226 / 227 and 158 / 161), soft-capping 386 / 464.
_CUDA_16BIT = {64: (128, 64, 4, 3), 128: (128, 64, 8, 3), 256: (128, 64, 8, 2)}
_CUDA_16BIT_NARROW_256 = (128, 64, 8, 3)
# Masks that cut more KV tiles per query block than a causal diagonal does (2 at 128 x 64: a band
# cuts 4, a stride all): at D = 128 on an H200 (bf16, B*L = 16384,
# bench/results/h200-attention-configs-2026-12-03-catalogue.json, medians of three alternating
# rounds) 64x64 tiles with 4 warps ran the sliding window at 280 / 281 TFLOP/s (L 2048 / 8192)
# against 232 / 230 at 128x64, causal + sliding 202 / 204 against 170 / 170 and the dilated mask
# 187 / 210 against 161 / 190, where causal ran 297 / 368 against 375 / 449 and prefix-LM 380 /
# 444 against 385 / 453. D = 64 and MI300 keep their tiles (not measured); past 128, see above.
# Plain softmax attention (no score_mod or mask) over long sequences on sm90, 16-bit, D = 128:
# 128x128 tiles on 8 warps loaded through TMA descriptors (measured made per program on the
# device, which its long KV loop repaid; made on the host since, HOST_TMA_HEAD_DIMS). On an H200
# (bf16, B*L = 16384, H 16, three alternating rounds, bench/results/h200-attention-configs-2026-12-04-long.json and -12-03-catalogue.json) full
# attention ran 452 / 481 / 491 / 507 TFLOP/s at L 2048 / 4096 / 8192 / 16384 against 442 / 469 /
# 462 / 469 at the 128x64 tiles; with a mask or a score_mod they lost (causal 369 against 414 at
# L 4096, ALiBi 347 against 377, the relative-bias table 226 against 327). At D = 64 the same tiles
# on 4 warps gained from L 8192 on (-long-d64.json: 423 / 424 at L 8192 / 16384 against 404 /
# 409; at L 2048 / 4096 388 / 412 against 395 / 405; on 8 warps 302-366).
# Head dim -> (config, the shortest Lq and Lk it takes).
_PLAIN_LONG = {128: ({"block_m": 128, "block_n": 128, "num_warps": 8, "num_stages": 3, "tensor_descriptors": True},
                     2048),
               64: ({"block_m": 128, "block_n": 128, "num_warps": 4, "num_stages": 3, "tensor_descriptors": True},
                    8192)}
CUT_TILES_AT = (128, 64)
CUT_TILES_MAX = 2.5
_CUDA_16BIT_CUT = {**_CUDA_16BIT, 128: (64, 64, 4, 3)}
_CUDA_FP32 = {64: (128, 32, 4, 3), 128: (32, 64, 4, 3), 256: (32, 32, 4, 3)}
# MI300 (gfx942): mfma 32x32 tiles; one LDS buffer per operand leaves room for 128x64 at D=128.
_HIP_16BIT = {64: (128, 64, 4, 2), 128: (128, 64, 4, 2), 256: (64, 32, 4, 2)}
_HIP_FP32 = {64: (64, 32, 4, 2), 128: (64, 32, 4, 2), 256: (32, 32, 4, 2)}


def next_pow2(n: int) -> int:
    """The power of two at or above n (1 for n <= 1)."""
    return 1 << max(0, n - 1).bit_length()


def _pow2(n: int) -> int:
    return max(16, next_pow2(n))


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


def warp_specialized(target: str, simple_mask: str | None, lq: int, dk: int, backward: bool = False,
                     batch_heads: int = 0, score_mod: bool = False, adds_bias: bool = False) -> bool:
    """Whether attn-lower-to-gluon's warp-specialized kernels replace the Triton IR ones: on sm90
    (their products are wgmma, which later NVIDIA GPUs lack), for the problems that pass takes
    (presets.Problem.simple_mask), longer than decoding (one program per query block and no KV
    split). On an H100 (bf16, B*L = 16384, H 16, L 2048 / 8192, five alternating rounds, peers in
    the same process; bench/results/h100-warp-specialized-2026-12-06.json and
    h100-gluon-backward-2026-12-06.json):
    - forward, D = 128, with its persistent grid (GLUON_SCHEDULE): full 553 / 605 TFLOP/s, causal
      468 / 572, against the Triton IR kernel's 485 / 522 and 385 / 473 (cuDNN 566 / 605, 477 / 531);
    - forward, D = 64 (three consumer warpgroups, persistent): full 439 / 473 against 416 / 446, but
      causal 258 / 367 (one program per query block: 303 / 435) against 357 / 431. Since each
      warpgroup skips the key tiles past its rows (2026-12-07), a program per block ran 332 / 456
      against the Triton IR kernel's 356 / 431 (bench/results/h100-forward-ab-2026-12-07-causal-d64.json),
      so causal takes it at L >= _GLUON_CAUSAL_D64_MIN_LQ only, where its grid is as many waves
      deep as there (_GLUON_CAUSAL_D64_MIN_WAVES; without `batch_heads`, not at all);
    - backward, D = 128: 397 / 451 full, 334 / 419 causal against 364 / 409 and 315 / 386; at D = 64
      it trailed (0.90-0.96x), so the Triton IR kernels keep it; with a score_mod (`score_mod`,
      which the Gluon kernels take asked for) soft-capping ran 259-262 (five products) and 264-265
      (two kernels) against the Triton IR kernels' 289-292 at L 2048 (h100-gluon-score-mods-*); a
      mod that adds a bias (`adds_bias`: ALiBi, a bias table), whose derivative is 1, takes the
      Gluon kernels: ALiBi's backward (causal, B 8, L 2048) ran 1.019 / 1.022 / 1.045 ms in the two
      Gluon kernels against the Triton IR kernels' 1.070 / 1.094 / 1.068 in three runs
      (FlexAttention 1.162-1.178; h100-backward-2026-12-07-alibi-gluon*.json).
    Full attention at D = 64 takes the Gluon kernel only where its 192-row programs fill their
    waves nearly as well as the Triton IR kernel's 128-row ones (`batch_heads`, B * H, given): over
    ten batch x heads x length shapes (bench/results/h100-gluon-shapes-2026-12-06.json) it ran
    1.06-1.09x the Triton IR kernel at a last wave 0.98 full, and 0.71-0.95x where its waves were
    0.67-0.89 full against the Triton IR kernel's 0.97."""
    if target != "cuda:90" or simple_mask is None or lq <= _SPLIT_MAX_LQ:
        return False
    if score_mod and not (backward and adds_bias):
        return False
    if dk == 128:
        return True
    if backward or dk != 64 or simple_mask not in ("none", "causal"):
        return False
    slots = multiprocessors(target)
    programs = -(-lq // _GLUON_ROWS[dk]) * batch_heads
    if simple_mask == "causal":
        return lq >= _GLUON_CAUSAL_D64_MIN_LQ and programs >= _GLUON_CAUSAL_D64_MIN_WAVES * slots
    if not batch_heads:
        return True
    gluon = grid_schedule.wave_fill(programs, slots)
    triton = grid_schedule.wave_fill(-(-lq // _TRITON_PLAIN_ROWS) * batch_heads, slots)
    return gluon * _GLUON_FULL_D64_GAIN >= triton


# attn-lower-to-gluon's forward rows per program (passes/gluon/attention_forward.block_m), the
# Triton IR kernel's for plain attention (_CUDA_16BIT, _PLAIN_LONG), and how much faster the
# former ran at D = 64 where both grids filled their waves alike (1.06x at B*L = 16384, H 16).
_GLUON_ROWS = {64: 192, 128: 128}
_TRITON_PLAIN_ROWS = 128
_GLUON_FULL_D64_GAIN = 1.05
# Causal attention at D = 64 takes the Gluon kernel (a program per query block, gluon_schedule)
# from this length, over grids of at least this many waves (the measured one, B 2 H 16 L 8192,
# had 10.4; warp_specialized).
_GLUON_CAUSAL_D64_MIN_LQ = 8192
_GLUON_CAUSAL_D64_MIN_WAVES = 8


# The warp-specialized forward's default schedule (gluon_schedule).
GLUON_SCHEDULE = {"persistent": True, "pingpong": False}
# The persistent grid ran 2-10% faster than a program per block where both loaded the GPU evenly
# (gluon_schedule), so it may model that much longer and still win.
PERSISTENT_SLACK = 1.10


def gluon_schedule(wave_programs: int, causal: bool, lq: int, dk: int, batch_heads: int,
                   warpgroups: int = 0) -> dict:
    """The warp-specialized forward's schedule (attn-lower-to-gluon `programs`, `pingpong`): a
    program per multiprocessor looping over work items (persistent), consumer warpgroups not
    taking turns. In the runs warp_specialized names, the persistent grid ran ahead of a program
    per query block at D = 128 (full 553 / 605 against 537 / 592 at L 2048 / 8192, causal 468 / 572
    against 424 / 544) and of ping-pong too (541 / 599 full). Its programs take fixed items, though,
    and over fewer heads the causal blocks' unequal lengths load them unequally: at B*H = 16, L
    8192, D 128 the persistent grid ran 458 against a program per block's 551
    (h100-gluon-shapes-2026-12-06.json). So a causal grid is persistent only where
    grid_schedule's model, on `wave_programs` multiprocessors (the preset's), puts its longest
    program within PERSISTENT_SLACK of the per-block grid's longest multiprocessor (its programs
    of `warpgroups` x 64 rows where asked for). Causal D = 64's three warpgroups take a program
    per block wherever: the persistent grid trailed it at L 2048 and 8192 in every run (258 / 367
    against 303 / 435 on 2026-12-06, 253 against 304 at L 2048 on 2026-12-07), though the model
    picked the persistent grid at L 2048."""
    if not causal or not wave_programs:
        return dict(GLUON_SCHEDULE)
    if dk == 64 and warpgroups != 2:
        return dict(GLUON_SCHEDULE, persistent=False)
    blocks = -(-lq // (64 * warpgroups or _GLUON_ROWS.get(dk, 128)))
    persistent = (grid_schedule.persistent_makespan(batch_heads, blocks, wave_programs)
                  <= PERSISTENT_SLACK * grid_schedule.per_block_makespan(batch_heads, blocks, wave_programs))
    return dict(GLUON_SCHEDULE, persistent=persistent)


# Queries at most this long (decoding) with GQA pack a KV head's query heads into one tile.
_PACK_GQA_MAX_LQ = 16


def default_config(lq: int, lk: int, dk: int, dv: int, dtype: str, target: str, batch_heads: int | None = None,
                   group: int = 1, uneven_keys: bool = False, cut_tiles: float = 0.0, plain: bool = False) -> dict:
    """Block sizes and launch options for one problem shape on `target` ("cuda:90", "hip:gfx942");
    with `batch_heads` (B * H), the KV splits and GQA packing too (`uneven_keys`, `cut_tiles`,
    `plain`: see Problem)."""
    d, table = _table(dk, dv, dtype, target, (_CUDA_16BIT, _CUDA_FP32, _HIP_16BIT, _HIP_FP32))
    if plain and table is _CUDA_16BIT and d in _PLAIN_LONG and has_tma(target):
        config, shortest = _PLAIN_LONG[d]
        if min(lq, lk) >= shortest:
            return dict(config)
    if table is _CUDA_16BIT and cut_tiles > CUT_TILES_MAX:
        table = _CUDA_16BIT_CUT
    block_m, block_n, warps, stages = table.get(d, (32, 32, 4, 2))
    if (table is _CUDA_16BIT or table is _CUDA_16BIT_CUT) and d == 256 and dk + dv <= 320:
        block_m, block_n, warps, stages = _CUDA_16BIT_NARROW_256
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
# Head dims past 128 (the bucket of 256): the dK/dV kernel keeps dK and dV of its keys in
# registers, (Dk + Dv) floats per key. On an H200 (bf16 B8 H16 L2048 causal, the backward's
# autotuning, bench/results/h200-autotune-backward-2026-12-04-d256.json and -mla.json) Dk = Dv =
# 256 ran 3.43 ms at dQ 64x64 and dK/dV 64 query rows on 32 keys, 4 warps, 2 stages, against
# 6.65 at the 32x32 single-stage tiles before (16 rows on 64 keys spilled: 11.3 ms); Dk = 192,
# Dv = 128 ran 1.85 ms at dQ 64x32 and dK/dV 16x64 (the 32x32 tiles: 5.07 ms; FlexAttention 3.42),
# and with the forward's 128x64 dQ tiles on 8 warps 1.72 ms (a later search that also tried those,
# bench/results/h200-autotune-backward-2026-12-04-wide-heads.json, where Dk = Dv = 256 kept its
# tiles: 3.39-3.41 ms at dQ 128x64 or 128x32 against 3.43).
_CUDA_BWD_16BIT = {64: ((128, 64, 4, 3), (32, 128, 4, 3)), 128: ((128, 64, 8, 3), (64, 128, 8, 3)),
                   256: ((64, 64, 4, 2), (64, 32, 4, 2))}
_CUDA_BWD_NARROW_256 = ((128, 64, 8, 2), (16, 64, 4, 2))  # Dk + Dv <= 320 (MLA's 192 and 128)
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
# A score_mod holding a tanh (soft-capping) takes the same dK/dV tiles (backward_config's
# `tanh_mod`): its 64x128 tiles on 8 warps spilled 108 bytes in the dK/dV kernel, these none. On
# an H100 (bf16, B 8, H 16, L 2048, D 128, causal soft-capping; bench/results/h100-backward-sweep-
# 2026-12-07-softcap-alibi.json, h100-backward-2026-12-07-softcap-dkdv-tiles*.json) the dK/dV
# kernel alone ran 0.637 ms against 0.696, and the whole backward 1.101-1.124 ms against
# 1.203-1.228 in three runs (FlexAttention 2.04); none of the sweep's other tiles ran faster.
# ALiBi (0.626 / 0.630 ms), ReLU and RetNet ran level (within 3%) with these tiles
# (h100-backward-2026-12-07-mods-dkdv-tiles.json).


# The dK/dV kernel runs a program per (batch, KV head, block of keys): a KV head's query heads
# all run in its program (GQA sums dK and dV over the group). Where 64x128 tiles would leave fewer
# programs than this, it takes 32x64 tiles on 4 warps, more programs in flight. On an H200 (bf16,
# B8 L2048 D128, causal, bench/results/h200-autotune-backward-2026-12-04-catalogue.json) GQA 16:4
# (512 programs) ran its backward in 1.134 ms at 32x64 against 1.386 at 64x128; with 16 KV heads
# (2048 programs) 32x64 was 1.6% slower to 3% faster across nine mods, so those keep 64x128.
_BWD_DKDV_MIN_PROGRAMS = 1024


def backward_config(lq: int, lk: int, dk: int, dv: int, dtype: str, target: str, cut_tiles: float = 0.0,
                    kv_heads: int | None = None, tanh_mod: bool = False) -> dict:
    """Block sizes and launch options of the backward kernels for one problem shape (`cut_tiles`:
    see Problem; `kv_heads`: B * Hkv, when known; `tanh_mod`: a score_mod holding a tanh, whose
    dK/dV kernel takes _CUDA_BWD_CUT_DKDV's tiles)."""
    d, table = _table(dk, dv, dtype, target, (_CUDA_BWD_16BIT, _CUDA_BWD_FP32, _HIP_BWD_16BIT, _HIP_BWD_FP32))
    dq, dkdv = table.get(d, ((16, 16, 4, 1),) * 2)
    if table is _CUDA_BWD_16BIT and d == 128 and cut_tiles > CUT_TILES_MAX:
        dq, dkdv = _CUDA_BWD_CUT_DQ, _CUDA_BWD_CUT_DKDV
    elif table is _CUDA_BWD_16BIT and d == 128 and (tanh_mod or (
            kv_heads is not None and kv_heads * -(-lk // dkdv[1]) < _BWD_DKDV_MIN_PROGRAMS)):
        dkdv = _CUDA_BWD_CUT_DKDV
    elif table is _CUDA_BWD_16BIT and d == 256 and dk + dv <= 320:
        dq, dkdv = _CUDA_BWD_NARROW_256
    config = {"block_m": min(dq[0], _pow2(lq)), "block_n": min(dq[1], _pow2(lk)), "num_warps": dq[2],
              "num_stages": dq[3], "dkdv_block_m": min(dkdv[0], _pow2(lq)), "dkdv_block_n": min(dkdv[1], _pow2(lk)),
              "dkdv_num_warps": dkdv[2], "dkdv_num_stages": dkdv[3]}
    _fit_warps(config)
    return config


def _fit_warps(config: dict, dq: bool = True, dkdv: bool = True) -> None:
    """8 warps are for the dK/dV kernel's 64x128 tiles and the dQ kernel's 128x64; smaller ones (a
    short sequence's, or a user's) take 4."""
    rows, keys = abi.backward_blocks("dkdv", config)
    if dkdv and rows * keys < 64 * 128:
        config["dkdv_num_warps"] = min(config["dkdv_num_warps"], 4)
    if dq and config["block_m"] * config["block_n"] < 64 * 128:
        config["num_warps"] = min(config["num_warps"], 4)


_SHARED = {"block_m": "dkdv_block_m", "block_n": "dkdv_block_n", "num_warps": "dkdv_num_warps",
           "num_stages": "dkdv_num_stages"}


def reduced_dq(warp_specialize: bool, backward: bool, score_mod: bool = False) -> bool:
    """Whether the Gluon backward takes its five-product form (attn-lower-to-gluon's reduce-dq,
    dQ added by TMA reduce-adds): wherever the Gluon backward runs but with a score_mod. On an
    H100 (bf16, B*L 16384, H 16, D 128) it ran 430 / 496 TFLOP/s full and 345 / 466 causal (L 2048
    / 8192) against the two kernels' 414 / 418 and 334 / 421, cuDNN 458 / 531 and 360 / 482
    (h100-gluon-backward-2026-12-06-reduce-dq.json; -run2.json: 420 / 476 and 335 / 455 against
    394 / 432 and 328 / 410); with soft-capping 259-262 against 264-265
    (h100-gluon-score-mods-2026-12-06-variants*.json). The order of its adds varies between runs:
    reduce_dq=False gives the same bits every run (torch.use_deterministic_algorithms does)."""
    return warp_specialize and backward and not score_mod


def backward_overrides(values: dict, typed: dict) -> None:
    """Apply a user's overrides to the backward's two configs: an override of a shared option
    (block_m, num_warps, ...) sets both kernels' unless the dK/dV kernel's own is given too (0:
    it follows the dQ kernel's); a kernel given no warps takes 4 for smaller tiles (_fit_warps)."""
    values.update(typed)
    for shared, own in _SHARED.items():
        if shared in typed and own not in typed:
            values[own] = 0
    _fit_warps(values, dq="num_warps" not in typed, dkdv=not {"num_warps", "dkdv_num_warps"} & typed.keys())


# Whether 16-bit softmax attention on NVIDIA GPUs takes the hardware's tanh approximation
# (attn-lower-to-triton{fast-tanh}: PTX tanh.approx.f32, max relative error 2^-11, as
# FlashAttention's soft-capping does) for f32 tanh and the logistic (as 0.5 + 0.5 tanh(x / 2)),
# where their values stay continuous (not where they reach a comparison: a mask must decide as
# its compile-time classification does). For tanh the error is below what rounding 16-bit inputs
# already puts in the scores. The logistic's is absolute (about 2^-12 near 0 for large negative
# x, large relative to a small probability); at the catalogue's sigmoid attention (a -log L bias,
# probabilities near 1/L) the outputs' error against a float32 reference stayed at 1.8e-3 / 6.1e-4
# (6.4e-4 before). On an H200 (bf16, B*L = 16384, bench/results/h200-catalogue-2026-12-03-fast-tanh.json,
# -fast-logistic.json) soft-capping went from 233 / 277 to 308 / 373 TFLOP/s (L 2048 / 8192) and
# sigmoid attention from 385 / 414 to 497 / 535. fp32 attention, linear attention (not measured)
# and AMD GPUs keep the exact expansions.
FAST_TANH = True


# Multiprocessors (compute units) of the GPU each target names, for attn-lower-to-triton's
# wave-programs: the H100 and H200 (sm90, SXM) have 132, the A100 (sm80) 108, the MI300X (gfx942)
# 304. A target another GPU shares (the H100 PCIe has 114) only sizes the sections differently.
MULTIPROCESSORS = {"cuda:90": 132, "cuda:80": 108, "hip:gfx942": 304}


def multiprocessors(target: str) -> int:
    """The programs `target`'s GPU runs at once, one a multiprocessor; 0 where unknown."""
    return MULTIPROCESSORS.get(target, 0)


def has_fast_tanh(target: str) -> bool:
    """Whether `target` has tanh.approx.f32: NVIDIA from sm75 on."""
    family, _, arch = target.partition(":")
    return family == "cuda" and arch.isdigit() and int(arch) >= 75


# Whether attn-tile and attn-tile-backward load the tiles of sequences that are a multiple of the
# block as static slices, without padding (row masks in Triton, bounds checks on the CPU). On the
# 2-core AVX2 CPU the causal demo (fp32 B1 H4 L1024 D64) ran 0.79x torch SDPA's speed with them
# against 0.69x without (medians of ratios over five alternating runs each, 2026-12-01); on an H200
# (bf16 B8 H16 L2048) the causal forward at D = 128 ran 363 TFLOP/s with them against 371-372
# without, and the backward within run-to-run noise (bench/results/h200-backward-2026-12-01-*), so
# the Triton preset keeps the masks.
WHOLE_TILES = {"cpu": True, "triton": False}


# The forward kernels of 16-bit attention on sm90 load their Q, K and V tiles through TMA
# descriptors the runtime makes on the host at each launch (attn-lower-to-triton{tensor-descriptors
# host-descriptors}), over the whole tensors. Made on the device instead, the descriptors cost
# every program a global write and fences before its first tile, about one KV tile's time on an
# H200, which short KV loops do not repay (has_tma). On an H200 (bf16, B*L = 16384, H 16, D 128,
# five alternating rounds, bench/results/h200-forward-ab-2026-12-04-host-descriptors.json) against
# the previous defaults at L 2048 / 8192: full attention 3.4% faster / level (its default was
# already TMA), causal 2.6 / 4.4%, the sliding window 8.2 / 8.3%, prefix-LM 2.6 / 4.1%, the
# document mask 2.6 / 2.4%, ALiBi 3.5 / 6.0%, soft-capping 2.6 / 3.8%, GQA 2.6 / 4.3%, the dilated
# mask 6.9 / 5.3%, sigmoid 3.9 / 5.2%, RetNet 5.2 / 8.1% faster; score_mods that read a closure
# tensor at a position-dependent index (the relative-bias table, T5's buckets) 1.2-1.9% slower,
# so they keep pointer loads. At D 64 (-host-descriptors-d64.json) full attention 7.0 / 3.9%
# faster (at L 8192 against device-made descriptors), causal 4.0 / 4.4%, ALiBi 3.1 / 2.7%, GQA
# 3.7 / 5.0%, the sliding window 4.3 / 2.2%, soft-capping 2.5 / 2.1%. The backward's kernels ran
# 11-34% slower through them (h200-backward-2026-12-04-host-descriptors.json), and D 256 forward
# 15-19% slower (full, causal, ALiBi, soft-capping, -d256.json), so those keep pointer loads;
# decoding shapes and linear attention are not measured.
# Packed sequences' tiles (rows up to a sequence's end) load through pointers either way.
HOST_TMA_HEAD_DIMS = (64, 128)


def host_tma(target: str, dtype: str, dk: int, dv: int, lq: int, position_gathers: bool) -> bool:
    """Whether a forward softmax kernel loads its tiles through host-made TMA descriptors
    (HOST_TMA_HEAD_DIMS)."""
    return (has_tma(target) and dtype in ("bf16", "f16") and not position_gathers and lq > _SPLIT_MAX_LQ
            and max(_pow2(dk), _pow2(dv), 64) in HOST_TMA_HEAD_DIMS)


def has_tma(target: str) -> bool:
    """Whether `target` can load tiles through TMA tensor descriptors (`tensor_descriptors`):
    NVIDIA from sm90 (Hopper) on; AMD's gfx942 has none. Made on the device in every program (a
    global write and a fence before its first tile), they ran on an H200 (bf16 B*L = 16384 H16,
    bench/results/h200-attention-configs-2026-12-03-tma.json) full attention at D = 128 3.5%
    faster at L = 8192 (496 against 479 TFLOP/s, 504 at 128x128 tiles) but 2% slower at L = 2048,
    causal 11% slower at L = 2048 (330 against 372) and D = 64 2-6% slower at L = 2048: short KV
    loops did not repay them. Made on the host (host_tma) they gain nearly everywhere."""
    family, _, arch = target.partition(":")
    return family == "cuda" and arch.isdigit() and int(arch) >= 90


# --- CPU defaults --------------------------------------------------------------------------------

# Rows per program and keys per KV tile: a 64x64 f32 score tile (16 KiB) and the K, V and
# accumulator tiles stay in L1/L2 for head dims up to 128. Without a mask that cuts tiles, KV tiles
# of 128 keys halve the per-tile work around the two products (the accumulator's rescale, a row
# block's loop overhead): on the 2-core AMD EPYC with AVX-512, fp32 B1 H4 D64, full attention ran
# 6-8% faster at L 512 to 2048 (7% at D 32, 6% at D 128), while causal attention ran 6% slower at
# L 512 (level at L 1024), where wider tiles cut at the diagonal leave more masked work, and the
# backward kernels' step (forward and backward, full, L 512) 8% slower. Shorter sequences take
# the power of two at or above their length.
CPU_BLOCK_M = 64
CPU_BLOCK_N = 64
CPU_BLOCK_N_UNCUT = 128
# bf16 inputs convert each K and V tile to f32 per program (attn-cpu-widen-matmul-operands, by
# integer shifts), so programs of 128 rows halve that work: uncut bf16 forwards ran 4-8% faster
# on the 2-core EPYC (D 64/128, L 512/1024, 2026-12-05, `python bench/cpu_dtypes.py --block-m
# 64,128`), causal ones up to 7% slower (more masked work at the diagonal), fp16 (a native
# conversion) level to 3% faster on full attention.
CPU_BLOCK_M_BF16_UNCUT = 128


def cpu_config(lq: int, lk: int, uncut_forward: bool = False, dtype: str = "f32") -> dict:
    """The CPU's tiles for lengths lq, lk and q's element type; `uncut_forward`: the forward
    kernels of a problem whose KV tiles nothing cuts (no mask, lengths, pages or packed
    sequences)."""
    keys = CPU_BLOCK_N_UNCUT if uncut_forward else CPU_BLOCK_N
    rows = CPU_BLOCK_M_BF16_UNCUT if uncut_forward and dtype == "bf16" else CPU_BLOCK_M
    return {"block_m": min(rows, next_pow2(lq)), "block_n": min(keys, next_pow2(lk))}
