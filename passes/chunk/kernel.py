"""What every kernel of `attn-chunk-recurrence` shares: the op's operands and shapes, q/k/v tiles
loaded and modded, the program ids, the scf.for over chunks, and the function text around a body."""
from __future__ import annotations

from ...core import abi
from ...core.regions import emit_scalar, float_literal, from_region
from ..l1_text import KernelText, convert, elt, fail, shape

DECAYS = ("none", "head", "token", "token_dim")


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


def or_zero(inner, keep: str, x: str) -> str:
    return inner(f"arith.select {keep}, {x}, {inner('arith.constant 0.0 : f32')} : f32")


def exp(inner, x: str) -> str:
    return inner(f"math.exp {x} : f32")


def exp_diff(inner, hi: str, lo: str) -> str:
    return exp(inner, inner(f"arith.subf {hi}, {lo} : f32"))


class ChunkKernel(KernelText):
    """One kernel function replacing `func`, whose `attn.linear_recurrence` `op` it computes in
    chunks of `chunk` tokens, `block_v` (at most) V columns per program. A program's state tile
    is [bk, bv]: all of Dk rows unless a subclass splits them."""

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
        self.chunks = -(-self.l // chunk)
        self.bv = value_block(self.dv, block_v)
        self.nv = self.dv // self.bv
        self.bk, self.nk = self.dk, 1
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

    # --- tiles -------------------------------------------------------------------------------
    def index_const(self, inner, n: int) -> str:
        return inner(f"arith.constant {n} : index")

    def tile_type(self, rows: int, cols: int, elt_: str = "f32") -> str:
        return f"tensor<{rows}x{cols}x{elt_}>"

    def converted(self, tile: str, rows: int, cols: int, src: str, dst: str) -> str:
        """A [rows, cols] tile converted elementwise from `src` to `dst` elements."""
        return self.generic([(tile, self.tile_type(rows, cols, src), "(d0, d1)")], self.tile_type(rows, cols, dst),
                            lambda inner, a: convert(inner, a[0], src, dst))

    def operand(self, value: str, rows: int, cols: int) -> str:
        """An f32 tile as a matmul operand: rounded to the dot type (16-bit inputs)."""
        if self.dot_elt == "f32":
            return value
        return self.converted(value, rows, cols, "f32", self.dot_elt)

    def output_elements(self, o: str, rows: int) -> str:
        """An f32 [rows, BV] output tile in the output's element type."""
        if self.out_elt == "f32":
            return o
        return self.converted(o, rows, self.bv, "f32", self.out_elt)

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
                y = or_zero(inner, keep, y)
            return y

        rows = rows or self.c
        return self.generic([(tile, self.tile_type(rows, cols, elt_), "(d0, d1)")],
                            self.tile_type(rows, cols), body)

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

    # --- scalar pieces of generic bodies -----------------------------------------------------
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

    def scaled(self, inner, x: str) -> str:
        return inner(f"arith.mulf {x}, {inner(f'arith.constant {float_literal(self.scale)} : f32')} : f32")

    # --- kernel structure --------------------------------------------------------------------
    def program_ids(self) -> str:
        """Emit the program ids, returning the third axis's."""
        self.pb = self.em('"attn.program_id"() {axis = 0 : i64} : () -> index')
        self.ph = self.em('"attn.program_id"() {axis = 1 : i64} : () -> index')
        return self.em('"attn.program_id"() {axis = 2 : i64} : () -> index')

    def split_id(self, pid: str) -> tuple[str, str | None]:
        """(pid / nv, first V column or None) of a third-axis id that enumerates (x, V block)."""
        if self.nv == 1:
            return pid, None
        em = self.em
        outer = em(f"arith.divsi {pid}, {self.idx(self.nv)} : index")
        block = em(f"arith.remsi {pid}, {self.idx(self.nv)} : index")
        return outer, em(f"arith.muli {block}, {self.idx(self.bv)} : index")

    def initial_state(self, k0: str | None, v0: str | None) -> str:
        """The program's f32 [bk, bv] slice of the initial state (zeros without one)."""
        s_type = self.tile_type(self.bk, self.bv)
        if self.s0 is None:
            return self.zeros(s_type)
        s0_elt = elt(self.s0)
        raw = self.em(f"tensor.extract_slice {self.arg_name(self.s0, 'initial_state')}[{self.pb}, {self.ph}, "
                      f"{k0 or 0}, {v0 or 0}] [1, 1, {self.bk}, {self.bv}] [1, 1, 1, 1] : {self.s0.type} to "
                      f"{self.tile_type(self.bk, self.bv, s0_elt)}")
        if s0_elt == "f32":
            return raw
        return self.converted(raw, self.bk, self.bv, s0_elt, "f32")

    def store_state(self, state: str, dest: str, k0: str | None, v0: str | None) -> str:
        """Insert the program's [bk, bv] state tile into the final-state destination."""
        return self.em(f"tensor.insert_slice {state} into {dest}[{self.pb}, {self.ph}, {k0 or 0}, {v0 or 0}] "
                       f"[1, 1, {self.bk}, {self.bv}] [1, 1, 1, 1] : {self.tile_type(self.bk, self.bv)} "
                       f"into {self.state_type}")

    def chunk_loop(self, carried: list[tuple[str, str]], step) -> list[str]:
        """scf.for over the chunks carrying `carried` (value, type); `step(it, t0, names)` emits
        one chunk and returns the new values."""
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

    def dest(self, offset: int) -> str:
        """The name of the destination argument `offset` places after the L0 inputs."""
        return f"%arg{len(self.func_args) + offset}"

    def function(self, name: str, extra: list[tuple[str, str]], results: list[tuple[str, str]],
                 grid: list[int]) -> str:
        """The kernel function text around the emitted body: the L0 inputs, then `extra`
        (role, type) arguments, returning `results` (value, type)."""
        args = self.func_args
        n_cap = len(args) - 3
        roles = abi.input_roles(len(abi.INPUTS) + n_cap) + [r for r, _ in extra]
        params = [f"%arg{i}: {a.type}" for i, a in enumerate(args)]
        params += [f"%arg{len(args) + i}: {t}" for i, (_, t) in enumerate(extra)]
        types = ", ".join(t for _, t in results)
        self.em.raw(f"return {', '.join(v for v, _ in results)} : {types}")
        body = "\n".join(f"    {line}" for line in self.em.lines)
        role_list = ", ".join(f'"{r}"' for r in roles)
        return (f"func.func @{name}({', '.join(params)}) -> ({types}) attributes "
                f"{{{abi.GRID} = array<i64: {', '.join(map(str, grid))}>, {abi.CHUNK_SIZE} = {self.c} : i64, "
                f"{abi.BLOCK_V} = {self.bv} : i64, {abi.ARG_ROLES} = [{role_list}]}} {{\n{body}\n}}\n")

    @property
    def name(self) -> str:
        return self.func.attributes["sym_name"].value
