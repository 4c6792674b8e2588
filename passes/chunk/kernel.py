"""What every kernel of `attn-chunk-recurrence` shares: the op's operands and shapes, q/k/v tiles
loaded and modded, the program ids, the scf.for over chunks, and the kernel function around a
body. Kernels are built with the bindings' builders at the current location (the op's).

With the op's `lengths`, a program reads its entry's length once (`end`, clamped into [0, L]):
rows from `end` on load as zeros (k and v after their mods too, and g, so they leave the state as
it is), are never stored, and the chunk loops stop at the last chunk holding a token. q, k, v
and g may then be `attn.unpack_sequences` views of packed sequences, which the kernels read in
place: the program's rows are its sequence's packed rows from `lo` (tile_varlen's span), and an
output packed by `attn.pack_sequences` is written straight into the packed rows."""
from __future__ import annotations

from ...core import abi
from ..l1_builders import (KernelBuilder, convert, element_type, extract_slice, f32, for_loop, index,
                           index_value, insert_slice, matmul, program_id, tensor_type, zeros)
from ..l1_ops import fail, shape
from ..kv_len import entry_length
from ..tile_varlen import sequences_source, span

DECAYS = ("none", "head", "token", "token_dim", "token_value_dim")
# The decays with a g per dimension: of the keys (the state's rows) or of the values (its columns).
DIM_DECAYS = ("token_dim", "token_value_dim")
TILE, ROW, COL = (0, 1), (0,), (1,)  # indexing-map dims of a 2-D tile, and of a vector along either axis


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


def or_zero(keep, x):
    from mlir.dialects import arith

    return arith.select(keep, x, f32(0.0))


def exp(x):
    from mlir.dialects import math

    return math.exp(x)


def exp_diff(hi, lo):
    from mlir.dialects import arith

    return exp(arith.subf(hi, lo))


def offset_of(value):
    """An optional index value as an offset: 0 when absent."""
    return 0 if value is None else value


def linalg_index(dim: int):
    from mlir.dialects import linalg

    return linalg.IndexOp(dim).result


