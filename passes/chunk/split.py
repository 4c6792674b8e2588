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
from .decay import ChunkDecay
from .kernel import value_block
from .step import ChunkStep

# The split form's workspaces: the state entering each chunk, and every chunk's cumulative decays.
STATES, DECAYS = abi.workspace(0), abi.workspace(1)


class SplitKernel(ChunkStep):
    """A kernel of the split form, which passes chunk states (and cumulative decays) between
    kernels through workspaces."""

    def __init__(self, op, func, chunk: int, block_v: int):
        super().__init__(op, func, chunk, block_v)
        self.h_type = f"tensor<{self.b}x{self.h}x{self.chunks}x{self.dk}x{self.dv}x{self.dot_elt}>"
        cum_shape = {"token": f"{self.b}x{self.h}x{self.l}", "token_dim": f"{self.b}x{self.h}x{self.l}x{self.dk}"}
        self.g_cum_type = f"tensor<{cum_shape[self.decay]}xf32>" if self.decay in cum_shape else None

    def arguments(self, loads_decays: bool, result: tuple[str, str]) -> list[tuple[str, str]]:
        """The (role, type) arguments after the L0 inputs: the cumulative-decay workspace when the
        kernel `loads_decays`, the chunk-state workspace, then the `result` destination."""
        return ([(DECAYS, self.g_cum_type)] if loads_decays else []) + [(STATES, self.h_type), result]

    def arg_names(self, extra: list[tuple[str, str]]) -> dict[str, str]:
        return {role: self.dest(i) for i, (role, _) in enumerate(extra)}


class CumulativeDecayKernel(SplitKernel):
    """G of every chunk, in parallel, into workspace w1."""

    def build(self) -> str:
        em, dk = self.em, self.dk
        it = self.program_ids()
        t0 = em(f"arith.muli {it}, {self.idx(self.c)} : index")
        cum = self.decays(t0, None, dk).cum[0]
        rows = self.rows_left(t0, self.l, self.c)
        dest = self.dest(0)
        if self.decay == "token":
            piece = em(f"tensor.extract_slice {cum}[0] [{rows}] [1] : tensor<{self.c}xf32> to tensor<?xf32>")
            out = em(f"tensor.insert_slice {piece} into {dest}[{self.pb}, {self.ph}, {t0}] [1, 1, {rows}] [1, 1, 1] "
                     f": tensor<?xf32> into {self.g_cum_type}")
        else:
            piece = em(f"tensor.extract_slice {cum}[0, 0] [{rows}, {dk}] [1, 1] : {self.tile_type(self.c, dk)} "
                       f"to tensor<?x{dk}xf32>")
            out = em(f"tensor.insert_slice {piece} into {dest}[{self.pb}, {self.ph}, {t0}, 0] [1, 1, {rows}, {dk}] "
                     f"[1, 1, 1, 1] : tensor<?x{dk}xf32> into {self.g_cum_type}")
        return self.function(f"{self.name}_decays", [(DECAYS, self.g_cum_type)], [(out, self.g_cum_type)],
                             [self.b, self.h, self.chunks])


