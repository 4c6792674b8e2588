"""The Triton backend's runtime side: the runtime imports no MLIR, bundles round-trip and bind a
launch in a process without the MLIR bindings, and the bundle cache (memory and disk, a second
process, two processes compiling at once, corrupt entries rebuilt, atomic writes)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import ae_mlir as ae
from ae_mlir import disk_cache, runtime
from ae_mlir.backends import triton as tb
from inputs import qkv
from test_triton_backend import ROOT, SMALL, alibi, causal


# --- the runtime loads without MLIR --------------------------------------------------------------


def _python(code: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def test_runtime_imports_no_mlir():
    result = _python("""
        import sys
        import ae_mlir.runtime
        heavy = sorted({m.split(".")[0] for m in sys.modules} & {"mlir", "torch", "triton"})
        print(heavy)
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_bundle_roundtrip_and_launch_contract_without_mlir(tmp_path):
    q, k, v = qkv(h=4, hkv=2, lq=70, dk=16, dtype=torch.bfloat16)
    attn = ae.attention(score_mod=alibi, mask_mod=causal)
    bundle = tb.compile_bundle(attn, q, k, v, config=SMALL)
    file_path = bundle.save(tmp_path / "b.json")
    dir_path = bundle.save(tmp_path / "b.bundle")
    assert (dir_path / "aligned.ttir").read_text() == bundle.variants["aligned"].ttir
    for path in (file_path, dir_path):
        loaded = runtime.Bundle.load(path)
        assert loaded.to_dict() == bundle.to_dict()
    # A process that cannot import mlir loads the bundle and binds arguments for a launch.
    result = _python(f"""
        import sys
        sys.modules["mlir"] = None
        import torch
        from ae_mlir import runtime
        b = runtime.Bundle.load({str(dir_path)!r})
        q = torch.zeros(1, 4, 70, 16, dtype=torch.bfloat16)
        kv = torch.zeros(1, 2, 70, 16, dtype=torch.bfloat16)
        t = runtime.bind(b, q, kv, kv, *[torch.zeros(s.shape, dtype=runtime.torch_dtype(s.dtype)) for s in b.inputs[3:]])
        v = runtime.choose_variant(b, t)
        print(len(runtime.argument_values(v, t, runtime.device_tables(b, "cpu"))) == len(v.args), sorted(t))
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[0] == "True"


# --- the bundle cache ----------------------------------------------------------------------------


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("AE_MLIR_CACHE_DIR", str(tmp_path))
    runtime.CACHE.clear_memory()
    yield tmp_path
    runtime.CACHE.clear_memory()


def _l0():
    q, k, v = qkv(h=2, lq=33, dk=16, dtype=torch.float16)
    return ae.attention(mask_mod=causal).mlir(q, k, v)


def test_cache_hit_in_memory_and_on_disk(cache_dir):
    text = _l0()
    first = tb.get_bundle(text, "cuda:90")
    files = list((cache_dir / "bundles").glob("*.json"))
    assert len(files) == 1 and files[0].stem == first.key
    assert tb.get_bundle(text, "cuda:90") is first
    runtime.CACHE.clear_memory()
    again = tb.get_bundle(text, "cuda:90")
    assert again is not first and again.to_dict() == first.to_dict()
    assert tb.get_bundle(text, "hip:gfx942").key != first.key


def test_second_process_needs_no_mlir(cache_dir):
    text = _l0()
    tb.get_bundle(text, "cuda:90")
    env = dict(os.environ, AE_MLIR_CACHE_DIR=str(cache_dir))
    result = _python(f"""
        import sys
        sys.modules["mlir"] = None
        from ae_mlir.backends import triton as tb
        b = tb.get_bundle({text!r}, "cuda:90")
        print(b.name, sorted(b.variants))
    """, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[0] == "attention"


def test_two_processes_compiling_the_same_kernel_both_succeed(cache_dir):
    # Both miss the cache, compile, and write the same entry at once; atomic renames mean each
    # ends with a whole bundle and the entry on disk is one of theirs, intact.
    text = _l0()
    env = dict(os.environ, AE_MLIR_CACHE_DIR=str(cache_dir))
    code = textwrap.dedent(f"""
        from ae_mlir.backends import triton as tb
        b = tb.get_bundle({text!r}, "cuda:90")
        print(b.name)
    """)
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _, err in outs]
    assert [out.split() for out, _ in outs] == [["attention"], ["attention"]]
    assert tb.get_bundle(text, "cuda:90").name == "attention"


@pytest.mark.parametrize("damage", ["truncate", "garbage", "edit"])
def test_corrupt_cache_entry_is_rebuilt(cache_dir, damage):
    text = _l0()
    bundle = tb.get_bundle(text, "cuda:90")
    path = runtime.CACHE.path(bundle.key)
    raw = path.read_text()
    if damage == "truncate":
        path.write_text(raw[: len(raw) // 2])
    elif damage == "garbage":
        path.write_bytes(b"\x00\xff not json")
    else:
        doc = json.loads(raw)
        doc["bundle"]["grid"][0] += 1
        path.write_text(json.dumps(doc))
    with pytest.raises(runtime.BundleError):
        runtime.Bundle.load(path)
    runtime.CACHE.clear_memory()
    rebuilt = tb.get_bundle(text, "cuda:90")
    assert rebuilt.to_dict() == bundle.to_dict()
    assert runtime.Bundle.load(path).to_dict() == bundle.to_dict()


def test_atomic_write_keeps_the_old_file_on_failure(tmp_path, monkeypatch):
    path = tmp_path / "entry.json"
    disk_cache.atomic_write(path, "old")

    def fail(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(disk_cache.os, "replace", fail)
    with pytest.raises(OSError):
        disk_cache.atomic_write(path, "new" * 1000)
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["entry.json"]
