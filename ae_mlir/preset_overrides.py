"""Preset overrides as users give them (`ae-opt --pipeline=triton{key=value ...}`, a backend's
`config` dict, the benchmarks' `--config`) turned into the options' field types, each checked
here so that a bad value is a diagnostic naming the option, not a failure deep in a pass or on
the GPU."""
from __future__ import annotations

import dataclasses
import typing
from typing import Literal

from .core.context import CompileError


def typed_overrides(overrides: dict, options_type, warp_counts: dict, stage_counts: dict) -> dict:
    """`overrides` (keys with - or _, values as text or typed) by `options_type`'s field names and
    types. `warp_counts` / `stage_counts` name the launch-count fields, each mapped to whether 0
    (follow the shared count) is allowed."""
    hints = typing.get_type_hints(options_type)
    # The target has its own flag and argument; whether the module is linear is read from it.
    fields = {f.name for f in dataclasses.fields(options_type)} - {"target", "linear"}
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
        _check_launch_count(key, typed[name], warp_counts.get(name), stage_counts.get(name))
    return typed


def _check_launch_count(key: str, value, warps_may_follow: bool | None, stages_may_follow: bool | None) -> None:
    """A warp count is what Triton launches (a power of two up to 32 warps, 1024 threads); a
    stage count is at least 1; a kernel's own count may be 0 (it follows the shared one)."""
    if warps_may_follow is not None:
        allowed = (value == 0 and warps_may_follow) or (1 <= value <= 32 and value & (value - 1) == 0)
        if not allowed:
            follow = " (or 0: as num-warps)" if warps_may_follow else ""
            raise CompileError(f"preset option '{key}' must be a power of two from 1 to 32{follow}, got {value}")
    elif stages_may_follow is not None and value < (0 if stages_may_follow else 1):
        follow = " (or 0: as num-stages)" if stages_may_follow else ""
        raise CompileError(f"preset option '{key}' must be at least 1{follow}, got {value}")
