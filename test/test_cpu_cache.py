"""The CPU backend's disk cache (`ae_mlir.backends.cpu_cache`) and the compile progress lines
(`ae_mlir.progress`)."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

import ae_mlir as ae
from ae_mlir import progress
from ae_mlir.backends import cpu, cpu_cache

needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="the disk cache links with the C compiler")


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("AE_MLIR_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(progress.AFTER_ENV, "0")
    cpu.clear_memory_cache()
    yield tmp_path
    cpu.clear_memory_cache()


def _entries(cache: os.PathLike) -> list[str]:
    return sorted(p.suffix for p in (cache / "cpu").glob("*.*")) if (cache / "cpu").is_dir() else []


def _python(code: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)


# --- a second process: no compile, no MLIR --------------------------------------------------------

_TWO_PROCESS_SCRIPT = textwrap.dedent("""
    import hashlib, sys, time
    import torch, ae_mlir as ae
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 200, 32, generator=gen) for _ in range(3))
    attn = ae.attention(mask_mod=lambda b, h, i, j: i >= j)
    start = time.perf_counter()
    o = attn(q, k, v)
    first_ms = (time.perf_counter() - start) * 1e3
    print(first_ms, "mlir" in sys.modules, hashlib.sha256(o.numpy().tobytes()).hexdigest())
""")

# The bar a second process's first call must meet. A cached kernel loads in about 1 ms and this
# one runs in a few; the rest is importing the backend and fingerprinting the compiler's sources
# for the key (about 20-30 ms on a 2-core x86-64 CPU). A compile takes seconds. The best of three
# second processes is compared, so one descheduled process on a loaded machine does not decide.
_FIRST_CALL_LIMIT_MS = 50
_SECOND_PROCESSES = 3


def _first_process(script: str, cache: os.PathLike) -> tuple[dict, subprocess.CompletedProcess]:
    """(the environment of processes sharing the disk cache `cache`, with progress lines on, and
    the run of `script` in the first of them, which compiles)."""
    env = dict(os.environ, AE_MLIR_CACHE_DIR=str(cache), **{progress.AFTER_ENV: "0"})
    env.pop(progress.QUIET_ENV, None)
    first = _python(script, env)
    assert first.returncode == 0, first.stderr
    return env, first


@needs_cc
def test_second_process_calls_the_cached_kernel_without_mlir(tmp_path):
    env, first = _first_process(_TWO_PROCESS_SCRIPT, tmp_path)
    assert "ae-mlir: compiling for the CPU" in first.stderr
    assert "ae-mlir: compiled 'attention' for the CPU in" in first.stderr
    assert _entries(tmp_path) == [".json", ".so"]
    ms1, mlir1, digest1 = first.stdout.split()
    assert mlir1 == "True"
    later_ms = []
    for _ in range(_SECOND_PROCESSES):
        second = _python(_TWO_PROCESS_SCRIPT, env)
        assert second.returncode == 0, second.stderr
        assert "ae-mlir:" not in second.stderr  # nothing compiled, nothing said
        ms2, mlir2, digest2 = second.stdout.split()
        assert mlir2 == "False"
        assert digest2 == digest1
        later_ms.append(float(ms2))
    assert min(later_ms) < _FIRST_CALL_LIMIT_MS, (ms1, later_ms)


_SERVING_SCRIPT = textwrap.dedent("""
    import hashlib, sys
    import torch, ae_mlir as ae
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 1, 32, generator=gen)
    k, v = (torch.randn(2, 2, 300, 32, generator=gen) for _ in range(2))
    cached = ae.attention(score_mod=lambda s, b, h, i, j: s - 0.01 * (i - j))(q, k, v, kv_len=torch.tensor([17, 300]))
    packed_q, packed_k = torch.randn(40, 4, 32, generator=gen), torch.randn(40, 2, 32, generator=gen)
    cu = torch.tensor([0, 7, 7, 40], dtype=torch.int32)
    packed = ae.attention(mask_mod=lambda b, h, i, j: i >= j, layout="blhd")(
        packed_q, packed_k, packed_k, cu_seqlens_q=cu, cu_seqlens_k=cu)
    g = -torch.rand(1, 40, 4, generator=gen)
    lin = ae.linear_attention(decay="token", layout="blhd")(packed_q[None], packed_q[None], packed_q[None], g,
                                                               cu_seqlens=cu)
    digests = [hashlib.sha256(o.contiguous().numpy().tobytes()).hexdigest() for o in (cached, packed, lin)]
    print("mlir" in sys.modules, *digests)
