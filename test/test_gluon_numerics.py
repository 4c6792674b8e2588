"""The Gluon kernel `attn-lower-to-gluon` instantiates, run by the emulator (test/gluon_emu.py) on
CPU tensors against float64 through bundle_interp: the bundle's aligned variant's grid and
arguments as the runtime makes them (host descriptors over the whole tensors, out's and lse's
strides), the kernel instantiated from the bundle's L0 module as the pass did (outputs start as
NaN, so a row the kernel does not write fails). What the GPU adds (layouts, timing) is left to the GPU-marked test in
test_lower_to_gluon.py; what this checks is the kernel's arithmetic, indexing, masking, GQA, ragged
tiles and its barrier protocol (a deadlock or an over-arrival fails)."""
from __future__ import annotations

import pytest
import torch

import ae_mlir as ae
from ae_mlir.backends import triton as tb
from ae_mlir.core import abi
from ae_mlir.core.context import new_context, parse_module
from ae_mlir.passes.lower_to_gluon import instance

from bundle_interp import interpret
from gluon_emu import EmulationError


def causal(b, h, i, j):
    return i >= j


def _meta(t):
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")


def emulate(attn, q, k, v, pingpong=False, programs=0, wave=0, warpgroups=0):
    """The bundle's Gluon variant on CPU tensors, as bundle_interp runs it; returns (out, lse).
    `programs`: a persistent grid of that many programs (0: a program per query block); `wave`:
    a per-block grid's wave (its causal blocks' sections of heads); `warpgroups`: the consumer
    warpgroups asked for (0: the head dim's)."""
    config = {"warp_specialize": True, "pingpong": pingpong, "persistent": bool(programs), "warpgroups": warpgroups}
    if programs or wave:
        config.update(wave_programs=programs or wave)
    bundle = tb.compile_bundle(attn, _meta(q), _meta(k), _meta(v), config=config)
    (out, lse), variant = interpret(bundle, q, k, v)
    assert variant.ir == "ttgir"
    return out, lse


@pytest.mark.parametrize("b, h, hkv, lq, lk, d, mask, dtype, layout, pingpong, programs, warpgroups", [
    (1, 2, 2, 256, 256, 128, causal, torch.bfloat16, "bhld", False, 0, 0),
    (1, 2, 2, 300, 300, 128, causal, torch.bfloat16, "bhld", True, 0, 0),
    (2, 4, 2, 200, 200, 64, None, torch.float16, "blhd", False, 0, 0),
    (1, 2, 2, 100, 390, 128, None, torch.bfloat16, "bhld", True, 0, 0),
    (1, 1, 1, 64, 64, 64, causal, torch.float16, "bhld", False, 0, 0),
    (1, 2, 1, 130, 130, 128, causal, torch.bfloat16, "blhd", False, 0, 0),
    # D 64's three warpgroups: 192-row programs whose rows span two key tiles.
    (1, 2, 2, 600, 600, 64, causal, torch.bfloat16, "bhld", False, 0, 0),
    (1, 2, 1, 450, 333, 64, None, torch.bfloat16, "bhld", False, 0, 0),
    # Persistent programs taking several query blocks each (of unequal lengths under causal):
    # the ring's phases, Q's release and the ping-pong's turns run on across blocks.
    (1, 3, 3, 300, 300, 128, causal, torch.bfloat16, "bhld", False, 2, 0),
    (2, 2, 1, 500, 500, 128, None, torch.bfloat16, "blhd", True, 3, 0),
    (1, 2, 2, 600, 600, 64, causal, torch.float16, "bhld", False, 3, 0),
    # D 64 with two warpgroups (128-row programs), which take the ping-pong there too.
    (1, 2, 2, 600, 600, 64, causal, torch.bfloat16, "bhld", False, 0, 2),
    (1, 2, 1, 450, 333, 64, None, torch.float16, "blhd", True, 0, 2),
    (1, 2, 2, 500, 500, 64, causal, torch.bfloat16, "bhld", True, 3, 2),
])
def test_emulated_kernel_matches_float64(b, h, hkv, lq, lk, d, mask, dtype, layout, pingpong, programs, warpgroups):
    torch.manual_seed(lq + lk + d)

    def make(heads, length):
        if layout == "blhd":
            return torch.randn(b, length, heads, d, dtype=dtype).transpose(1, 2)
        return torch.randn(b, heads, length, d, dtype=dtype)

    q, k, v = make(h, lq), make(hkv, lk), make(hkv, lk)
    attn = ae.attention(mask_mod=mask)
    out, lse = emulate(attn, q, k, v, pingpong, programs, warpgroups=warpgroups)
    want, want_lse = attn(q.double(), k.double(), v.double(), backend="reference", return_lse=True)
    # The 16-bit rounding of P and of the output: SDPA's own error in these types.
    torch.testing.assert_close(out.double(), want, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse.double(), want_lse, atol=1e-4, rtol=1e-4)


