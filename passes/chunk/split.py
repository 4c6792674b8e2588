"""The split form (the Triton pipeline's, as flash-linear-attention splits its chunk kernels).

The one-kernel form leaves a GPU nearly idle: B * H * Dv / BV programs (64 for B = 2, H = 16,
D = 128) each walk all chunks with four products per step, so its time grows with L. Instead
`@<name>_states` (grid [B, H, Dk / BK * Dv / BV]) walks the chunks doing only the state update and
writes the state entering each chunk to a workspace h [B, H, NC, Dk, Dv] (argument role "w0"), and
the final state; then `@<name>` (grid [B, H, NC * Dv / BV]) computes every chunk's output in
parallel from its q, k, v and h[chunk]. The workspace costs one write and one read of
NC * Dk * Dv elements per head, far less than the sequential time it removes.

Decays that need a cumulative sum ("token" and the per-dimension ones) get another kernel first,
`@<name>_decays` (grid [B, H, ceil(NC / DECAY_CHUNKS)], times the column blocks of DECAY_COLUMNS
for the per-dimension decays), writing every chunk's G to workspace "w1", so the chunk-state
loop loads G instead of summing it: the sums' reductions, inside the sequential loop, would set
the time of every step. "head" needs none: G_t = min(t + 1, n) g_h in closed form.

For packed sequences (T rows in all, S sequences) the workspaces follow the packed rows, not the
[S, H, L] view, so they grow with T rather than S x L (one long sequence among many short ones):
sequence s's chunk i is chunk floor(lo_s / C) + i + s of h [1, H, T / C + S + 1, Dk, Dv], and its
row t of G is row lo_s + s C + t of [1, H, T + S C(, Dk)]. Both spans of a sequence end before the
next one's begin (its chunks cover at most ceil(len_s / C) C rows)."""
from __future__ import annotations

from ...core import abi
from ..l1_builders import extract_slice, for_loop, index, insert_slice, tensor_type
from ..l1_ops import shape
from .decay import ChunkDecay
from .kernel import COL, DIM_DECAYS, ROW, TILE, linalg_index, offset_of, value_block
from .step import ChunkStep

# The split form's workspaces: the state entering each chunk, and every chunk's cumulative decays.
STATES, DECAYS = abi.workspace(0), abi.workspace(1)
DECAY_COLUMNS = 32  # the most columns of G a cumulative-decay program sums
# The chunks a cumulative-decay program walks in turn. Measured on an H200 (GLA, B 8, L 2048,
# H 16, Dk 128): 204 us in one stage against 205-209 for a program per chunk, so no gain, but
# 446 us in three stages (pipelining the loop) and 706 for one chunk in a pipelined loop; the
# preset launches the kernel in one stage. A copy of g to G alone takes 157 us: the tiles' loads
# and stores, not the sums, keep it at a third of the memory bandwidth (fla's cumsum: 63 us).
DECAY_CHUNKS = 4