""")


@needs_cc
def test_second_process_runs_cached_serving_kernels_without_mlir(tmp_path):
    # Per-entry key lengths, a packed batch and packed linear attention: kernels whose extra
    # operands (lengths, offsets) are bound at run time load from the cache like any other.
    env, first = _first_process(_SERVING_SCRIPT, tmp_path)
    assert first.stderr.count("ae-mlir: compiled") == 3, first.stderr
    second = _python(_SERVING_SCRIPT, env)
    assert second.returncode == 0, second.stderr
    assert "ae-mlir:" not in second.stderr
    assert second.stdout.split() == ["False"] + first.stdout.split()[1:]


# --- corrupt entries are rebuilt ------------------------------------------------------------------


def _small():
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 40, 16, generator=gen) for _ in range(3))
    return ae.attention(mask_mod=lambda b, h, i, j: i >= j).mlir(q, k, v), [q, k, v]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """One small kernel's cache entry and its outputs, compiled once for the damage tests."""
    root = tmp_path_factory.mktemp("pristine")
    old = os.environ.get("AE_MLIR_CACHE_DIR")
    os.environ["AE_MLIR_CACHE_DIR"] = str(root)
    try:
        cpu.clear_memory_cache()
        text, inputs = _small()
        outputs = cpu.compile_module(text)(inputs)
    finally:
        cpu.clear_memory_cache()
        if old is None:
            del os.environ["AE_MLIR_CACHE_DIR"]
        else:
            os.environ["AE_MLIR_CACHE_DIR"] = old
    return root / "cpu", outputs


def _damage(so, record, how: str) -> None:
    if how == "truncated .so":
        so.write_bytes(so.read_bytes()[:4096])
    elif how == "bad JSON":
        record.write_text(record.read_text()[:-20])
    else:  # a consistent record of a library that does not load
        so.write_bytes(b"not an ELF file")
        doc = json.loads(record.read_text())
        doc["kernel"]["library_sha256"] = hashlib.sha256(b"not an ELF file").hexdigest()
        doc["checksum"] = hashlib.sha256(json.dumps(doc["kernel"], sort_keys=True).encode()).hexdigest()
        record.write_text(json.dumps(doc))


@needs_cc
@pytest.mark.parametrize("how", ["truncated .so", "bad JSON", "unloadable .so"])
def test_corrupt_entry_is_rebuilt(cache_dir, pristine, how, caplog):
    entry, want = pristine
    shutil.copytree(entry, cache_dir / "cpu")
    (so,), (record,) = (list((cache_dir / "cpu").glob(f"*.{ext}")) for ext in ("so", "json"))
    _damage(so, record, how)
    caplog.set_level(logging.DEBUG, logger="ae_mlir")
    text, inputs = _small()
    got = cpu.compile_module(text)(inputs)
    assert "is unusable, rebuilding it" in caplog.text
    # The rebuild is a compile, reported through logging (pytest configured it) at INFO.
    assert "ae-mlir: compiled 'attention' for the CPU in" in caplog.text
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert cpu_cache.load(record.stem) is not None


# --- no C compiler; call-time tables and bf16 ---------------------------------------------------


@needs_cc
def test_without_a_c_compiler_the_jit_runs_the_kernel_and_the_cached_one_matches_it(cache_dir, monkeypatch):
    text, inputs = _small()
    with monkeypatch.context() as m:
        m.setattr(cpu_cache, "_compiler", lambda: None)
        jitted = cpu.compile_module(text)(inputs)
    assert _entries(cache_dir) == []
    cpu.clear_memory_cache()
    stored = cpu.compile_module(text)(inputs)
    assert _entries(cache_dir) == [".json", ".so"]
    assert all(torch.equal(a, b) for a, b in zip(jitted, stored))


