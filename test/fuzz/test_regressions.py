"""Minimized cases the differential fuzzer found, kept so they stay fixed."""
from __future__ import annotations

import pytest
import torch

import ae_mlir as ae
from test_differential import triton_interpreted
from test_linear_differential import triton_linear_interpreted

BACKENDS = ["cpu", "triton"]


def _run(backend, attn, q, k, v):
    return attn(q, k, v, backend="cpu") if backend == "cpu" else triton_interpreted(attn, q, k, v)


@pytest.mark.parametrize("backend", BACKENDS)
def test_closure_tensor_indexed_by_a_python_constant(backend):
    # `bias[0]` with a Python int index is a 0-d tensor taken before tracing sees it; it crashed
    # the Triton lowering (a gather with no index) and the CPU kernel (a rank-0 memref).
    bias = torch.tensor([1.5, -0.5])
    attn = ae.attention(score_mod=lambda s, b, h, q_idx, kv_idx: s * bias[0])
    q = torch.randn(1, 1, 5, 16, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(_run(backend, attn, q, q, q), attn(q, q, q, backend="reference"),
                               atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("normalize", ["none", "retnet"])
def test_closure_read_at_a_python_constant_and_at_a_traced_index_takes_both_gradients(normalize):
    # table[0] taken in Python is a closure tensor of its own (the element) beside table, which
    # the traced index reads: the kernels' gradients of both reach table through autograd. The
    # fuzzer's harness compared table's kernel gradient alone with the whole.
    from ae_mlir import variants

    table = torch.tensor([1.5410, -0.25], requires_grad=True)
    norm = variants.retnet_normalizer() if normalize == "retnet" else normalize
    attn = ae.attention(score_mod=lambda s, b, h, i, j: s + 2 * table[(0 % 1 + 1) % 1] - table[(i + 1) % 1],
                        normalize=norm)
    q, k, v, d_out = (torch.randn(1, 1, 40, 16, generator=torch.Generator().manual_seed(n)) for n in range(4))
    (got,) = torch.autograd.grad(attn(q, k, v, backend="cpu"), [table], d_out)
    (want,) = torch.autograd.grad(attn(q.double(), k.double(), v.double(), backend="reference"), [table],
                                  d_out.double())
    assert float(want.abs().max()) > 0.1
    torch.testing.assert_close(got.double(), want.double(), atol=1e-4 * float(want.abs().max()), rtol=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_index_expression_folding_to_a_constant(backend):
    # ((0 % 1) + 1) % 1 folds to the constant 0 during tracing; the bounds mask of the gather was
    # then the scalar constant `true`, printed with a type suffix MLIR's parser rejects.
    bias = torch.tensor([0.25])
    attn = ae.attention(score_mod=lambda s, b, h, q_idx, kv_idx: bias[((0 % 1) + 1) % 1] + s)
    q = torch.randn(1, 1, 3, 16, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(_run(backend, attn, q, q, q), attn(q, q, q, backend="reference"),
                               atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("normalize", ["relu", "sigmoid", "none"])
def test_partial_key_tile_staged_through_a_misaligned_buffer(backend, normalize):
    # 40 keys in a 64-key block: the last rows of the V tile are staged in a stack buffer that
    # upstream aligns to 32 bytes, then stored as one 16-float vector, which LLVM assumes 64-byte
    # aligned (an AVX-512 aligned move): a segfault whenever the stack pointer was not.
    attn = ae.attention(normalize=normalize)
    g = torch.Generator().manual_seed(2)
    q, k, v = torch.randn(1, 1, 20, 16, generator=g), torch.randn(1, 1, 40, 16, generator=g), torch.randn(1, 1, 40, 16, generator=g)
    torch.testing.assert_close(_run(backend, attn, q, k, v), attn(q, k, v, backend="reference"),
                               atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_single_query_row_with_a_partial_key_tile(backend):
    # Lq = 1, Lk = 28: the same misaligned staging buffer, found before the fix as a crash with
    # blocks of 1 or 2 rows.
    attn = ae.attention()
    g = torch.Generator().manual_seed(3)
    q, k, v = torch.randn(1, 1, 1, 16, generator=g), torch.randn(1, 1, 28, 16, generator=g), torch.randn(1, 1, 28, 16, generator=g)
    torch.testing.assert_close(_run(backend, attn, q, k, v), attn(q, k, v, backend="reference"),
                               atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("target", ["cuda:90", "hip:gfx942"])
@pytest.mark.parametrize("length,chunk", [(1, 32), (16, 32), (32, 64)])
def test_normalized_linear_attention_shorter_than_half_a_chunk(target, length, chunk):
    # normalize=True keeps the one-kernel recurrence; with L <= chunk / 2 (and chunk >= 32) the
    # whole sequence is one ragged chunk whose static row count pads to a power of two below the
    # chunk, which the Triton lowering could not trim the chunk-sized tile to; the one-kernel form
    # now takes the sequence's own power of two as its chunk there.
    lin = ae.linear_attention(normalize=True, chunk_size=chunk)
    q = torch.rand(1, 1, length, 16, generator=torch.Generator().manual_seed(4))
    out, state = triton_linear_interpreted(lin, [q, q, q, None, None], target)
    want_out, want_state = lin(q, q, q, return_state=True, backend="reference")
    torch.testing.assert_close(out.double(), want_out.double(), atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(state.double(), want_state.double(), atol=2e-5, rtol=2e-5)


def test_cpu_gla_with_a_head_dim_not_a_power_of_two():
    # decay="token_dim" with Dk = 24: the CPU lowering tiled the chunk's [C, C, Dk] scores by the
    # shape of one operand, leaving rows of Dk = 24 that the vector lowering staged in a buffer
    # viewed as vector<8x24xf32> (rows LLVM pads to 32), and rejected; they now run in rows of 8.
    lin = ae.linear_attention(decay="token_dim", chunk_size=16)
    g = torch.Generator().manual_seed(5)
    q, v = torch.rand(1, 1, 20, 24, generator=g), torch.rand(1, 1, 20, 16, generator=g)
    decay = -torch.rand(1, 1, 20, 24, generator=g)
    torch.testing.assert_close(lin(q, q, v, decay, backend="cpu").double(),
                               lin(q, q, v, decay, backend="reference").double(), atol=2e-5, rtol=2e-5)


def test_cpu_linear_attention_leaves_the_initial_state_alone():
    # With one program in the grid (B = H = 1) the CPU kernel updated the caller's initial_state
    # in place: one-shot bufferization took the input argument as writable.
    lin = ae.linear_attention(chunk_size=16)
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 1, 5, 16, generator=g) for _ in range(3))
    s0 = torch.randn(1, 1, 16, 16, generator=g)
    before = s0.clone()
    out, state = lin(q, k, v, initial_state=s0, return_state=True, backend="cpu")
    assert torch.equal(s0, before)
    want_out, want_state = lin(q, k, v, initial_state=before, return_state=True, backend="reference")
    torch.testing.assert_close(out.double(), want_out.double(), atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(state.double(), want_state.double(), atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("target", ["cuda:90", "hip:gfx942"])
def test_decoding_rows_whose_every_key_is_masked(target):
    # Two query rows of 4 heads on 2 KV heads (the packed-GQA decoding form) against 90 keys, a
    # mask that keeps no pair: the kernel has no KV loop and zero-fills its output, a fill that
    # canonicalization moves past the reshape of its tensor.empty, which the Triton lowering
    # refused as a read of an uninitialized tensor.
    attn = ae.attention(mask_mod=lambda b, h, i, j: j + 1 <= -i, normalize="sigmoid")
    g = torch.Generator().manual_seed(4)
    q, k, v = torch.randn(2, 4, 2, 64, generator=g), torch.randn(2, 2, 90, 64, generator=g), torch.randn(2, 2, 90, 64, generator=g)
    out = triton_interpreted(attn, q, k, v, target, None)
    torch.testing.assert_close(out, attn(q, k, v, backend="reference"), atol=0, rtol=0)
