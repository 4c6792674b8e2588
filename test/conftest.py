"""Every test starts from the same global random state, so that a test's unseeded draws
(torch.rand without a generator) do not depend on which tests ran before it: a bf16 check once
failed only in the full suite, after new tests had moved the global generator."""
from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _seeded_global_generator():
    torch.manual_seed(0)
