"""The measured launch defaults of linear attention's kernels (the split chunked recurrence,
passes/chunk_recurrence.py), as `launch_defaults` holds the softmax kernels'; each comment names
the run behind it (bench/results/)."""
from __future__ import annotations

import typing

from .launch_defaults import multiprocessors

if typing.TYPE_CHECKING:
    from .presets import Problem

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


def _state_programs(problem: Problem, config: dict) -> int:
    """The chunk-state kernel's programs: one per (batch, head, [block_k, block_v] state block)."""
    return problem.batch_heads * -(-problem.dk // config["block_k"]) * -(-problem.dv // config["block_v"])


def linear_config(problem: Problem, target: str = "cuda:90") -> dict:
    """Launch options of a linear-attention bundle. block_m/block_n are the chunk's rows (what
    the runtime's 32-bit tile-offset check reads). The chunk-state V blocks stay 64 wide: that
    loop is bound by each step's latency, not by the programs in flight, so narrower blocks (more
    programs) only add work. With the "token_dim" decay the output kernel takes all of V (up to
    128 columns) in one program, chosen when it still computed the scores (not timed since the
    scores kernel does), and the chunk-state kernel 32 state rows per program where 64 would
    leave fewer than _STATE_PROGRAMS programs."""
    chunk, hip = problem.chunk_size, target.startswith("hip")
    config = dict(_LINEAR, block_m=chunk, block_n=chunk)
    if problem.decay == "token" and not hip:
        # Simple GLA's cumulative decays (a masked [C, C] tile's row sums per chunk) on one warp:
        # 8.5 us against 20.4 on four (19.7 on two, 20.3 on eight) on an H100, in each of the
        # four suite cases (CUDA-graph replays, bench/results/h100-linear-configs-graphs-
        # 2026-12-06.json; why more warps take longer was not looked into). GLA's per-dimension
        # decays (tile products) keep num_warps: on one they took 4-4.5x as long.
        config["decays_num_warps"] = 1
    if hip:
        # MI300's 64 KiB of LDS: three stages of the GLA chunk-state loop need 80 KiB.
        config["num_stages"] = 2
    elif problem.decay == "token" and problem.dk > config["block_v"]:
        # Simple GLA's output kernel loops over V blocks there (passes/chunk/step.py): 110-111 us
        # in two stages against 119-120 in three at D 128 on an H200, its chunk-state kernel 106
        # against 172 in three (L 8192; h200-linear-configs-2026-12-03-simple-gla-value-loop).
        # Retention's output kernel has the same loop but was not swept; it keeps three.
        config.update(num_stages=2, states_num_stages=3)
    if problem.decay in ("head", "token") and not hip and _state_programs(problem, config) > 2 * multiprocessors(target):
        # Two stages where the chunk-state programs fill the GPU more than twice over, three where
        # they do not. On an H100 (CUDA-graph replays, bench/results/h100-linear-configs-graphs-
        # 2026-12-06.json) at D 128: 512 programs (B 8, L 2048) 101.8 us in two stages against
        # 118.5 in three (retention 100.0 / 113.5); 128 programs (B 2, L 8192) 177.2 against
        # 117.5 (178.1 / 117.1), and 128 at D 64 51.1 against 38.8. Nothing between was measured.
        config["states_num_stages"] = 2
    if problem.decay == "token_dim":
        config["block_v"] = 128
        # GLA's chunk-state kernel at L 2048, D 128: 137 us in two stages against 164 in three;
        # within 4% either way in the other three suite cases.
        config["states_num_stages"] = 2
        if _state_programs(problem, config) < _STATE_PROGRAMS:
            config["block_k"] = 32
    return config
