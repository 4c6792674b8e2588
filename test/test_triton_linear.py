"""Linear attention through the Triton backend: the kernels' Triton IR run by the NumPy TTIR
interpreter against the reference recurrence, every decay, the output kernel's value blocks
(ragged ones too) and GLA's score kernels."""
from __future__ import annotations

import pytest
import torch

import ae_mlir as ae
from ae_mlir.backends import triton as tb
from bundle_interp import interpret
from inputs import rand
from test_triton_backend import SMALL, TOL


@pytest.mark.parametrize("decay", [None, "head", "token", "token_dim"])
def test_linear_attention_numerics(decay):
    """The chunked recurrence of ae.linear_attention lowers through the same pass (destinations
    stored inside the chunk loop, the state carried as a tile, contractions over the key dim)."""
    b, h, l, d = 1, 2, 40, 16
    q, k, v = (rand(b, h, l, d, seed=s) for s in (1, 2, 3))
    g = {None: None, "head": (h,), "token": (b, h, l), "token_dim": (b, h, l, d)}[decay]
    g = None if g is None else -0.3 * rand(*g, seed=4).abs()
    s0 = rand(b, h, d, d, seed=5)
    lin = ae.linear_attention(decay=decay, chunk_size=16, normalize=decay == "head")
    inputs = [t for t in (g, s0) if t is not None]
    bundle = tb.build_bundle(lin.mlir(q, k, v, g, s0), "cuda:90", SMALL)
    (out, state), _ = interpret(bundle, q, k, v, *inputs)
    ref_out, ref_state = lin(q, k, v, g, initial_state=s0, return_state=True, backend="reference")
    torch.testing.assert_close(out, ref_out, **TOL[torch.float32])
    torch.testing.assert_close(state, ref_state, **TOL[torch.float32])


@pytest.mark.parametrize("target", ["cuda:90", "hip:gfx942"])
@pytest.mark.parametrize("decay", [None, "head", "token"])
def test_linear_output_walks_value_blocks(decay, target):
    """At the default config, Dk = Dv = 128 (two V blocks of 64): with G one value per row, the
    output kernel is a program per chunk (the last of 70 tokens 6 rows) that builds the chunk's
    scores once and walks both V blocks in a loop, scaling q @ S by exp(G) row by row."""
    b, h, l, d = 1, 2, 70, 128
    q, k, v = (rand(b, h, l, d, seed=s) for s in (1, 2, 3))
    g = {None: None, "head": -0.2 * rand(h, seed=4).abs(), "token": -0.3 * rand(b, h, l, seed=4).abs()}[decay]
    s0 = rand(b, h, d, d, seed=5)
    lin = ae.linear_attention(decay=decay, chunk_size=64)
    inputs = [t for t in (g, s0) if t is not None]
    bundle = tb.build_bundle(lin.mlir(q, k, v, g, s0), target)
    assert bundle.grid == [2, 2, 1]  # (chunks, heads, batch): no V-block axis
    assert [s.name for s in bundle.stages][-1] == "linear_attention_states"
    (out, state), _ = interpret(bundle, q, k, v, *inputs)
    ref_out, ref_state = lin(q, k, v, g, initial_state=s0, return_state=True, backend="reference")
    torch.testing.assert_close(out, ref_out, **TOL[torch.float32])
    torch.testing.assert_close(state, ref_state, **TOL[torch.float32])


@pytest.mark.parametrize("target", ["cuda:90", "hip:gfx942"])
@pytest.mark.parametrize("decay, dk, dv, dtype", [
    ("head", 96, 80, torch.float32),      # Dk padded to 128 lanes; the second V block 16 of 64 wide
    ("token", 80, 200, torch.bfloat16),   # four V blocks, the last 8 wide
    (None, 128, 80, torch.bfloat16),
])
def test_linear_value_loop_ragged_blocks(target, decay, dk, dv, dtype):
    """The output kernel's loop over V blocks at the default config where neither head dim is a
    multiple of the blocks: the last V block's columns past Dv are neither read nor stored, and
    q's padded columns add nothing to q @ S."""
    b, h, l = 1, 2, 70
    q, k = (rand(b, h, l, dk, seed=s).to(dtype) / dk ** 0.5 for s in (1, 2))
    v = rand(b, h, l, dv, seed=3).to(dtype)
    g = {None: None, "head": -0.2 * rand(h, seed=4).abs(), "token": -0.3 * rand(b, h, l, seed=4).abs()}[decay]
    s0 = rand(b, h, dk, dv, seed=5)
    lin = ae.linear_attention(decay=decay, chunk_size=64)
    inputs = [t for t in (g, s0) if t is not None]
    bundle = tb.build_bundle(lin.mlir(q, k, v, g, s0), target)
    assert bundle.grid == [2, 2, 1]
    (out, state), _ = interpret(bundle, q, k, v, *inputs)
    wide = [t.double() for t in (q, k, v)] + [None if g is None else g.double()]
    ref_out, ref_state = lin(*wide, initial_state=s0.double(), return_state=True, backend="reference")
    for got, want in ((out, ref_out), (state, ref_state)):
        # bf16 inputs: products of rounded operands, f32 sums; 1% of the largest value.
        tol = dict(rtol=0, atol=1e-2 * want.abs().max().item()) if dtype == torch.bfloat16 else TOL[torch.float32]
        torch.testing.assert_close(got.double(), want, **tol)


