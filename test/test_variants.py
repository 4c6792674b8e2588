"""Every entry of the variant catalogue, at ragged sizes, on the CPU backend and through the
Triton IR (NumPy interpreter), against the float64 reference executor."""
from __future__ import annotations

import os
import sys

import pytest
import torch

from ae_mlir import variants

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "fuzz"))
from test_differential import triton_interpreted  # noqa: E402

# Ragged on purpose: neither length is a multiple of any block size, and Lq != Lk.
SHAPE = variants.Shape(batch=1, heads=4, seq_q=45, seq_k=77, dim_qk=16, dim_v=16)
TOL = {torch.float32: dict(atol=3e-5, rtol=3e-5), torch.bfloat16: dict(atol=3e-2, rtol=3e-2)}


def _case(name, dtype):
    shape = SHAPE
    if name == "mla_dims":
        shape = variants.Shape(1, 4, 45, 77, 48, 32)
    attn, shape = variants.build(name, shape)
    if name == "mla_dims":
        shape = variants.Shape(1, 4, 45, 77, 48, 32)
    q, k, v = variants.inputs(shape, dtype=dtype, seed=3)
    return attn, q, k, v


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("name", list(variants.CATALOGUE))
def test_catalogue_entry_on_cpu(name, dtype):
    attn, q, k, v = _case(name, dtype)
    want = attn(q, k, v, backend="reference").float()
    torch.testing.assert_close(attn(q, k, v, backend="cpu").float(), want, **TOL[dtype])


@pytest.mark.parametrize("name", list(variants.CATALOGUE))
def test_catalogue_entry_as_triton_ir(name):
    attn, q, k, v = _case(name, torch.float32)
    want = attn(q, k, v, backend="reference").float()
    torch.testing.assert_close(triton_interpreted(attn, q, k, v), want, **TOL[torch.float32])


def test_catalogue_names_its_entries():
    with pytest.raises(ValueError, match="unknown variant 'nope'"):
        variants.build("nope", SHAPE)
