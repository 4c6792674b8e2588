"""The cumulative log-decay of a chunk: G_i = g_0 + ... + g_i inside the chunk (padded positions
have g = 0) and its total G_end = G_{C-1}, for each decay kind. G_end is always read off G's last
entry (or computed exactly as G's last entry is), so G_end - G is exactly 0 at the chunk's end."""
from __future__ import annotations

from dataclasses import dataclass

from ..l1_text import convert, elt
from .kernel import ChunkKernel, or_zero


@dataclass(frozen=True)
class ChunkDecay:
    """A chunk's decay as generic operands (value, type, map) over a [C, width] tile of keys:
    `cum` is G (for the scalar decays a [C] vector read through (d0)), `end` is G_end; `end_rows`
    is G_end as a [width] vector, one value per state row."""

    cum: tuple[str, str, str]
    end: tuple[str, str, str]
    end_rows: str


class DecayedKernel(ChunkKernel):
    """A chunk kernel that computes G from g."""

    def program_ids(self, sums: bool = True) -> str:
        """The program ids (returning the third axis's) and, for the "token_dim" decay of a kernel
        that `sums` g along chunks, the lower-triangular ones that do it, built once."""
        third = super().program_ids()
        if self.decay == "token_dim" and sums:
            self.tril = self.generic([], self.tile_type(self.c, self.c), lambda inner, a: inner(
                f"arith.select {self.pair_mask(inner)}, {inner('arith.constant 1.0 : f32')}, "
                f"{inner('arith.constant 0.0 : f32')} : f32"))
        return third

    def decays(self, t0: str, k_col: str | None, width: int) -> ChunkDecay | None:
        """The decay of the chunk at t0 for k columns [k_col, k_col + width); None without one."""
        if self.decay in ("head", "token"):
            cum, end_c, end_k = self.head_decay(t0, width) if self.decay == "head" else self.token_decay(t0, width)
            vec = f"tensor<{self.c}xf32>"
            return ChunkDecay((cum, vec, "(d0)"), (end_c, vec, "(d0)"), end_k)
        if self.decay == "token_dim":
            cum, end_k = self.dim_decay(t0, k_col, width)
            return ChunkDecay((cum, self.tile_type(self.c, width), "(d0, d1)"),
                              (end_k, f"tensor<{width}xf32>", "(d1)"), end_k)
        return None

    def token_decay(self, t0: str, width: int) -> tuple[str, str, str]:
        """(G [C], G_end [C], G_end [width]) for the "token" decay: G as row sums of the masked
        [C, C] tile [j <= i] * g_j."""
        c = self.c
        g_elt = elt(self.g)
        steps = self.load_tile(self.arg_name(self.g, "g"), str(self.g.type), g_elt, [self.pb, self.ph], t0, self.l,
                               c, None)

        def prefix(inner, a):
            return or_zero(inner, self.pair_mask(inner), convert(inner, a[0], g_elt, "f32"))

        tri = self.generic([(steps, f"tensor<{c}x{g_elt}>", "(d1)")], self.tile_type(c, c), prefix)
        cum = self.row_sum(tri, c, c)
        vec = f"tensor<{c}xf32>"
        return cum, self.last_of(cum, vec, "(d1)", c), self.last_of(cum, vec, "(d1)", width)

    def head_decay(self, t0: str, width: int) -> tuple[str, str, str]:
        """The "head" decay in closed form: with n the chunk's valid rows, G_t = min(t + 1, n) * g_h
        and G_end = n * g_h, both exactly as the sums of g define them, so G_end - G_t is exactly 0
        at the last valid row. No cumulative sum: on a GPU its reductions and layout changes would
        lengthen each step of the chunk-state loop."""
        g_name, g_type, g_elt = self.arg_name(self.g, "g"), str(self.g.type), elt(self.g)
        n = self.rows_left(t0, self.l, self.c) if self.ragged else None

        def steps(inner, upto_row: bool) -> str:
            count = self.index_const(inner, self.c) if n is None else n
            if upto_row:
                i = inner("linalg.index 0 : index")
                count = inner(f"arith.minsi {inner(f'arith.addi {i}, {self.index_const(inner, 1)} : index')}, "
                              f"{count} : index")
            as_int = inner(f"arith.index_cast {count} : index to i32")
            rate = convert(inner, inner(f"tensor.extract {g_name}[{self.ph}] : {g_type}"), g_elt, "f32")
            return inner(f"arith.mulf {inner(f'arith.sitofp {as_int} : i32 to f32')}, {rate} : f32")

        vec = f"tensor<{self.c}xf32>"
        cum = self.generic([], vec, lambda inner, a: steps(inner, True), rank=1)
        end_c = self.generic([], vec, lambda inner, a: steps(inner, False), rank=1)
        end_k = self.generic([], f"tensor<{width}xf32>", lambda inner, a: steps(inner, False), rank=1)
        return cum, end_c, end_k

    def dim_decay(self, t0: str, col: str | None, width: int) -> tuple[str, str]:
        """(G [C, width], G_end [width]) for the "token_dim" decay: G = tril(ones) @ g."""
        c = self.c
        g_name, g_type, g_elt = self.arg_name(self.g, "g"), str(self.g.type), elt(self.g)
        steps = self.load_tile(g_name, g_type, g_elt, [self.pb, self.ph], t0, self.l, c, width, col or "0")
        steps = self.modded(steps, g_elt, width, None, t0, None, False)
        cum = self.matmul(self.tril, self.tile_type(c, c), steps, self.tile_type(c, width),
                          self.zeros(self.tile_type(c, width)), self.tile_type(c, width), "tf32x3")
        cum_t = self.transpose(cum, c, width)
        return cum, self.last_of(cum_t, self.tile_type(width, c), "(d0, d1)", width)

    def last_of(self, cum: str, cum_type: str, cum_map: str, rows: int, cols: int | None = None) -> str:
        """[rows] values of the last column of cum viewed as a [rows, cols (C)] tile through
        `cum_map` (the chunk's total log-decay G_end): a row sum with every other column masked,
        so the value is bitwise cum's last entry and G_end - G is exactly 0 at the chunk's end."""
        c = cols or self.c

        def pick(inner, a):
            j = inner("linalg.index 1 : index")
            return or_zero(inner, inner(f"arith.cmpi eq, {j}, {self.index_const(inner, c - 1)} : index"), a[0])

        picked = self.generic([(cum, cum_type, cum_map)], self.tile_type(rows, c), pick)
        return self.row_sum(picked, rows, c)