def test_three_warpgroups_skip_the_tiles_past_their_rows():
    """With three consumer warpgroups (D = 64, 192-row programs over 128-key tiles) a causal
    warpgroup reads the key tiles up to the one holding its last row, and one whose rows start
    past the queries' end reads none: two products (Q K^T, P V) per tile it reads. Before, each
    read every tile its block's last warpgroup needs (90 products here, not 60)."""
    from gluon_emu import PRODUCTS

    seq, rows, tile = 600, 192, 128
    torch.manual_seed(3)
    q, k, v = (torch.randn(1, 1, seq, 64, dtype=torch.bfloat16) for _ in range(3))
    attn = ae.attention(mask_mod=causal)
    out, _ = emulate(attn, q, k, v)
    read = 0
    for first in range(0, seq, 64):  # each warpgroup's first row; those past seq read nothing
        block_end = min(first - first % rows + rows, seq)
        read += min(first // tile + 1, -(-block_end // tile))
    assert PRODUCTS["count"] == 2 * read == 60
    torch.testing.assert_close(out.double(), attn(q.double(), k.double(), v.double(), backend="reference"),
                               atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("b, h, lq, d, wave", [
    (1, 5, 300, 128, 4),   # 3 blocks a head, sections of 2 heads, the last of one
    (2, 3, 600, 64, 5),    # 4 blocks of 192 rows a head, sections of 2 over batch x heads
])
def test_emulated_sectioned_causal_grid_covers_every_block(b, h, lq, d, wave):
    """A per-block causal grid over a small `wave` starts every head's longest block first across
    sections of heads (pipeline.query_item); every block is computed once (out starts NaN)."""
    torch.manual_seed(lq + h)
    q, k, v = (torch.randn(b, h, lq, d, dtype=torch.bfloat16) for _ in range(3))
    attn = ae.attention(mask_mod=causal)
    bundle = tb.compile_bundle(attn, _meta(q), _meta(k), _meta(v),
                               config={"warp_specialize": True, "persistent": False, "wave_programs": wave})
    module = parse_module(bundle.meta["l0"], new_context(), "l0.mlir")
    assert instance(abi.functions(module)[0], False, 0, wave).constants["SECTION"] == 2
    out, lse = emulate(attn, q, k, v, wave=wave)
    want, want_lse = attn(q.double(), k.double(), v.double(), backend="reference", return_lse=True)
    torch.testing.assert_close(out.double(), want, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse.double(), want_lse, atol=1e-4, rtol=1e-4)


def test_emulator_reports_a_deadlock(monkeypatch):
    """A kernel whose consumer waits on a phase nobody completes fails instead of hanging."""
    import gluon_emu

    monkeypatch.setattr(gluon_emu, "TIMEOUT", 0.3)
    barrier = gluon_emu.Barrier()
    barrier.init(1)
    with pytest.raises(EmulationError, match="deadlock"):
        barrier.wait(0)
    barrier.arrive(1)
    barrier.wait(0)
    with pytest.raises(EmulationError, match="2 arrivals"):
        barrier.arrive(2)
