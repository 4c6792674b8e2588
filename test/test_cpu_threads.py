"""The CPU backend on several threads (`ae_mlir.backends.cpu_threads`): a kernel runs a range of
its programs per call, or claims them from a shared counter through its claiming entry; the
threads (torch's OpenMP team, else the backend's own pool: the scheduling tests run on both) run
in parallel, and the outputs are bit-identical whatever the thread count (`AE_MLIR_CPU_THREADS`),
since each program computes its own slices of the outputs alone."""
from __future__ import annotations

import contextlib
import gc
import json
import os
import random
import shutil
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch

import ae_mlir as ae
from ae_mlir.backends import cpu, cpu_cache, cpu_launch, cpu_threads
from inputs import qkv, rand

THREADS = cpu_threads.THREADS_ENV


@pytest.fixture(params=["openmp", "pool"])
def threads_from(request, monkeypatch):
    """Which threads run a call's pieces: torch's OpenMP team, or the backend's own pool (as
    without an OpenMP runtime)."""
    if request.param == "openmp":
        assert cpu_threads.openmp_parallel() is not None, "torch's CPU build brings an OpenMP runtime"
    else:
        monkeypatch.setattr(cpu_threads, "_openmp", None)
    return request.param


@pytest.fixture
def own_pool(monkeypatch):
    monkeypatch.setattr(cpu_threads, "_openmp", None)


# --- ranges and the thread count ------------------------------------------------------------------


@pytest.mark.parametrize("programs,threads", [(10, 3), (12, 2), (100, 2), (5, 8), (1, 4), (0, 2), (7, 1)])
def test_pieces_cover_the_grid_in_contiguous_ranges_of_one_length(programs, threads):
    ranges = cpu_threads.pieces(programs, threads)
    assert ranges[0][0] == 0 and ranges[-1][1] == programs
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    lengths = [last - first for first, last in ranges]
    assert len(set(lengths[:-1])) <= 1 and lengths[-1] <= lengths[0]
    if threads > 1 and programs > 1:
        assert min(threads, programs) <= len(ranges) <= threads * cpu_threads.PIECES_PER_THREAD
    else:
        assert ranges == [(0, programs)]


def test_thread_count_defaults_to_the_usable_cores_and_follows_the_variable(monkeypatch):
    monkeypatch.delenv(THREADS, raising=False)
    assert cpu_threads.thread_count() == len(os.sched_getaffinity(0))
    monkeypatch.setenv(THREADS, "3")
    assert cpu_threads.thread_count() == 3
    for bad in ("0", "-2", "two"):
        monkeypatch.setenv(THREADS, bad)
        with pytest.raises(ValueError, match=f"{THREADS} must be a positive integer"):
            cpu_threads.thread_count()


def test_pieces_run_at_the_same_time_on_distinct_threads(monkeypatch, threads_from):
    monkeypatch.setenv(THREADS, "3")
    barrier = threading.Barrier(3, timeout=60)
    seen, first_calls = [], set()
    lock = threading.Lock()

    def call(first, last):
        with lock:
            seen.append((first, last))
            new_thread = threading.get_ident() not in first_calls
            first_calls.add(threading.get_ident())
        if new_thread:
            barrier.wait()  # breaks (an error) unless three threads are running pieces together

    cpu_threads.run(call, 8)
    assert sorted(p for first, last in seen for p in range(first, last)) == list(range(8))
    assert len(first_calls) == 3


def test_a_thread_that_finishes_early_takes_more_pieces(monkeypatch, threads_from):
    # Causal attention's later programs cost more; a slow first piece must not hold the rest.
    monkeypatch.setenv(THREADS, "2")
    release = threading.Event()
    ran_by = {}

    def call(first, last):
        ran_by[first] = threading.get_ident()
        if first == 0:
            assert release.wait(60)
        elif len(ran_by) == 8:
            release.set()

    cpu_threads.run(call, 8)
    slow = ran_by[0]
    assert sum(ident != slow for ident in ran_by.values()) == 7


def test_a_piece_that_raises_raises_in_the_caller_after_the_others_finish(monkeypatch, threads_from):
    # Whichever thread runs the failing piece, the call raises its error, and only once every
    # other piece has returned: the caller may free what the pieces write into.
    monkeypatch.setenv(THREADS, "2")
    for failing in (0, 7):
        done = []

        def call(first, last, failing=failing):
            if first == failing:
                raise ZeroDivisionError(f"piece {first}")
            done.append(first)

        with pytest.raises(ZeroDivisionError, match=f"piece {failing}"):
            cpu_threads.run(call, 8, per_thread=4)
        assert sorted(done) == [p for p in range(8) if p != failing]
    seen = []
    cpu_threads.run(lambda first, last: seen.append(first), 8)  # the threads still serve calls
    assert sorted(seen) == list(range(8))


