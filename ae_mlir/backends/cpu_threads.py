"""How the CPU backend spreads a kernel's programs over threads.

A lowered kernel runs the range [first, last) of its flat program ids that its last two arguments
give (`attn-cpu-grid-loops`). Its programs are cut into contiguous pieces, a few per thread, and
each thread takes the next piece until none is left: programs differ in cost (causal attention's
last query blocks see the most keys, so equal contiguous shares of a grid with fewer heads than
threads are unbalanced) and a thread the OS deschedules should not hold the rest back. Most
kernels take their pieces in their own code (`run_claiming`: the kernel's claiming entry,
`attn-cpu-claim-programs`), so a call is one foreign call per thread; kernels that add into a
copy of an output per piece (the closure gradients: see `ae_mlir.backends.cpu`) are called once
per piece (`run`). The pieces share no memory they write: each program writes only its own
slices of the outputs and each call allocates its own scratch buffers. Which thread runs a
program changes nothing it computes.

The threads are torch's own OpenMP team where the process has an OpenMP runtime loaded (torch's
CPU builds bring one): a call is a parallel region (`GOMP_parallel`, which libgomp, LLVM's libomp
and Intel's runtime all provide), each thread of the team calling the claiming entry, or a
Python function that takes pieces for a range kernel. A pool of threads of the backend's own
would compete with torch's: after each torch call, torch's OpenMP threads spin for a while
waiting for more work (libgomp's default wait policy), and on a 2-core host a kernel called right
after a torch op ran 1.4x slower than with the threads made to sleep (OMP_WAIT_POLICY=PASSIVE),
in a training step's forward and backward alike. In the team those threads run the kernel.
Without a runtime (or in a forked child, where libgomp's threads are not the parent's) the
backend's own pool serves: the calling thread and pool threads take pieces the same way (the
calling thread does not sleep waiting for the others on claiming kernels; ctypes releases the
GIL around each foreign call).

Threads: as many as the process may run on (`os.sched_getaffinity`), or `AE_MLIR_CPU_THREADS`;
1 runs every program on the calling thread.

This module imports neither the MLIR bindings nor torch.
"""
from __future__ import annotations

import atexit
import contextlib
import ctypes
import logging
import os
import queue
import threading
from collections.abc import Callable

THREADS_ENV = "AE_MLIR_CPU_THREADS"
_log = logging.getLogger("ae_mlir.cpu_threads")


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


# Pieces per thread: enough that a slow or unlucky thread leaves its share to the others, few
# enough that a call's fixed cost (a ctypes call over the argument descriptors) stays small. On
# the 2-core AMD EPYC with AVX-512 (fp32 B1 H4 D64, two threads, 4 / 8 / 16 pieces a thread
# alternated in one process, medians of 25-40 calls each, two runs): causal L 512 1.337 / 1.244 /
# 1.288 and 1.341 / 1.248 / 1.273 ms, L 1024 4.57 / 4.26 / 4.28; full L 512 2.245 / 2.152 / 2.137
# and 1.853 / 1.820 / 1.837, L 1024 6.79 / 6.75 / 6.79, L 2048 25.2 / 25.3 / 25.3: the last piece
# of a thread that finishes early waits less.
PIECES_PER_THREAD = 8


