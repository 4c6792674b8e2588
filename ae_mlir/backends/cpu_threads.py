"""How the CPU backend spreads a kernel's programs over threads.

A lowered kernel runs the range [first, last) of its flat program ids that its last two arguments
give (`attn-cpu-grid-loops`). A call splits [0, programs) into contiguous ranges of near-equal
length, at most one per thread, runs the first on the calling thread and the others on a shared
pool. ctypes releases the GIL around a foreign call, so the ranges run in parallel; they share no
memory they write: each program writes only its own slices of the outputs and each call allocates
its own scratch buffers.

Threads: as many as the process may run on (`os.sched_getaffinity`), or `AE_MLIR_CPU_THREADS`;
1 runs every program on the calling thread.

This module imports neither the MLIR bindings nor torch.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor

THREADS_ENV = "AE_MLIR_CPU_THREADS"


def thread_count() -> int:
    """The threads one kernel call may use; read at every call, so the variable can change."""
    raw = os.environ.get(THREADS_ENV, "").strip()
    if not raw:
        return _usable_cores()
    try:
        count = int(raw)
    except ValueError:
        count = 0
    if count < 1:
        raise ValueError(f"{THREADS_ENV} must be a positive integer (threads per CPU kernel call), got {raw!r}")
    return count


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS and Windows have no affinity masks
        return os.cpu_count() or 1


def split(programs: int, threads: int) -> list[tuple[int, int]]:
    """[0, programs) as at most `threads` contiguous ranges whose lengths differ by at most one."""
    parts = max(1, min(threads, programs))
    return [(i * programs // parts, (i + 1) * programs // parts) for i in range(parts)]


def run(call: Callable[[int, int], None], programs: int) -> None:
    """`call(first, last)` over every program, the ranges on `thread_count()` threads."""
    first, *others = split(programs, thread_count())
    if not others:
        call(*first)
        return
    pool = _POOL.get(len(others))
    pending = [pool.submit(call, *bounds) for bounds in others]
    try:
        call(*first)
    finally:
        # Whatever becomes of this thread's range, the others finish before the call returns.
        futures.wait(pending)
    for future in pending:
        future.result()


class _Pool:
    """The worker threads, shared by every kernel; grown, never shrunk, when a call wants more."""

    def __init__(self):
        self.lock = threading.Lock()
        self.executor: ThreadPoolExecutor | None = None
        self.workers = 0

    def get(self, workers: int) -> ThreadPoolExecutor:
        with self.lock:
            if self.executor is None or self.workers < workers:
                # The smaller pool is not shut down: a concurrent call may still be submitting to
                # it; its idle threads exit once it is unreferenced.
                self.executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ae-mlir-cpu")
                self.workers = workers
            return self.executor


_POOL = _Pool()


def _forget_pool_in_child() -> None:
    # A forked child (a DataLoader worker, say) inherits the pool's bookkeeping but none of its
    # threads, and work submitted there would wait forever; it starts a pool of its own.
    global _POOL
    _POOL = _Pool()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool_in_child)
