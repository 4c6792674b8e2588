"""The tiles a call of a Triton module takes for its mask: a mask read at call time (a document
mask's closure ids) is classified from its first call's tables, and where it cuts many KV tiles per
query block the preset's smaller tiles apply (`launch_defaults.CUT_TILES_MAX`), forward and
backward. What a module poses (`presets.Problem`) is read once per module: parsed where the MLIR
bindings are installed, and recorded in the cache for machines that only run bundles.

This module imports the MLIR bindings only where a module is parsed.
"""
from __future__ import annotations

import dataclasses
import json

from .. import runtime
from ..core import abi
from ..core.regions import strip_locations


def call_time_tiles(l0_text: str, target: str, inputs: list) -> dict:
    """The launch options (block sizes, warps, stages) a call of the module takes over the
    preset's, {} for none: those the preset gives a mask read at call time for the tiles its
    first call's tables cut (`_call_time_cut`)."""
    from .. import launch_defaults

    cut = _call_time_cut(l0_text, target, inputs)
    if not cut:
        return {}
    p = _problem(l0_text)
    config = launch_defaults.default_config(p.lq, p.lk, p.dk, p.dv, p.dtype, target, p.batch_heads, p.group,
                                    p.uneven_keys, cut)
    preset = launch_defaults.default_config(p.lq, p.lk, p.dk, p.dv, p.dtype, target, p.batch_heads, p.group,
                                    p.uneven_keys)
    return {key: config[key] for key in _TILES} if any(preset[key] != config[key] for key in _TILES) else {}


def backward_call_time_tiles(l0_text: str, target: str, tensors: dict) -> dict:
    """The backward's counterpart of `call_time_tiles`, from the tensors by role: the overrides
    of the preset's backward config for the tiles the module's mask cuts."""
    from .. import presets

    key = (l0_text, target)
    found = _BACKWARD_TILES.get(key)
    if found is None:
        captures = [tensors[role] for role in sorted((r for r in tensors if abi.is_capture(r)), key=lambda r: int(r[1:]))]
        cut = _call_time_cut(l0_text, target, [tensors["q"], tensors["k"], tensors["v"], *captures])
        found = {}
        if cut:
            p = _problem(l0_text)
            config = presets.backward_defaults(p, target, cut)
            preset = presets.backward_defaults(p, target, 0.0)
            found = {name: value for name, value in config.items() if preset[name] != value}
        _BACKWARD_TILES[key] = found
    return found


def _call_time_cut(l0_text: str, target: str, operands: list) -> float:
    """The tiles a mask read at call time (a document mask's closure ids) cuts per query block at
    `launch_defaults.CUT_TILES_AT`, from its tables on the module's first call (the same tables the
    forward's launch classifies at those tiles, from the cache); 0 for other masks, and where the
    preset's tiles do not depend on it. Kept per module: deciding on every call would classify a
    mask whose tensors change at every step once more."""
    from .. import launch_defaults

    key = (l0_text, target)
    if key not in _CUTS:
        p = _problem(l0_text)
        if p is None:  # not known here: the preset's tiles
            _CUTS[key] = 0.0
            return 0.0
        program = p.call_time_mask
        cut = 0.0
        past = launch_defaults.CUT_TILES_MAX + 1
        matters = (launch_defaults.default_config(p.lq, p.lk, p.dk, p.dv, p.dtype, target, cut_tiles=past)
                   != launch_defaults.default_config(p.lq, p.lk, p.dk, p.dv, p.dtype, target))
        if program is not None and matters:
            from ..block_mask import call_time_tables
            from ..core.block_tables import BlockTables, cut_per_block

            tables = call_time_tables(program, operands, p.lq, p.lk, *launch_defaults.CUT_TILES_AT, operands[0].device)
            cut = cut_per_block(BlockTables(*tables))
        _CUTS[key] = cut
    return _CUTS[key]


def _problem(l0_text: str):
    """The problem the module poses (`presets.read_problem`), read once per module. Reading it
    parses the module, so a machine with the MLIR bindings also records it in the cache
    (`<cache_dir>/problems/`), beside the bundles it compiles; a machine without them, which runs
    bundles compiled elsewhere, reads that record, or gets None where there is none."""
    if l0_text not in _PROBLEMS:
        _PROBLEMS[l0_text] = _read_problem(l0_text)
    return _PROBLEMS[l0_text]


def _read_problem(l0_text: str):
    from .. import presets
    from ..disk_cache import atomic_write, cache_dir
    from .triton import _parse_l0

    path = cache_dir() / "problems" / f"{runtime.cache_key(strip_locations(l0_text), 'problem', {})}.json"
    try:
        import mlir  # noqa: F401
    except ImportError:
        try:
            return presets.Problem(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            return None
    problem = presets.read_problem(_parse_l0(l0_text))
    if problem is not None:
        try:
            atomic_write(path, json.dumps(dataclasses.asdict(problem)))
        except OSError:
            pass  # a read-only cache: this machine parses the module again next process
    return problem


# The launch options a mask's tables choose; the first call's cut per module and target; what
# each module poses.
_TILES = ("block_m", "block_n", "num_warps", "num_stages")
_CUTS: dict = {}
_BACKWARD_TILES: dict = {}  # per (module, target): backward_call_time_tiles' answer
_PROBLEMS: dict = {}