def _from_disk_only(*args):
    raise AssertionError("the kernel should have come from the disk cache")


@needs_cc
def test_closure_mask_bf16_kernel_round_trips(cache_dir, monkeypatch):
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, 150, 16, generator=gen).to(torch.bfloat16) for _ in range(3))
    doc = torch.repeat_interleave(torch.arange(3), torch.tensor([40, 70, 40]))
    attn = ae.attention(mask_mod=lambda b, h, i, j: doc[i] == doc[j])

    def call():
        return attn(q, k, v, return_lse=True, backend="cpu")

    stored = call()
    (record,) = (cache_dir / "cpu").glob("*.json")
    assert json.loads(record.read_text())["kernel"]["mask_program"]  # tile tables classified per call
    cpu.clear_memory_cache()
    monkeypatch.setattr(cpu, "_build", _from_disk_only)
    loaded = call()
    assert all(torch.equal(a, b) for a, b in zip(stored, loaded))
    # Another call site (another source location in the L0 module) is the same kernel.
    cpu.clear_memory_cache()
    elsewhere = attn(q, k, v, return_lse=True, backend="cpu")
    assert all(torch.equal(a, b) for a, b in zip(stored, elsewhere))
    want = attn(q.float(), k.float(), v.float(), backend="reference")
    torch.testing.assert_close(loaded[0].float(), want, atol=2e-2, rtol=2e-2)


# --- progress lines -------------------------------------------------------------------------------

_PROGRESS_SCRIPT = textwrap.dedent("""
    import time
    from ae_mlir import progress
    with progress.Compile("for the CPU", "L0 -> L1 -> LLVM") as report:
        report.name = "attention"
        report.stage("L0 -> L1: fuse, tile")
        time.sleep(0.3)
        report.stage("L1 -> LLVM dialect")
""")


_LINES = ["ae-mlir: compiling for the CPU (L0 -> L1 -> LLVM)...", "ae-mlir:   L0 -> L1: fuse, tile",
          "ae-mlir:   L1 -> LLVM dialect", "ae-mlir: compiled 'attention' for the CPU in"]


@pytest.mark.parametrize("env, lines", [
    ({progress.AFTER_ENV: "0"}, _LINES),
    # The timer announces a stage that outlives the threshold while it runs.
    ({progress.AFTER_ENV: "0.1"}, _LINES),
    ({}, []),  # a short compile says nothing
    ({progress.AFTER_ENV: "0", progress.QUIET_ENV: "1"}, []),
])
def test_progress_lines_on_stderr(env, lines):
    base = {k: v for k, v in os.environ.items() if k not in (progress.AFTER_ENV, progress.QUIET_ENV)}
    result = _python(_PROGRESS_SCRIPT, dict(base, **env))
    assert result.returncode == 0, result.stderr
    got = result.stderr.splitlines()
    assert len(got) == len(lines) and all(line.startswith(want) for line, want in zip(got, lines)), got


def test_progress_lines_are_log_records_and_the_logger_level_silences_them(monkeypatch, caplog):
    monkeypatch.setenv(progress.AFTER_ENV, "0")
    monkeypatch.delenv(progress.QUIET_ENV, raising=False)
    caplog.set_level(logging.INFO, logger="ae_mlir")
    with progress.Compile("for cuda:90", "L0 -> L1 -> Triton IR") as report:
        report.stage("L0 -> L1: fuse, tile")
    assert [r.name for r in caplog.records] == ["ae_mlir"] * 3
    assert caplog.records[0].getMessage() == "ae-mlir: compiling for cuda:90 (L0 -> L1 -> Triton IR)..."
    caplog.clear()
    caplog.set_level(logging.WARNING, logger="ae_mlir")
    with progress.Compile("for cuda:90", "L0 -> L1 -> Triton IR") as report:
        report.stage("L0 -> L1: fuse, tile")
    assert caplog.records == []
