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
"token_dim" it depends on d, so A is one 3-D `linalg.generic` over (t, s, d) with a reduction on
d. G itself is a row sum of the masked [C, C] tile [j <= i] * g_j ("token"), `tril(ones) @ g`
("token_dim") or in closed form ("head"). `normalize` divides o by the same
quantity with v = 1: rowsum(A) + (scale * q * exp(G)) . z, z the decayed key sum.

Two forms (option `split`):

* One kernel (default; the CPU pipeline's): `attn.grid = [B, H, Dv / BV]`, a program owns one
  (batch, head) and a BV-wide column slice of V, of the state and of the output, and carries S
  (and z) through one `scf.for` over the ceil(L / C) chunks. On a CPU the programs run one after
  another anyway, and this form reads every input once and writes nothing but the outputs.
* Two or three kernels (`split`, the Triton pipeline's, as flash-linear-attention splits its chunk
  kernels). The one-kernel form leaves a GPU nearly idle: B * H * Dv / BV programs (64 for
  B = 2, H = 16, D = 128) each walk all chunks with four products per step, so its time grows with
  L. Instead `@<name>_states` (grid [B, H, Dk / BK * Dv / BV]) walks the chunks doing only the
  state update and writes the state entering each chunk to a workspace h [B, H, NC, Dk, Dv]
  (argument role "w0"), and the final state; then `@<name>` (grid [B, H, NC * Dv / BV]) computes
  every chunk's output in parallel from its q, k, v and h[chunk]. The workspace costs one write
  and one read of NC * Dk * Dv elements per head, far less than the sequential time it removes.
  Decays that need a cumulative sum ("token", "token_dim") get a third kernel first,
  `@<name>_decays` (grid [B, H, NC]), writing every chunk's G to workspace "w1", so the
  chunk-state loop loads G instead of summing it: its reductions, in the loop, set the time of
  every step (on an H200, simple GLA's chunk states took 0.30 ms at L = 8192 summing in the loop
  and 0.085 ms loading). "head" needs none: G_t = min(t + 1, n) g_h in closed form. The
  "token_dim" output kernel works in blocks of SUB rows (`store_output_by_subchunks`).
  `normalize` keeps the one-kernel form: its key sum z would need a second workspace written by
  every V-column program alike, for a variant (the normalized linear transformer) that is not
  bound by this.

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
initial state and closure tensors in order, "w0" and "w1" the workspaces, "out", "state"); a
module of several kernels runs them in module order.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..core.regions import float_literal
from ..core.regions import emit_scalar, from_region
from . import ModulePass, option
from .l1_text import KernelText, convert, elt, fail, kernel_function, ops_named, replace_function, shape

DECAYS = ("none", "head", "token", "token_dim")
ROLES_ATTR = "attn.arg_roles"
# The "token_dim" output kernel's row blocks (the smallest tile tt.dot takes) and the widest Dk
# slice of its 3-D diagonal blocks: SUB * SUB * SLICE f32 values are 64 registers per thread of
# a 4-warp program.
SUB = 16
SLICE = 32