@pytest.mark.parametrize("wide,dtype", [(False, torch.float32), (True, torch.float32), (True, torch.bfloat16)])
def test_linear_gla_scores_numerics(wide, dtype):
    """The split recurrence's "token_dim" scores kernel: a program per chunk (the last chunk of
    70 tokens is 6 rows), then the output kernel, all 128 V columns in one program a chunk. The
    cumulative decays take 24 of G's columns a program. A chunk whose decay stays under the span
    limit takes one product on tensor cores (chunk 1 always, chunk 0 without `wide`); with
    `wide`, rows 20-35 decay by 6 a token in five dimensions, so chunk 0 (96 nats) takes its
    blocks of 16 rows: block 1 (72 nats) computes its diagonal block in the exact 3-D form (over
    Dk = 48 in two slices of 24 key columns, each padded to 32 lanes in Triton IR) and block 2
    (24 nats) the factorized one across a strong decay."""
    b, h, l, d = 1, 2, 70, 48
    q, k = (rand(b, h, l, d, seed=s).to(dtype) for s in (1, 2))
    v = rand(b, h, l, 128, seed=3).to(dtype)
    g = -0.3 * rand(b, h, l, d, seed=4).abs()
    if wide:
        g[:, :, 20:36, :5] = -6.0
    s0 = rand(b, h, d, 128, seed=5)
    lin = ae.linear_attention(decay="token_dim", chunk_size=64)
    bundle = tb.build_bundle(lin.mlir(q, k, v, g, s0), "cuda:90")
    stages = [(s.name, s.grid) for s in bundle.stages]
    # The cumulative decays: a program per 24 columns of G, walking both chunks; the chunk
    # states in two blocks of 24 rows (2 programs of 64 rows would be too few, presets).
    assert stages == [("linear_attention_decays", [2, 2, 1]), ("linear_attention_states", [2, 2, 1]),
                      ("linear_attention_scores", [2, 2, 1])]  # (chunks, heads, batch)
    assert bundle.grid == [2, 2, 1]
    # Each kernel's own stage count (linear_defaults.linear_config).
    assert [s.num_stages for s in bundle.stages] + [bundle.num_stages] == [1, 2, 3, 3]
    (out, state), _ = interpret(bundle, q, k, v, g, s0)
    if dtype == torch.bfloat16:
        # bf16 operands, f32 accumulation: within a few roundings of the largest output.
        ref_out, ref_state = lin(q.float(), k.float(), v.float(), g, initial_state=s0, return_state=True,
                                 backend="reference")
        assert (out.float() - ref_out).abs().max() <= 2e-2 * ref_out.abs().max()
        assert (state - ref_state).abs().max() <= 2e-2 * ref_state.abs().max()
        return
    ref_out, ref_state = lin(q, k, v, g, initial_state=s0, return_state=True, backend="reference")
    # With `wide`, G reaches -96 nats, and its f32 sums carry about 5e-5 of absolute error into
    # the exponents (the exact path alone leaves 4e-5 here).
    tol = dict(atol=2e-4, rtol=1e-3) if wide else TOL[torch.float32]
    torch.testing.assert_close(out, ref_out, **tol)
    torch.testing.assert_close(state, ref_state, **tol)


def test_linear_gla_scores_in_column_passes():
    """At Dk = 96 the scores' products take Dk in two passes of 48 columns (padded to 64 lanes),
    the chunk's [64, 64] product and, past the span limit, a block's [16, 64] one; bf16 at the
    default chunk. Six loops: the chunk's passes, its store (under the limit), the loop past it
    and its blocks, a block's passes, and the loop of the block's exact diagonal."""
    b, h, l, d = 1, 2, 100, 96
    q, k, v = (rand(b, h, l, d, seed=s).bfloat16() for s in (1, 2, 3))
    g = -0.5 * rand(b, h, l, d, seed=4).abs()
    lin = ae.linear_attention(decay="token_dim")
    bundle = tb.build_bundle(lin.mlir(q, k, v, g), "cuda:90")
    scores = next(s for s in bundle.stages if s.name.endswith("_scores"))
    ttir = scores.variants["generic"].ttir
    assert ttir.count("scf.for") == 6
    assert "(tensor<64x64xbf16>, tensor<64x64xbf16>, tensor<64x64xf32>) -> tensor<64x64xf32>" in ttir
    assert "(tensor<16x64xbf16>, tensor<64x64xbf16>, tensor<16x64xf32>) -> tensor<16x64xf32>" in ttir
    (out, _), _ = interpret(bundle, q, k, v, g)
    ref = lin(q.float(), k.float(), v.float(), g, backend="reference")
    assert (out.float() - ref).abs().max() <= 1e-2 * ref.abs().max()