class StateKernel(SplitKernel):
    """The state entering every chunk, into workspace w0, and the final state: a program owns a
    [BK, BV] block of the state (at most `block_k` rows) and walks the chunks in order."""

    def __init__(self, op, func, chunk: int, block_v: int, block_k: int):
        super().__init__(op, func, chunk, block_v)
        self.bk = value_block(self.dk, block_k)
        self.nk = self.dk // self.bk

    def build(self) -> str:
        em = self.em
        bk, bv = self.bk, self.bv
        loads_decays = self.g_cum_type is not None
        extra = self.arguments(loads_decays, ("state", self.state_type))
        args = self.arg_names(extra)
        g_cum = args.get(DECAYS)
        kb, self.v0 = self.split_id(self.program_ids(sums=not loads_decays))
        k0 = em(f"arith.muli {kb}, {self.idx(bk)} : index") if self.nk > 1 else None

        def step(it, t0, names):
            state, h = names
            snapshot = self.operand(state, bk, bv)
            h = em(f"tensor.insert_slice {snapshot} into {h}[{self.pb}, {self.ph}, {it}, {k0 or 0}, {self.v0 or 0}] "
                   f"[1, 1, 1, {bk}, {bv}] [1, 1, 1, 1, 1] : {self.tile_type(bk, bv, self.dot_elt)} into {self.h_type}")
            k, v = self.load("k", t0, k0, bk), self.load("v", t0, self.v0, bv)
            decay = self.loaded_decays(t0, k0, bk, g_cum) if loads_decays else self.decays(t0, k0, bk)
            return [self.next_state(state, k, v, decay, bk), h]

        results = self.chunk_loop([(self.initial_state(k0, self.v0), self.tile_type(bk, bv)),
                                   (args[STATES], self.h_type)], step)
        final = self.store_state(results[0], args["state"], k0, self.v0)
        return self.function(f"{self.name}_states", extra, [(results[1], self.h_type), (final, self.state_type)],
                             [self.b, self.h, self.nk * self.nv])

    def loaded_decays(self, t0: str, k_col: str | None, width: int, g_cum: str) -> ChunkDecay:
        """`decays` from the workspace the cumulative-decay kernel wrote: G is a tile load and
        G_end the entries of the chunk's last valid row."""
        c = self.c
        last = self.em(f"arith.subi {self.em(f'arith.addi {t0}, {self.rows_left(t0, self.l, c)} : index')}, "
                       f"{self.idx(1)} : index")
        if self.decay == "token":
            cum = self.load_tile(g_cum, self.g_cum_type, "f32", [self.pb, self.ph], t0, self.l, c, None)

            def end(inner, a):
                return inner(f"tensor.extract {g_cum}[{self.pb}, {self.ph}, {last}] : {self.g_cum_type}")

            vec = f"tensor<{c}xf32>"
            end_c = self.generic([], vec, end, rank=1)
            end_k = self.generic([], f"tensor<{width}xf32>", end, rank=1)
            return ChunkDecay((cum, vec, "(d0)"), (end_c, vec, "(d0)"), end_k)

        def end_row(inner, a):
            d = inner("linalg.index 0 : index")
            if k_col is not None:
                d = inner(f"arith.addi {k_col}, {d} : index")
            return inner(f"tensor.extract {g_cum}[{self.pb}, {self.ph}, {last}, {d}] : {self.g_cum_type}")

        cum = self.load_tile(g_cum, self.g_cum_type, "f32", [self.pb, self.ph], t0, self.l, c, width, k_col or "0")
        vec = f"tensor<{width}xf32>"
        end_k = self.generic([], vec, end_row, rank=1)
        return ChunkDecay((cum, self.tile_type(c, width), "(d0, d1)"), (end_k, vec, "(d1)"), end_k)


class OutputKernel(SplitKernel):
    """Every chunk's output in parallel, from its q, k, v and the state entering it (workspace
    w0); a program owns one chunk and a BV-wide column slice."""

    loads_decays = False  # whether G comes from workspace w1 rather than being summed here

    def build(self) -> str:
        em = self.em
        dk, bv = self.dk, self.bv
        extra = self.arguments(self.loads_decays, ("out", self.out_type))
        args = self.arg_names(extra)
        it, self.v0 = self.split_id(self.program_ids(sums=not self.loads_decays))
        t0 = em(f"arith.muli {it}, {self.idx(self.c)} : index")
        state = em(f"tensor.extract_slice {args['w0']}[{self.pb}, {self.ph}, {it}, 0, {self.v0 or 0}] "
                   f"[1, 1, 1, {dk}, {bv}] [1, 1, 1, 1, 1] : {self.h_type} to {self.tile_type(dk, bv, self.dot_elt)}")
        out = self.chunk_output(t0, state, args["out"], args.get(DECAYS))
        return self.function(self.name, extra, [(out, self.out_type)], [self.b, self.h, self.chunks * self.nv])

    def chunk_output(self, t0: str, state: str, out: str, g_cum: str | None) -> str:
        """Store the output rows of the chunk at t0, S being `state`."""
        dk = self.dk
        q, k, v = self.load("q", t0, None, dk), self.load("k", t0, None, dk), self.load("v", t0, self.v0, self.bv)
        return self.store_output(t0, q, k, v, self.decays(t0, None, dk), state, None, out)