def test_calls_from_several_threads_share_the_threads(monkeypatch, threads_from):
    # Two callers at once (each the master of its own OpenMP team, or one waiting for the pool
    # threads the other holds): each gets the outputs a call alone gives.
    monkeypatch.setenv(THREADS, "2")
    attn, (q, k, v) = ATTENTION_CASES["causal"]()
    alone = attn(q, k, v, backend="cpu")
    results, errors = [None] * 4, []

    def caller(i):
        try:
            results[i] = attn(q, k, v, backend="cpu")
        except Exception as err:  # noqa: BLE001 -- reported below
            errors.append(err)

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and all(torch.equal(r, alone) for r in results)


# --- bit-identical outputs ---------------------------------------------------------------------------


def _by_thread_count(monkeypatch, run) -> dict:
    results = {}
    for threads in ("1", "2", "3"):
        monkeypatch.setenv(THREADS, threads)
        results[threads] = run()
    return results


def _assert_identical(results: dict) -> None:
    base = results["1"]
    for threads, got in results.items():
        assert len(got) == len(base)
        for a, b in zip(got, base):
            assert torch.equal(a, b), f"{threads} threads differ from one"


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def _closure_case():
    # A score mod and a mask that read closure tensors: the kernel takes them, and the mask's
    # tile tables classified at call time, as extra arrays.
    slopes = torch.tensor([2.0 ** -(i + 1) for i in range(4)])
    doc = torch.repeat_interleave(torch.arange(3), torch.tensor([30, 50, 23]))

    def alibi(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx)

    def same_doc(b, h, q_idx, kv_idx):
        return doc[q_idx] == doc[kv_idx]

    return ae.attention(score_mod=alibi, mask_mod=same_doc), qkv(b=1, h=4, lq=103, dk=16, seed=7)


ATTENTION_CASES = {
    # (attention, inputs); 2*3*3 = 18, 1*4*2 = 8, 2*2*1 = 4 and 1*4*2 = 8 programs.
    "causal": lambda: (ae.attention(mask_mod=causal), qkv(b=2, h=3, lq=150, dk=32)),
    "gqa": lambda: (ae.attention(mask_mod=causal), qkv(b=1, h=4, hkv=2, lq=100, dk=16, seed=3)),
    "ragged": lambda: (ae.attention(), qkv(b=2, h=2, lq=37, lk=101, dk=24, dv=40, seed=5)),
    "closure": _closure_case,
}


