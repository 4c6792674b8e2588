"""Source locations of traced code: which line of the user's Python built an op.

The tracer records, for every expression node, the innermost frame that is neither ae-mlir's nor
torch's; the emitter writes it as an MLIR `loc("file.py":line:col)`, so a diagnostic about a mod's
op, at any level, names the user's line.
"""
from __future__ import annotations

import functools
import os
import sys
from typing import NamedTuple


class SourceLoc(NamedTuple):
    """A position in the user's Python source; `col` is 1-based, 0 when unknown (MLIR's usage).
    A tuple: module texts are cached by keys holding one per traced op, hashed at every call."""

    file: str
    line: int
    col: int = 0


@functools.lru_cache(maxsize=1)
def _own_dir() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _is_library_file(filename: str) -> bool:
    """ae-mlir's own frames and torch's (its __torch_function__ dispatch, flex_attention's
    and_masks) stand between the user's line and the expression being recorded."""
    torch = sys.modules.get("torch")
    return _library_file(filename, None if torch is None else torch.__file__)


# Cached: every traced op and every call asks for each frame between it and the user's line.
@functools.lru_cache(maxsize=4096)
def _library_file(filename: str, torch_file: str | None) -> bool:
    if filename.startswith(_own_dir()):
        return True
    return torch_file is not None and filename.startswith(os.path.dirname(torch_file) + os.sep)


# Per code object (by id, the object kept to check it): whether it is ae-mlir's or torch's, and
# the location of each instruction offset asked for. Every traced op asks for the user's line (a
# mod of a few ops traces on every call), and hashing a code object hashes its bytecode.
_LIBRARY_CODES: dict = {}
_LOCATIONS: dict = {}


def _is_library_code(code) -> bool:
    found = _LIBRARY_CODES.get(id(code))
    if found is None or found[0] is not code:
        if len(_LIBRARY_CODES) > 65536:
            _LIBRARY_CODES.clear()
        found = _LIBRARY_CODES[id(code)] = (code, _is_library_file(code.co_filename))
    return found[1]


def user_location() -> SourceLoc | None:
    """Where the innermost frame outside ae-mlir and torch is: the user's line being run."""
    frame = sys._getframe(1)  # the caller may be ae-mlir's own (the tracer) or the user's
    while frame is not None and _is_library_code(frame.f_code):
        frame = frame.f_back
    if frame is None:
        return None
    code = frame.f_code
    key = (id(code), frame.f_lasti)
    found = _LOCATIONS.get(key)
    if found is None or found[0] is not code:
        if len(_LOCATIONS) > 65536:
            _LOCATIONS.clear()
        found = _LOCATIONS[key] = (code, _location(frame))
    return found[1]


def _location(frame) -> SourceLoc:
    # co_positions has one entry per 2-byte code unit; f_lasti is the running instruction's offset.
    positions = tuple(frame.f_code.co_positions())
    index = frame.f_lasti // 2
    line, _, col, _ = positions[index] if 0 <= index < len(positions) else (None, None, None, None)
    return SourceLoc(frame.f_code.co_filename, line or frame.f_lineno, col + 1 if col is not None else 0)


def definition_location(fn) -> SourceLoc | None:
    """The line that defines the user function `fn` (a partial's function, a callable object's
    __call__); None when it is defined inside ae-mlir or torch or has no Python code."""
    target = fn.func if isinstance(fn, functools.partial) else fn
    code = getattr(target, "__code__", None) or getattr(getattr(type(target), "__call__", None), "__code__", None)
    if code is None or _is_library_file(code.co_filename):
        return None
    return SourceLoc(code.co_filename, code.co_firstlineno)