class SplitKernel(ChunkStep):
    """A kernel of the split form, which passes chunk states (and cumulative decays) between
    kernels through workspaces."""

    def __init__(self, op, func, chunk: int, block_v: int):
        super().__init__(op, func, chunk, block_v)
        from mlir import ir

        if self.packed_out is None:
            lead, chunks, rows = [self.b, self.h], self.chunks, self.l
        elif ir.ShapedType.is_dynamic_size(total := shape(self.packed_out)[abi.PACKED_ROWS_DIM]):
            # A packed batch of any rows: the runtime sizes the workspaces (workspace_rows).
            lead, chunks, rows = [1, self.h], total, total
        else:
            lead, chunks, rows = [1, self.h], total // chunk + self.b + 1, total + self.b * chunk
        self.ws_rows = rows
        self.h_type = tensor_type(lead + [chunks, self.dk, self.dv], self.dot_elt)
        cum_shape = {"token": lead + [rows], "token_dim": lead + [rows, self.dk],
                     "token_value_dim": lead + [rows, self.dv]}  # G over the dimensions g decays
        self.g_cum_type = tensor_type(cum_shape[self.decay]) if self.decay in cum_shape else None

    def workspace_rows(self) -> dict:
        """The rows of each workspace of a packed batch as (divisor, addend) of the packed rows T
        (abi.WORKSPACE_ROWS): T / C + S + 1 chunk states, T + S C rows of decays and scores."""
        c, s = self.c, self.b
        return {STATES: (c, s + 1), DECAYS: (1, s * c), abi.workspace(2): (1, s * c)}

    def ws_extent(self, workspace):
        """The rows of `workspace` (w1 or w2): a constant, or read where it takes any rows."""
        from mlir import ir
        from mlir.dialects import tensor

        if ir.ShapedType.is_dynamic_size(self.ws_rows):
            return tensor.dim(workspace, index(abi.PACKED_ROWS_DIM))
        return index(self.ws_rows)

    # --- workspace coordinates (the view's, or the packed rows' for packed sequences) ---------
    def ws_lead(self) -> list:
        return [self.pb, self.ph] if self.packed_out is None else [index(0), self.ph]

    def ws_chunk(self, it):
        """The workspace chunk of the program's chunk `it`."""
        from mlir.dialects import arith

        if self.packed_out is None:
            return it
        return arith.addi(arith.addi(arith.divsi(self.lo, index(self.c)), it), self.pb)

    def ws_row(self, t):
        """The workspace row of the program's row `t`."""
        from mlir.dialects import arith

        if self.packed_out is None:
            return t
        return arith.addi(arith.addi(self.lo, arith.muli(self.pb, index(self.c))), t)

    def ws_load(self, g_cum, t0, rows: int, width: int | None, col=0):
        """Rows [t0, t0 + rows) of the program's G in the workspace (a load_tile)."""
        from mlir.dialects import arith

        stop = arith.minsi(self.ws_row(index(self.l)), self.ws_extent(g_cum))
        return self.load_tile(g_cum, self.ws_lead(), self.ws_row(t0), stop, rows, width, col, past_end=True)

    @property
    def loads_decays(self) -> bool:
        """Whether G comes from workspace w1: every decay that needs a sum has a cumulative-decay
        kernel, whose G the later kernels load rather than sum again (the "token" output kernel
        summed its chunk's g with a [C, C] masked tile and row reductions)."""
        return self.g_cum_type is not None

    def loaded_decays(self, t0, k_col, width: int, g_cum) -> ChunkDecay:
        """`decays` from the workspace the cumulative-decay kernel wrote: G is a tile load and
        G_end the entries of the chunk's last valid row (of the program's V columns for
        "token_value_dim")."""
        from mlir.dialects import arith, tensor

        if self.decay == "token_value_dim":
            k_col, width = self.v0, self.bv
        c = self.c
        last = self.ws_row(arith.subi(arith.addi(t0, self.rows_left(t0, self.l, c)), index(1)))
        if self.decay == "token":
            cum = self.ws_load(g_cum, t0, c, None)

            def end(a):
                return tensor.extract(g_cum, self.ws_lead() + [last])

            end_c = self.generic([], tensor_type([c]), end, rank=1)
            end_k = self.generic([], tensor_type([width]), end, rank=1)
            return ChunkDecay((cum, ROW), (end_c, ROW), end_k)

        def end_row(a):
            d = linalg_index(0)
            if k_col is not None:
                d = arith.addi(k_col, d)
            return tensor.extract(g_cum, self.ws_lead() + [last, d])

        cum = self.ws_load(g_cum, t0, c, width, offset_of(k_col))
        end_k = self.generic([], tensor_type([width]), end_row, rank=1)
        return ChunkDecay((cum, TILE), (end_k, COL), end_k)

    def arguments(self, result: tuple) -> list[tuple]:
        """The (role, type) arguments after the L0 inputs: the cumulative-decay workspace when the
        kernel `loads_decays`, the chunk-state workspace, then the `result` destination."""
        return ([(DECAYS, self.g_cum_type)] if self.loads_decays else []) + [(STATES, self.h_type), result]


