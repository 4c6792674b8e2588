"""The named pipelines, "triton" and "cpu": the one place that says which passes run, in which
order, with which options, and how the kernels are launched.

A preset is an ordered list of stages over one `PresetOptions` (as Triton's backends list their
`add_stages` over one options object). The options come from the L0 module itself, read from the
parsed IR (the function's types, the linear recurrence's attributes), and the target:

    options = options_for(module, "triton", "cuda:90")     # block sizes, warps, stages, ...
    pipeline_text("triton", options)                        # every pass with its options
    builtin.module(attn-verify,attn-fuse-online-softmax,attn-chunk-recurrence{...},attn-tile{...},
                   canonicalize,cse,attn-lower-to-triton{...})

`ae-opt --pipeline=NAME` runs exactly that text; the backends run the same stages one at a time,
because they read the L1 kernels between the two (argument specs, call-time tables), and the
Triton backend runs the last stage twice, with assume-aligned true and false, for the bundle's two
variants. `ae-opt` prints the aligned one, which the runtime launches on the usual layouts.
Where `warp_specialize` is on, the aligned variant's stages are attn-verify and attn-lower-to-gluon
on L0 (the kernel takes the module whole; with `backward`, its two backward kernels), the general
one's those above.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .core import abi
from .core.context import CompileError
from .core.mod_traits import ModTraits, mod_traits
from .core.regions import from_region
from .launch_defaults import (CUT_TILES_AT, FAST_TANH, GLUON_SCHEDULE, WHOLE_TILES, backward_config,
                              backward_overrides, cpu_config, default_config, gluon_schedule, has_fast_tanh, has_tma,
                              host_tma, multiprocessors, reduced_dq, warp_specialized)
from .linear_defaults import linear_config
from .preset_overrides import typed_overrides

PRESETS = ("cpu", "triton")
TARGETS = {"cpu": "host", "triton": "cuda:90"}

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
    # only a call's tables tell (backends.call_time_tiles); None otherwise.
    call_time_mask: str | None = None
    # A mask, per-entry lengths, pages or packed sequences: KV tiles may be cut (the CPU's tiles).
    masked: bool = False
    # Softmax over the scores as they are, every pair: no score_mod, mask, lengths, pages or packed
    # sequences (launch_defaults: its own tiles at long sequences).
    plain: bool = False
    # A score_mod reads a closure tensor at an index that depends on the query or key position
    # (a relative-bias table): it keeps pointer tile loads (launch_defaults.host_tma).
    position_gathers: bool = False
    # "none" or "causal": softmax with no score_mod, and no mask or exactly the causal one, in the
    # types and shapes attn-lower-to-gluon takes; None otherwise.
    simple_mask: str | None = None
    # "none" or "causal" where attn-lower-to-gluon's backward lowers the function: as
    # `simple_mask`, with a score_mod its kernels take too; None otherwise.
    gluon_backward: str | None = None
    # The scores pass through a score_mod, and what it does (core.mod_traits): a closure tensor
    # read (whose gradient only the Triton IR backward computes), a bias added, a tanh.
    score_mod: bool = False
    mod_reads_closures: bool = False
    mod_adds_bias: bool = False
    mod_tanh: bool = False

    @property
    def linear(self) -> bool:
        return self.decay is not None

    def gluon_backward_serves(self, closure_grads: bool) -> bool:
        """Whether attn-lower-to-gluon's backward computes every gradient asked for: it computes no
        closure tensor's, which the mod's reads need where `closure_grads` are wanted."""
        return not (closure_grads and self.mod_reads_closures)


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
        paged = lengths = packed = modded = False
        traits = ModTraits()
        mask, kind = None, None
        for op in func.regions[0].blocks[0].operations:
            if op.operation.name == "attn.score_mod":
                modded = True
                traits = mod_traits(from_region(op.operation.regions[0]))
            if op.operation.name == "attn.normalize":
                kind = ir.StringAttr(op.operation.attributes["kind"]).value
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
        masked = mask is not None or paged or packed
        from .passes.lower_to_gluon import lowers

        kind_of_mask = "causal" if mask is not None else "none"
        simple = kind_of_mask if lowers(func) else None
        return Problem(queries, keys, q.shape[3], v.shape[3], str(q.element_type), decay, chunk,
                       batch * q.shape[1], q.shape[1] // k.shape[1], paged or (lengths and batch > 1), cut,
                       program.to_json() if program is not None else None, masked,
                       plain=kind == "softmax" and not (modded or masked or lengths),
                       position_gathers=traits.reads_by_position,
                       # Without a score_mod the backward's kernels take what the forward's do.
                       simple_mask=simple,
                       gluon_backward=kind_of_mask if simple or (modded and lowers(func, backward=True)) else None,
                       score_mod=modded, mod_reads_closures=traits.reads_closures,
                       mod_adds_bias=traits.adds_bias, mod_tanh=traits.tanh)
    return None


def takes_host_tma(problem: Problem, target: str) -> bool:
    """Whether the forward kernels of `problem` load through host-made TMA descriptors by default
    (launch_defaults.host_tma)."""
    return not problem.linear and host_tma(target, problem.dtype, problem.dk, problem.dv, problem.lq,
                                           problem.position_gathers)


def backward_defaults(problem: Problem, target: str, cut_tiles: float | None = None) -> dict:
    """`launch_defaults.backward_config` for `problem`: at the tiles its mask cuts, or at `cut_tiles`
    (a mask read at call time, classified then)."""
    return backward_config(problem.lq, problem.lk, problem.dk, problem.dv, problem.dtype, target,
                           problem.cut_tiles if cut_tiles is None else cut_tiles, problem.batch_heads // problem.group,
                           problem.mod_tanh)


# --- options and stages --------------------------------------------------------------------------


# The split recurrence's kernels (abi.CHUNK_STAGES) that launch with their own stage count, and
# the PresetOptions field holding it.
_OWN_STAGES = {"decays": "decays_num_stages", "states": "states_num_stages"}
# Those that launch with their own warps too (0: num_warps).
_OWN_WARPS = {"decays": "decays_num_warps"}
# Launch counts a user may set, and whether 0 ("as num_warps / num_stages") is allowed for each.
_WARP_COUNTS = {"num_warps": False, "dkdv_num_warps": True, **dict.fromkeys(_OWN_WARPS.values(), True)}
_STAGE_COUNTS = {"num_stages": False, "dkdv_num_stages": True, **dict.fromkeys(_OWN_STAGES.values(), True)}


@dataclass(frozen=True)
class PresetOptions:
    """Every choice a preset makes; `options_for` derives them, keyword overrides replace them."""

    target: str
    block_m: int = 64              # attn-tile: query rows per program (linear: the chunk)
    block_n: int = 64              # attn-tile: keys per KV tile
    call_time_tables: bool = True  # attn-tile(-backward): closure-reading masks classified per call
    kv_splits: int = 1             # attn-tile: programs per query block over its KV tiles (decoding)
    pack_gqa: bool = False         # attn-tile: a KV head's query heads in one tile (decoding)
    whole_tiles: bool = True       # attn-tile(-backward): whole tiles as static slices (see WHOLE_TILES)
    prescale_q: bool = False       # attn-tile: the Q tile scaled once per program (the cpu preset)
    split: bool = False            # attn-chunk-recurrence: the split (multi-kernel) recurrence
    block_v: int = 64              # attn-chunk-recurrence: V columns per program
    block_k: int = 64              # attn-chunk-recurrence: state rows per chunk-state program
    canonicalize: bool = True      # triton: canonicalize,cse on L1 before attn-lower-to-triton
    assume_aligned: bool = True    # attn-lower-to-triton: the aligned variant
    input_precision: Literal["ieee", "tf32", "tf32x3"] = "ieee"   # attn-lower-to-triton
    tensor_descriptors: bool = False  # attn-lower-to-triton: TMA tile loads (see has_tma)
    host_descriptors: bool = False  # attn-lower-to-triton: their descriptors made on the host (see host_tma)
    fast_tanh: bool = False        # attn-lower-to-triton: tanh.approx.f32 (see FAST_TANH)
    wave_programs: int = 0         # attn-lower-to-triton: the GPU's multiprocessors (launch_defaults)
    unit_inner_stride: bool = True  # attn-lower-to-cpu
    vector_bits: int = 512         # attn-lower-to-cpu: register tiles for the host's vector width
    no_avx512_bf16: bool = False   # attn-lower-to-cpu: the host has AVX512-BF16 (cpu_target_features)
    narrow_isa: bool = False       # attn-lower-to-cpu: x86 code no wider than vector_bits (cpu_target_features)
    amx: bool = False              # attn-lower-to-cpu: bf16 tile products on AMX units (cpu_amx_tile_products)
    num_warps: int = 4             # Triton launch
    num_stages: int = 2            # Triton launch
    linear: bool = False           # the module is linear attention (its launch config has block_v/k)
    backward: bool = False         # attn-differentiate + attn-tile-backward: the backward kernels
    dkdv_block_m: int = 0          # attn-tile-backward: the dK/dV kernel's blocks (0: block_m/n)
    dkdv_block_n: int = 0
    dkdv_num_warps: int = 0        # the dK/dV kernel's Triton launch (0: num_warps/num_stages)
    dkdv_num_stages: int = 0
    closure_grads: bool = True     # attn-tile-backward: the closure tensors' gradients (dc<i>)
    # attn-tile(-backward): reads stepping back along a tile's rows from a mirrored copy, in both
    # presets: Triton stages a gather whose index descends along a tile's rows one element at a
    # time, and the CPU's vectorizer gathers it lane by lane (passes/mirror_reads.py).
    mirror_reads: bool = True
    raw_row_max: bool = False      # attn-tile: the row max of the unscaled scores, scaled per row (Triton)
    # The aligned variant is attn-lower-to-gluon's warp-specialized kernel (launch_defaults.warp_specialized).
    warp_specialize: bool = False
    pingpong: bool = False         # attn-lower-to-gluon (launch_defaults.gluon_schedule)
    persistent: bool = False       # attn-lower-to-gluon: wave_programs programs loop over query blocks
    warpgroups: int = 0            # attn-lower-to-gluon: the forward's consumer warpgroups (0: by head dim)
    reduce_dq: bool = False        # attn-lower-to-gluon's backward in five products, dQ by TMA reduce-adds
    # The split recurrence's kernels with their own stage count (_OWN_STAGES; 0: num_stages).
    decays_num_stages: int = 0     # the cumulative-decay kernel
    decays_num_warps: int = 0      # the cumulative-decay kernel's warps (0: num_warps)
    states_num_stages: int = 0     # its chunk-state kernel (0: num_stages)

    def kernel_launch(self, kernel_name: str, chunk_stage: str | None = None) -> tuple[int, int]:
        """(num_warps, num_stages) the kernel of this name (and abi.CHUNK_STAGE) launches with:
        the backward's dK/dV kernel and the split recurrence's cumulative-decay and chunk-state
        kernels have their own."""
        if self.backward and abi.backward_part(kernel_name) == "dkdv":
            return self.dkdv_num_warps or self.num_warps, self.dkdv_num_stages or self.num_stages
        if self.linear and chunk_stage in _OWN_STAGES:
            own_warps = getattr(self, _OWN_WARPS[chunk_stage]) if chunk_stage in _OWN_WARPS else 0
            return own_warps or self.num_warps, getattr(self, _OWN_STAGES[chunk_stage]) or self.num_stages
        return self.num_warps, self.num_stages

    @property
    def gluon_programs(self) -> int:
        """attn-lower-to-gluon's `programs`: the target's multiprocessors for a persistent grid,
        else 0 (a program per query block)."""
        return self.wave_programs if self.persistent else 0

    def launch_text(self) -> str:
        """The launch options as `--dump-pass-pipeline` prints them."""
        if self.warp_specialize and self.assume_aligned:
            return "the warps its Triton GPU IR states (attn-lower-to-gluon)"
        text = f"num-warps={self.num_warps} num-stages={self.num_stages}"
        if self.backward:
            warps, stages = self.kernel_launch(abi.backward_kernel_name("", "dkdv"))
            text += f" dkdv-num-warps={warps} dkdv-num-stages={stages}"
        if self.linear:
            for stage in _OWN_WARPS:
                text += f" {stage}-num-warps={self.kernel_launch('', stage)[0]}"
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
        if self.tensor_descriptors:  # plain attention's default on sm90 (launch_defaults)
            config["tensor_descriptors"] = True
        if self.host_descriptors and self.tensor_descriptors:
            config["host_descriptors"] = True
        if self.target != "host" and self.wave_programs != multiprocessors(self.target):
            config["wave_programs"] = self.wave_programs
        if not self.mirror_reads:  # both presets mirror
            config["mirror_reads"] = False
        if not self.raw_row_max and self.target != "host" and not self.backward:  # and takes the raw row max
            config["raw_row_max"] = False
        if self.warp_specialize:
            # Both schedules recorded: the default depends on the shape (gluon_schedule).
            config.update(warp_specialize=True, pingpong=self.pingpong, persistent=self.persistent)
            if self.warpgroups:
                config["warpgroups"] = self.warpgroups
            if self.backward:
                config["reduce_dq"] = self.reduce_dq
        if self.backward:
            config.update(dkdv_block_m=self.dkdv_block_m, dkdv_block_n=self.dkdv_block_n,
                          dkdv_num_warps=self.dkdv_num_warps, dkdv_num_stages=self.dkdv_num_stages)
            if not self.closure_grads:
                config["closure_grads"] = False
        if self.linear:
            config.update(block_v=self.block_v, block_k=self.block_k,
                          **{field: getattr(self, field) for field in [*_OWN_WARPS.values(), *_OWN_STAGES.values()]})
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
    typed = typed_overrides(overrides, PresetOptions, _WARP_COUNTS, _STAGE_COUNTS)
    # On the CPU a tile's scores are a pass through memory of their own; Triton multiplies them
    # in registers on the way to exp2, and the H200 ran level either way.
    values: dict = {"split": preset == "triton", "whole_tiles": WHOLE_TILES[preset], "prescale_q": preset == "cpu",
                    "raw_row_max": preset == "triton"}
    if preset == "triton":
        values["wave_programs"] = multiprocessors(target)
    if problem is not None and preset == "triton":
        values["fast_tanh"] = (FAST_TANH and has_fast_tanh(target) and not problem.linear
                               and problem.dtype in ("bf16", "f16"))
        if not typed.get("backward") and takes_host_tma(problem, target):
            values.update(tensor_descriptors=True, host_descriptors=True)
        backward = bool(typed.get("backward"))
        values["warp_specialize"] = warp_specialized(
            target, problem.gluon_backward if backward else problem.simple_mask, problem.lq, problem.dk,
            backward=backward, batch_heads=problem.batch_heads, score_mod=problem.score_mod,
            adds_bias=problem.mod_adds_bias)
    if preset == "cpu":
        from .backends.cpu_cache import host_has_avx512_bf16, narrows_isa, uses_amx, vector_bits

        values["vector_bits"] = vector_bits()
        values["no_avx512_bf16"] = host_has_avx512_bf16()
        values["narrow_isa"] = narrows_isa(values["vector_bits"])
        # AMX multiplies bf16 tiles: Q is then multiplied unscaled (a scaled copy would be f32),
        # the scale taken on the scores as Triton does. Its tile loads read rows of contiguous
        # elements, so arrays of any inner stride keep the f32 products.
        if problem is not None and problem.dtype == "bf16" and not typed.get("backward") and not problem.linear:
            values["amx"] = not values["narrow_isa"] and typed.get("unit_inner_stride", True) and uses_amx()
            values["prescale_q"] = not values["amx"]
    if problem is not None and preset == "cpu":
        values.update(cpu_config(problem.lq, problem.lk, not problem.masked and not typed.get("backward"),
                                 problem.dtype))
    elif problem is not None and problem.linear:
        values.update(linear_config(problem, target), linear=True)
    elif problem is not None:
        if typed.get("backward"):
            values.update(backward_defaults(problem, target))
        else:
            values.update(default_config(problem.lq, problem.lk, problem.dk, problem.dv, problem.dtype, target,
                                         problem.batch_heads, problem.group, problem.uneven_keys, problem.cut_tiles,
                                         plain=problem.plain))
    if "dkdv_num_warps" in values:  # the Triton backward's two configs
        backward_overrides(values, typed)
    else:
        values.update(typed)
        if "num_stages" in typed:  # the kernels with their own stage count follow, unless given it
            for own in _OWN_STAGES.values():
                values[own] = typed.get(own, 0)
        if "num_warps" in typed:  # and those with their own warps the warps
            for own in _OWN_WARPS.values():
                values[own] = typed.get(own, 0)
    if values.get("tensor_descriptors") and not has_tma(target):
        raise CompileError(f"preset option 'tensor-descriptors' needs an NVIDIA target from sm90 on "
                           f"(TMA), got '{target}'")
    if values.get("warp_specialize") and not values.get("backward"):
        # The Gluon forward's schedule, whether the preset or the overrides chose that kernel.
        schedule_for = GLUON_SCHEDULE if problem is None else gluon_schedule(
            values.get("wave_programs", 0), problem.simple_mask == "causal", problem.lq, problem.dk,
            problem.batch_heads, values.get("warpgroups", 0))
        for schedule, on in schedule_for.items():
            values.setdefault(schedule, on)
    if values.get("backward") and values.get("warp_specialize") and problem is not None \
            and not problem.gluon_backward_serves(values.get("closure_grads", True)):
        if typed.get("warp_specialize"):
            raise CompileError("preset option 'warp-specialize': the Gluon backward computes no closure tensor's "
                               "gradient, which this score_mod's reads need (closure-grads=false: none required)")
        values["warp_specialize"] = False
    # The backward's form follows its kernel, whether the preset or the overrides chose it.
    values.setdefault("reduce_dq", reduced_dq(bool(values.get("warp_specialize")), bool(values.get("backward")),
                                              problem is not None and problem.score_mod))
    if values["reduce_dq"] and not (values.get("backward") and values.get("warp_specialize")):
        raise CompileError("preset option 'reduce-dq' is a form of attn-lower-to-gluon's backward; it needs "
                           "'backward' and 'warp-specialize'")
    for name, off in (("pingpong", False), ("persistent", False), ("warpgroups", 0)):
        if values.get(name) and values.get("backward"):
            raise CompileError(f"preset option '{name}' is an option of the forward kernel; the backward has none")
        if values.get(name) and not values.get("warp_specialize"):
            if name in typed:
                raise CompileError(f"preset option '{name}' is an option of attn-lower-to-gluon's kernel; it "
                                   "needs 'warp-specialize'")
            values[name] = off  # a default of the kernel the overrides turned off
    if values.get("warp_specialize") and target != "cuda:90":
        raise CompileError(f"preset option 'warp-specialize' needs the NVIDIA sm90 target (wgmma), got '{target}'")
    if values.get("fast_tanh") and not has_fast_tanh(target):
        raise CompileError(f"preset option 'fast-tanh' needs an NVIDIA target from sm75 on (PTX tanh.approx), "
                           f"got '{target}'")
    return PresetOptions(target=target, **values)


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
                 f"closure-grads={_flag(o.closure_grads)} mirror-reads={_flag(o.mirror_reads)} "
                 f"call-time-tables={_flag(o.call_time_tables)}}}", fold]
    else:
        to_l1 = ["attn-verify", "attn-fuse-online-softmax",
                 f"attn-chunk-recurrence{{split={_flag(o.split)} block-v={o.block_v} block-k={o.block_k}}}",
                 f"attn-tile{{block-m={o.block_m} block-n={o.block_n} call-time-tables={_flag(o.call_time_tables)} "
                 f"kv-splits={o.kv_splits} pack-gqa={_flag(o.pack_gqa)} whole-tiles={_flag(o.whole_tiles)} "
                 f"prescale-q={_flag(o.prescale_q)} mirror-reads={_flag(o.mirror_reads)} "
                 f"raw-row-max={_flag(o.raw_row_max)}}}", fold]
    if preset == "cpu":
        return [Stage("l1", tuple(to_l1)),
                Stage("llvm", (f"attn-lower-to-cpu{{unit-inner-stride={_flag(o.unit_inner_stride)} "
                               f"vector-bits={o.vector_bits} no-avx512-bf16={_flag(o.no_avx512_bf16)} "
                               f"narrow-isa={_flag(o.narrow_isa)} amx={_flag(o.amx)}}}",))]
    if o.warp_specialize and o.assume_aligned:
        # attn-lower-to-gluon reads L0 itself (the backward's kernels too, and the score_mod's
        # derivative from attn-differentiate); the general variant (assume-aligned=false) takes
        # the stages below.
        bwd_opts = f"reduce-dq={_flag(o.reduce_dq)} fast-tanh={_flag(o.fast_tanh)} " if o.backward else ""
        fwd_opts = "" if o.backward else f" warpgroups={o.warpgroups}"
        return [Stage("l1", ("attn-verify", "attn-differentiate") if o.backward else ("attn-verify",)),
                Stage("ttir", (f"attn-lower-to-gluon{{pingpong={_flag(o.pingpong)} backward={_flag(o.backward)} "
                               f"{bwd_opts}programs={o.gluon_programs} wave-programs={o.wave_programs}{fwd_opts}}}",))]
    # Folding L1's one-trip loops and constant tables before the lowering shortens the Triton IR;
    # the lowering takes unfolded L1 too (the `canonicalize=false` option).
    if o.canonicalize:
        to_l1 += ["canonicalize", "cse"]
    return [Stage("l1", tuple(to_l1)),
            Stage("ttir", (f"attn-lower-to-triton{{assume-aligned={_flag(o.assume_aligned)} "
                           f"input-precision={o.input_precision} "
                           f"tensor-descriptors={_flag(o.tensor_descriptors)} "
                           f"host-descriptors={_flag(o.host_descriptors)} "
                           f"fast-tanh={_flag(o.fast_tanh)} "
                           f"wave-programs={o.wave_programs}}}",))]


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
