"""The CPU backend's disk cache: JIT-compiled kernels kept as shared objects.

After the LLVM JIT builds a kernel, its object file (`ExecutionEngine.dump_to_object_file`) is
linked into a shared object with the system C compiler and stored beside a JSON record of what a
call needs (the kernel's name and argument specs, block sizes, its call-time mask program, its
program count):

    <cache_dir>/cpu/<key>.so     <cache_dir>/cpu/<key>.json

A later process loads both with ctypes, which takes no MLIR and no compile. The key hashes the L0
module, the compile options, the host CPU (its architecture and feature flags: the JIT compiles
for the host), the MLIR/LLVM libraries and ae-mlir's own sources. Files are written atomically and
the record carries the shared object's hash, so a torn, truncated or edited entry, or one that
does not load, is rebuilt. Without a C compiler kernels stay in-process JIT only.

This module imports neither the MLIR bindings nor torch.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import importlib.util
import json
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

from .. import disk_cache, runtime

# The record's layout and the kernel's calling convention; a change makes old entries misses.
# 2: the kernel takes a range of its programs after the arrays (two int64), and the record says
# how many programs it has. 3: the record names the kernel's claiming entry
# (`attn-cpu-claim-programs`). 4: its shapes may hold -1 (a packed batch's rows), sized per call
# from q's or k's rows by the outputs' roles, which the record names.
FORMAT_VERSION = 4
# The JIT's packed wrapper of the kernel's C interface (what ExecutionEngine.raw_lookup returns):
# one argument, an array of pointers to the arguments (memref descriptor pointers, then the
# program range).
_SYMBOL_PREFIX = "_mlir__mlir_ciface_"
_log = logging.getLogger("ae_mlir.cpu_cache")


def directory() -> Path:
    return disk_cache.cache_dir() / "cpu"


@functools.lru_cache(maxsize=None)
def host_features() -> str:
    """The host CPU's feature flags, which the JIT's host target is derived from."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                # x86 lists "flags", AArch64 "Features"; the first CPU speaks for all of them.
                if line.startswith(("flags", "Features")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        return platform.processor()
    return ""


@functools.lru_cache(maxsize=None)
def host_identity() -> str:
    """The architecture and the CPU feature flags."""
    return f"{platform.machine()}:{hashlib.sha256(host_features().encode()).hexdigest()[:16]}"


def host_vector_bits() -> int:
    """The width of the host's vector registers that the JIT uses: 512 with AVX-512F, 256 with
    AVX2, else 128 (SSE, NEON)."""
    flags = host_features().split()
    return 512 if "avx512f" in flags else 256 if "avx2" in flags else 128


VECTOR_BITS_ENV = "AE_MLIR_CPU_VECTOR_BITS"


def vector_bits() -> int:
    """The vector width the CPU kernels are compiled for: the host's (`host_vector_bits`), or
    `AE_MLIR_CPU_VECTOR_BITS` (128, 256 or 512, at most the host's) to compile them as for a host
    with narrower registers (an AVX2 or SSE one, on x86: `narrows_isa`), e.g. to test or time
    those kernels where they do not run by default."""
    host = host_vector_bits()
    raw = os.environ.get(VECTOR_BITS_ENV, "").strip()
    if not raw:
        return host
    allowed = [bits for bits in (128, 256, 512) if bits <= host]
    if raw not in map(str, allowed):
        raise ValueError(f"{VECTOR_BITS_ENV} must be one of {', '.join(map(str, allowed))} on this host "
                         f"(its vector registers are {host} bits), got {raw!r}")
    return int(raw)


def narrows_isa(bits: int) -> bool:
    """Whether kernels tiled for `bits` leave out the host's wider x86 vector extensions
    (`attn-cpu-narrow-isa`); other architectures have one width."""
    return bits < host_vector_bits() and platform.machine().lower() in ("x86_64", "amd64")


def host_has_avx512_bf16() -> bool:
    """Whether the host has AVX512-BF16 instructions (`attn-cpu-no-avx512-bf16` says why that
    matters)."""
    return "avx512_bf16" in host_features().split()


AMX_ENV = "AE_MLIR_CPU_AMX"


def uses_amx() -> bool:
    """Whether bf16 forward kernels multiply their tiles on AMX units: where the host has them
    (`host_has_amx_bf16`), unless `AE_MLIR_CPU_AMX=0` (then in f32, as on other hosts)."""
    raw = os.environ.get(AMX_ENV, "").strip()
    if raw not in ("", "0", "1"):
        raise ValueError(f"{AMX_ENV} must be 0 or 1, got {raw!r}")
    return raw != "0" and host_has_amx_bf16()


def host_has_amx_bf16() -> bool:
    """Whether kernels may multiply bf16 tiles on the host's AMX units: the CPU has AMX-BF16 and
    the kernel (Linux) lets this process use the tile registers (`request_amx`)."""
    flags = host_features().split()
    return "amx_bf16" in flags and "amx_tile" in flags and request_amx()


# Linux keeps AMX's tile data off until a process asks for it (arch_prctl ARCH_REQ_XCOMP_PERM for
# XFEATURE_XTILEDATA); a tile instruction before that raises SIGILL.
_ARCH_PRCTL_SYSCALL = 158
_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILEDATA = 18


@functools.lru_cache(maxsize=None)
def request_amx() -> bool:
    """Ask the kernel to let this process (all its threads) use AMX tiles; whether it did."""
    if platform.system() != "Linux" or platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syscall(_ARCH_PRCTL_SYSCALL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) == 0
    except (OSError, AttributeError):
        return False


@functools.lru_cache(maxsize=None)
def toolchain_identity() -> str:
    """The MLIR and LLVM libraries that compile the kernels, by size and modification time
    (found without importing the bindings; a distribution's metadata takes 100 ms to read)."""
    spec = importlib.util.find_spec("mlir")
    if spec is None or not spec.submodule_search_locations:
        return "no-mlir"
    root = Path(list(spec.submodule_search_locations)[0])
    parts = []
    for lib in (root / "_mlir_libs" / "libMLIRPythonCAPI.so", root.parent / "llvm" / "lib" / "libLLVM.so"):
        try:
            st = lib.stat()
            parts.append(f"{lib.name}:{st.st_size}:{st.st_mtime_ns}")
        except OSError:
            parts.append(f"{lib.name}:absent")
    return ",".join(parts)


def key(module_text: str, options: dict) -> str:
    """The cache key of a kernel compiled with `options` (the preset's; the host's vector width
    unless they name one)."""
    return runtime.cache_key(module_text, f"cpu:{host_identity()}",
                             dict({"vector_bits": vector_bits(), "amx": uses_amx()}, **options,
                                  toolchain=toolchain_identity(),
                                  cpu_format=FORMAT_VERSION))


def _paths(key: str) -> tuple[Path, Path]:
    return directory() / f"{key}.so", directory() / f"{key}.json"


def _checksum(payload: dict) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def load(key: str) -> tuple[dict, int, object, int | None] | None:
    """The cached kernel's record, the address of its entry point, its loaded library (keep it
    alive while the kernel is used) and the address of its claiming entry (None if the record
    names none); None on a miss or a bad entry (the caller rebuilds it)."""
    library, record_path = _paths(key)
    try:
        doc = json.loads(record_path.read_text())
        payload = doc["kernel"]
        if doc.get("format") != FORMAT_VERSION or doc.get("key") != key or doc.get("checksum") != _checksum(payload):
            raise ValueError("a record of another format, key or content")
        if hashlib.sha256(library.read_bytes()).hexdigest() != payload["library_sha256"]:
            raise ValueError("the shared object does not match its record")
        lib = ctypes.CDLL(str(library))
        entry = getattr(lib, _SYMBOL_PREFIX + payload["name"])
        claiming = getattr(lib, _SYMBOL_PREFIX + payload["claiming"]) if payload.get("claiming") else None
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        # Not deleted: a concurrent writer may be halfway through replacing it; the rebuild
        # overwrites it either way.
        _log.debug("CPU kernel cache entry %s is unusable, rebuilding it: %s", key, err)
        return None
    address = ctypes.cast(entry, ctypes.c_void_p).value
    return payload, address, lib, None if claiming is None else ctypes.cast(claiming, ctypes.c_void_p).value


@functools.lru_cache(maxsize=None)
def _compiler() -> str | None:
    found = shutil.which("cc")
    if found is None:
        _log.debug("no C compiler (cc) on PATH: CPU kernels are compiled in every process, not cached on disk")
    return found


def store(key: str, engine, kernel: dict) -> tuple[dict, int, object, int | None] | None:
    """Link the JIT's object code into `<key>.so`, record `kernel` (the name and what a call
    needs) beside it, and load it back as `load` does; None where that is not possible (no C
    compiler, a failed link, an unwritable cache directory), and the caller keeps the JIT's code."""
    compiler = _compiler()
    if compiler is None:
        return None
    library, record_path = _paths(key)
    try:
        library.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=library.parent, prefix=".build-") as tmp:
            obj, linked = Path(tmp) / "kernel.o", Path(tmp) / "kernel.so"
            engine.dump_to_object_file(str(obj))
            # The JIT's code is not position independent, so the library carries text
            # relocations (-z notext says that is intended); -Bsymbolic binds the kernel's calls
            # to its own helpers (e.g. __truncsfbf2) rather than to a same-named global symbol,
            # as the JIT did.
            result = subprocess.run([compiler, "-shared", "-o", str(linked), str(obj), "-lm",
                                     "-Wl,-Bsymbolic", "-Wl,-z,notext"],
                                    capture_output=True, text=True, timeout=120)
            if result.returncode != 0:
                _log.debug("linking CPU kernel %s failed, not caching it: %s", key, result.stderr.strip())
                return None
            data = linked.read_bytes()
            os.chmod(linked, 0o755)
            os.replace(linked, library)
        payload = dict(kernel, library_sha256=hashlib.sha256(data).hexdigest())
        disk_cache.atomic_write(record_path, json.dumps({"format": FORMAT_VERSION, "key": key,
                                                      "checksum": _checksum(payload), "kernel": payload}))
    except (OSError, subprocess.SubprocessError) as err:
        _log.debug("caching CPU kernel %s failed: %s", key, err)
        return None
    loaded = load(key)
    if loaded is None:
        # An entry this host will not load (e.g. under a policy against text relocations) is
        # not left behind; the caller runs the JIT's code.
        for path in (record_path, library):
            with contextlib.suppress(OSError):
                path.unlink()
    return loaded
