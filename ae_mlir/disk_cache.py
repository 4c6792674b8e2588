"""What every on-disk cache of ae-mlir shares: where it lives, how a file is written, and the
compiler fingerprint that keys entries to the compiler code that built them.

Needs neither torch, triton nor the MLIR bindings, so the runtime and the CPU kernel cache load
entries in a process that never imports them.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import tempfile
from pathlib import Path


def cache_dir() -> Path:
    root = os.environ.get("AE_MLIR_CACHE_DIR")
    return Path(root) if root else Path.home() / ".cache" / "ae-mlir"


def atomic_write(path: Path, text: str) -> None:
    """Write `text` to `path` so that readers see the old file or the whole new one, never part."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        # mkstemp makes the file private; cache entries are shared between users and machines.
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _source_files() -> list[tuple[str, Path]]:
    """ae-mlir's own sources (package, passes, dialects) by their name inside the package."""
    package_dir = Path(__file__).resolve().parent
    roots = [("ae_mlir", package_dir)]
    for name in ("passes", "dialects"):
        # Installed, they are ae_mlir/<name>; a source checkout keeps them beside ae_mlir/ (mapped
        # in by pyproject's package-dir), installed in editable mode or not at all.
        for candidate in (package_dir / name, package_dir.parent / name):
            if candidate.is_dir():
                roots.append((name, candidate))
                break
    files = []
    for name, root in roots:
        # os.walk rather than Path.rglob: pruning __pycache__ keeps this a few milliseconds, and it
        # runs on every new process's first call.
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"
                           and not (name == "ae_mlir" and dirpath == str(root) and d in ("passes", "dialects"))]
            for filename in filenames:
                if filename.endswith((".py", ".mlir")):
                    path = Path(dirpath, filename)
                    files.append((f"{name}/{path.relative_to(root).as_posix()}", path))
    files.sort()
    return files


@functools.lru_cache(maxsize=None)
def compiler_fingerprint() -> str:
    """A hash of ae-mlir's own sources, so that an entry built by other compiler code is never
    taken for this one's.

    Hashing the sources' contents is most of a cached call's cost in a new process, so the digest
    is remembered on disk under the files' names, sizes and modification times: an unchanged tree
    reads one small file instead of every source.
    """
    files = _source_files()
    stats = hashlib.sha256()
    for name, path in files:
        st = path.stat()
        stats.update(f"{name}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    memo = cache_dir() / "fingerprints" / f"{stats.hexdigest()}.json"
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        return str(json.loads(memo.read_text())["fingerprint"])
    digest = hashlib.sha256()
    for name, path in files:
        digest.update(name.encode())
        digest.update(path.read_bytes())
    fingerprint = digest.hexdigest()
    with contextlib.suppress(OSError):
        atomic_write(memo, json.dumps({"fingerprint": fingerprint}))
    return fingerprint
