"""`attn-chunk-recurrence`: `attn.linear_recurrence` becomes L1 kernels walking chunks of tokens.

Per chunk of C tokens, with q, k [C, Dk] and v [C, BV] loaded zero-padded past L, the mods applied
(indices b, h, t0 + i, d) and padded rows of k and v forced back to zero, and G the cumulative
log-decay inside the chunk (G_i = g_0 + ... + g_i, padded positions have g = 0, so G_end = G_{C-1}):

    A      = scale * [s <= t] * sum_d q[t,d] k[s,d] exp(G[t,d] - G[s,d])       [C, C]
    o      = A @ v + (scale * q * exp(G)) @ S                                  [C, BV]
    S_next = exp(G_end) * S + (k * exp(G_end - G))^T @ v

Every exponent is G_t - G_s with s <= t, G_t, G_end or G_end - G_s: all <= 0 for decays g <= 0,
so nothing overflows however strong the decay (the factorization q exp(G) . k exp(-G) would). The
exponent of a pair s > t is replaced by 0 before `math.exp`, never evaluated. For scalar decays
("head", "token") the pair factor is a [C, C] tile and A is the masked, decayed `q @ k^T`; for
"token_dim" it depends on d: A is the masked product (scale * q * exp(G)) @ (k * exp(-G))^T
while |G| stays under SPAN_LIMIT (40 nats) in the chunk, where both factors are finite and the
product exact, and one 3-D `linalg.generic` over (t, s, d) with a reduction on d in a chunk that
decays more (a loop of one trip or none: `chunk/step.py`). G itself is a row sum of the masked [C, C] tile [j <= i] * g_j ("token"), `tril(ones) @ g`
("token_dim") or in closed form ("head"). `normalize` divides o by the same
quantity with v = 1: rowsum(A) + (scale * q * exp(G)) . z, z the decayed key sum.

"token_value_dim" (g [B, H, L, Dv]) decays the state's columns, S_t = S_{t-1} diag(exp(g_t)) +
k_t v_t^T: the decay moves from A to the values (`chunk/step.py`). No user API offers it; it is
what the gradients of "token_dim" (GLA) with respect to q and k compute (their decay acts on
the output side), so the backward runs it as a forward. `normalize` does not take it.

Two forms (option `split`), a module under passes/chunk/ each:

* One kernel (default; the CPU pipeline's; `chunk/sequential.py`): a program owns one (batch,
  head) and a BV-wide column slice of V, of the state and of the output, and carries S (and z)
  through one `scf.for` over the ceil(L / C) chunks.
* Two to four kernels (`split`, the Triton pipeline's; `chunk/split.py`): a cumulative-decay
  kernel for the decays that need a sum ("token" and the per-dimension ones), a chunk-state
  kernel walking the chunks doing only the state update and writing the state entering each
  chunk to a workspace, then a chunk-parallel output kernel. For the per-dimension decays a
  scores kernel first writes every chunk's A to a third workspace, a program per chunk
  (`chunk/scores.py`): GLA's ("token_dim") decayed, by blocks of SUB rows past the span limit;
  "token_value_dim"'s undecayed, which its output kernel, a program per chunk, decays on the
  values' side (by blocks past the span limit, `chunk/blocked.py`; with f16 operands a program
  per block and no scores kernel). `normalize` keeps
  the one-kernel form: its key sum z would need a second workspace written by every V-column
  program alike, for a variant (the normalized linear transformer) that is not bound by this.

Products: with 16-bit q/k/v, every `linalg.matmul` but the cumulative sums takes 16-bit operands
(A, the decayed q and k, and the state rounded to q's type) with an f32 accumulator, so GPUs run
them on tensor cores; flash-linear-attention rounds the same operands. The carried state, G and
all elementwise work stay f32. The cumulative sums (`tril @ g`) are f32 products marked
`attn.precision = "tf32x3"` (three tf32 tensor-core products, about 21 bits: 16-bit operands would
lose the sums' accuracy, and f32 FMA products cost a GPU program more registers than it has).
With f32 inputs every other product is f32 and marked `attn.precision = "ieee"`. S and z are
updated in place (they are the outputs of the generics that decay them), so a bufferized loop
keeps one buffer for each.

Every kernel lists its arguments' roles in `attn.arg_roles` ("q", "k", "v", "c<i>" for g, the
initial state and closure tensors in order, "w0", "w1" and "w2" the workspaces, "out", "state"); a
module of several kernels runs them in module order.

The kernels are built with the bindings' builders (`l1_builders`) at the recurrence op's location;
the q/k/v mods' ops are cloned into them and keep theirs, so diagnostics about them name the
user's lines.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from . import ModulePass, option
from .chunk import scores
from .chunk.kernel import DIM_DECAYS
from .chunk.sequential import SequentialKernel
from .chunk.split import CumulativeDecayKernel, OutputKernel, StateKernel
from .l1_ops import SEQUENCE_VIEWS, fail, kernel_function, ops_named, shape


@dataclass(frozen=True)
class ChunkRecurrence(ModulePass):
    name: ClassVar[str] = "attn-chunk-recurrence"
    summary: ClassVar[str] = ("Rewrite attn.linear_recurrence into L1 kernels over chunks of tokens: one kernel "
                              "carrying the f32 state through an scf.for, or (split) a chunk-state kernel then a "
                              "chunk-parallel output kernel, after a chunk-parallel cumulative-decay kernel")

    chunk_size: int = option(0, "tokens per chunk; 0 keeps the op's chunk_size attribute")
    block_v: int = option(64, "at most this many V columns per program (the grid's third axis splits Dv)")
    block_k: int = option(64, "with split, at most this many state rows (K columns) per chunk-state program")
    split: bool = option(False, "separate kernels: summed decays of every chunk, chunk states walked in order "
                                "into a workspace, then every chunk's output in parallel (normalize keeps one "
                                "kernel)")

    def __post_init__(self):
        if self.chunk_size < 0:
            raise ValueError(f"chunk-size must be 0 (keep the op's chunk_size) or positive, got {self.chunk_size}")
        if self.block_v < 1:
            raise ValueError(f"block-v must be positive, got {self.block_v}")
        if self.block_k < 1:
            raise ValueError(f"block-k must be positive, got {self.block_k}")

    def apply(self, module_op) -> None:
        for op in ops_named(module_op, "attn.linear_recurrence"):
            self._rewrite(op)

    def _rewrite(self, op) -> None:
        func = kernel_function(op, "chunked", views=SEQUENCE_VIEWS)
        chunk = self.chunk_size or int(op.attributes["chunk_size"].value)
        if chunk < 1:
            raise fail(op, f"chunk_size must be positive, got {chunk}")
        split = self.split and not bool(op.attributes["normalize"].value)
        with op.location:
            if split:
                kernels = self._split_kernels(op, func, chunk)
            else:
                kernels = [SequentialKernel(op, func, _one_chunk_rows(shape(op.operands[0])[2], chunk),
                                            self.block_v)]
            for kernel in kernels:
                kernel.build()
        func.operation.erase()

    def _split_kernels(self, op, func, chunk: int) -> list:
        decay = op.attributes["decay"].value
        summed = decay == "token" or decay in DIM_DECAYS
        kernels = [CumulativeDecayKernel(op, func, chunk, self.block_v)] if summed else []
        kernels.append(StateKernel(op, func, chunk, self.block_v, self.block_k))
        if scores.applies(decay, chunk):
            return kernels + scores.kernels(op, func, chunk, self.block_v)
        return kernels + [OutputKernel(op, func, chunk, self.block_v)]


def _one_chunk_rows(length: int, chunk: int) -> int:
    """The chunk size the one-kernel form uses. A sequence no longer than the chunk is one chunk
    either way; the power of two that covers it computes the same and keeps the chunk's tiles
    within the rows that exist, since canonicalization makes that ragged chunk's size static and
    the Triton lowering cannot trim a computed tile below its padded power-of-two shape. Tiles
    are at least 16 rows there, so no chunk is made smaller than that."""
    rows = max(16, 1 << max(length - 1, 0).bit_length())
    return rows if length <= chunk and rows < chunk else chunk
