"""`attn-chunk-recurrence`: `attn.linear_recurrence` becomes an L1 kernel walking chunks of tokens.

The kernel function keeps the inputs, takes the outputs (`out`, then the final `state`) as
destinations and returns them updated; `attn.grid = [B, H, ceil(Dv / BV)]`, so a program owns one
(batch, head) and a BV-wide column slice of V, of the state and of the output. BV divides Dv
(see `value_block`), so every slice has the same static width.

A program carries, in one `scf.for` over the ceil(L / C) chunks:

* the state tile S [Dk, BV] (f32; initial_state's slice or zeros),
* with `normalize`, the key sum z [Dk] (zeros: the reference recurrence starts z at 0),
* the output destination, into which each chunk inserts its valid rows.

Per chunk, with q, k [C, Dk] and v [C, BV] loaded zero-padded past L, the mods applied (indices
b, h, t0 + i, d) and padded rows of k and v forced back to zero, and G the cumulative log-decay
inside the chunk (G_i = g_0 + ... + g_i, padded positions have g = 0, so G_end = G_{C-1}):

    A      = scale * [s <= t] * sum_d q[t,d] k[s,d] exp(G[t,d] - G[s,d])       [C, C]
    o      = A @ v + (scale * q * exp(G)) @ S                                  [C, BV]
    S_next = exp(G_end) * S + (k * exp(G_end - G))^T @ v

Every exponent is G_t - G_s with s <= t, G_t, G_end or G_end - G_s: all <= 0 for decays g <= 0,
so nothing overflows however strong the decay (the factorization q exp(G) . k exp(-G) would). The
exponent of a pair s > t is replaced by 0 before `math.exp`, never evaluated. For scalar decays
("head", "token") the pair factor is a [C, C] tile and A is the masked, decayed `q @ k^T`; for
"token_dim" it depends on d, so A is one 3-D `linalg.generic` over (t, s, d) with a reduction on
d. G itself is a row sum of the masked [C, C] tile [j <= i] * g_j (scalar decays) or
`tril(ones) @ g` ("token_dim"). `normalize` divides o by the same quantity with v = 1:
rowsum(A) + (scale * q * exp(G)) . z.

All products run in f32 (`linalg.matmul` on f32 tiles carries `attn.precision = "ieee"`); the
output rows are converted to q's element type when stored. S and z are updated in place (they are
the outputs of the generics that decay them), so a bufferized loop keeps one buffer for each.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..frontend.emit import float_literal
from ..regions import emit_scalar, from_region
from . import ModulePass, option
from .l1_text import KernelText, convert, elt, fail, kernel_function, ops_named, replace_function, shape

DECAYS = ("none", "head", "token", "token_dim")


def value_block(dv: int, block_v: int) -> int:
    """The V columns per program: the widest equal split of Dv no wider than block_v; the whole
    of Dv when every such split is narrower than block_v / 2 (a prime Dv, say), which would
    leave tiles too thin to be worth a program each."""
    if dv <= block_v:
        return dv
    parts = -(-dv // block_v)
    while dv % parts:
        parts += 1
    width = dv // parts
    return width if 2 * width >= block_v else dv


class _Kernel(KernelText):
    def __init__(self, op, func, chunk: int, block_v: int):
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
        self.bv = value_block(self.dv, block_v)
        self.nv = self.dv // self.bv
        self.decay = op.attributes["decay"].value
        if self.decay not in DECAYS:
            raise fail(op, f"unknown decay kind '{self.decay}' (expected one of {', '.join(DECAYS)})")
        if (self.decay == "none") != (self.g is None):
            raise fail(op, f"decay '{self.decay}' {'takes no' if self.g is not None else 'needs a'} g operand")
        self.scale = float(op.attributes["scale"].value)
        self.normalize = bool(op.attributes["normalize"].value)
        self.mods = [from_region(r) for r in op.regions]
        self.out_elt = elt(op.results[0])
        # With L a multiple of C no row is ever padding, and the masks for it disappear.
        self.ragged = self.l % self.c != 0

    # --- helpers -----------------------------------------------------------------------------
    def index_const(self, inner, n: int) -> str:
        return inner(f"arith.constant {n} : index")

    def tile_type(self, rows: int, cols: int, elt_: str = "f32") -> str:
        return f"tensor<{rows}x{cols}x{elt_}>"

    def modded(self, tile: str, elt_: str, cols: int, program, t0: str, col0: str | None,
               zero_pad: bool) -> str:
        """The f32 tile mod(x, b, h, t, d) of a loaded [C, cols] tile (identity without a mod).
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

        return self.generic([(tile, self.tile_type(self.c, cols, elt_), "(d0, d1)")],
                            self.tile_type(self.c, cols), body)

    def pair_mask(self, inner) -> str:
        """In a body over (t, s, ...): s <= t."""
        i = inner("linalg.index 0 : index")
        j = inner("linalg.index 1 : index")
        return inner(f"arith.cmpi sle, {j}, {i} : index")

    def safe_exp(self, inner, keep: str, hi: str, lo: str) -> str:
        """exp(hi - lo) where `keep`, and exp(0) elsewhere: a masked pair's exponent may be large
        and positive, so it is never evaluated."""
        diff = inner(f"arith.subf {hi}, {lo} : f32")
        zero = inner("arith.constant 0.0 : f32")
        return inner(f"math.exp {inner(f'arith.select {keep}, {diff}, {zero} : f32')} : f32")

    def last_of(self, cum: str, cum_type: str, cum_map: str, rows: int) -> str:
        """[rows] values of the last column of cum viewed as a [rows, C] tile through `cum_map`
        (the chunk's total log-decay G_end): a row sum with every other column masked, so the
        value is bitwise cum's last entry and G_end - G is exactly 0 at the chunk's end."""
        c = self.c

        def pick(inner, a):
            j = inner("linalg.index 1 : index")
            return _or_zero(inner, inner(f"arith.cmpi eq, {j}, {self.index_const(inner, c - 1)} : index"), a[0])

        picked = self.generic([(cum, cum_type, cum_map)], self.tile_type(rows, c), pick)
        return self.row_sum(picked, rows, c)

    # --- decay -------------------------------------------------------------------------------
    def scalar_decay(self, t0: str) -> tuple[str, str, str]:
        """(G [C], G_end [C], G_end [Dk]) for the "head" and "token" decays."""
        c = self.c
        g_name, g_type, g_elt = self.arg_name(self.g, "g"), str(self.g.type), elt(self.g)
        vec = f"tensor<{c}xf32>"
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
        return cum, self.last_of(cum, vec, "(d1)", c), self.last_of(cum, vec, "(d1)", self.dk)

    def dim_decay(self, t0: str, tril: str) -> tuple[str, str]:
        """(G [C, Dk], G_end [Dk]) for the "token_dim" decay."""
        c, dk = self.c, self.dk
        g_name, g_type, g_elt = self.arg_name(self.g, "g"), str(self.g.type), elt(self.g)
        steps = self.load_tile(g_name, g_type, g_elt, [self.pb, self.ph], t0, self.l, c, dk)
        steps = self.modded(steps, g_elt, dk, None, t0, None, False)
        cum = self.matmul(tril, self.tile_type(c, c), steps, self.tile_type(c, dk),
                          self.zeros(self.tile_type(c, dk)), self.tile_type(c, dk))
        cum_t = self.transpose(cum, c, dk)
        return cum, self.last_of(cum_t, self.tile_type(dk, c), "(d0, d1)", dk)

    # --- the kernel --------------------------------------------------------------------------
    def build(self) -> str:
        em = self.em
        c, dk, bv = self.c, self.dk, self.bv
        args = self.func_args
        n_in = len(args)
        out_type, state_type = str(self.op.results[0].type), str(self.op.results[1].type)
        out_arg, state_arg = f"%arg{n_in}", f"%arg{n_in + 1}"

        self.pb = em('"attn.program_id"() {axis = 0 : i64} : () -> index')
        self.ph = em('"attn.program_id"() {axis = 1 : i64} : () -> index')
        pv = em('"attn.program_id"() {axis = 2 : i64} : () -> index')
        self.v0 = em(f"arith.muli {pv}, {self.idx(bv)} : index") if self.nv > 1 else None
        col0 = self.v0 or "0"

        s_type = self.tile_type(dk, bv)
        if self.s0 is not None:
            s0_elt = elt(self.s0)
            raw = em(f"tensor.extract_slice {self.arg_name(self.s0, 'initial_state')}[{self.pb}, {self.ph}, 0, "
                     f"{col0}] [1, 1, {dk}, {bv}] [1, 1, 1, 1] : {self.s0.type} to {self.tile_type(dk, bv, s0_elt)}")
            state = self.generic([(raw, self.tile_type(dk, bv, s0_elt), "(d0, d1)")], s_type,
                                 lambda inner, a: convert(inner, a[0], s0_elt, "f32")) if s0_elt != "f32" else raw
        else:
            state = self.zeros(s_type)
        carried = [(state, s_type)]
        if self.normalize:
            carried.append((self.zeros(f"tensor<{dk}xf32>"), f"tensor<{dk}xf32>"))
        carried.append((out_arg, out_type))

        tril = None
        if self.decay == "token_dim":
            tril = self.generic([], self.tile_type(c, c), lambda inner, a: inner(
                f"arith.select {self.pair_mask(inner)}, {inner('arith.constant 1.0 : f32')}, "
                f"{inner('arith.constant 0.0 : f32')} : f32"))

        chunks = -(-self.l // c)
        it = f"%chunk{em.count}"
        names = [f"%carry{em.count}_{i}" for i in range(len(carried))]
        types = [t for _, t in carried]
        results = em.results(
            len(carried),
            f"scf.for {it} = {self.idx(0)} to {self.idx(chunks)} step {self.idx(1)} iter_args("
            + ", ".join(f"{n} = {v}" for n, (v, _) in zip(names, carried))
            + f") -> ({', '.join(types)}) {{",
        )
        new = self.chunk(it, names, tril, out_type)
        em.raw(f"scf.yield {', '.join(new)} : {', '.join(types)}")
        em.raw("}")

        final_state = em(f"tensor.insert_slice {results[0]} into {state_arg}[{self.pb}, {self.ph}, 0, {col0}] "
                         f"[1, 1, {dk}, {bv}] [1, 1, 1, 1] : {s_type} into {state_type}")
        em.raw(f"return {results[-1]}, {final_state} : {out_type}, {state_type}")

        params = [f"%arg{i}: {a.type}" for i, a in enumerate(args)]
        params += [f"{out_arg}: {out_type}", f"{state_arg}: {state_type}"]
        name = self.func.attributes["sym_name"].value
        body = "\n".join(f"    {line}" for line in em.lines)
        return (f"func.func @{name}({', '.join(params)}) -> ({out_type}, {state_type}) attributes "
                f"{{attn.grid = array<i64: {self.b}, {self.h}, {self.nv}>, attn.chunk_size = {c} : i64, "
                f"attn.block_v = {bv} : i64}} {{\n{body}\n}}\n")

    def chunk(self, it: str, carried: list[str], tril: str | None, out_type: str) -> list[str]:
        em = self.em
        c, dk, bv, l = self.c, self.dk, self.bv, self.l
        state, out = carried[0], carried[-1]
        z = carried[1] if self.normalize else None
        t0 = em(f"arith.muli {it}, {self.idx(c)} : index")
        rows = em(f"arith.minsi {em(f'arith.subi {self.idx(l)}, {t0} : index')}, {self.idx(c)} : index")
        coords = [self.pb, self.ph]
        col0 = self.v0 or "0"
        q_mod, k_mod, v_mod = self.mods
        tiles = []
        # k and v rows past L must be zero (they would enter the state); q's are never stored.
        for role, value, width, mod, col, pad in (("q", self.q, dk, q_mod, "0", False),
                                                  ("k", self.k, dk, k_mod, "0", True),
                                                  ("v", self.v, bv, v_mod, col0, True)):
            raw = self.load_tile(self.arg_name(value, role), str(value.type), elt(value), coords, t0, l, c, width, col)
            tiles.append(self.modded(raw, elt(value), width, mod, t0, self.v0 if role == "v" else None, pad))
        q, k, v = tiles
        cd, cc, cb, db = (self.tile_type(c, dk), self.tile_type(c, c), self.tile_type(c, bv),
                          self.tile_type(dk, bv))
        vec_c, vec_k = f"tensor<{c}xf32>", f"tensor<{dk}xf32>"
        scale = self.scale

        def scaled(inner, x):
            return inner(f"arith.mulf {x}, {inner(f'arith.constant {float_literal(scale)} : f32')} : f32")

        # G and G_end, with the maps that broadcast them over a [C, Dk] tile of k.
        if self.decay in ("head", "token"):
            cum, end_c, end_k = self.scalar_decay(t0)
            cum_row, end_map, cum_type, end_type = "(d0)", "(d0)", vec_c, vec_c
        elif self.decay == "token_dim":
            cum, end_k = self.dim_decay(t0, tril)
            end_c = end_k
            cum_row, end_map, cum_type, end_type = "(d0, d1)", "(d1)", cd, vec_k

        # A: the causal, decayed, scaled scores of the chunk.
        if self.decay == "token_dim":
            def decayed_dot(inner, a):
                keep = self.pair_mask(inner)
                factor = self.safe_exp(inner, keep, a[2], a[3])
                term = inner(f"arith.mulf {inner(f'arith.mulf {a[0]}, {a[1]} : f32')}, {factor} : f32")
                term = _or_zero(inner, keep, scaled(inner, term))
                return inner(f"arith.addf {a[4]}, {term} : f32")

            scores = self.generic(
                [(q, cd, "(d0, d2)"), (k, cd, "(d1, d2)"), (cum, cd, "(d0, d2)"), (cum, cd, "(d1, d2)")],
                cc, decayed_dot, rank=3, iterators=["parallel", "parallel", "reduction"],
                init=self.zeros(cc), out_map="(d0, d1)")
        else:
            k_t = self.transpose(k, c, dk)
            qk = self.matmul(q, cd, k_t, self.tile_type(dk, c), self.zeros(cc), cc)
            ins = [(qk, cc, "(d0, d1)")]
            if self.decay != "none":
                ins += [(cum, vec_c, "(d0)"), (cum, vec_c, "(d1)")]

            def causal(inner, a):
                keep = self.pair_mask(inner)
                x = scaled(inner, a[0])
                if self.decay != "none":
                    x = inner(f"arith.mulf {x}, {self.safe_exp(inner, keep, a[1], a[2])} : f32")
                return _or_zero(inner, keep, x)

            scores = self.generic(ins, cc, causal)

        # o = A @ v + (scale * q * exp(G)) @ S
        o = self.matmul(scores, cc, v, cb, self.zeros(cb), cb)
        if self.decay == "none":
            q_dec = self.generic([(q, cd, "(d0, d1)")], cd, lambda inner, a: scaled(inner, a[0]))
        else:
            q_dec = self.generic([(q, cd, "(d0, d1)"), (cum, cum_type, cum_row)], cd, lambda inner, a: scaled(
                inner, inner(f"arith.mulf {a[0]}, {_exp(inner, a[1])} : f32")))
        o = self.matmul(q_dec, cd, state, db, o, cb)

        if self.normalize:
            den_intra = self.row_sum(scores, c, c)
            qz = self.generic([(q_dec, cd, "(d0, d1)"), (z, vec_k, "(d1)")], cd,
                              lambda inner, a: inner(f"arith.mulf {a[0]}, {a[1]} : f32"))
            den_inter = self.row_sum(qz, c, dk)

            def divide(inner, a):
                den = inner(f"arith.addf {a[1]}, {a[2]} : f32")
                return convert(inner, inner(f"arith.divf {a[0]}, {den} : f32"), "f32", self.out_elt)

            o = self.generic([(o, cb, "(d0, d1)"), (den_intra, vec_c, "(d0)"), (den_inter, vec_c, "(d0)")],
                             self.tile_type(c, bv, self.out_elt), divide)
        elif self.out_elt != "f32":
            o = self.generic([(o, cb, "(d0, d1)")], self.tile_type(c, bv, self.out_elt),
                             lambda inner, a: convert(inner, a[0], "f32", self.out_elt))
        o_rows = em(f"tensor.extract_slice {o}[0, 0] [{rows}, {bv}] [1, 1] : {self.tile_type(c, bv, self.out_elt)} "
                    f"to tensor<?x{bv}x{self.out_elt}>")
        out = em(f"tensor.insert_slice {o_rows} into {out}[{self.pb}, {self.ph}, {t0}, {col0}] [1, 1, {rows}, {bv}] "
                 f"[1, 1, 1, 1] : tensor<?x{bv}x{self.out_elt}> into {out_type}")

        # S_next = exp(G_end) * S + (k * exp(G_end - G))^T @ v, and z likewise with v = 1.
        if self.decay == "none":
            k_dec_t = k_t
        else:
            k_dec = self.generic([(k, cd, "(d0, d1)"), (cum, cum_type, cum_row), (end_c, end_type, end_map)], cd,
                                 lambda inner, a: inner(f"arith.mulf {a[0]}, {_exp_diff(inner, a[2], a[1])} : f32"))
            # In place: a fresh tile per chunk would make bufferization allocate one per iteration.
            state = self.generic([(end_k, vec_k, "(d0)")], db,
                                 lambda inner, a: inner(f"arith.mulf {a[1]}, {_exp(inner, a[0])} : f32"), init=state)
            k_dec_t = self.transpose(k_dec, c, dk)
        state = self.matmul(k_dec_t, self.tile_type(dk, c), v, cb, state, db)
        new = [state]
        if self.normalize:
            k_sum = self.row_sum(k_dec_t, dk, c)
            if self.decay == "none":
                z = self.generic([(k_sum, vec_k, "(d0)")], vec_k,
                                 lambda inner, a: inner(f"arith.addf {a[1]}, {a[0]} : f32"), rank=1, init=z)
            else:
                z = self.generic([(end_k, vec_k, "(d0)"), (k_sum, vec_k, "(d0)")], vec_k,
                                 lambda inner, a: inner(
                                     f"arith.addf {inner(f'arith.mulf {a[2]}, {_exp(inner, a[0])} : f32')}, "
                                     f"{a[1]} : f32"), rank=1, init=z)
            new.append(z)
        new.append(out)
        return new


def _or_zero(inner, keep: str, x: str) -> str:
    return inner(f"arith.select {keep}, {x}, {inner('arith.constant 0.0 : f32')} : f32")


def _exp(inner, x: str) -> str:
    return inner(f"math.exp {x} : f32")


def _exp_diff(inner, hi: str, lo: str) -> str:
    return _exp(inner, inner(f"arith.subf {hi}, {lo} : f32"))


@dataclass(frozen=True)
class ChunkRecurrence(ModulePass):
    name: ClassVar[str] = "attn-chunk-recurrence"
    summary: ClassVar[str] = ("Rewrite attn.linear_recurrence into an L1 kernel: a program per (batch, head, "
                              "V column block), an scf.for over chunks carrying the f32 state")

    chunk_size: int = option(0, "tokens per chunk; 0 keeps the op's chunk_size attribute")
    block_v: int = option(64, "at most this many V columns per program (the grid's third axis splits Dv)")

    def __post_init__(self):
        if self.chunk_size < 0:
            raise ValueError(f"chunk-size must be 0 (keep the op's chunk_size) or positive, got {self.chunk_size}")
        if self.block_v < 1:
            raise ValueError(f"block-v must be positive, got {self.block_v}")

    def apply(self, module_op) -> None:
        for op in ops_named(module_op, "attn.linear_recurrence"):
            self._rewrite(module_op, op)

    def _rewrite(self, module_op, op) -> None:
        func = kernel_function(op, "chunked")
        chunk = self.chunk_size or int(op.attributes["chunk_size"].value)
        if chunk < 1:
            raise fail(op, f"chunk_size must be positive, got {chunk}")
        replace_function(module_op, func, _Kernel(op, func, chunk, self.block_v).build(), "<attn-chunk-recurrence>")
