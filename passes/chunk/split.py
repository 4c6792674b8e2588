"""The split form (the Triton pipeline's, as flash-linear-attention splits its chunk kernels).

The one-kernel form leaves a GPU nearly idle: B * H * Dv / BV programs (64 for B = 2, H = 16,
D = 128) each walk all chunks with four products per step, so its time grows with L. Instead
`@<name>_states` (grid [B, H, Dk / BK * Dv / BV]) walks the chunks doing only the state update and
writes the state entering each chunk to a workspace h [B, H, NC, Dk, Dv] (argument role "w0"), and
the final state; then `@<name>` (grid [B, H, NC * Dv / BV]) computes every chunk's output in
parallel from its q, k, v and h[chunk]. The workspace costs one write and one read of
NC * Dk * Dv elements per head, far less than the sequential time it removes.

Decays that need a cumulative sum ("token", "token_dim") get a third kernel first,
`@<name>_decays` (grid [B, H, NC]), writing every chunk's G to workspace "w1", so the chunk-state
loop loads G instead of summing it: the sums' reductions, inside the sequential loop, would set
the time of every step. "head" needs none: G_t = min(t + 1, n) g_h in closed form."""
from __future__ import annotations

from ...core import abi
from ..l1_builders import extract_slice, index, insert_slice, tensor_type
from .decay import ChunkDecay
from .kernel import COL, ROW, TILE, linalg_index, offset_of, value_block
from .step import ChunkStep

# The split form's workspaces: the state entering each chunk, and every chunk's cumulative decays.
STATES, DECAYS = abi.workspace(0), abi.workspace(1)


class SplitKernel(ChunkStep):
    """A kernel of the split form, which passes chunk states (and cumulative decays) between
    kernels through workspaces."""

    def __init__(self, op, func, chunk: int, block_v: int):
        super().__init__(op, func, chunk, block_v)
        self.h_type = tensor_type([self.b, self.h, self.chunks, self.dk, self.dv], self.dot_elt)
        cum_shape = {"token": [self.b, self.h, self.l], "token_dim": [self.b, self.h, self.l, self.dk]}
        self.g_cum_type = tensor_type(cum_shape[self.decay]) if self.decay in cum_shape else None

    def arguments(self, loads_decays: bool, result: tuple) -> list[tuple]:
        """The (role, type) arguments after the L0 inputs: the cumulative-decay workspace when the
        kernel `loads_decays`, the chunk-state workspace, then the `result` destination."""
        return ([(DECAYS, self.g_cum_type)] if loads_decays else []) + [(STATES, self.h_type), result]


class CumulativeDecayKernel(SplitKernel):
    """G of every chunk, in parallel, into workspace w1."""

    writes_output = False

    def build(self) -> None:
        self.define(f"{self.name}_decays", [(DECAYS, self.g_cum_type)], [self.g_cum_type],
                    [self.b, self.h, self.chunks], self.body)

    def body(self) -> list:
        from mlir.dialects import arith

        dk = self.dk
        it = self.program_ids()
        t0 = arith.muli(it, index(self.c))

        def store(values):
            cum = self.decays(t0, None, dk).cum[0]
            rows = self.rows_left(t0, self.l, self.c)
            if self.decay == "token":
                piece = extract_slice(cum, [0], [rows], 1)
                return [insert_slice(piece, values[0], [self.pb, self.ph, t0], [1, 1, rows])]
            piece = extract_slice(cum, [0, 0], [rows, dk], 2)
            return [insert_slice(piece, values[0], [self.pb, self.ph, t0, 0], [1, 1, rows, dk])]

        return self.if_holding_tokens(t0, [self.dests[DECAYS]], store)


