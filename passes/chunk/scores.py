"""GLA's ("token_dim") chunk output in two kernels, as flash-linear-attention splits its GLA
forward: the intra-chunk scores

    A = scale * [s <= t] * sum_d q[t,d] k[s,d] exp(G[t,d] - G[s,d])        [C, C] per chunk

first, into workspace w2 (`@<name>_scores`, grid [B, H, NC], a program per chunk), then every
chunk's output o = A @ v + (scale * q * exp(G)) @ S from two tensor-core products over the
chunk's whole rows (`@<name>`, grid [B, H, NC * Dv / BV]). Computing A inside the output kernel
repeated its exponentials in every V-column program and cut the products into pieces.

A chunk whose decay stays under SPAN_LIMIT in every dimension (max |G| over the chunk, checked
as a scalar) takes one product, as in `ChunkStep.dim_decayed_scores`:

    A = mask((scale * q exp(G)) @ (k exp(min(-G, SPAN_LIMIT)))^T),

in passes of PRODUCT_COLUMNS columns of Dk: the chunk's q, k and G are read once and take
2 * C * Dk exponentials. A chunk that decays more (in a loop of one trip or none: the kernels'
lowerings take loops, not conditionals) computes A a block I of SUB rows at a time, factorized
at the block's boundary R_I (`chunk/blocked.py`; R_I = 0 for a chunk's first block),

    A[I, :] = mask((scale * q_I exp(G_I - R_I)) @ (k exp(min(R_I - G, SPAN_LIMIT)))^T),

one product against the chunk's keys. For the earlier blocks both exponents are <= 0. For the
diagonal block the keys' factor exp(R_I - G_s) grows with the block's own decay, so the product
is exact only while that stays under SPAN_LIMIT, which is checked again per block; a block that
decays more recomputes its diagonal block A_II in the 3-D form over Dk, in slices of at most
SLICE columns, moved to columns [first, first + SUB) by an exact f32 product with the 0/1
placement [SUB, C] (a register tile cannot be indexed at a computed column), in a loop of one
trip or none. f16 operands (whose range ends at exp(11)) always take the blocks and their 3-D
diagonal. Keys after a row have their exponents capped at SPAN_LIMIT: masked, they must only
stay finite.

A holds the dot type (16-bit for 16-bit inputs: the output's product rounds it to that anyway)
and every chunk's C rows: [B, H, NC * C, C], or for packed sequences [1, H, T + S C, C] with the
rows G has (`chunk/split.py`), so a chunk's or block's tile is always stored and loaded whole.

"token_value_dim" (the runs GLA's backward takes for dq and dk) splits the same way: its scores
kernel writes A = scale * [s <= t] * q k^T, undecayed, and its output kernel
(`ScoredValueOutputKernel`) decays the values' side."""
from __future__ import annotations

from ...core import abi
from ..l1_builders import extract_slice, f32, for_loop, index, insert_slice, tensor_type, transpose, zeros
from .blocked import SLICE, SUB, BlockedKernel, BlockedValueOutputKernel
from .kernel import COL, DIM_DECAYS, TILE, exp, linalg_index, offset_of, or_zero, value_block
from .split import DECAYS, STATES, OutputKernel
from .step import SPAN_LIMIT

SCORES = abi.workspace(2)
# The Dk columns a pass of the scores' products takes: at Dk = 128 two passes of an scf.for keep
# half the key tiles live (253 registers a thread in one pass).
PRODUCT_COLUMNS = 64


def applies(decay: str, chunk: int) -> bool:
    """Whether the output of a per-dimension decay takes the two kernels: a chunk of several
    blocks of SUB rows."""
    return decay in DIM_DECAYS and chunk % SUB == 0 and chunk > SUB


def kernels(op, func, chunk: int, block_v: int) -> list:
    """The scores kernel and the output kernel that reads its workspace, for a decay that
    `applies`; "token_value_dim" with f16 operands (which never factorize) takes a program per
    block of its output instead (`BlockedValueOutputKernel`), its scores being no product."""
    if op.attributes["decay"].value == "token_dim":
        return [ScoreKernel(op, func, chunk, block_v), ScoredOutputKernel(op, func, chunk, block_v)]
    output = ScoredValueOutputKernel(op, func, chunk, block_v)
    if not output.factorizes:
        return [BlockedValueOutputKernel(op, func, chunk, block_v)]
    return [ScoreKernel(op, func, chunk, block_v), output]


