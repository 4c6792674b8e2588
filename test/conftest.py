"""Every test starts from the same global random state, so that a test's unseeded draws
(torch.rand without a generator) do not depend on which tests ran before it: a bf16 check once
failed only in the full suite, after new tests had moved the global generator. `tuning_cache`
gives the autotuning tests an empty kernel cache."""
from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _seeded_global_generator():
    torch.manual_seed(0)


@pytest.fixture
def tuning_cache(tmp_path, monkeypatch):
    """An empty kernel cache directory (AE_MLIR_CACHE_DIR), with the bundles and tuning records
    kept in memory cleared before and after."""
    from ae_mlir import autotune, runtime

    monkeypatch.setenv("AE_MLIR_CACHE_DIR", str(tmp_path))
    runtime.CACHE.clear_memory()
    autotune._RECORDS.clear()
    yield tmp_path
    runtime.CACHE.clear_memory()
    autotune._RECORDS.clear()
