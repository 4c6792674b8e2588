"""core.mod_traits: what the presets read of a score_mod region (a closure read, one by position,
a bias added to the score, a tanh), on the traced regions of small mods."""
from __future__ import annotations

import pytest
import torch

import ae_mlir as ae
from ae_mlir.core.context import new_context, parse_module
from ae_mlir.core.mod_traits import ModTraits, mod_traits
from ae_mlir.core.regions import from_region

SLOPES = torch.tensor([0.5, 0.25])
TABLE = torch.randn(2, 255)


@pytest.mark.parametrize("mod, want", [
    (lambda s, b, h, q, kv: s + SLOPES[h] * (kv - q), ModTraits(reads_closures=True, adds_bias=True)),
    (lambda s, b, h, q, kv: TABLE[h, q - kv + 127] + s,
     ModTraits(reads_closures=True, reads_by_position=True, adds_bias=True)),
    (lambda s, b, h, q, kv: s - 0.5 * (q - kv), ModTraits(adds_bias=True)),
    (lambda s, b, h, q, kv: 0.5 * (q - kv) - s, ModTraits()),
    (lambda s, b, h, q, kv: s + 0.5 * s, ModTraits()),
    (lambda s, b, h, q, kv: s * SLOPES[h], ModTraits(reads_closures=True)),
    (lambda s, b, h, q, kv: 30.0 * torch.tanh(s / 30.0), ModTraits(tanh=True)),
    (lambda s, b, h, q, kv: s + torch.tanh(s), ModTraits(tanh=True)),
], ids=["alibi", "bias table", "minus a bias", "bias minus the score", "score plus itself", "scaled by a slope",
        "soft-capping", "score plus its tanh"])
def test_traits_of_traced_mods(mod, want):
    q = torch.empty(1, 2, 128, 64, dtype=torch.bfloat16, device="meta")
    module = parse_module(ae.attention(score_mod=mod).mlir(q, q, q), new_context(), "l0.mlir")
    func = next(op for op in module.body.operations if op.operation.name == "func.func")
    region = next(op for op in func.regions[0].blocks[0].operations if op.operation.name == "attn.score_mod")
    assert mod_traits(from_region(region.operation.regions[0])) == want


def test_no_region_has_no_traits():
    assert mod_traits(None) == ModTraits()