def value_block(dv: int, block_v: int) -> int:
    """The columns per program: the widest equal split of dv no wider than block_v; the whole
    of dv when every such split is narrower than block_v / 2 (a prime dv, say), which would
    leave tiles too thin to be worth a program each."""
    if dv <= block_v:
        return dv
    parts = -(-dv // block_v)
    while dv % parts:
        parts += 1
    width = dv // parts
    return width if 2 * width >= block_v else dv


class _Kernel(KernelText):
    """One kernel function of the rewrite; `form` is "fused", "states" or "outputs"."""

    def __init__(self, op, func, chunk: int, block_v: int, block_k: int, form: str):
        super().__init__(op, func)
        seg = [int(x) for x in op.attributes["operandSegmentSizes"]]
        operands = list(op.operands)
        self.q, self.k, self.v = operands[:3]
        rest = operands[3:]
        self.g = rest.pop(0) if seg[3] else None
        self.s0 = rest.pop(0) if seg[4] else None
        self.b, self.h, self.l, self.dk = shape(self.q)
        self.dv = shape(self.v)[3]
        self.c = chunk
        self.chunks = -(-self.l // chunk)
        self.bv = value_block(self.dv, block_v)
        self.nv = self.dv // self.bv
        self.bk = value_block(self.dk, block_k) if form == "states" else self.dk
        self.nk = self.dk // self.bk
        self.form = form
        self.decay = op.attributes["decay"].value
        if self.decay not in DECAYS:
            raise fail(op, f"unknown decay kind '{self.decay}' (expected one of {', '.join(DECAYS)})")
        if (self.decay == "none") != (self.g is None):
            raise fail(op, f"decay '{self.decay}' {'takes no' if self.g is not None else 'needs a'} g operand")
        self.scale = float(op.attributes["scale"].value)
        self.normalize = bool(op.attributes["normalize"].value)
        self.mods = [from_region(r) for r in op.regions]
        self.out_elt = elt(op.results[0])
        q_elt = elt(self.q)
        self.dot_elt = q_elt if q_elt in ("bf16", "f16") else "f32"
        # With L a multiple of C no row is ever padding, and the masks for it disappear.
        self.ragged = self.l % self.c != 0
        self.out_type, self.state_type = str(op.results[0].type), str(op.results[1].type)
        self.h_type = (f"tensor<{self.b}x{self.h}x{self.chunks}x{self.dk}x{self.dv}x{self.dot_elt}>"
                       if form != "fused" else None)
        # The split form's chunk-local cumulative log-decays G, for the decays that need a sum.
        cum_shape = {"token": f"{self.b}x{self.h}x{self.l}", "token_dim": f"{self.b}x{self.h}x{self.l}x{self.dk}"}
        self.g_cum_type = (f"tensor<{cum_shape[self.decay]}xf32>"
                           if form != "fused" and self.decay in cum_shape else None)

    # --- helpers -----------------------------------------------------------------------------
    def index_const(self, inner, n: int) -> str:
        return inner(f"arith.constant {n} : index")

    def tile_type(self, rows: int, cols: int, elt_: str = "f32") -> str:
        return f"tensor<{rows}x{cols}x{elt_}>"

    def modded(self, tile: str, elt_: str, cols: int, program, t0: str, col0: str | None,
               zero_pad: bool, rows: int | None = None) -> str:
        """The f32 tile mod(x, b, h, t, d) of a loaded [rows (C), cols] tile (identity without a mod).
        Padded rows read closure tensors at t = L - 1 (never out of bounds); with `zero_pad` their
        result is forced to 0, because a mod (elu + 1, say) can turn zero padding into non-zero."""
        if program is None and elt_ == "f32":
            return tile
        zero_pad = zero_pad and program is not None and self.ragged

        def body(inner, a):
            x = convert(inner, a[0], elt_, "f32")
            if program is None:
                return x
            i = inner("linalg.index 0 : index")
            j = inner("linalg.index 1 : index")
            t = inner(f"arith.addi {t0}, {i} : index")
            tc = t
            if self.ragged:
                tc = inner(f"arith.minsi {t}, {self.index_const(inner, self.l - 1)} : index")
            d = j if col0 is None else inner(f"arith.addi {col0}, {j} : index")
            y = emit_scalar(program, [x, self.pb, self.ph, tc, d], inner, self.externals(program, inner))
            if zero_pad:
                keep = inner(f"arith.cmpi slt, {t}, {self.index_const(inner, self.l)} : index")
                y = _or_zero(inner, keep, y)
            return y

        rows = rows or self.c
        return self.generic([(tile, self.tile_type(rows, cols, elt_), "(d0, d1)")],
                            self.tile_type(rows, cols), body)

    def operand(self, value: str, rows: int, cols: int) -> str:
        """An f32 tile as a matmul operand: rounded to the dot type (16-bit inputs)."""
        if self.dot_elt == "f32":
            return value
        return self.generic([(value, self.tile_type(rows, cols), "(d0, d1)")], self.tile_type(rows, cols, self.dot_elt),
                            lambda inner, a: convert(inner, a[0], "f32", self.dot_elt))

    def load(self, role: str, t0: str, col: str | None, width: int, rows: int | None = None) -> tuple[str, str]:
        """(f32 tile, matmul operand) of rows [t0, t0 + rows (C)) and columns [col, col + width) of
        q, k or v, modded; k and v rows past L are zero (they would enter the state), q's are
        never stored. Without a mod a 16-bit tile is its own operand."""
        value = {"q": self.q, "k": self.k, "v": self.v}[role]
        mod = self.mods["qkv".index(role)]
        rows = rows or self.c
        raw = self.load_tile(self.arg_name(value, role), str(value.type), elt(value), [self.pb, self.ph], t0, self.l,
                             rows, width, col or "0", past_end=rows != self.c)
        tile = self.modded(raw, elt(value), width, mod, t0, col, role != "q", rows)
        if mod is None and elt(value) == self.dot_elt:
            return tile, raw
        return tile, self.operand(tile, rows, width)

    def pair_mask(self, inner) -> str:
        """In a body over (t, s, ...): s <= t."""
        i = inner("linalg.index 0 : index")
        j = inner("linalg.index 1 : index")
        return inner(f"arith.cmpi sle, {j}, {i} : index")

    def safe_exp(self, inner, keep: str, hi: str, lo: str, clamp: bool = False) -> str:
        """exp(hi - lo) where `keep`, and exp(0) elsewhere: a masked pair's exponent may be large
        and positive, so it is never evaluated; with `clamp`, exponents above 0 (padded rows
        whose G was loaded as 0) count as 0."""
        diff = inner(f"arith.subf {hi}, {lo} : f32")
        zero = inner("arith.constant 0.0 : f32")
        exponent = inner(f"arith.select {keep}, {diff}, {zero} : f32")
        if clamp:
            exponent = inner(f"arith.minimumf {exponent}, {zero} : f32")
        return inner(f"math.exp {exponent} : f32")

    def last_of(self, cum: str, cum_type: str, cum_map: str, rows: int, cols: int | None = None) -> str:
        """[rows] values of the last column of cum viewed as a [rows, cols (C)] tile through
        `cum_map` (the chunk's total log-decay G_end): a row sum with every other column masked,
        so the value is bitwise cum's last entry and G_end - G is exactly 0 at the chunk's end."""
        c = cols or self.c

        def pick(inner, a):
            j = inner("linalg.index 1 : index")
            return _or_zero(inner, inner(f"arith.cmpi eq, {j}, {self.index_const(inner, c - 1)} : index"), a[0])

        picked = self.generic([(cum, cum_type, cum_map)], self.tile_type(rows, c), pick)
        return self.row_sum(picked, rows, c)

    # --- decay -------------------------------------------------------------------------------
    def decays(self, t0: str, k_col: str | None, width: int, g_cum: str | None = None):
        """The chunk's cumulative log-decay for k columns [k_col, k_col + width): (G, G's type and
        map over a [C, width] tile, G_end over C rows and its map, G_end [width]), or None.
        With `g_cum` (the cumulative-decay workspace) G is loaded and G_end read from it."""
        if g_cum is not None:
            return self.loaded_decays(t0, k_col, width, g_cum)
        if self.decay in ("head", "token"):
            cum, end_c, end_k = self.scalar_decay(t0, width)
            return cum, f"tensor<{self.c}xf32>", "(d0)", end_c, f"tensor<{self.c}xf32>", "(d0)", end_k
        if self.decay == "token_dim":
            cum, end_k = self.dim_decay(t0, k_col, width)
            vec = f"tensor<{width}xf32>"
            return cum, self.tile_type(self.c, width), "(d0, d1)", end_k, vec, "(d1)", end_k
        return None

    def loaded_decays(self, t0: str, k_col: str | None, width: int, g_cum: str):
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
            return cum, vec, "(d0)", end_c, vec, "(d0)", end_k

        def end_row(inner, a):
            d = inner("linalg.index 0 : index")
            if k_col is not None:
                d = inner(f"arith.addi {k_col}, {d} : index")
            return inner(f"tensor.extract {g_cum}[{self.pb}, {self.ph}, {last}, {d}] : {self.g_cum_type}")

        cum = self.load_tile(g_cum, self.g_cum_type, "f32", [self.pb, self.ph], t0, self.l, c, width, k_col or "0")
        vec = f"tensor<{width}xf32>"
        end_k = self.generic([], vec, end_row, rank=1)
        return cum, self.tile_type(c, width), "(d0, d1)", end_k, vec, "(d1)", end_k

    def scalar_decay(self, t0: str, width: int) -> tuple[str, str, str]:
        """(G [C], G_end [C], G_end [width]) for the "head" and "token" decays."""
        c = self.c
        g_name, g_type, g_elt = self.arg_name(self.g, "g"), str(self.g.type), elt(self.g)
        vec = f"tensor<{c}xf32>"
        if self.decay == "head":
            return self.head_decay(t0, width)
        if self.decay == "token":
            steps = self.load_tile(g_name, g_type, g_elt, [self.pb, self.ph], t0, self.l, c, None)
            steps_type = f"tensor<{c}x{g_elt}>"
        else:
            def head(inner, a):
                raw = inner(f"tensor.extract {g_name}[{self.ph}] : {g_type}")
                value = convert(inner, raw, g_elt, "f32")
                if not self.ragged:
                    return value
                i = inner("linalg.index 0 : index")
                t = inner(f"arith.addi {t0}, {i} : index")
                keep = inner(f"arith.cmpi slt, {t}, {self.index_const(inner, self.l)} : index")
                return _or_zero(inner, keep, value)

            steps = self.generic([], vec, head, rank=1)
            steps_type, g_elt = vec, "f32"

        def prefix(inner, a):
            return _or_zero(inner, self.pair_mask(inner), convert(inner, a[0], g_elt, "f32"))

        tri = self.generic([(steps, steps_type, "(d1)")], self.tile_type(c, c), prefix)
        cum = self.row_sum(tri, c, c)
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
        """(G [C, width], G_end [width]) for the "token_dim" decay."""
        c = self.c
        g_name, g_type, g_elt = self.arg_name(self.g, "g"), str(self.g.type), elt(self.g)
        steps = self.load_tile(g_name, g_type, g_elt, [self.pb, self.ph], t0, self.l, c, width, col or "0")
        steps = self.modded(steps, g_elt, width, None, t0, None, False)
        cum = self.matmul(self.tril, self.tile_type(c, c), steps, self.tile_type(c, width),
                          self.zeros(self.tile_type(c, width)), self.tile_type(c, width), "tf32x3")
        cum_t = self.transpose(cum, c, width)
        return cum, self.last_of(cum_t, self.tile_type(width, c), "(d0, d1)", width)

    # --- kernels -----------------------------------------------------------------------------
    def program_ids(self, sums: bool = True) -> str:
        """Emit the kernel's prologue: the program ids (returning the third axis's) and, for the
        "token_dim" decay of a kernel that `sums` g along chunks, the lower-triangular ones that
        do it, built once."""
        self.pb = self.em('"attn.program_id"() {axis = 0 : i64} : () -> index')
        self.ph = self.em('"attn.program_id"() {axis = 1 : i64} : () -> index')
        third = self.em('"attn.program_id"() {axis = 2 : i64} : () -> index')
        if self.decay == "token_dim" and sums:
            self.tril = self.generic([], self.tile_type(self.c, self.c), lambda inner, a: inner(
                f"arith.select {self.pair_mask(inner)}, {inner('arith.constant 1.0 : f32')}, "
                f"{inner('arith.constant 0.0 : f32')} : f32"))
        return third

    def split_id(self, pid: str) -> tuple[str, str | None]:
        """(pid / nv, first V column or None) of a third-axis id that enumerates (x, V block)."""
        if self.nv == 1:
            return pid, None
        em = self.em
        outer = em(f"arith.divsi {pid}, {self.idx(self.nv)} : index")
        block = em(f"arith.remsi {pid}, {self.idx(self.nv)} : index")
        return outer, em(f"arith.muli {block}, {self.idx(self.bv)} : index")

    def initial_state(self, k0: str | None, v0: str | None) -> str:
        em = self.em
        s_type = self.tile_type(self.bk, self.bv)
        if self.s0 is None:
            return self.zeros(s_type)
        s0_elt = elt(self.s0)
        raw = em(f"tensor.extract_slice {self.arg_name(self.s0, 'initial_state')}[{self.pb}, {self.ph}, {k0 or 0}, "
                 f"{v0 or 0}] [1, 1, {self.bk}, {self.bv}] [1, 1, 1, 1] : {self.s0.type} to "
                 f"{self.tile_type(self.bk, self.bv, s0_elt)}")
        if s0_elt == "f32":
            return raw
        return self.generic([(raw, self.tile_type(self.bk, self.bv, s0_elt), "(d0, d1)")], s_type,
                            lambda inner, a: convert(inner, a[0], s0_elt, "f32"))

    def chunk_loop(self, carried: list[tuple[str, str]], step) -> list[str]:
        """scf.for over the chunks carrying `carried` (value, type); `step(t0, names)` emits one
        chunk and returns the new values."""
        em = self.em
        it = f"%chunk{em.count}"
        names = [f"%carry{em.count}_{i}" for i in range(len(carried))]
        types = [t for _, t in carried]
        results = em.results(
            len(carried),
            f"scf.for {it} = {self.idx(0)} to {self.idx(self.chunks)} step {self.idx(1)} iter_args("
            + ", ".join(f"{n} = {v}" for n, (v, _) in zip(names, carried))
            + f") -> ({', '.join(types)}) {{",
        )
        t0 = em(f"arith.muli {it}, {self.idx(self.c)} : index")
        new = step(it, t0, names)
        em.raw(f"scf.yield {', '.join(new)} : {', '.join(types)}")
        em.raw("}")
        return results

    def function(self, name: str, extra: list[tuple[str, str]], results: list[tuple[str, str]],
                 grid: list[int]) -> str:
        """The kernel function text around the emitted body: the L0 inputs, then `extra`
        (role, type) arguments, returning `results` (value, type)."""
        args = self.func_args
        n_cap = len(args) - 3
        roles = ["q", "k", "v"] + [f"c{i}" for i in range(n_cap)] + [r for r, _ in extra]
        params = [f"%arg{i}: {a.type}" for i, a in enumerate(args)]
        params += [f"%arg{len(args) + i}: {t}" for i, (_, t) in enumerate(extra)]
        types = ", ".join(t for _, t in results)
        self.em.raw(f"return {', '.join(v for v, _ in results)} : {types}")
        body = "\n".join(f"    {line}" for line in self.em.lines)
        role_list = ", ".join(f'"{r}"' for r in roles)
        return (f"func.func @{name}({', '.join(params)}) -> ({types}) attributes "
                f"{{attn.grid = array<i64: {', '.join(map(str, grid))}>, attn.chunk_size = {self.c} : i64, "
                f"attn.block_v = {self.bv} : i64, {ROLES_ATTR} = [{role_list}]}} {{\n{body}\n}}\n")

    def dest(self, offset: int) -> str:
        """The name of the destination argument `offset` places after the L0 inputs."""
        return f"%arg{len(self.func_args) + offset}"

    def build(self) -> str:
        name = self.func.attributes["sym_name"].value
        return {"fused": self.build_fused, "cumulative": self.build_cumulative, "states": self.build_states,
                "outputs": self.build_outputs}[self.form](name)

    def build_fused(self, name: str) -> str:
        em = self.em
        dk, bv = self.dk, self.bv
        out_arg, state_arg = self.dest(0), self.dest(1)
        pv = self.program_ids()
        self.v0 = em(f"arith.muli {pv}, {self.idx(bv)} : index") if self.nv > 1 else None
        carried = [(self.initial_state(None, self.v0), self.tile_type(dk, bv))]
        if self.normalize:
            carried.append((self.zeros(f"tensor<{dk}xf32>"), f"tensor<{dk}xf32>"))
        carried.append((out_arg, self.out_type))

        def step(it, t0, names):
            state, out = names[0], names[-1]
            z = names[1] if self.normalize else None
            q, k, v = self.load("q", t0, None, dk), self.load("k", t0, None, dk), self.load("v", t0, self.v0, bv)
            decay = self.decays(t0, None, dk)
            out = self.store_output(t0, q, k, v, decay, self.operand(state, dk, bv), z, out)
            new = [self.next_state(state, k, v, decay, dk)]
            if self.normalize:
                new.append(self.next_key_sum(z, k, decay))
            return new + [out]

        results = self.chunk_loop(carried, step)
        final = em(f"tensor.insert_slice {results[0]} into {state_arg}[{self.pb}, {self.ph}, 0, {self.v0 or 0}] "
                   f"[1, 1, {dk}, {bv}] [1, 1, 1, 1] : {self.tile_type(dk, bv)} into {self.state_type}")
        return self.function(name, [("out", self.out_type), ("state", self.state_type)],
                             [(results[-1], self.out_type), (final, self.state_type)], [self.b, self.h, self.nv])

    def build_cumulative(self, name: str) -> str:
        """The chunk-local cumulative log-decays G of every chunk, in parallel: the sums the
        chunk-state kernel would otherwise do inside its sequential loop, where their reductions
        lengthen every step (simple GLA at L = 8192 on an H200: 0.30 ms there, against 0.08 ms
        for the closed-form head decay)."""
        em = self.em
        it = self.program_ids()
        t0 = em(f"arith.muli {it}, {self.idx(self.c)} : index")
        cum = self.decays(t0, None, self.dk)[0]
        rows = self.rows_left(t0, self.l, self.c)
        dest = self.dest(0)
        if self.decay == "token":
            piece = em(f"tensor.extract_slice {cum}[0] [{rows}] [1] : tensor<{self.c}xf32> to tensor<?xf32>")
            out = em(f"tensor.insert_slice {piece} into {dest}[{self.pb}, {self.ph}, {t0}] [1, 1, {rows}] [1, 1, 1] "
                     f": tensor<?xf32> into {self.g_cum_type}")
        else:
            piece = em(f"tensor.extract_slice {cum}[0, 0] [{rows}, {self.dk}] [1, 1] : {self.tile_type(self.c, self.dk)} "
                       f"to tensor<?x{self.dk}xf32>")
            out = em(f"tensor.insert_slice {piece} into {dest}[{self.pb}, {self.ph}, {t0}, 0] [1, 1, {rows}, {self.dk}] "
                     f"[1, 1, 1, 1] : tensor<?x{self.dk}xf32> into {self.g_cum_type}")
        return self.function(f"{name}_decays", [("w1", self.g_cum_type)], [(out, self.g_cum_type)],
                             [self.b, self.h, self.chunks])

    def build_states(self, name: str) -> str:
        em = self.em
        bk, bv = self.bk, self.bv
        g_cum = self.dest(0) if self.g_cum_type else None
        h_arg, state_arg = self.dest(1 if g_cum else 0), self.dest(2 if g_cum else 1)
        kb, self.v0 = self.split_id(self.program_ids(sums=self.g_cum_type is None))
        k0 = em(f"arith.muli {kb}, {self.idx(bk)} : index") if self.nk > 1 else None
        s_type = self.tile_type(bk, bv)

        def step(it, t0, names):
            state, h = names
            snapshot = self.operand(state, bk, bv)
            h = em(f"tensor.insert_slice {snapshot} into {h}[{self.pb}, {self.ph}, {it}, {k0 or 0}, {self.v0 or 0}] "
                   f"[1, 1, 1, {bk}, {bv}] [1, 1, 1, 1, 1] : {self.tile_type(bk, bv, self.dot_elt)} into {self.h_type}")
            k, v = self.load("k", t0, k0, bk), self.load("v", t0, self.v0, bv)
            return [self.next_state(state, k, v, self.decays(t0, k0, bk, g_cum), bk), h]

        results = self.chunk_loop([(self.initial_state(k0, self.v0), s_type), (h_arg, self.h_type)], step)
        final = em(f"tensor.insert_slice {results[0]} into {state_arg}[{self.pb}, {self.ph}, {k0 or 0}, "
                   f"{self.v0 or 0}] [1, 1, {bk}, {bv}] [1, 1, 1, 1] : {s_type} into {self.state_type}")
        extra = ([("w1", self.g_cum_type)] if g_cum else []) + [("w0", self.h_type), ("state", self.state_type)]
        return self.function(f"{name}_states", extra,
                             [(results[1], self.h_type), (final, self.state_type)],
                             [self.b, self.h, self.nk * self.nv])

    def build_outputs(self, name: str) -> str:
        em = self.em
        dk, bv = self.dk, self.bv
        by_rows = self.decay == "token_dim" and self.c % SUB == 0 and self.c > SUB
        g_cum = self.dest(0) if by_rows else None
        h_arg, out_arg = self.dest(1 if by_rows else 0), self.dest(2 if by_rows else 1)
        it, self.v0 = self.split_id(self.program_ids(sums=not by_rows))
        t0 = em(f"arith.muli {it}, {self.idx(self.c)} : index")
        state = em(f"tensor.extract_slice {h_arg}[{self.pb}, {self.ph}, {it}, 0, {self.v0 or 0}] [1, 1, 1, {dk}, {bv}] "
                   f"[1, 1, 1, 1, 1] : {self.h_type} to {self.tile_type(dk, bv, self.dot_elt)}")
        if by_rows:
            out = self.store_output_by_subchunks(t0, state, out_arg, g_cum)
        else:
            q, k, v = self.load("q", t0, None, dk), self.load("k", t0, None, dk), self.load("v", t0, self.v0, bv)
            out = self.store_output(t0, q, k, v, self.decays(t0, None, dk), state, None, out_arg)
        extra = ([("w1", self.g_cum_type)] if by_rows else []) + [("w0", self.h_type), ("out", self.out_type)]
        return self.function(name, extra, [(out, self.out_type)], [self.b, self.h, self.chunks * self.nv])

    # --- one chunk ---------------------------------------------------------------------------
    def scaled(self, inner, x: str) -> str:
        return inner(f"arith.mulf {x}, {inner(f'arith.constant {float_literal(self.scale)} : f32')} : f32")

    def store_output(self, t0: str, q, k, v, decay, state: str, z: str | None, out: str) -> str:
        """Insert the chunk's output rows o = A @ v + (scale * q * exp(G)) @ S (normalized with z)
        into `out`; `state` is S [Dk, BV] as a matmul operand."""
        c, dk, bv = self.c, self.dk, self.bv
        (q, q_op), (k, k_op), (v, v_op) = q, k, v
        cd, cc, cb = self.tile_type(c, dk), self.tile_type(c, c), self.tile_type(c, bv)
        dot_cd, dot_cc = self.tile_type(c, dk, self.dot_elt), self.tile_type(c, c, self.dot_elt)

        # A: the causal, decayed, scaled scores of the chunk.
        if self.decay == "token_dim":
            cum = decay[0]

            def decayed_dot(inner, a):
                keep = self.pair_mask(inner)
                factor = self.safe_exp(inner, keep, a[2], a[3])
                term = inner(f"arith.mulf {inner(f'arith.mulf {a[0]}, {a[1]} : f32')}, {factor} : f32")
                term = _or_zero(inner, keep, self.scaled(inner, term))
                return inner(f"arith.addf {a[4]}, {term} : f32")

            scores = self.generic(
                [(q, cd, "(d0, d2)"), (k, cd, "(d1, d2)"), (cum, cd, "(d0, d2)"), (cum, cd, "(d1, d2)")],
                cc, decayed_dot, rank=3, iterators=["parallel", "parallel", "reduction"],
                init=self.zeros(cc), out_map="(d0, d1)")
        else:
            k_t = self.transpose(k_op, c, dk, self.dot_elt)
            qk = self.matmul(q_op, dot_cd, k_t, self.tile_type(dk, c, self.dot_elt), self.zeros(cc), cc)
            ins = [(qk, cc, "(d0, d1)")]
            if decay is not None:
                ins += [(decay[0], decay[1], "(d0)"), (decay[0], decay[1], "(d1)")]

            def causal(inner, a):
                keep = self.pair_mask(inner)
                x = self.scaled(inner, a[0])
                if decay is not None:
                    x = inner(f"arith.mulf {x}, {self.safe_exp(inner, keep, a[1], a[2])} : f32")
                return _or_zero(inner, keep, x)

            scores = self.generic(ins, cc, causal)

        o = self.matmul(self.operand(scores, c, c), dot_cc, v_op, self.tile_type(c, bv, self.dot_elt),
                        self.zeros(cb), cb)
        if decay is None:
            q_dec = self.generic([(q, cd, "(d0, d1)")], cd, lambda inner, a: self.scaled(inner, a[0]))
        else:
            q_dec = self.generic([(q, cd, "(d0, d1)"), (decay[0], decay[1], decay[2])], cd, lambda inner, a: self.scaled(
                inner, inner(f"arith.mulf {a[0]}, {_exp(inner, a[1])} : f32")))
        o = self.matmul(self.operand(q_dec, c, dk), dot_cd, state, self.tile_type(dk, bv, self.dot_elt), o, cb)

        if self.normalize:
            den_intra = self.row_sum(scores, c, c)
            vec_k = f"tensor<{dk}xf32>"
            qz = self.generic([(q_dec, cd, "(d0, d1)"), (z, vec_k, "(d1)")], cd,
                              lambda inner, a: inner(f"arith.mulf {a[0]}, {a[1]} : f32"))
            den_inter = self.row_sum(qz, c, dk)

            def divide(inner, a):
                den = inner(f"arith.addf {a[1]}, {a[2]} : f32")
                return convert(inner, inner(f"arith.divf {a[0]}, {den} : f32"), "f32", self.out_elt)

            vec_c = f"tensor<{c}xf32>"
            o = self.generic([(o, cb, "(d0, d1)"), (den_intra, vec_c, "(d0)"), (den_inter, vec_c, "(d0)")],
                             self.tile_type(c, bv, self.out_elt), divide)
        elif self.out_elt != "f32":
            o = self.generic([(o, cb, "(d0, d1)")], self.tile_type(c, bv, self.out_elt),
                             lambda inner, a: convert(inner, a[0], "f32", self.out_elt))
        return self.store_rows(o, t0, c, out)

    def store_rows(self, o: str, t0: str, rows: int, out: str) -> str:
        """Insert the rows of the [rows, BV] output tile o that lie before L into `out` at t0."""
        em, bv = self.em, self.bv
        valid = self.rows_left(t0, self.l, rows, past_end=rows != self.c)
        if rows != self.c:
            t0 = em(f"arith.minsi {t0}, {self.idx(self.l)} : index")
        o_rows = em(f"tensor.extract_slice {o}[0, 0] [{valid}, {bv}] [1, 1] : {self.tile_type(rows, bv, self.out_elt)} "
                    f"to tensor<?x{bv}x{self.out_elt}>")
        return em(f"tensor.insert_slice {o_rows} into {out}[{self.pb}, {self.ph}, {t0}, {self.v0 or 0}] "
                  f"[1, 1, {valid}, {bv}] [1, 1, 1, 1] : tensor<?x{bv}x{self.out_elt}> into {self.out_type}")

    def store_output_by_subchunks(self, t0: str, state: str, out: str, g_cum: str) -> str:
        """The "token_dim" output of one chunk, SUB rows at a time, as flash-linear-attention's
        GLA kernels compute it: the 3-D scores of the one-kernel form cost C * C * Dk exponentials
        and as many registers, more than a GPU program holds at C = 64, Dk = 128.

        G comes from the cumulative-decay workspace `g_cum`. With the chunk cut into blocks I of
        SUB rows and R_I the row of G just before block I, a pair of blocks J < I factorizes at
        that boundary safely:

            A_IJ = scale * (q_I exp(G_I - R_I)) @ (k_J exp(R_I - G_J))^T,

        both exponents <= 0 (decays only shrink G), on tensor cores. Only the SUB x SUB diagonal
        blocks need the 3-D form, evaluated over Dk in slices of at most SLICE columns. Then
        o_I = sum_J A_IJ @ v_J + (scale q_I exp(G_I)) @ S. The exponents are also clamped at 0:
        rows past L load G = 0, and a padded row (never stored) must not overflow either. Tiles
        are loaded where they are used, again for each block pair, rather than kept: a GPU
        program's registers hold one block's tiles, not the chunk's (and cannot be sliced)."""
        em = self.em
        dk, bv, blocks = self.dk, self.bv, self.c // SUB
        vec = f"tensor<{dk}xf32>"
        sd = self.tile_type(SUB, dk)
        dot_sd = self.tile_type(SUB, dk, self.dot_elt)
        sub_sub, sub_bv = self.tile_type(SUB, SUB), self.tile_type(SUB, bv)

        def cum(start: str, col: str | None, width: int) -> str:
            return self.load_tile(g_cum, self.g_cum_type, "f32", [self.pb, self.ph], start, self.l, SUB, width,
                                  col or "0", past_end=True)

        def decayed(inner, x: str, hi: str, lo: str | None, scale: bool) -> str:
            exponent = hi if lo is None else inner(f"arith.subf {hi}, {lo} : f32")
            if lo is not None:
                exponent = inner(f"arith.minimumf {exponent}, {inner('arith.constant 0.0 : f32')} : f32")
            y = inner(f"arith.mulf {x}, {_exp(inner, exponent)} : f32")
            return self.scaled(inner, y) if scale else y

        starts = [em(f"arith.addi {t0}, {self.idx(j * SUB)} : index") for j in range(blocks)]
        for i in range(blocks):
            q, _ = self.load("q", starts[i], None, dk, SUB)
            g_i = cum(starts[i], None, dk)
            o = self.matmul(self.operand(self.generic([(q, sd, "(d0, d1)"), (g_i, sd, "(d0, d1)")], sd,
                                                      lambda inner, a: decayed(inner, a[0], a[1], None, True)),
                                         SUB, dk),
                            dot_sd, state, self.tile_type(dk, bv, self.dot_elt), self.zeros(sub_bv), sub_bv)
            if i:
                before = em(f"arith.minsi {em(f'arith.subi {starts[i]}, {self.idx(1)} : index')}, "
                            f"{self.idx(self.l - 1)} : index")
                boundary = self.generic([], vec, lambda inner, a: inner(
                    f"tensor.extract {g_cum}[{self.pb}, {self.ph}, {before}, {inner('linalg.index 0 : index')}] "
                    f": {self.g_cum_type}"), rank=1)
                q_local = self.operand(self.generic(
                    [(q, sd, "(d0, d1)"), (g_i, sd, "(d0, d1)"), (boundary, vec, "(d1)")], sd,
                    lambda inner, a: decayed(inner, a[0], a[1], a[2], True)), SUB, dk)
            for j in range(i):
                k_j, _ = self.load("k", starts[j], None, dk, SUB)
                k_dec = self.generic([(k_j, sd, "(d0, d1)"), (cum(starts[j], None, dk), sd, "(d0, d1)"),
                                      (boundary, vec, "(d1)")], sd,
                                     lambda inner, a: decayed(inner, a[0], a[2], a[1], False))
                k_t = self.transpose(self.operand(k_dec, SUB, dk), SUB, dk, self.dot_elt)
                scores = self.matmul(q_local, dot_sd, k_t, self.tile_type(dk, SUB, self.dot_elt),
                                     self.zeros(sub_sub), sub_sub)
                o = self.matmul(self.operand(scores, SUB, SUB), self.tile_type(SUB, SUB, self.dot_elt),
                                self.load("v", starts[j], self.v0, bv, SUB)[1], self.tile_type(SUB, bv, self.dot_elt),
                                o, sub_bv)

            diagonal = self.zeros(sub_sub)
            width = value_block(dk, SLICE)
            for col in range(0, dk, width):
                if width == dk:
                    q_s, g_s = q, g_i
                    k_s = self.load("k", starts[i], None, dk, SUB)[0]
                else:
                    c0 = self.idx(col)
                    q_s = self.load("q", starts[i], c0, width, SUB)[0]
                    k_s = self.load("k", starts[i], c0, width, SUB)[0]
                    g_s = cum(starts[i], c0, width)
                diagonal = self.diagonal_scores(q_s, k_s, g_s, width, diagonal)
            o = self.matmul(self.operand(diagonal, SUB, SUB), self.tile_type(SUB, SUB, self.dot_elt),
                            self.load("v", starts[i], self.v0, bv, SUB)[1], self.tile_type(SUB, bv, self.dot_elt),
                            o, sub_bv)
            if self.out_elt != "f32":
                o = self.generic([(o, sub_bv, "(d0, d1)")], self.tile_type(SUB, bv, self.out_elt),
                                 lambda inner, a: convert(inner, a[0], "f32", self.out_elt))
            out = self.store_rows(o, starts[i], SUB, out)
        return out

    def diagonal_scores(self, q: str, k: str, cum: str, width: int, acc: str) -> str:
        """acc + scale * [s <= t] * sum_d q[t,d] k[s,d] exp(cum[t,d] - cum[s,d]) over a [SUB, width]
        slice: the 3-D form, on one diagonal block."""
        sd = self.tile_type(SUB, width)

        def body(inner, a):
            keep = self.pair_mask(inner)
            factor = self.safe_exp(inner, keep, a[2], a[3], clamp=True)
            term = inner(f"arith.mulf {inner(f'arith.mulf {a[0]}, {a[1]} : f32')}, {factor} : f32")
            term = _or_zero(inner, keep, self.scaled(inner, term))
            return inner(f"arith.addf {a[4]}, {term} : f32")

        return self.generic([(q, sd, "(d0, d2)"), (k, sd, "(d1, d2)"), (cum, sd, "(d0, d2)"), (cum, sd, "(d1, d2)")],
                            self.tile_type(SUB, SUB), body, rank=3, iterators=["parallel", "parallel", "reduction"],
                            init=acc, out_map="(d0, d1)")

    def decayed_keys(self, k: str, decay, width: int) -> str:
        """k * exp(G_end - G) [C, width] (f32)."""
        cd = self.tile_type(self.c, width)
        return self.generic([(k, cd, "(d0, d1)"), (decay[0], decay[1], decay[2]), (decay[3], decay[4], decay[5])], cd,
                            lambda inner, a: inner(f"arith.mulf {a[0]}, {_exp_diff(inner, a[2], a[1])} : f32"))

    def next_state(self, state: str, k, v, decay, width: int) -> str:
        """S_next = exp(G_end) * S + (k * exp(G_end - G))^T @ v, for a [width, BV] state."""
        c, bv = self.c, self.bv
        (k, k_op), (_, v_op) = k, v
        db = self.tile_type(width, bv)
        if decay is None:
            k_dec = k_op
        else:
            k_dec = self.operand(self.decayed_keys(k, decay, width), c, width)
            # In place: a fresh tile per chunk would make bufferization allocate one per iteration.
            state = self.generic([(decay[6], f"tensor<{width}xf32>", "(d0)")], db,
                                 lambda inner, a: inner(f"arith.mulf {a[1]}, {_exp(inner, a[0])} : f32"), init=state)
        k_dec_t = self.transpose(k_dec, c, width, self.dot_elt)
        return self.matmul(k_dec_t, self.tile_type(width, c, self.dot_elt), v_op,
                           self.tile_type(c, bv, self.dot_elt), state, db)

    def next_key_sum(self, z: str, k, decay) -> str:
        """z_next = exp(G_end) * z + sum_t k[t] * exp(G_end - G_t) (the state update with v = 1)."""
        c, dk = self.c, self.dk
        vec_k = f"tensor<{dk}xf32>"
        k_dec = k[0] if decay is None else self.decayed_keys(k[0], decay, dk)
        k_sum = self.row_sum(self.transpose(k_dec, c, dk), dk, c)
        if decay is None:
            return self.generic([(k_sum, vec_k, "(d0)")], vec_k,
                                lambda inner, a: inner(f"arith.addf {a[1]}, {a[0]} : f32"), rank=1, init=z)
        return self.generic([(decay[6], vec_k, "(d0)"), (k_sum, vec_k, "(d0)")], vec_k,
                            lambda inner, a: inner(f"arith.addf {inner(f'arith.mulf {a[2]}, {_exp(inner, a[0])} : f32')}, "
                                                   f"{a[1]} : f32"), rank=1, init=z)


def _or_zero(inner, keep: str, x: str) -> str:
    return inner(f"arith.select {keep}, {x}, {inner('arith.constant 0.0 : f32')} : f32")


def _exp(inner, x: str) -> str:
    return inner(f"math.exp {x} : f32")


def _exp_diff(inner, hi: str, lo: str) -> str:
    return _exp(inner, inner(f"arith.subf {hi}, {lo} : f32"))


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
            self._rewrite(module_op, op)

    def _rewrite(self, module_op, op) -> None:
        func = kernel_function(op, "chunked")
        chunk = self.chunk_size or int(op.attributes["chunk_size"].value)
        if chunk < 1:
            raise fail(op, f"chunk_size must be positive, got {chunk}")
        forms = ["states", "outputs"] if self.split and not bool(op.attributes["normalize"].value) else ["fused"]
        if forms[0] == "states" and op.attributes["decay"].value in ("token", "token_dim"):
            forms.insert(0, "cumulative")
        text = "".join(_Kernel(op, func, chunk, self.block_v, self.block_k, form).build() for form in forms)
        replace_function(module_op, func, text, "<attn-chunk-recurrence>")