class ChunkKernel(KernelBuilder):
    """One kernel function replacing `func`, whose `attn.linear_recurrence` `op` it computes in
    chunks of `chunk` tokens, `block_v` (at most) V columns per program. A program's state tile
    is [bk, bv]: all of Dk rows unless a subclass splits them. Built inside the op's location."""

    def __init__(self, op, func, chunk: int, block_v: int):
        from mlir import ir

        super().__init__(op, func)
        seg = [int(x) for x in op.attributes["operandSegmentSizes"]]
        operands = list(op.operands)
        self.q, self.k, self.v = operands[:3]
        rest = operands[3:]
        self.g = rest.pop(0) if seg[3] else None
        self.s0 = rest.pop(0) if seg[4] else None
        self.lengths = rest.pop(0) if len(seg) > 5 and seg[5] else None
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
        self.mods = [region if len(region.blocks) else None for region in op.regions]
        self.out_elt = element_type(op.results[0])
        q_elt = element_type(self.q)
        self.dot_elt = q_elt if str(q_elt) in ("bf16", "f16") else ir.F32Type.get()
        # With L a multiple of C and no lengths no row is ever padding, and the masks for it disappear.
        self.ragged = self.l % self.c != 0 or self.lengths is not None
        self.end = self.l  # the program's tokens: L, or its entry's length once program_ids read it
        self.lo = None  # packed sequences: the program's first packed row
        self.packed_out = self.packed_sources(op)
        self.out_type = (self.packed_out or op.results[0]).type
        self.state_type = op.results[1].type
        self.v0 = None  # the program's first V column, an index value, when Dv is split
        self.dests: dict = {}  # the kernel's arguments after the L0 inputs, by role, once defined

    def packed_sources(self, op):
        """The packed output (the attn.pack_sequences result of `out`) when q, k and v are views
        of packed sequences, else None; packed operands need lengths (their view's rows past a
        sequence are not the sequence's tokens) and share one set of offsets."""
        sources = [sequences_source(x) for x in (self.q, self.k, self.v)]
        if self.g is not None and len(shape(self.g)) > 1:
            sources.append(sequences_source(self.g))
        if not any(sources):
            return None
        users = [use.owner for use in op.results[0].uses]
        packs = [u for u in users if getattr(u, "name", None) == "attn.pack_sequences"]
        offsets = {src[1] for src in sources if src}
        if (not all(sources) or len(offsets) != 1 or not packs or packs[0].operands[1] not in offsets
                or self.lengths is None):
            raise fail(op, "reads packed sequences in place only when q, k, v (and a per-token g) are "
                           "attn.unpack_sequences views of one set of offsets, lengths are given and out is "
                           "packed by attn.pack_sequences with the same offsets")
        return packs[0].results[0]

    def read_extent(self) -> None:
        """`end` (and `lo` for packed sequences): the program's entry's tokens, read once."""
        from mlir.dialects import arith

        if self.lengths is None:
            return
        self.end = entry_length(self.kernel_arg(self.lengths, "lengths"), self.pb, self.l)
        source = sequences_source(self.q)
        if source is not None:
            self.lo, hi = span(self, source, self.pb, self.l)
            self.end = arith.minsi(self.end, arith.subi(hi, self.lo))

    def load_rows(self, value, what: str, t0, rows: int, width: int | None, col=0, past_end: bool = False):
        """Rows [t0, t0 + rows) of the program's (batch, head) of `value` (q, k, v or g), columns
        [col, col + width) (a 1-D row vector without `width`), zero from row `end` on: a slice of
        the tensor, or of the sequence's packed rows."""
        from mlir.dialects import arith

        past_end = past_end or self.lengths is not None
        source = sequences_source(value)
        if source is None:
            return self.load_tile(self.kernel_arg(value, what), [self.pb, self.ph], t0, self.end, rows, width, col,
                                  past_end=past_end)
        packed = self.kernel_arg(source[0], what)
        return self.load_tile(packed, [index(0), self.ph], arith.addi(self.lo, t0), arith.addi(self.lo, self.end),
                              rows, width, col, past_end=True)

    # Whether the kernel writes output rows: with lengths, rows past an entry's end are then
    # written as zeros (the op's contract), except in a packed output, where they are the next
    # sequence's rows and no program skips them. Kernels that write only workspaces or the state
    # set this False.
    writes_output = True

    def skips_padding(self) -> bool:
        """Whether chunks past the program's end may be skipped entirely."""
        return self.lengths is not None and (self.packed_out is not None or not self.writes_output)

    def chunks_to_visit(self):
        """The chunks the program walks: all of them, or ceil(end / C) when it skips padding."""
        from mlir.dialects import arith

        if not self.skips_padding():
            return self.chunks
        return arith.ceildivsi(self.end, index(self.c))

    def if_holding_tokens(self, t0, carried: list, build) -> list:
        """`build(carried)` (returning the new values of `carried`) run only when the chunk at t0
        holds one of the program's tokens: with lengths, a chunk-parallel program past its
        entry's end (a short sequence in a packed batch) skips the chunk's work. A loop of one
        or zero trips, since the kernels' lowerings take loops, not conditionals."""
        from mlir.dialects import arith

        if not self.skips_padding():
            return build(carried)
        inside = arith.cmpi(arith.CmpIPredicate.slt, t0, index_value(self.end))
        trips = arith.select(inside, index(1), index(0))
        return for_loop(trips, carried, lambda _, values: build(values))

    # --- tiles -------------------------------------------------------------------------------
    def tile_type(self, rows: int, cols: int, elt=None):
        return tensor_type([rows, cols], elt)

    def converted(self, tile, dst):
        """A 2-D tile converted elementwise to `dst` elements."""
        return self.generic([(tile, TILE)], self.tile_type(*tile.type.shape, dst), lambda a: convert(a[0], dst))

    def operand(self, value):
        """An f32 tile as a matmul operand: rounded to the dot type (16-bit inputs)."""
        if str(self.dot_elt) == "f32":
            return value
        return self.converted(value, self.dot_elt)

    def output_elements(self, o):
        """An f32 output tile in the output's element type."""
        if str(self.out_elt) == "f32":
            return o
        return self.converted(o, self.out_elt)

    def matmul(self, a, b, acc, precision: str = "ieee"):
        """acc + a @ b; f32 products are exact unless told (the cumulative sums' are not)."""
        return matmul(a, b, acc, precision)

    def modded(self, tile, mod, t0, col0, zero_pad: bool):
        """The f32 tile mod(x, b, h, t, d) of a loaded [rows, cols] tile (identity without a mod).
        Padded rows read closure tensors at t = L - 1 (never out of bounds); with `zero_pad` their
        result is forced to 0, because a mod (elu + 1, say) can turn zero padding into non-zero."""
        from mlir import ir
        from mlir.dialects import arith

        f32_type = ir.F32Type.get()
        if mod is None and element_type(tile) == f32_type:
            return tile
        zero_pad = zero_pad and mod is not None and self.ragged

        def body(a):
            x = convert(a[0], f32_type)
            if mod is None:
                return x
            i = linalg_index(0)
            j = linalg_index(1)
            t = arith.addi(t0, i)
            tc = t
            if self.ragged:
                tc = arith.minsi(t, index(self.l - 1))
            d = j if col0 is None else arith.addi(col0, j)
            y = self.inline(mod, [x, self.pb, self.ph, tc, d], constants_first=True)
            if zero_pad:
                y = or_zero(arith.cmpi(arith.CmpIPredicate.slt, t, index_value(self.end)), y)
            return y

        return self.generic([(tile, TILE)], self.tile_type(*tile.type.shape), body)

    def load(self, role: str, t0, col, width: int, rows: int | None = None) -> tuple:
        """(f32 tile, matmul operand) of rows [t0, t0 + rows (C)) and columns [col, col + width) of
        q, k or v, modded; k and v rows past L are zero (they would enter the state), q's are
        never stored. Without a mod a 16-bit tile is its own operand."""
        value = {"q": self.q, "k": self.k, "v": self.v}[role]
        mod = self.mods["qkv".index(role)]
        rows = rows or self.c
        raw = self.load_rows(value, role, t0, rows, width, offset_of(col), past_end=rows != self.c)
        tile = self.modded(raw, mod, t0, col, role != "q")
        if mod is None and element_type(raw) == self.dot_elt:
            return tile, raw
        return tile, self.operand(tile)

    # --- scalar pieces of generic bodies -----------------------------------------------------
    def pair_mask(self):
        """In a body over (t, s, ...): s <= t."""
        from mlir.dialects import arith

        i = linalg_index(0)
        j = linalg_index(1)
        return arith.cmpi(arith.CmpIPredicate.sle, j, i)

    def safe_exp(self, keep, hi, lo, clamp: bool = False):
        """exp(hi - lo) where `keep`, and exp(0) elsewhere: a masked pair's exponent may be large
        and positive, so it is never evaluated; with `clamp`, exponents above 0 (padded rows
        whose G was loaded as 0) count as 0."""
        from mlir.dialects import arith

        diff = arith.subf(hi, lo)
        zero = f32(0.0)
        exponent = arith.select(keep, diff, zero)
        if clamp:
            exponent = arith.minimumf(exponent, zero)
        return exp(exponent)

    def scaled(self, x):
        from mlir.dialects import arith

        return arith.mulf(x, f32(self.scale))

    # --- kernel structure --------------------------------------------------------------------
    def program_ids(self):
        """Build the program ids, returning the third axis's."""
        self.pb = program_id(0)
        self.ph = program_id(1)
        third = program_id(2)
        self.read_extent()
        return third

    def split_id(self, pid) -> tuple:
        """(pid / nv, first V column or None) of a third-axis id that enumerates (x, V block)."""
        from mlir.dialects import arith

        if self.nv == 1:
            return pid, None
        outer = arith.divsi(pid, index(self.nv))
        block = arith.remsi(pid, index(self.nv))
        return outer, arith.muli(block, index(self.bv))

    def initial_state(self, k0, v0):
        """The program's f32 [bk, bv] slice of the initial state (zeros without one)."""
        from mlir import ir

        if self.s0 is None:
            return zeros([self.bk, self.bv])
        raw = extract_slice(self.kernel_arg(self.s0, "initial_state"), [self.pb, self.ph, offset_of(k0), offset_of(v0)],
                            [1, 1, self.bk, self.bv], 2)
        if element_type(raw) == ir.F32Type.get():
            return raw
        return self.converted(raw, ir.F32Type.get())

    def store_state(self, state, dest, k0, v0):
        """Insert the program's [bk, bv] state tile into the final-state destination."""
        return insert_slice(state, dest, [self.pb, self.ph, offset_of(k0), offset_of(v0)], [1, 1, self.bk, self.bv])

    def chunk_loop(self, carried: list, step) -> list:
        """scf.for over the chunks carrying `carried`; `step(it, t0, values)` builds one chunk
        and returns the new values."""
        from mlir.dialects import arith

        return for_loop(self.chunks_to_visit(), carried,
                        lambda it, values: step(it, arith.muli(it, index(self.c)), values))

    def define(self, extra: list[tuple], result_types: list, grid: list[int], body, stage: str | None = None) -> None:
        """The kernel function: the L0 inputs, then `extra` (role, type) arguments (in `dests` by
        role while `body()` builds the function), returning what `body()` returns. The output
        kernel keeps the op's function name; a kernel launched before it is its `stage`
        (abi.CHUNK_STAGES), named and marked so."""
        from mlir import ir
        from mlir.dialects import func

        inputs = [a.type for a in self.func_block.arguments]
        roles = abi.input_roles(len(inputs)) + [r for r, _ in extra]
        i64 = ir.IntegerType.get_signless(64)
        attributes = {abi.GRID: ir.DenseI64ArrayAttr.get(grid), abi.CHUNK_SIZE: ir.IntegerAttr.get(i64, self.c),
                      abi.BLOCK_V: ir.IntegerAttr.get(i64, self.bv),
                      abi.ARG_ROLES: ir.ArrayAttr.get([ir.StringAttr.get(r) for r in roles])}
        if stage is not None:
            attributes[abi.CHUNK_STAGE] = ir.StringAttr.get(stage)
        any_rows = [r for r, t in extra if abi.is_workspace(r) and not ir.RankedTensorType(t).has_static_shape]
        if any_rows:
            rules = self.workspace_rows()
            attributes[abi.WORKSPACE_ROWS] = ir.DictAttr.get({r: ir.DenseI64ArrayAttr.get(list(rules[r]))
                                                              for r in any_rows})
        name = self.name if stage is None else abi.chunk_stage_name(self.name, stage)
        entry = self.function(name, inputs + [t for _, t in extra], result_types, attributes)
        self.dests = dict(zip(roles[len(inputs):], self.kernel_args[len(inputs):]))
        with ir.InsertionPoint(entry):
            func.ReturnOp(body())

    @property
    def name(self) -> str:
        return self.func.attributes["sym_name"].value