@pytest.mark.parametrize("case", list(ATTENTION_CASES))
def test_attention_is_bit_identical_on_one_two_and_three_threads(case, monkeypatch, threads_from):
    attn, (q, k, v) = ATTENTION_CASES[case]()
    results = _by_thread_count(monkeypatch, lambda: attn(q, k, v, return_lse=True, backend="cpu"))
    _assert_identical(results)
    want = attn(q, k, v, backend="reference")
    torch.testing.assert_close(results["2"][0], want.float(), atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("decay", [None, "head", "token", "token_dim"])
def test_linear_attention_is_bit_identical_on_one_two_and_three_threads(decay, monkeypatch):
    # Dv = 80: two V blocks per head, so 2*2*2 = 8 programs, run in pieces of one program: a
    # thread's piece can start at the second V block of a head.
    b, h, length, dk, dv = 2, 2, 45, 16, 80
    q, k, v = (rand(b, h, length, d, seed=s) for s, d in ((1, dk), (2, dk), (3, dv)))
    g = None
    if decay is not None:
        shape = {"head": (h,), "token": (b, h, length), "token_dim": (b, h, length, dk)}[decay]
        g = torch.nn.functional.logsigmoid(rand(*shape, seed=4) + 2.0)
    s0 = rand(b, h, dk, dv, seed=6)
    lin = ae.linear_attention(decay=decay, chunk_size=16)
    results = _by_thread_count(
        monkeypatch, lambda: lin(q, k, v, g, initial_state=s0, return_state=True, backend="cpu"))
    _assert_identical(results)
    want = lin(q, k, v, g, initial_state=s0, return_state=True, backend="reference")
    for got, w in zip(results["3"], want):
        torch.testing.assert_close(got.double(), w.double(), atol=2e-5, rtol=2e-5)


def test_programs_run_alone_in_any_order(monkeypatch):
    # Each program as its own call, in a shuffled order: the outputs are those of one call over
    # the whole grid, so no program reads what another writes, and the flat ids decode as a
    # nest of loops would number the programs.
    attn, (q, k, v) = ATTENTION_CASES["causal"]()
    monkeypatch.setenv(THREADS, "1")
    whole = attn(q, k, v, return_lse=True, backend="cpu")

    def one_at_a_time(call, programs, per_thread=cpu_threads.PIECES_PER_THREAD):
        order = list(range(programs))
        random.Random(0).shuffle(order)
        for p in order:
            call(p, p + 1)

    monkeypatch.setattr(cpu_threads, "run", one_at_a_time)
    monkeypatch.setattr(cpu.compile_module(attn.mlir(q, k, v)), "_claiming", None)  # ranges, not claims
    alone = attn(q, k, v, return_lse=True, backend="cpu")
    assert all(torch.equal(a, b) for a, b in zip(whole, alone))


class _IdlePool:
    """Pool threads that never start the jobs handed to them, then start them late (`late()`)."""

    def __init__(self):
        self.jobs = []

    @contextlib.contextmanager
    def get(self, workers):
        yield [self] * workers

    def submit(self, run, wait=False):
        assert not wait
        self.jobs.append(run)

    def late(self):
        for run in self.jobs:
            run()


def test_a_pool_thread_that_never_starts_is_not_waited_for(monkeypatch, own_pool):
    # The calling thread claims every program the pool threads leave; one that starts after the
    # call returned finds nothing to claim and writes nothing.
    attn, (q, k, v) = ATTENTION_CASES["causal"]()
    monkeypatch.setenv(THREADS, "1")
    alone = attn(q, k, v, return_lse=True, backend="cpu")
    monkeypatch.setenv(THREADS, "3")
    idle = _IdlePool()
    monkeypatch.setattr(cpu_threads, "_POOL", idle)
    got = attn(q, k, v, return_lse=True, backend="cpu")
    assert len(idle.jobs) == 2 and all(torch.equal(a, b) for a, b in zip(got, alone))
    copies = [t.clone() for t in got]
    idle.late()
    assert all(torch.equal(a, b) for a, b in zip(got, copies))


def test_a_pool_thread_that_starts_late_keeps_the_kernel_it_calls(tmp_path, monkeypatch, own_pool):
    # The kernel's JIT-compiled code (no C compiler: no shared object) must stay mapped until a
    # pool thread that starts after the call has returned from it, though the caller dropped the
    # kernel in between.
    monkeypatch.setenv("AE_MLIR_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cpu_cache, "_compiler", lambda: None)
    cpu.clear_memory_cache()
    q, k, v = qkv(b=1, h=2, lq=70, dk=16, seed=13)
    monkeypatch.setenv(THREADS, "2")
    idle = _IdlePool()
    monkeypatch.setattr(cpu_threads, "_POOL", idle)
    got = ae.attention(mask_mod=causal)(q, k, v, backend="cpu")
    cpu.clear_memory_cache()
    gc.collect()
    idle.late()
    torch.testing.assert_close(got, ae.attention(mask_mod=causal)(q, k, v, backend="reference").float(),
                               atol=2e-5, rtol=2e-5)


def test_a_thread_that_waits_long_for_another_sleeps(monkeypatch):
    # One thread claims the whole grid (about a tenth of a second of work); a second enters after
    # it and finds nothing to claim: it waits for the first in the claiming entry's final spin,
    # which sleeps once it has waited long, so its CPU time stays well below its wait.
    monkeypatch.setenv(THREADS, "1")
    q, k, v = qkv(b=1, h=4, lq=2048, dk=64, seed=14)
    kernel = cpu.compile_module(ae.attention().mlir(q, k, v))
    outputs = [torch.empty(spec.shape) for spec in kernel.outputs]
    layouts = [(spec.shape, t.stride()) for spec, t in zip(kernel.inputs + kernel.outputs, [q, k, v, *outputs])]
    launch = cpu_launch.ClaimingLaunch(kernel._claiming, [q, k, v, *outputs], layouts, kernel.programs)
    first = threading.Thread(target=launch, args=(kernel.programs,))
    first.start()
    while launch.counters[0] == 0:  # the first thread has not claimed yet
        time.sleep(0.001)
    wall, cpu_time = time.perf_counter(), time.thread_time()
    launch(1)
    wall, cpu_time = time.perf_counter() - wall, time.thread_time() - cpu_time
    first.join(60)
    assert list(launch.counters)[1:] == [2, 2]
    torch.testing.assert_close(outputs[0], kernel([q, k, v])[0])
    assert wall > 0.02 and cpu_time < 0.5 * wall, (wall, cpu_time)


def test_claims_cover_every_program_once_at_any_chunk(monkeypatch):
    # The claiming entry on its own, on one thread, at chunks of 1 to past the grid's size (the
    # runtime's 0 is taken as 1): the outputs of one call over the whole range.
    attn, (q, k, v) = ATTENTION_CASES["causal"]()
    monkeypatch.setenv(THREADS, "1")
    kernel = cpu.compile_module(attn.mlir(q, k, v))
    want = kernel([q, k, v])
    for chunk in (0, 1, 5, 18, 40):
        outputs = [torch.full(spec.shape, float("nan")) for spec in kernel.outputs]
        layouts = [(spec.shape, t.stride()) for spec, t in zip(kernel.inputs + kernel.outputs, [q, k, v, *outputs])]
        launch = cpu_launch.ClaimingLaunch(kernel._claiming, [q, k, v, *outputs], layouts, kernel.programs)
        launch(chunk)
        assert all(torch.equal(a, b) for a, b in zip(outputs, want)), chunk
        assert list(launch.counters)[1:] == [1, 1]


class _NoPool:
    def get(self, workers):
        raise AssertionError("a grid of one program needs no threads")


def _no_team(*args):
    raise AssertionError("a grid of one program needs no parallel region")


def test_a_grid_of_one_program_runs_on_the_calling_thread(monkeypatch):
    q, k, v = qkv(b=1, h=1, lq=50, dk=16, seed=9)
    attn = ae.attention(mask_mod=causal)
    assert cpu.compile_module(attn.mlir(q, k, v)).programs == 1
    monkeypatch.setenv(THREADS, "4")
    monkeypatch.setattr(cpu_threads, "_POOL", _NoPool())
    monkeypatch.setattr(cpu_threads, "_openmp", _no_team)
    got = attn(q, k, v, backend="cpu")
    torch.testing.assert_close(got, attn(q, k, v, backend="reference").float(), atol=2e-5, rtol=2e-5)


# --- the disk cache -------------------------------------------------------------------------------

_CACHED_SCRIPT = textwrap.dedent("""
    import hashlib, sys
    import torch, ae_mlir as ae
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 150, 32, generator=gen) for _ in range(3))
    o, lse = ae.attention(mask_mod=lambda b, h, i, j: i >= j)(q, k, v, return_lse=True)
    print("mlir" in sys.modules, hashlib.sha256(o.numpy().tobytes() + lse.numpy().tobytes()).hexdigest())
""")


@pytest.mark.skipif(shutil.which("cc") is None, reason="the disk cache links with the C compiler")
def test_a_second_process_runs_the_cached_kernel_on_threads(tmp_path):
    env = dict(os.environ, AE_MLIR_CACHE_DIR=str(tmp_path), **{THREADS: "1"})

    def run(threads: str) -> list[str]:
        result = subprocess.run([sys.executable, "-c", _CACHED_SCRIPT], env=dict(env, **{THREADS: threads}),
                                capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stderr
        return result.stdout.split()

    compiled = run("1")
    assert compiled[0] == "True"
    (record,) = (tmp_path / "cpu").glob("*.json")
    doc = json.loads(record.read_text())
    assert doc["format"] == cpu_cache.FORMAT_VERSION == 4
    assert doc["kernel"]["programs"] == 2 * 3 * 3 and doc["kernel"]["claiming"] == "attention_claiming"
    assert doc["kernel"]["output_roles"] == ["out", "lse"] and doc["kernel"]["mask_grid"] is None
    for threads in ("2", "3"):
        assert run(threads) == ["False", compiled[1]]


@pytest.mark.skipif(shutil.which("cc") is None, reason="the disk cache links with the C compiler")
def test_a_record_of_the_single_range_format_is_rebuilt(tmp_path, monkeypatch):
    # A format-1 kernel takes no program range; its record must not be read as a current one.
    monkeypatch.setenv("AE_MLIR_CACHE_DIR", str(tmp_path))
    cpu.clear_memory_cache()
    q, k, v = qkv(b=1, h=2, lq=40, dk=16, seed=11)
    text = ae.attention(mask_mod=causal).mlir(q, k, v)
    want = cpu.compile_module(text)([q, k, v])
    (record,) = (tmp_path / "cpu").glob("*.json")
    doc = json.loads(record.read_text())
    doc["format"] = 1
    record.write_text(json.dumps(doc))
    assert cpu_cache.load(record.stem) is None
    cpu.clear_memory_cache()
    got = cpu.compile_module(text)([q, k, v])
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert json.loads(record.read_text())["format"] == cpu_cache.FORMAT_VERSION
    cpu.clear_memory_cache()
