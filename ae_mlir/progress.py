"""Progress lines for long compiles.

A compile that runs past a threshold (2 s; `$AE_MLIR_PROGRESS_AFTER` seconds) says what it is
doing, one line per stage, then how long it took:

    ae-mlir: compiling for the CPU (L0 -> L1 -> LLVM -> native code)...
    ae-mlir:   L1 -> LLVM dialect
    ae-mlir:   LLVM -> native code (JIT, -O3)
    ae-mlir: compiled 'attention' for the CPU in 9.8 s

The lines are records of the `ae_mlir` logger at INFO level when the application configured
logging, else lines on stderr. `AE_MLIR_QUIET=1`, or the `ae_mlir` logger's level set above INFO,
silences them. Short compiles (the usual case once a kernel is cached) print nothing.
"""
from __future__ import annotations

import logging
import os
import sys
import threading
import time

logger = logging.getLogger("ae_mlir")

QUIET_ENV = "AE_MLIR_QUIET"
AFTER_ENV = "AE_MLIR_PROGRESS_AFTER"
DEFAULT_AFTER_S = 2.0
_PREFIX = "ae-mlir:"


def _after_s() -> float:
    try:
        return float(os.environ.get(AFTER_ENV, DEFAULT_AFTER_S))
    except ValueError:
        return DEFAULT_AFTER_S


def silenced() -> bool:
    if os.environ.get(QUIET_ENV, "").strip() not in ("", "0"):
        return True
    return logger.level > logging.INFO


def emit(line: str) -> None:
    """One progress line: a log record where logging is set up, else a line on stderr."""
    if silenced():
        return
    if logger.hasHandlers():
        logger.info(line)
    else:
        print(line, file=sys.stderr, flush=True)


class Compile:
    """Reports one compile: `with Compile("for the CPU", "L0 -> L1 -> LLVM") as c: c.stage(...)`.

    Nothing is said before the threshold; then the header and the current stage (from a timer
    thread, so a single long stage is announced while it runs, as soon as it lets go of the
    GIL), every later stage, and the total time at the end."""

    def __init__(self, target: str, route: str):
        self._target, self._route = target, route
        self._stage: str | None = None
        self._announced = False
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self.name: str | None = None  # the kernel's name, once known, for the closing line

    def __enter__(self) -> Compile:
        self._start = time.monotonic()
        after = _after_s()
        if after <= 0:
            self._announce()
        else:
            self._timer = threading.Timer(after, self._announce)
            self._timer.daemon = True
            self._timer.start()
        return self

    def stage(self, text: str) -> None:
        with self._lock:
            self._stage = text
            if self._announced:
                emit(f"{_PREFIX}   {text}")
        if time.monotonic() - self._start >= _after_s():
            self._announce()

    def _announce(self) -> None:
        # Under the lock, so the timer thread's lines never interleave with the caller's.
        with self._lock:
            if self._announced:
                return
            self._announced = True
            emit(f"{_PREFIX} compiling {self._target} ({self._route})...")
            if self._stage:
                emit(f"{_PREFIX}   {self._stage}")

    def __exit__(self, kind, value, tb) -> None:
        if self._timer is not None:
            self._timer.cancel()
        elapsed = time.monotonic() - self._start
        if not self._announced and elapsed < _after_s():
            return
        self._announce()
        what = f"'{self.name}' " if self.name else ""
        with self._lock:
            if kind is None:
                emit(f"{_PREFIX} compiled {what}{self._target} in {elapsed:.1f} s")
            else:
                emit(f"{_PREFIX} compiling {what}{self._target} failed after {elapsed:.1f} s")


class Silent:
    """A `Compile` that says nothing (ae-opt's lowering prints the module instead)."""

    def __init__(self):
        self.name: str | None = None

    def stage(self, text: str) -> None:
        pass