class StateKernel(SplitKernel):
    """The state entering every chunk, into workspace w0, and the final state: a program owns a
    [BK, BV] block of the state (at most `block_k` rows) and walks the chunks in order."""

    writes_output = False

    def __init__(self, op, func, chunk: int, block_v: int, block_k: int):
        super().__init__(op, func, chunk, block_v)
        self.bk = value_block(self.dk, block_k)
        self.nk = self.dk // self.bk

    def build(self) -> None:
        extra = self.arguments(self.g_cum_type is not None, ("state", self.state_type))
        self.define(f"{self.name}_states", extra, [self.h_type, self.state_type],
                    [self.b, self.h, self.nk * self.nv], self.body)

    def body(self) -> list:
        from mlir.dialects import arith

        bk, bv = self.bk, self.bv
        loads_decays = self.g_cum_type is not None
        g_cum = self.dests.get(DECAYS)
        kb, self.v0 = self.split_id(self.program_ids(sums=not loads_decays))
        k0 = arith.muli(kb, index(bk)) if self.nk > 1 else None

        def step(it, t0, values):
            state, h = values
            snapshot = self.operand(state)
            h = insert_slice(snapshot, h, [self.pb, self.ph, it, offset_of(k0), offset_of(self.v0)],
                             [1, 1, 1, bk, bv])
            k, v = self.load("k", t0, k0, bk), self.load("v", t0, self.v0, bv)
            decay = self.loaded_decays(t0, k0, bk, g_cum) if loads_decays else self.decays(t0, k0, bk)
            return [self.next_state(state, k, v, decay, bk), h]

        results = self.chunk_loop([self.initial_state(k0, self.v0), self.dests[STATES]], step)
        final = self.store_state(results[0], self.dests["state"], k0, self.v0)
        return [results[1], final]

    def loaded_decays(self, t0, k_col, width: int, g_cum) -> ChunkDecay:
        """`decays` from the workspace the cumulative-decay kernel wrote: G is a tile load and
        G_end the entries of the chunk's last valid row."""
        from mlir.dialects import arith, tensor

        c = self.c
        last = arith.subi(arith.addi(t0, self.rows_left(t0, self.l, c)), index(1))
        if self.decay == "token":
            cum = self.load_tile(g_cum, [self.pb, self.ph], t0, self.l, c, None)

            def end(a):
                return tensor.extract(g_cum, [self.pb, self.ph, last])

            end_c = self.generic([], tensor_type([c]), end, rank=1)
            end_k = self.generic([], tensor_type([width]), end, rank=1)
            return ChunkDecay((cum, ROW), (end_c, ROW), end_k)

        def end_row(a):
            d = linalg_index(0)
            if k_col is not None:
                d = arith.addi(k_col, d)
            return tensor.extract(g_cum, [self.pb, self.ph, last, d])

        cum = self.load_tile(g_cum, [self.pb, self.ph], t0, self.l, c, width, offset_of(k_col))
        end_k = self.generic([], tensor_type([width]), end_row, rank=1)
        return ChunkDecay((cum, TILE), (end_k, COL), end_k)


class OutputKernel(SplitKernel):
    """Every chunk's output in parallel, from its q, k, v and the state entering it (workspace
    w0); a program owns one chunk and a BV-wide column slice."""

    loads_decays = False  # whether G comes from workspace w1 rather than being summed here

    def build(self) -> None:
        extra = self.arguments(self.loads_decays, ("out", self.out_type))
        self.define(self.name, extra, [self.out_type], [self.b, self.h, self.chunks * self.nv], self.body)

    def body(self) -> list:
        from mlir.dialects import arith

        it, self.v0 = self.split_id(self.program_ids(sums=not self.loads_decays))
        t0 = arith.muli(it, index(self.c))

        def store(values):
            state = extract_slice(self.dests[STATES], [self.pb, self.ph, it, 0, offset_of(self.v0)],
                                  [1, 1, 1, self.dk, self.bv], 2)
            return [self.chunk_output(t0, state, values[0], self.dests.get(DECAYS))]

        return self.if_holding_tokens(t0, [self.dests["out"]], store)

    def chunk_output(self, t0, state, out, g_cum):
        """Store the output rows of the chunk at t0, S being `state`."""
        dk = self.dk
        q, k, v = self.load("q", t0, None, dk), self.load("k", t0, None, dk), self.load("v", t0, self.v0, self.bv)
        return self.store_output(t0, q, k, v, self.decays(t0, None, dk), state, None, out)