class ScoresWorkspace:
    """The type of workspace w2, for a kernel of the split form."""

    @property
    def scores_type(self):
        lead = self.h_type.shape[:2]
        rows = self.chunks * self.c if self.packed_out is None else self.ws_rows
        return tensor_type(lead + [rows, self.c], self.dot_elt)

    def chunk_scores(self, t0, rows: int):
        """The [rows, C] tile of w2 from the program's row t0."""
        return self.ws_lead() + [self.ws_row(t0), 0], [1, 1, rows, self.c]


class ScoreKernel(ScoresWorkspace, BlockedKernel):
    """Every chunk's scores A into workspace w2, a program per chunk (grid [B, H, NC]); it writes
    no output rows."""

    writes_output = False

    def build(self) -> None:
        decays = [(DECAYS, self.g_cum_type)] if self.decay == "token_dim" else []
        self.define(decays + [(SCORES, self.scores_type)],
                    [self.scores_type], [self.b, self.h, self.chunks], self.body, "scores")

    def body(self) -> list:
        from mlir.dialects import arith

        t0 = arith.muli(self.program_ids(sums=False), index(self.c))

        # With lengths and an unpadded output the output kernel also computes the chunks past the
        # program's end, from w2 rows no program wrote; it stores those rows as zeros by a select.
        return self.if_holding_tokens(t0, [self.dests[SCORES]], lambda values: [self.chunk_into(t0, values[0])])

    def chunk_into(self, t0, dest):
        """Store the scores of the chunk at t0 into `dest`: whole, or past SPAN_LIMIT by blocks;
        "token_value_dim"'s, undecayed, always whole."""
        from mlir.dialects import arith

        if self.decay == "token_value_dim":
            q, k = self.load("q", t0, None, self.dk), self.load("k", t0, None, self.dk)
            return insert_slice(self.operand(self.scores(q, k, None)), dest, *self.chunk_scores(t0, self.c))

        def by_blocks(dest):
            return for_loop(self.c // SUB, [dest], lambda block, values: [self.block_scores(t0, block, values[0])])[0]

        if not self.factorizes:
            return by_blocks(dest)
        products, span = self.chunk_products(t0)
        scores = self.generic([(products, TILE)], products.type, lambda a: or_zero(self.pair_mask(), a[0]))
        wide = self.beyond_span_limit(span)
        offsets, sizes = self.chunk_scores(t0, self.c)
        dest = for_loop(arith.subi(index(1), wide), [dest], lambda _, values: [
            insert_slice(self.operand(scores), values[0], offsets, sizes)])[0]
        return for_loop(wide, [dest], lambda _, values: [by_blocks(values[0])])[0]

    def chunk_products(self, t0) -> tuple:
        """((scale * q exp(G)) @ (k exp(min(-G, SPAN_LIMIT)))^T [C, C], max |G| as a scalar) over
        the chunk at t0, in passes of PRODUCT_COLUMNS columns of Dk."""
        from mlir.dialects import arith

        c, dk = self.c, self.dk
        width = value_block(dk, PRODUCT_COLUMNS)

        def one_pass(col, products, span):
            cum = self.ws_load(self.dests[DECAYS], t0, c, width, offset_of(col))
            q = self.load("q", t0, col, width)[0]
            q_f = self.generic([(q, TILE), (cum, TILE)], cum.type, lambda a: self.scaled(arith.mulf(a[0], exp(a[1]))))
            k_f = self.undecayed(self.load("k", t0, col, width)[0], cum)
            products = self.matmul(self.operand(q_f), transpose(self.operand(k_f)), products)
            return [products, arith.maximumf(span, self.tile_max(self.chunk_span(cum), 0.0))]

        if width == dk:
            return tuple(one_pass(None, zeros([c, c]), f32(0.0)))
        return tuple(for_loop(index(dk // width), [zeros([c, c]), f32(0.0)], lambda j, values: one_pass(
            arith.muli(j, index(width)), *values)))

    def block_scores(self, t0, block, dest):
        """Store block `block`'s [SUB, C] row of the scores of the chunk at t0 into `dest`."""
        from mlir.dialects import arith

        g_cum, dk, c = self.dests[DECAYS], self.dk, self.c
        start = self.block_start(t0, block)
        width = value_block(dk, PRODUCT_COLUMNS)
        if width == dk:
            products = self.matmul(*self.factors(t0, start, None, width), zeros([SUB, c]))
        else:
            products = for_loop(index(dk // width), [zeros([SUB, c])], lambda j, values: [
                self.matmul(*self.factors(t0, start, arith.muli(j, index(width)), width), values[0])])[0]
        block_col = arith.muli(block, index(SUB))  # the block's first column in the chunk
        if not self.factorizes:
            scores = self.exact_scores(products, block_col, start)
        else:
            def causal(a):
                i, j = linalg_index(0), linalg_index(1)
                return or_zero(arith.cmpi(arith.CmpIPredicate.sle, j, arith.addi(block_col, i)), a[0])

            scores = self.generic([(products, TILE)], self.tile_type(SUB, c), causal)
            wide = self.wide(self.cum(g_cum, start, None, dk), self.boundary(g_cum, start))
            scores = for_loop(wide, [scores], lambda _, values: [self.exact_scores(products, block_col, start)])[0]
        offsets, sizes = self.chunk_scores(start, SUB)
        return insert_slice(self.operand(scores), dest, offsets, sizes)

    def factors(self, t0, start, col, width: int) -> tuple:
        """The operands of the products over Dk columns [col, col + width) (col an index value or
        None): (scale * q_I exp(G_I - R_I), (k exp(min(R_I - G, cap)))^T) over the chunk's keys,
        the cap SPAN_LIMIT (0 without the tensor-core diagonal: only the earlier blocks' columns
        are kept)."""
        g_cum, c = self.dests[DECAYS], self.c
        cap = SPAN_LIMIT if self.factorizes else 0.0
        boundary = self.boundary(g_cum, start, col, width)
        q = self.load("q", start, col, width, SUB)[0]
        q_local = self.generic([(q, TILE), (self.cum(g_cum, start, col, width), TILE), (boundary, COL)],
                               self.tile_type(SUB, width), lambda a: self.decayed(a[0], a[1], a[2], True))
        k = self.load("k", t0, col, width)[0]
        k_dec = self.generic([(k, TILE), (self.ws_load(g_cum, t0, c, width, offset_of(col)), TILE), (boundary, COL)],
                             self.tile_type(c, width), lambda a: self.decayed(a[0], a[2], a[1], False, cap))
        return self.operand(q_local), transpose(self.operand(k_dec))

    def exact_scores(self, products, block_col, start):
        """The block's row of scores with its diagonal block in the 3-D form: the products'
        columns before the block, then A_II placed at columns [block_col, block_col + SUB)."""
        from mlir.dialects import arith

        def before_block(a):
            return or_zero(arith.cmpi(arith.CmpIPredicate.slt, linalg_index(1), block_col), a[0])

        earlier = self.generic([(products, TILE)], self.tile_type(SUB, self.c), before_block)
        placement = self.generic([], self.tile_type(SUB, self.c), lambda a: self.placed(block_col))
        return self.matmul(self.diagonal_block(start), placement, earlier)

    @staticmethod
    def placed(block_col):
        """In a body over (i, j): 1 where j = block_col + i, else 0."""
        from mlir.dialects import arith

        on = arith.cmpi(arith.CmpIPredicate.eq, linalg_index(1), arith.addi(block_col, linalg_index(0)))
        return arith.select(on, f32(1.0), f32(0.0))

    def diagonal_block(self, start):
        """A_II [SUB, SUB] of the block at `start` in the 3-D form, summed over slices of Dk."""
        g_cum, dk = self.dests[DECAYS], self.dk
        diagonal = zeros([SUB, SUB])
        width = value_block(dk, SLICE)
        for col in range(0, dk, width):
            c0 = None if width == dk else index(col)
            q_s = self.load("q", start, c0, width, SUB)[0]
            k_s = self.load("k", start, c0, width, SUB)[0]
            diagonal = self.decayed_scores(q_s, k_s, self.cum(g_cum, start, c0, width), SUB, diagonal, clamp=True)
        return diagonal


class ScoredOutput(ScoresWorkspace):
    """An output kernel that reads the scores kernel's workspace w2: a program per chunk and V
    block, from the chunk's scores, G (w1) and the state entering it (w0)."""

    def build(self) -> None:
        extra = [(DECAYS, self.g_cum_type), (SCORES, self.scores_type), (STATES, self.h_type),
                 ("out", self.out_type)]
        self.define(extra, [self.out_type], [self.b, self.h, self.chunks * self.nv], self.body)

    body = OutputKernel.body


class ScoredOutputKernel(ScoredOutput, OutputKernel):
    """Every chunk's output from its scores (workspace w2), G (w1) and the state entering it (w0)."""

    def chunk_output(self, t0, state, out):
        from mlir.dialects import arith

        c, dk = self.c, self.dk
        q = self.load("q", t0, None, dk)[0]
        q_dec = self.generic([(q, TILE), (self.ws_load(self.dests[DECAYS], t0, c, dk), TILE)], self.tile_type(c, dk),
                             lambda a: self.scaled(arith.mulf(a[0], exp(a[1]))))
        o = self.matmul(self.operand(q_dec), state, zeros([c, self.bv]))
        offsets, sizes = self.chunk_scores(t0, c)
        scores = extract_slice(self.dests[SCORES], offsets, sizes, 2)
        o = self.matmul(scores, self.load("v", t0, self.v0, self.bv)[1], o)
        return self.store_rows(self.output_elements(o), t0, c, out)


class ScoredValueOutputKernel(ScoredOutput, BlockedValueOutputKernel):
    """The output kernel of "token_value_dim" from its scores A (workspace w2): a program per
    chunk and SLICE V columns at most (grid [B, H, NC * Dv / BV]). While the chunk's |G| over the
    program's columns stays under SPAN_LIMIT, its output is

        o = exp(G) * (A @ (v exp(min(-G, SPAN_LIMIT)))) + scale * (q @ S) * exp(G);

    past it (in a loop of one trip) the chunk's blocks of SUB rows one after the other
    (`BlockedValueOutputKernel.block_output`), whose 3-D diagonal blocks need BV <= SLICE.

    A comes from memory, not from a product in this kernel: on an H200 with Triton 3.6 the
    kernel that fed its own q @ k^T (rounded to bf16) to the product with v as a register
    operand got every row of a 64-row chunk after the first 16 wrong, and its interpreted
    Triton IR right."""

    def chunk_output(self, t0, state, out):
        from mlir.dialects import arith

        c, bv, g_cum = self.c, self.bv, self.dests[DECAYS]

        def by_blocks(out):
            return for_loop(self.c // SUB, [out], lambda block, values: [self.block_output(
                t0, block, self.block_start(t0, block), state, values[0], g_cum)])[0]

        cum = self.ws_load(g_cum, t0, c, bv, offset_of(self.v0))
        scores = extract_slice(self.dests[SCORES], *self.chunk_scores(t0, c), 2)
        v = self.load("v", t0, self.v0, bv)[0]
        products = self.matmul(scores, self.operand(self.undecayed(v, cum)), zeros([c, bv]))
        o = self.generic([(products, TILE), (cum, TILE)], cum.type, lambda a: arith.mulf(a[0], exp(a[1])))
        o = self.plus_decayed_state(o, self.load("q", t0, None, self.dk)[1], state, cum)
        wide = self.past_span_limit(self.chunk_span(cum))
        out = for_loop(arith.subi(index(1), wide), [out], lambda _, values: [
            self.store_rows(self.output_elements(o), t0, c, values[0])])[0]
        return for_loop(wide, [out], lambda _, values: [by_blocks(values[0])])[0]
