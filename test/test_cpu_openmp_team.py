"""The CPU kernels' threads are torch's OpenMP team (`ae_mlir.backends.cpu_threads`): a call is a
parallel region of the runtime torch loaded, so torch's threads, which spin for a while after
each torch op, run the kernel instead of competing with threads of the backend's own. The
backend's pool serves only without a runtime, and in a forked child."""
from __future__ import annotations

import ctypes
import os
import select
import signal
import subprocess
import sys
import threading

import torch

import ae_mlir as ae
from ae_mlir.backends import cpu, cpu_launch, cpu_threads
from inputs import qkv

THREADS = cpu_threads.THREADS_ENV


class _RefusingPool:
    def get(self, workers):
        raise AssertionError("with an OpenMP runtime loaded, the backend's own pool takes no work")


def _runtime():
    runtime = ctypes.CDLL(None)
    for name in ("omp_get_thread_num", "omp_in_parallel", "omp_get_num_threads"):
        getattr(runtime, name).restype = ctypes.c_int
    return runtime


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def test_torch_brings_the_runtime_the_kernels_run_in():
    assert cpu_threads.openmp_parallel() is not None


def test_range_pieces_run_in_one_parallel_region_of_the_team(monkeypatch):
    # Each piece runs inside the region, on the team's threads (numbered from 0, the caller's
    # thread the master), and the backend's pool is never asked.
    monkeypatch.setenv(THREADS, "2")
    monkeypatch.setattr(cpu_threads, "_POOL", _RefusingPool())
    runtime = _runtime()
    barrier = threading.Barrier(2, timeout=60)
    seen, lock = [], threading.Lock()

    def call(first, last):
        ident = threading.get_ident()
        with lock:
            new_thread = ident not in {i for *_, i in seen}
            seen.append((first, runtime.omp_in_parallel(), runtime.omp_get_num_threads(),
                         runtime.omp_get_thread_num(), ident))
        if new_thread:
            barrier.wait()  # breaks (an error) unless two threads of the team run pieces together

    caller = threading.get_ident()
    cpu_threads.run(call, 16)
    assert sorted(first for first, *_ in seen) == [first for first, _ in cpu_threads.pieces(16, 2)]
    assert all(inside == 1 and team == 2 for _, inside, team, _, _ in seen)
    assert {number for *_, number, _ in seen} == {0, 1}
    assert all(number == 0 for *_, number, ident in seen if ident == caller)


def test_claiming_kernels_run_on_every_thread_of_the_team(monkeypatch):
    # Each thread of the region enters the claiming entry once with the same packed arguments,
    # and the outputs are those of one thread.
    monkeypatch.setattr(cpu_threads, "_POOL", _RefusingPool())
    q, k, v = qkv(b=2, h=3, lq=150, dk=32)
    kernel = cpu.compile_module(ae.attention(mask_mod=causal).mlir(q, k, v))
    monkeypatch.setenv(THREADS, "1")
    want = kernel([q, k, v])
    for threads in (2, 3):
        monkeypatch.setenv(THREADS, str(threads))
        outputs = [torch.full(spec.shape, float("nan")) for spec in kernel.outputs]
        layouts = [(spec.shape, t.stride()) for spec, t in zip(kernel.inputs + kernel.outputs, [q, k, v, *outputs])]
        launch = cpu_launch.ClaimingLaunch(kernel._claiming, [q, k, v, *outputs], layouts, kernel.programs)
        cpu_threads.run_claiming(launch, kernel.programs)
        assert launch.counters[0] >= kernel.programs and list(launch.counters)[1:] == [threads, threads]
        assert all(torch.equal(a, b) for a, b in zip(outputs, want)), threads


def test_a_forked_child_runs_its_kernels_on_the_backends_own_pool():
    # The team's threads are the parent's (a parallel region of libgomp's in a forked child never
    # returned on the 2-core x86-64 host): a child gets the pool, and the same outputs.
    q, k, v = qkv(b=1, h=4, lq=100, dk=16, seed=3)
    attn = ae.attention(mask_mod=causal)
    want = attn(q, k, v, backend="cpu")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, then leave without running the parent's exit handlers
        try:
            os.environ[THREADS] = "2"
            got = attn(q, k, v, backend="cpu")
            ok = cpu_threads.openmp_parallel() is None and torch.equal(got, want)
            os.write(write, b"ok" if ok else b"differs")
        finally:
            os._exit(0)
    os.close(write)
    # libgomp's parallel regions hang in a forked child: a child that does not answer is killed.
    ready, _, _ = select.select([read], [], [], 120)
    answer = os.read(read, 16) if ready else b"no answer"
    os.close(read)
    if not ready:
        os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    assert answer == b"ok"


_LIMITED_SCRIPT = """
import torch, ae_mlir as ae
from ae_mlir.backends import cpu_threads
gen = torch.Generator().manual_seed(5)
q, k, v = (torch.randn(1, 4, 150, 32, generator=gen) for _ in range(3))
attn = ae.attention(mask_mod=lambda b, h, i, j: i >= j)
got = attn(q, k, v, backend="cpu")
want = attn(q.double(), k.double(), v.double(), backend="reference")
print(cpu_threads.openmp_parallel() is not None, float((got.double() - want).abs().max()))
"""


def test_a_team_the_runtime_limits_to_one_thread_still_runs_every_program():
    # OMP_THREAD_LIMIT=1 gives a region one thread however many are asked for: the caller's
    # thread then claims every program itself.
    env = dict(os.environ, OMP_THREAD_LIMIT="1", **{THREADS: "3"})
    result = subprocess.run([sys.executable, "-c", _LIMITED_SCRIPT], env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr
    team, error = result.stdout.split()
    assert team == "True" and float(error) < 1e-5