def pieces(programs: int, threads: int, per_thread: int = PIECES_PER_THREAD) -> list[tuple[int, int]]:
    """[0, programs) as contiguous ranges of one length (the last may be shorter), about
    `per_thread` per thread; one range with a single thread or program."""
    if threads <= 1 or programs <= 1:
        return [(0, programs)]
    size = -(-programs // (threads * per_thread))
    return [(first, min(first + size, programs)) for first in range(0, programs, size)]


def run(call: Callable[[int, int], None], programs: int, per_thread: int = PIECES_PER_THREAD) -> None:
    """`call(first, last)` over every program, on up to `thread_count()` threads, in about
    `per_thread` pieces per thread."""
    threads = min(thread_count(), programs)
    if threads <= 1:
        call(0, programs)
        return
    todo = iter(pieces(programs, threads, per_thread))
    lock = threading.Lock()

    def work() -> None:
        while True:
            with lock:
                piece = next(todo, None)
            if piece is None:
                return
            call(*piece)

    parallel = openmp_parallel()
    if parallel is not None:
        errors: list[BaseException] = []

        def member(_) -> None:
            try:
                work()
            except BaseException as err:  # raised in the caller once the team has finished
                errors.append(err)

        # The region returns once every thread of the team has: no piece runs after the call.
        region = _REGION(member)
        parallel(ctypes.cast(region, ctypes.c_void_p), None, threads, 0)
        if errors:
            raise errors[0]
        return
    with _POOL.get(threads - 1) as workers:
        jobs = [worker.submit(work, wait=True) for worker in workers]
    try:
        work()
    finally:
        # Whatever becomes of this thread's pieces, the others finish before the call returns.
        errors = [job.wait() for job in jobs]
    for error in errors:
        if error is not None:
            raise error


def run_claiming(launch, programs: int, per_thread: int = PIECES_PER_THREAD) -> None:
    """`launch(chunk)` on up to `thread_count()` threads at once, for a kernel's claiming entry
    (`cpu_launch.ClaimingLaunch`): each thread claims `chunk` programs at a time (about
    `per_thread` claims per thread) until none is left, and the entry returns on each thread once
    every thread that entered it has finished (`attn-cpu-claim-programs`). In torch's OpenMP team
    each thread calls the entry with the same packed arguments (`launch.packed`) and the region
    returns with the team. In the backend's own pool this returns when the calling thread's call
    does, without waiting for the pool threads to come back from theirs: a pool thread that
    starts late finds nothing left to claim."""
    threads = min(thread_count(), programs)
    if threads <= 1:
        launch(max(programs, 1))
        return
    chunk = -(-programs // (threads * per_thread))
    parallel = openmp_parallel()
    if parallel is not None:
        parallel(*launch.packed(chunk), threads, 0)
        return
    with _POOL.get(threads - 1) as workers:
        for worker in workers:
            worker.submit(lambda: launch(chunk))
    launch(chunk)


# A parallel region's function: void (*)(void *data).
_REGION = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_UNSET = object()
_openmp: object = _UNSET


def openmp_parallel():
    """`GOMP_parallel(fn, data, num_threads, flags)` of the OpenMP runtime loaded in this process
    (torch's), as a ctypes function, or None where there is none. Looked up once, at the first
    multi-threaded call (torch is loaded by then: the kernels take its tensors)."""
    global _openmp
    if _openmp is _UNSET:
        try:
            parallel = ctypes.CDLL(None).GOMP_parallel
        except (AttributeError, OSError, TypeError):  # no runtime, or no global symbol table (Windows)
            parallel = None
        if parallel is not None:
            parallel.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint]
            parallel.restype = None
        _openmp = parallel
    return _openmp


class _Job:
    """A job handed to a pool thread; `wait()` blocks until it ends and returns its exception."""

    def __init__(self, run: Callable[[], None], wait: bool):
        self.run = run
        self.error: BaseException | None = None
        self.done = threading.Lock() if wait else None
        if self.done is not None:
            self.done.acquire()

    def wait(self) -> BaseException | None:
        self.done.acquire()
        return self.error


class _Worker:
    """A pool thread that runs the jobs handed to it in turn, from a queue: a SimpleQueue's get
    wakes on a lock, the cheapest wake-up CPython has (a ThreadPoolExecutor's futures and condition
    variables cost a kernel call about 30 us more on a 2-core host)."""

    def __init__(self, name: str):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._serve, name=name, daemon=True).start()

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                job.run()
            except BaseException as err:  # handed to a caller that waits, else logged
                job.error = err
                if job.done is None:
                    _log.error("a CPU kernel job failed on a pool thread", exc_info=err)
            if job.done is not None:
                job.done.release()

    def submit(self, run: Callable[[], None], wait: bool = False) -> _Job:
        job = _Job(run, wait)
        self._jobs.put(job)
        return job


class _Pool:
    """The worker threads, shared by every kernel call and grown when a call wants more. One call
    hands them its jobs at a time; a thread runs the jobs of concurrent calls in turn."""

    def __init__(self):
        self.lock = threading.Lock()
        self.workers: list[_Worker] = []

    @contextlib.contextmanager
    def get(self, workers: int):
        with self.lock:
            while len(self.workers) < workers:
                self.workers.append(_Worker(f"ae-mlir-cpu_{len(self.workers)}"))
            yield self.workers[:workers]


_POOL = _Pool()


def _forget_pool_in_child() -> None:
    # A forked child (a DataLoader worker, say) inherits the pool's bookkeeping but none of its
    # threads, and work submitted there would wait forever; it starts a pool of its own. The OpenMP
    # team's threads were not forked either: the child uses the pool.
    global _POOL, _openmp
    _POOL = _Pool()
    _openmp = None


def _drain_pool() -> None:
    # A pool thread may still have a claiming job to start (one that claims nothing: its call
    # returned long ago); it must end before the interpreter unloads the kernels' code.
    with _POOL.lock:
        workers = list(_POOL.workers)
    for job in [worker.submit(lambda: None, wait=True) for worker in workers]:
        job.wait()


atexit.register(_drain_pool)

if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool_in_child)