class CumulativeDecayKernel(SplitKernel):
    """G of every chunk, in parallel, into workspace w1: a program walks DECAY_CHUNKS chunks and,
    for the per-dimension decays, takes DECAY_COLUMNS columns at most, the columns' sums being
    independent (106 registers a thread at Dk = 128 against 154 for a whole chunk)."""

    writes_output = False

    def __init__(self, op, func, chunk: int, block_v: int):
        super().__init__(op, func, chunk, block_v)
        self.width = self.dv if self.decay == "token_value_dim" else self.dk
        self.bw = value_block(self.width, DECAY_COLUMNS) if self.decay in DIM_DECAYS else self.width

    def build(self) -> None:
        self.define([(DECAYS, self.g_cum_type)], [self.g_cum_type],
                    [self.b, self.h, -(-self.chunks // DECAY_CHUNKS) * (self.width // self.bw)], self.body, "decays")

    def body(self) -> list:
        from mlir.dialects import arith

        group, col = self.program_ids(), None
        if self.bw < self.width:
            blocks = index(self.width // self.bw)
            group, col = arith.divsi(group, blocks), arith.muli(arith.remsi(group, blocks), index(self.bw))
        first = arith.muli(group, index(DECAY_CHUNKS))
        trips = arith.minsi(index(DECAY_CHUNKS), arith.subi(index(self.chunks), first))

        def chunk(j, values):
            t0 = arith.muli(arith.addi(first, j), index(self.c))
            return self.if_holding_tokens(t0, values, lambda dest: [self.store_chunk(t0, col, dest[0])])

        return for_loop(trips, [self.dests[DECAYS]], chunk)

    def store_chunk(self, t0, col, dest):
        """Insert G of the chunk at t0 (columns [col, col + bw)) into `dest`."""
        rows = self.rows_left(t0, self.l, self.c)
        if self.decay == "token":
            cum = self.decays(t0, None, self.width).cum[0]
            piece = extract_slice(cum, [0], [rows], 1)
            return insert_slice(piece, dest, self.ws_lead() + [self.ws_row(t0)], [1, 1, rows])
        cum = self.dim_decay(t0, col, self.bw)[0]
        piece = extract_slice(cum, [0, 0], [rows, self.bw], 2)
        return insert_slice(piece, dest, self.ws_lead() + [self.ws_row(t0), offset_of(col)], [1, 1, rows, self.bw])


class StateKernel(SplitKernel):
    """The state entering every chunk, into workspace w0, and the final state: a program owns a
    [BK, BV] block of the state (at most `block_k` rows) and walks the chunks in order."""

    writes_output = False

    def __init__(self, op, func, chunk: int, block_v: int, block_k: int):
        super().__init__(op, func, chunk, block_v)
        self.bk = value_block(self.dk, block_k)
        self.nk = self.dk // self.bk

    def build(self) -> None:
        extra = self.arguments(("state", self.state_type))
        self.define(extra, [self.h_type, self.state_type],
                    [self.b, self.h, self.nk * self.nv], self.body, "states")

    def body(self) -> list:
        from mlir.dialects import arith

        bk, bv = self.bk, self.bv
        loads_decays = self.loads_decays
        g_cum = self.dests.get(DECAYS)
        kb, self.v0 = self.split_id(self.program_ids(sums=not loads_decays))
        k0 = arith.muli(kb, index(bk)) if self.nk > 1 else None

        def step(it, t0, values):
            state, h = values
            snapshot = self.operand(state)
            h = insert_slice(snapshot, h, self.ws_lead() + [self.ws_chunk(it), offset_of(k0), offset_of(self.v0)],
                             [1, 1, 1, bk, bv])
            k, v = self.load("k", t0, k0, bk), self.load("v", t0, self.v0, bv)
            decay = self.loaded_decays(t0, k0, bk, g_cum) if loads_decays else self.decays(t0, k0, bk)
            return [self.next_state(state, k, v, decay, bk), h]

        results = self.chunk_loop([self.initial_state(k0, self.v0), self.dests[STATES]], step)
        final = self.store_state(results[0], self.dests["state"], k0, self.v0)
        return [results[1], final]


class OutputKernel(SplitKernel):
    """Every chunk's output in parallel, from its q, k, v, the state entering it (workspace w0)
    and its G (workspace w1, for the decays that sum one); a program owns one chunk and a
    BV-wide column slice, or, with `loops_values`, the chunk and all its V blocks in turn."""

    def build(self) -> None:
        extra = self.arguments(("out", self.out_type))
        blocks = 1 if self.loops_values else self.nv
        self.define(extra, [self.out_type], [self.b, self.h, self.chunks * blocks], self.body)

    @property
    def loops_values(self) -> bool:
        """Whether a program walks its chunk's V blocks, computing the chunk's scores once: with
        the row-decayed output, whose q and k tiles (Dk wide) are the largest it loads. A
        program per V block reads them once per block (an H200, simple GLA at Dk 128, BV 64:
        64 KiB a program, of which the second block's q and k are 32)."""
        return self.nv > 1 and self.row_decayed_output

    def body(self) -> list:
        from mlir.dialects import arith

        third = self.program_ids(sums=not self.loads_decays)
        it, self.v0 = (third, None) if self.loops_values else self.split_id(third)
        t0 = arith.muli(it, index(self.c))

        def store(values):
            if self.loops_values:
                return [self.value_blocks(t0, it, values[0])]
            return [self.chunk_output(t0, self.chunk_state(it), values[0])]

        return self.if_holding_tokens(t0, [self.dests["out"]], store)

    def value_blocks(self, t0, it, out):
        """Store the chunk's output rows, one V block after another, from its scores built once."""
        from mlir.dialects import arith

        dk = self.dk
        q, k = self.load("q", t0, None, dk), self.load("k", t0, None, dk)
        decay = self.chunk_decay(t0)
        scores = self.operand(self.scores(q, k, decay))

        def block(j, values):
            self.v0 = arith.muli(j, index(self.bv))
            v = self.load("v", t0, self.v0, self.bv)
            return [self.store_row_decayed(t0, q, scores, v, decay, self.chunk_state(it), values[0])]

        return for_loop(self.nv, [out], block)[0]

    def chunk_decay(self, t0):
        """The decay of the chunk at t0 over all Dk columns (G from workspace w1 where one was summed)."""
        dk = self.dk
        return self.loaded_decays(t0, None, dk, self.dests[DECAYS]) if self.loads_decays else self.decays(t0, None, dk)

    def chunk_state(self, it):
        """The program's [Dk, BV] slice of the state entering its chunk `it` (workspace w0)."""
        return extract_slice(self.dests[STATES], self.ws_lead() + [self.ws_chunk(it), 0, offset_of(self.v0)],
                             [1, 1, 1, self.dk, self.bv], 2)

    def chunk_output(self, t0, state, out):
        """Store the output rows of the chunk at t0, S being `state`."""
        dk = self.dk
        q, k, v = self.load("q", t0, None, dk), self.load("k", t0, None, dk), self.load("v", t0, self.v0, self.bv)
        return self.store_output(t0, q, k, v, self.chunk_decay(t0), state, None, out)
