"""A NumPy interpreter for Triton IR (TTIR), so Triton kernels can be checked numerically without a GPU.

`run_ttir` parses TTIR with the upstream MLIR Python bindings (unregistered dialects allowed, so `tt`
ops are unregistered ops and `!tt.ptr<T>` is an opaque type), compiles every op once into a Python
closure and runs the kernel once per program id, vectorized over the tile tensors.

Value model
- Tensors are NumPy arrays of the element type's dtype; scalars are 0-d arrays. f32 math runs in
  float32 and f16 in float16, so rounding follows the GPU's; `tt.dot` converts its inputs to
  float32 and accumulates in float32 (`inputPrecision` is ignored: the reference is exact f32).
- bf16 values are float32 arrays holding bf16-rounded values: every op producing bf16 rounds its
  float32 result to nearest-even bf16. A `!tt.ptr<bf16>` argument is likewise a float32 array (what
  `torch_tensor.float().numpy()` gives); loads round, stores write bf16-rounded float32 values.
- A pointer is an int64 "address" `buffer_id << 40 | element_index`, so pointer tensors are plain
  integer arrays, `tt.addptr` is integer addition (offsets count elements) and pointers into
  different arguments can be mixed by `arith.select`. Loads and stores decode the address, and
  raise `OutOfBoundsError` for any active lane outside its argument's array: a miscompiled index is
  an error here even where a GPU would silently read garbage.
- Masked-off load lanes without `other` read 0, as both Triton GPU backends materialize them.

Unknown ops raise NotImplementedError naming the op when their function is compiled, before it runs.

Triton interop, for tests (imports triton lazily): `ttir_from_triton` gives Triton's own TTIR for a
@triton.jit function in generic form, without a GPU; `generic_from_pretty_ttir` does the rewrite.
"""

import itertools
import math
import re

import numpy as np

__all__ = ["OutOfBoundsError", "run_ttir", "generic_from_pretty_ttir", "ttir_from_triton"]


class OutOfBoundsError(IndexError):
    """An unmasked tt.load/tt.store lane addressed memory outside every argument array."""


_ADDR_BITS = 40
_ADDR_HALF = np.int64(1 << (_ADDR_BITS - 1))

_DTYPES = {
    "f64": np.float64, "f32": np.float32, "f16": np.float16, "bf16": np.float32,
    "i1": np.bool_, "i8": np.int8, "i16": np.int16, "i32": np.int32, "i64": np.int64,
    "index": np.int64,
}
_UNSIGNED = {np.dtype(np.bool_): np.bool_, np.dtype(np.int8): np.uint8, np.dtype(np.int16): np.uint16,
             np.dtype(np.int32): np.uint32, np.dtype(np.int64): np.uint64}


class _Type:
    """Shape and element type of an MLIR type, parsed from its text (tt types are opaque to MLIR)."""

    _cache = {}

    def __init__(self, text):
        m = re.fullmatch(r"tensor<((?:\d+x)*)(.+)>", text)
        self.shape = tuple(int(d) for d in m.group(1).split("x") if d) if m else ()
        self.elem = m.group(2) if m else text
        p = re.fullmatch(r"!tt\.ptr<([^,>]+)(?:,\s*\d+)?>", self.elem)
        self.pointee = p.group(1) if p else None
        desc = re.fullmatch(r"!tt\.tensordesc<(tensor<.+>)>", text)
        # A tensor descriptor's value is a _Descriptor; its type keeps the tile's type.
        self.block = _Type(desc.group(1)) if desc else None
        if self.block is not None:
            self.dtype = np.dtype(object)
        elif self.pointee is not None:
            self.dtype = np.dtype(np.int64)
        elif self.elem in _DTYPES:
            self.dtype = np.dtype(_DTYPES[self.elem])
        else:
            raise NotImplementedError(f"tt_interp: unsupported type {text}")

    @classmethod
    def of(cls, mlir_type):
        text = str(mlir_type)
        if text not in cls._cache:
            cls._cache[text] = cls(text)
        return cls._cache[text]


def _round_bf16(x):
    bits = np.asarray(x, np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return np.where(np.isnan(x), np.float32(np.nan), rounded.view(np.float32))


def _finisher(ty):
    """Cast a computed value to `ty`'s storage dtype, rounding to bf16 where `ty` is bf16."""
    dtype = ty.dtype
    if ty.elem == "bf16":
        return lambda x: np.asarray(_round_bf16(np.asarray(x, np.float32)))
    return lambda x: np.asarray(x, dtype)


def _unsigned(x):
    x = np.asarray(x)
    return x.view(_UNSIGNED[x.dtype])


def _divsi(a, b):
    q = np.floor_divide(a, b)
    return np.where((q < 0) & (q * b != a), q + 1, q)


def _ceildivsi(a, b):
    q = np.floor_divide(a, b)
    return np.where(q * b != a, q + 1, q)


_CMPI = {
    0: np.equal, 1: np.not_equal, 2: np.less, 3: np.less_equal, 4: np.greater, 5: np.greater_equal,
    6: lambda a, b: _unsigned(a) < _unsigned(b), 7: lambda a, b: _unsigned(a) <= _unsigned(b),
    8: lambda a, b: _unsigned(a) > _unsigned(b), 9: lambda a, b: _unsigned(a) >= _unsigned(b),
}


def _unordered(a, b):
    return np.isnan(a) | np.isnan(b)


# arith.cmpf predicates by their enum value: ordered ones are false and unordered ones true where
# an operand is NaN. NumPy's comparisons are already false on NaN, except != which is true.
_CMPF = {
    0: lambda a, b: np.zeros(np.broadcast(a, b).shape, bool),
    1: np.equal, 2: np.greater, 3: np.greater_equal, 4: np.less, 5: np.less_equal,
    6: lambda a, b: (a != b) & ~_unordered(a, b),
    7: lambda a, b: ~_unordered(a, b),
    8: lambda a, b: (a == b) | _unordered(a, b),
    9: lambda a, b: ~(a <= b), 10: lambda a, b: ~(a < b),
    11: lambda a, b: ~(a >= b), 12: lambda a, b: ~(a > b),
    13: np.not_equal, 14: _unordered,
    15: lambda a, b: np.ones(np.broadcast(a, b).shape, bool),
}

_erf = np.vectorize(math.erf, otypes=[np.float64])

# Ops whose result is a pure elementwise function of the operands, computed in the operands' dtype
# and cast to the result type.
_ELEMENTWISE = {
    "arith.addf": np.add, "arith.subf": np.subtract, "arith.mulf": np.multiply,
    "arith.divf": np.divide, "arith.remf": np.fmod, "arith.negf": np.negative,
    "arith.maximumf": np.maximum, "arith.minimumf": np.minimum,
    "arith.maxnumf": np.fmax, "arith.minnumf": np.fmin,
    "arith.addi": np.add, "arith.subi": np.subtract, "arith.muli": np.multiply,
    "arith.divsi": _divsi, "arith.remsi": np.fmod, "arith.floordivsi": np.floor_divide,
    "arith.ceildivsi": _ceildivsi,
    "arith.divui": lambda a, b: _unsigned(a) // _unsigned(b),
    "arith.remui": lambda a, b: _unsigned(a) % _unsigned(b),
    "arith.maxsi": np.maximum, "arith.minsi": np.minimum,
    "arith.maxui": lambda a, b: np.maximum(_unsigned(a), _unsigned(b)),
    "arith.minui": lambda a, b: np.minimum(_unsigned(a), _unsigned(b)),
    "arith.andi": np.bitwise_and, "arith.ori": np.bitwise_or, "arith.xori": np.bitwise_xor,
    "arith.shli": np.left_shift, "arith.shrsi": np.right_shift,
    "arith.shrui": lambda a, b: _unsigned(a) >> _unsigned(b),
    "arith.select": np.where,
    "math.exp": np.exp, "math.exp2": np.exp2, "math.log": np.log, "math.log2": np.log2,
    "math.log1p": np.log1p, "math.expm1": np.expm1,
    "math.sqrt": np.sqrt, "math.rsqrt": lambda x: 1 / np.sqrt(x), "math.tanh": np.tanh,
    "math.sin": np.sin, "math.cos": np.cos, "math.absf": np.abs, "math.absi": np.abs,
    "math.floor": np.floor, "math.ceil": np.ceil, "math.trunc": np.trunc,
    "math.roundeven": np.rint,  # half to even in the current (default) rounding mode
    "math.erf": lambda x: _erf(x).astype(x.dtype),
    # float64 products of f32/f16 inputs are exact, so this rounds like a fused multiply-add.
    "math.fma": lambda a, b, c: (a.astype(np.float64) * b + c).astype(a.dtype),
    "tt.precise_sqrt": np.sqrt, "tt.precise_divf": np.divide,
}


def _bits_dtype(elem, dtype):
    return np.dtype(np.int16) if elem == "bf16" else dtype


def _bitcast(x, src, dst):
    if src.elem == "bf16":
        x = (np.asarray(x, np.float32).view(np.uint32) >> np.uint32(16)).astype(np.uint16)
    x = np.ascontiguousarray(x).view(_bits_dtype(dst.elem, dst.dtype))
    if dst.elem == "bf16":
        x = (x.view(np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)
    return x


def _signed_i1(x):
    return -x.astype(np.int8) if x.dtype == np.bool_ else x


_CASTS = {
    "arith.extf": lambda x, s, d: x.astype(d.dtype),
    "arith.truncf": lambda x, s, d: x.astype(d.dtype),
    "arith.sitofp": lambda x, s, d: _signed_i1(x).astype(d.dtype),
    "arith.uitofp": lambda x, s, d: _unsigned(x).astype(d.dtype),
    "arith.fptosi": lambda x, s, d: x.astype(d.dtype),
    "arith.fptoui": lambda x, s, d: x.astype(_UNSIGNED[d.dtype]).view(d.dtype),
    "arith.extsi": lambda x, s, d: _signed_i1(x).astype(d.dtype),
    "arith.extui": lambda x, s, d: _unsigned(x).astype(d.dtype),
    "arith.trunci": lambda x, s, d: (x & 1) != 0 if d.elem == "i1" else x.astype(d.dtype),
    "arith.index_cast": lambda x, s, d: _signed_i1(x).astype(d.dtype),
    "arith.index_castui": lambda x, s, d: _unsigned(x).astype(d.dtype),
    "arith.bitcast": _bitcast,
    "tt.bitcast": _bitcast,
}


def _fp_to_fp(x, src, dst, rounding):
    """tt.fp_to_fp between f64/f32/f16/bf16; `rounding` 1 is nearest-even, 0 toward zero."""
    y = x.astype(dst.dtype) if dst.elem != "bf16" else _round_bf16(x.astype(np.float32))
    if rounding == 0:
        if dst.elem == "bf16":
            y = (np.asarray(x, np.float32).view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
        else:
            too_far = np.abs(y.astype(np.float64)) > np.abs(x.astype(np.float64))
            y = np.where(too_far, np.nextafter(y, np.zeros_like(y)), y)
    return y


class _Block:
    """A compiled single-block region: argument slots, op closures and terminator operand slots."""

    def __init__(self, arg_slots, steps, term_slots):
        self.arg_slots, self.steps, self.term_slots = arg_slots, steps, term_slots

    def run(self, env, args):
        for slot, value in zip(self.arg_slots, args):
            env[slot] = value
        for step in self.steps:
            step(env)
        return [env[s] for s in self.term_slots]


class _Function:
    """A tt.func compiled to closures over an environment list indexed by value slots."""

    def __init__(self, program, func_op):
        self.program = program
        self.name = func_op.attributes["sym_name"].value
        self.slots = {}
        region = func_op.regions[0]
        self.arg_types = [_Type.of(a.type) for a in region.blocks[0].arguments]
        self.body = self.block(region)

    def slot(self, value):
        if value not in self.slots:
            self.slots[value] = len(self.slots)
        return self.slots[value]

    def block(self, region):
        blocks = list(region.blocks)
        if len(blocks) != 1:
            raise NotImplementedError(f"tt_interp: regions with {len(blocks)} blocks (unstructured control flow)")
        ops = list(blocks[0].operations)
        arg_slots = [self.slot(a) for a in blocks[0].arguments]
        steps = [self.compile_op(op) for op in ops[:-1]]
        return _Block(arg_slots, steps, [self.slot(v) for v in ops[-1].operands])

    def call(self, args):
        env = [None] * len(self.slots)
        return self.body.run(env, args)

    def compile_op(self, op):
        name = op.name
        try:
            if name in _ELEMENTWISE:
                return self.elementwise(op, _ELEMENTWISE[name])
            if name in _CASTS:
                return self.cast(op, _CASTS[name])
            handler = _HANDLERS.get(name)
            if handler is None:
                raise NotImplementedError(f"tt_interp: unsupported op {name}")
            return handler(self, op)
        except NotImplementedError as e:
            raise NotImplementedError(f"{e} (at {op.location})") from None

    def elementwise(self, op, fn):
        ins = [self.slot(v) for v in op.operands]
        out = self.slot(op.results[0])
        finish = _finisher(_Type.of(op.results[0].type))

        def run(env):
            env[out] = finish(fn(*[env[i] for i in ins]))
        return run

    def cast(self, op, fn):
        src, dst = _Type.of(op.operands[0].type), _Type.of(op.results[0].type)
        a, out = self.slot(op.operands[0]), self.slot(op.results[0])
        finish = _finisher(dst)

        def run(env):
            env[out] = finish(fn(np.asarray(env[a]), src, dst))
        return run


def _int_attr(op, name, default=None):
    if name not in op.attributes:
        return default
    return int(op.attributes[name].value)


def _const_value(attr, ty):
    from mlir.ir import DenseElementsAttr

    if isinstance(attr, DenseElementsAttr):
        if attr.is_splat:
            return np.full(ty.shape, attr.get_splat_value().value, ty.dtype)
        if ty.elem == "bf16":
            raise NotImplementedError("tt_interp: non-splat bf16 dense constants")
        return np.array(attr).astype(ty.dtype).reshape(ty.shape)
    return np.array(attr.value).astype(ty.dtype)


def _op_constant(f, op):
    ty = _Type.of(op.results[0].type)
    value = _finisher(ty)(_const_value(op.attributes["value"], ty))
    out = f.slot(op.results[0])

    def run(env):
        env[out] = value
    return run


def _op_poison(f, op):
    ty = _Type.of(op.results[0].type)
    value, out = np.zeros(ty.shape, ty.dtype), f.slot(op.results[0])

    def run(env):
        env[out] = value
    return run


def _op_cmp(table):
    def factory(f, op):
        cmp = table[_int_attr(op, "predicate")]
        a, b, out = f.slot(op.operands[0]), f.slot(op.operands[1]), f.slot(op.results[0])

        def run(env):
            env[out] = np.asarray(cmp(env[a], env[b]))
        return run
    return factory


def _op_program_id(field):
    def factory(f, op):
        axis, out, launch = _int_attr(op, "axis"), f.slot(op.results[0]), f.program.launch

        def run(env):
            env[out] = np.asarray(launch[field][axis], np.int32)
        return run
    return factory


def _op_make_range(f, op):
    value = np.arange(_int_attr(op, "start"), _int_attr(op, "end"), dtype=np.int32)
    out = f.slot(op.results[0])

    def run(env):
        env[out] = value
    return run


def _shape_op(make):
    """tt ops that only rearrange a tensor: make(op, result type) returns the NumPy rearrangement."""
    def factory(f, op):
        rearrange = make(op, _Type.of(op.results[0].type))
        a, out = f.slot(op.operands[0]), f.slot(op.results[0])

        def run(env):
            env[out] = rearrange(env[a])
        return run
    return factory


def _expand_dims(op, ty):
    axis = _int_attr(op, "axis")
    return lambda x: np.expand_dims(x, axis)


def _trans(op, ty):
    order = [int(i) for i in op.attributes["order"]]
    return lambda x: np.transpose(x, order)


_SHAPE_OPS = {
    "tt.splat": lambda op, ty: lambda x: np.full(ty.shape, x, ty.dtype),
    "tt.broadcast": lambda op, ty: lambda x: np.broadcast_to(x, ty.shape),
    "tt.expand_dims": _expand_dims,
    "tt.reshape": lambda op, ty: lambda x: np.reshape(x, ty.shape),
    "tt.trans": _trans,
}


def _op_addptr(f, op):
    p, o, out = f.slot(op.operands[0]), f.slot(op.operands[1]), f.slot(op.results[0])

    def run(env):
        env[out] = np.asarray(env[p] + np.asarray(env[o]).astype(np.int64))
    return run


def _memory_operands(op, names):
    """Map a tt.load/tt.store's operands to `names`, using operandSegmentSizes where present."""
    operands = list(op.operands)
    if "operandSegmentSizes" in op.attributes:
        sizes = [int(s) for s in op.attributes["operandSegmentSizes"]]
    else:
        sizes = [1] * len(operands) + [0] * (len(names) - len(operands))
    it = iter(operands)
    return {n: (next(it) if s else None) for n, s in zip(names, sizes)}


def _op_load(f, op):
    opnds = _memory_operands(op, ("ptr", "mask", "other"))
    ty = _Type.of(op.results[0].type)
    ptr = f.slot(opnds["ptr"])
    mask = f.slot(opnds["mask"]) if opnds["mask"] is not None else None
    other = f.slot(opnds["other"]) if opnds["other"] is not None else None
    out = f.slot(op.results[0])
    program, finish, where = f.program, _finisher(ty), f"tt.load at {op.location}"

    def run(env):
        addr = np.asarray(env[ptr])
        active = np.broadcast_to(env[mask], addr.shape) if mask is not None else np.ones(addr.shape, bool)
        result = np.zeros(addr.shape, ty.dtype)
        for buf, sel, idx in program.resolve(addr, active, ty.elem, where):
            result[sel] = buf[idx]
        if other is not None:
            result = np.where(active, result, env[other])
        env[out] = finish(result)
    return run


def _op_store(f, op):
    opnds = _memory_operands(op, ("ptr", "value", "mask"))
    ptr, value = f.slot(opnds["ptr"]), f.slot(opnds["value"])
    mask = f.slot(opnds["mask"]) if opnds["mask"] is not None else None
    elem = _Type.of(opnds["value"].type).elem
    program, where = f.program, f"tt.store at {op.location}"

    def run(env):
        addr = np.asarray(env[ptr])
        vals = np.broadcast_to(env[value], addr.shape)
        active = np.broadcast_to(env[mask], addr.shape) if mask is not None else np.ones(addr.shape, bool)
        for buf, sel, idx in program.resolve(addr, active, elem, where):
            buf[idx] = vals[sel]
    return run


class _Descriptor:
    """A tensor descriptor: the base address, and per dimension its size and stride (elements)."""

    def __init__(self, base, sizes, strides):
        self.base, self.sizes, self.strides = base, sizes, strides


def _op_make_tensor_descriptor(f, op):
    """tt.make_tensor_descriptor(base, sizes..., strides...): sizes and strides, one per dimension."""
    slots = [f.slot(v) for v in op.operands]
    rank = (len(slots) - 1) // 2
    out = f.slot(op.results[0])

    def run(env):
        values = [int(env[s]) for s in slots[1:]]
        env[out] = _Descriptor(np.int64(env[slots[0]]), values[:rank], values[rank:])
    return run


def _op_descriptor_load(f, op):
    """tt.descriptor_load: the block at the offsets; elements past the tensor's sizes (or before
    its start) read 0, as a TMA copy fills them."""
    desc, offsets = f.slot(op.operands[0]), [f.slot(v) for v in list(op.operands)[1:]]
    ty = _Type.of(op.results[0].type)
    out, program, finish = f.slot(op.results[0]), f.program, _finisher(ty)
    where = f"tt.descriptor_load at {op.location}"

    def run(env):
        d = env[desc]
        addr = np.full(ty.shape, d.base, np.int64)
        active = np.ones(ty.shape, bool)
        for k, (n, size, stride) in enumerate(zip(ty.shape, d.sizes, d.strides)):
            index = int(env[offsets[k]]) + np.arange(n, dtype=np.int64)
            shape = [1] * len(ty.shape)
            shape[k] = n
            index = index.reshape(shape)
            addr = addr + index * stride
            active = active & (index >= 0) & (index < size)
        result = np.zeros(ty.shape, ty.dtype)
        for buf, sel, idx in program.resolve(addr, active, ty.elem, where):
            result[sel] = buf[idx]
        env[out] = finish(result)
    return run


def _op_atomic_rmw(f, op):
    """tt.atomic_rmw fadd (atomic_rmw_op 5): each active lane adds its value to its element, lanes
    on one element all counting (np.add.at); the result is what the elements held before."""
    if int(op.attributes["atomic_rmw_op"].value) != 5:
        raise NotImplementedError("tt.atomic_rmw: only fadd (atomic_rmw_op = 5) is interpreted")
    opnds = _memory_operands(op, ("ptr", "value", "mask"))
    ptr, value = f.slot(opnds["ptr"]), f.slot(opnds["value"])
    mask = f.slot(opnds["mask"]) if opnds["mask"] is not None else None
    ty = _Type.of(op.results[0].type)
    out = f.slot(op.results[0])
    program, where = f.program, f"tt.atomic_rmw at {op.location}"

    def run(env):
        addr = np.asarray(env[ptr])
        vals = np.broadcast_to(env[value], addr.shape)
        active = np.broadcast_to(env[mask], addr.shape) if mask is not None else np.ones(addr.shape, bool)
        old = np.zeros(addr.shape, ty.dtype)
        for buf, sel, idx in program.resolve(addr, active, ty.elem, where):
            old[sel] = buf[idx]
            np.add.at(buf, idx, vals[sel])
        env[out] = old
    return run


def _op_dot(f, op):
    a, b, c = (f.slot(v) for v in op.operands[:3])
    out = f.slot(op.results[0])
    ty = _Type.of(op.results[0].type)
    acc_dtype = np.float32 if ty.dtype.kind == "f" else np.int64
    finish = _finisher(ty)

    def run(env):
        prod = np.matmul(env[a].astype(acc_dtype), env[b].astype(acc_dtype))
        env[out] = finish(prod + env[c].astype(acc_dtype))
    return run


def _op_reduce(f, op):
    """tt.reduce by a pairwise tree over the axis; every level evaluates the combine region once on
    whole tensors of (left, right) neighbours, so any combine region works, e.g. argmax's."""
    ins = [f.slot(v) for v in op.operands]
    outs = [f.slot(r) for r in op.results]
    axis = _int_attr(op, "axis")
    combine = f.block(op.regions[0])

    def run(env):
        vals = [np.moveaxis(np.asarray(env[i]), axis, -1) for i in ins]
        while vals[0].shape[-1] > 1:
            n = vals[0].shape[-1]
            pairs = n // 2 * 2
            lhs = [v[..., 0:pairs:2] for v in vals]
            rhs = [v[..., 1:pairs:2] for v in vals]
            merged = [np.broadcast_to(m, lhs[0].shape) for m in combine.run(env, lhs + rhs)]
            if n % 2:
                merged = [np.concatenate([m, v[..., -1:]], axis=-1) for m, v in zip(merged, vals)]
            vals = merged
        for o, v in zip(outs, vals):
            env[o] = np.asarray(v[..., 0])
    return run


def _op_scan(f, op):
    ins = [f.slot(v) for v in op.operands]
    outs = [f.slot(r) for r in op.results]
    axis = _int_attr(op, "axis")
    reverse = "reverse" in op.attributes and bool(op.attributes["reverse"].value)
    combine = f.block(op.regions[0])

    def run(env):
        vals = [np.moveaxis(np.asarray(env[i]), axis, -1) for i in ins]
        n = vals[0].shape[-1]
        order = range(n - 1, -1, -1) if reverse else range(n)
        results = [np.empty_like(v) for v in vals]
        carry = None
        for k in order:
            cur = [v[..., k] for v in vals]
            carry = cur if carry is None else [np.broadcast_to(m, cur[0].shape) for m in combine.run(env, carry + cur)]
            for r, c in zip(results, carry):
                r[..., k] = c
        for o, r in zip(outs, results):
            env[o] = np.moveaxis(r, -1, axis)
    return run


def _op_fp_to_fp(f, op):
    src, dst = _Type.of(op.operands[0].type), _Type.of(op.results[0].type)
    if src.elem not in ("f64", "f32", "f16", "bf16") or dst.elem not in ("f64", "f32", "f16", "bf16"):
        raise NotImplementedError(f"tt_interp: tt.fp_to_fp from {src.elem} to {dst.elem}")
    rounding = _int_attr(op, "rounding", 1)
    a, out = f.slot(op.operands[0]), f.slot(op.results[0])

    def run(env):
        env[out] = np.asarray(_fp_to_fp(np.asarray(env[a]), src, dst, rounding))
    return run


def _op_clampf(f, op):
    """propagateNan = all (65535) keeps NaN inputs like min/max; none (0) ignores them."""
    lo_hi = (np.minimum, np.maximum) if _int_attr(op, "propagateNan", 0) else (np.fmin, np.fmax)
    return f.elementwise(op, lambda x, lo, hi: lo_hi[0](lo_hi[1](x, lo), hi))


# The inline PTX the lowering emits, by its asm string, as NumPy computes it: tanh.approx.f32's
# result is within 2^-11 of tanh, which the interpreter takes exactly.
_INLINE_ASM = {"tanh.approx.f32 $0, $1;": np.tanh}


def _op_inline_asm(f, op):
    text = op.attributes["asm_string"].value
    if text not in _INLINE_ASM:
        raise NotImplementedError(f"tt.elementwise_inline_asm {text!r}")
    return f.elementwise(op, _INLINE_ASM[text])


def _op_call(f, op):
    callee_name = op.attributes["callee"].value
    ins = [f.slot(v) for v in op.operands]
    outs = [f.slot(r) for r in op.results]
    program = f.program

    def run(env):
        results = program.function(callee_name).call([env[i] for i in ins])
        for o, v in zip(outs, results):
            env[o] = v
    return run


def _op_for(f, op):
    lb, ub, step = (f.slot(v) for v in op.operands[:3])
    inits = [f.slot(v) for v in op.operands[3:]]
    outs = [f.slot(r) for r in op.results]
    body = f.block(op.regions[0])
    iv_dtype = _Type.of(op.operands[0].type).dtype

    def run(env):
        vals = [env[i] for i in inits]
        for iv in range(int(env[lb]), int(env[ub]), int(env[step])):
            vals = body.run(env, [np.asarray(iv, iv_dtype)] + vals)
        for o, v in zip(outs, vals):
            env[o] = v
    return run


def _op_if(f, op):
    cond = f.slot(op.operands[0])
    outs = [f.slot(r) for r in op.results]
    then = f.block(op.regions[0])
    orelse = f.block(op.regions[1]) if len(op.regions[1].blocks) else None

    def run(env):
        branch = then if bool(env[cond]) else orelse
        if branch is not None:
            for o, v in zip(outs, branch.run(env, [])):
                env[o] = v
    return run


def _op_while(f, op):
    inits = [f.slot(v) for v in op.operands]
    outs = [f.slot(r) for r in op.results]
    before, after = f.block(op.regions[0]), f.block(op.regions[1])

    def run(env):
        vals = [env[i] for i in inits]
        while True:
            cond, *forwarded = before.run(env, vals)
            if not bool(cond):
                break
            vals = after.run(env, forwarded)
        for o, v in zip(outs, forwarded):
            env[o] = v
    return run


_HANDLERS = {
    "arith.constant": _op_constant,
    "ub.poison": _op_poison,
    "arith.cmpi": _op_cmp(_CMPI),
    "arith.cmpf": _op_cmp(_CMPF),
    "tt.get_program_id": _op_program_id("pid"),
    "tt.get_num_programs": _op_program_id("grid"),
    "tt.make_range": _op_make_range,
    "tt.addptr": _op_addptr,
    "tt.load": _op_load,
    "tt.store": _op_store,
    "tt.atomic_rmw": _op_atomic_rmw,
    "tt.make_tensor_descriptor": _op_make_tensor_descriptor,
    "tt.descriptor_load": _op_descriptor_load,
    "tt.dot": _op_dot,
    "tt.reduce": _op_reduce,
    "tt.scan": _op_scan,
    "tt.fp_to_fp": _op_fp_to_fp,
    "tt.clampf": _op_clampf,
    "tt.elementwise_inline_asm": _op_inline_asm,
    "tt.call": _op_call,
    "scf.for": _op_for,
    "scf.if": _op_if,
    "scf.while": _op_while,
    **{name: _shape_op(fn) for name, fn in _SHAPE_OPS.items()},
}


def _storage_matches(elem, dtype):
    if elem == "bf16":
        return dtype == np.float32
    if elem == "i1":
        return dtype.kind in "bui" and dtype.itemsize == 1
    return elem in _DTYPES and dtype == np.dtype(_DTYPES[elem])


class _Program:
    """The parsed module, the argument buffers and the current launch (program id, grid)."""

    def __init__(self, module):
        self.func_ops = {op.attributes["sym_name"].value: op
                         for op in module.body.operations if op.name == "tt.func"}
        self.functions = {}
        self.buffers = [None]
        self.launch = {"pid": (0, 0, 0), "grid": (1, 1, 1)}

    def function(self, name):
        if name not in self.functions:
            if name not in self.func_ops:
                raise KeyError(f"tt_interp: no tt.func @{name}; the module has {sorted(self.func_ops)}")
            self.functions[name] = _Function(self, self.func_ops[name])
        return self.functions[name]

    def add_buffer(self, array):
        self.buffers.append(array.reshape(-1))
        return np.int64(len(self.buffers) - 1) << np.int64(_ADDR_BITS)

    def resolve(self, addr, active, elem, where):
        """Yield (flat buffer, lane selection, element indices) for the active lanes of `addr`."""
        buf_ids = (addr + _ADDR_HALF) >> np.int64(_ADDR_BITS)
        index = addr - (buf_ids << np.int64(_ADDR_BITS))
        for b in np.unique(buf_ids[active]):
            sel = active & (buf_ids == b)
            idx = index[sel]
            buf = self.buffers[b] if 0 < b < len(self.buffers) else None
            bad = np.ones(idx.shape, bool) if buf is None else (idx < 0) | (idx >= buf.size)
            if bad.any():
                lane = tuple(int(i) for i in np.argwhere(sel)[np.argmax(bad)])
                target = (f"element {int(idx[np.argmax(bad)])} of argument buffer #{b - 1} "
                          f"(size {buf.size})" if buf is not None else "no argument buffer")
                raise OutOfBoundsError(f"{where}: active lane {lane} of program {self.launch['pid']} "
                                       f"addresses {target}")
            if not _storage_matches(elem, buf.dtype):
                raise TypeError(f"{where}: accesses {elem} through a pointer into a {buf.dtype} array")
            yield buf, sel, idx


def _bind_args(program, fn, args):
    bound = []
    for i, (value, ty) in enumerate(zip(args, fn.arg_types)):
        if ty.block is not None:
            # A descriptor made on the host: its tensor's storage (a NumPy array, as for a
            # pointer) with the tensor's sizes and strides.
            if not isinstance(getattr(value, "base", None), np.ndarray):
                raise TypeError(f"argument {i} of @{fn.name} is a tensor descriptor: pass one over a NumPy array")
            bound.append(_Descriptor(program.add_buffer(value.base), list(value.shape), list(value.strides)))
        elif ty.pointee is not None:
            if not isinstance(value, np.ndarray):
                raise TypeError(f"argument {i} of @{fn.name} is !tt.ptr<{ty.pointee}>: pass a NumPy array")
            if not value.flags.c_contiguous:
                raise ValueError(f"argument {i} of @{fn.name}: the array must be C-contiguous")
            if not _storage_matches(ty.pointee, value.dtype):
                raise TypeError(f"argument {i} of @{fn.name} is !tt.ptr<{ty.pointee}> but the array is "
                                f"{value.dtype} (bf16 is passed as float32)")
            bound.append(program.add_buffer(value))
        else:
            bound.append(_finisher(ty)(np.array(value).astype(ty.dtype)))
    return bound


def run_ttir(ttir_text, kernel_name, args, grid, constexprs=None):
    """Run the tt.func `kernel_name` of `ttir_text` over `grid`, program ids in x-fastest order.

    `args` follow the tt.func's parameters: NumPy arrays for `!tt.ptr<T>` parameters (stores write
    into them), Python or NumPy scalars for the rest. `kernel_name` may be None when the module has
    a single public tt.func. Triton folds constexprs into the IR and drops their parameters; a
    producer that keeps them as trailing parameters gets them from `constexprs`, in dict order.
    """
    from mlir.ir import Context, Module

    with Context() as ctx:
        ctx.allow_unregistered_dialects = True
        module = Module.parse(ttir_text)
        program = _Program(module)
        if kernel_name is None:
            public = [n for n, op in program.func_ops.items()
                      if "sym_visibility" not in op.attributes
                      or op.attributes["sym_visibility"].value == "public"]
            if len(public) != 1:
                raise ValueError(f"tt_interp: name the kernel, the module has public functions {public}")
            kernel_name = public[0]
        fn = program.function(kernel_name)
        all_args = list(args) + list((constexprs or {}).values())
        if len(all_args) != len(fn.arg_types):
            raise TypeError(f"@{kernel_name} takes {len(fn.arg_types)} arguments, got {len(all_args)}")
        bound = _bind_args(program, fn, all_args)
        grid = tuple(grid) + (1,) * (3 - len(grid))
        program.launch["grid"] = grid
        with np.errstate(all="ignore"):
            for z, y, x in itertools.product(range(grid[2]), range(grid[1]), range(grid[0])):
                program.launch["pid"] = (x, y, z)
                fn.call(bound)


# Triton interop: Triton prints TTIR only in its custom syntax, which needs Triton's dialects to
# parse. The upstream bindings already know the syntax of arith/math/scf, so only the tt ops are
# rewritten here, line by line, into generic form; tt.func/return/call share func's syntax and
# properties, so they parse as func ops and are renamed back after generic printing.

_PRETTY_TT = re.compile(r"^(\s*)(?:(%[\w#]+)\s*=\s*)?tt\.([\w.]+)(.*)$")
_KEYWORDS = {
    "cacheModifier": ("cache", {"none": 1, "ca": 2, "cg": 3, "wb": 4, "cs": 5, "wt": 6, "cv": 7}),
    "evictionPolicy": ("evict", {"evict_normal": 1, "evict_first": 2, "evict_last": 3}),
    "inputPrecision": ("inputPrecision", {"tf32": 0, "tf32x3": 1, "ieee": 2, "bf16x3": 3, "bf16x6": 4}),
    "rounding": ("rounding", {"rtz": 0, "rtne": 1}),
    "propagateNan": ("propagateNan", {"none": 0, "all": 65535}),
}
_AXES = {"x": 0, "y": 1, "z": 2}
_CONVERSIONS = {"splat", "broadcast", "expand_dims", "reshape", "trans", "fp_to_fp", "bitcast"}
_SAME_TYPE = {"precise_sqrt", "precise_divf", "clampf"}


def _split_top(text, sep):
    """Split at `sep` outside brackets; '->' is an arrow, not a closing bracket."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "<([{":
            depth += 1
        elif ch in ">)]}" and not (ch == ">" and i and text[i - 1] == "-"):
            depth -= 1
        elif depth == 0 and text.startswith(sep, i):
            parts.append(text[start:i].strip())
            start = i + len(sep)
    parts.append(text[start:].strip())
    return parts


def _with_elem(type_text, elem):
    t = _Type(type_text)
    return f"tensor<{'x'.join(map(str, t.shape))}x{elem}>" if t.shape else elem


def _with_defaults(attrs, *defaults):
    """Spell out inherent attributes Triton's printer elides at their default, as the compiler does."""
    given = {a.split("=")[0].strip() for a in attrs}
    return [d for d in defaults if d.split(" =")[0] not in given] + attrs


def _generic_tt_line(indent, result, name, rest):
    head, types = (_split_top(rest, " : ") + [""])[:2]
    attr_text = ""
    dict_match = re.search(r"\{(.*)\}\s*$", head)
    if dict_match:
        attr_text, head = dict_match.group(1), head[:dict_match.start()]
    operands = re.findall(r"%[\w#]+", head)
    attrs = [a for a in _split_top(attr_text, ",") if a]
    for key, value in re.findall(r"(\w+)\s*=\s*(\w+)", re.sub(r"%[\w#]+", "", head)):
        if key not in _KEYWORDS:
            raise NotImplementedError(f"generic_from_pretty_ttir: keyword {key} of tt.{name}")
        prop, values = _KEYWORDS[key]
        attrs.append(f"{prop} = {values[value]} : i32")

    if name in ("get_program_id", "get_num_programs"):
        attrs.append(f"axis = {_AXES[head.strip()]} : i32")
        in_types, out_types = [], [types]
    elif name == "make_range":
        in_types, out_types = [], [types]
    elif name in _CONVERSIONS:
        src, dst = _split_top(types, "->")
        in_types, out_types = [src], [dst]
    elif name in _SAME_TYPE:
        in_types, out_types = [types] * len(operands), [types]
    elif name == "addptr":
        in_types = _split_top(types, ",")
        out_types = in_types[:1]
    elif name == "load":
        pointee = re.search(r"!tt\.ptr<([^,>]+)", types).group(1)
        in_types = [types, _with_elem(types, "i1"), _with_elem(types, pointee)][:len(operands)]
        out_types = [_with_elem(types, pointee)]
        sizes = ", ".join(str(int(len(operands) > i)) for i in range(3))
        attrs = _with_defaults(attrs, f"operandSegmentSizes = array<i32: {sizes}>",
                               "cache = 1 : i32", "evict = 1 : i32", "isVolatile = false")
    elif name == "store":
        pointee = re.search(r"!tt\.ptr<([^,>]+)", types).group(1)
        in_types = [types, _with_elem(types, pointee), _with_elem(types, "i1")][:len(operands)]
        out_types = []
        attrs = _with_defaults(attrs, "cache = 1 : i32", "evict = 1 : i32")
    elif name == "dot":
        ab, c = _split_top(types, "->")
        in_types, out_types = _split_top(ab, "*") + [c], [c]
        attrs = _with_defaults(attrs, "inputPrecision = 0 : i32", "maxNumImpreciseAcc = 0 : i32")
    elif name in ("reduce.return", "scan.return"):
        in_types, out_types = (_split_top(types, ",") if types else []), []
    else:
        raise NotImplementedError(f"generic_from_pretty_ttir: no rule for tt.{name}")

    lhs = f"{result} = " if result else ""
    attr_dict = f" {{{', '.join(attrs)}}}" if attrs else ""
    return (f'{indent}{lhs}"tt.{name}"({", ".join(operands)}){attr_dict} : '
            f'({", ".join(in_types)}) -> ({", ".join(out_types)})')


def generic_from_pretty_ttir(text):
    """Rewrite TTIR as Triton prints it (custom syntax, no locations) into MLIR generic form."""
    from mlir.ir import Context, Module

    lines = []
    for line in text.splitlines():
        m = _PRETTY_TT.match(line)
        if m is None:
            lines.append(line)
        elif m.group(3) in ("func", "return", "call"):
            lines.append(line.replace(f"tt.{m.group(3)}", f"func.{m.group(3)}", 1))
        else:
            lines.append(_generic_tt_line(*m.groups()))
    with Context() as ctx:
        ctx.allow_unregistered_dialects = True
        generic = Module.parse("\n".join(lines)).operation.get_asm(print_generic_op_form=True)
    return re.sub(r'"func\.(func|return|call)"', r'"tt.\1"', generic)


def ttir_from_triton(fn, signature, constexprs=None, target=("cuda", 90, 32)):
    """Triton's own TTIR for the @triton.jit `fn`, in generic form; needs no GPU nor driver.

    `triton.compile` would also run the later stages (ptxas), so this stops after the `ttir` stage:
        backend = triton.compiler.compiler.make_backend(GPUTarget("cuda", 90, 32))
        src = ASTSource(fn, signature, constexprs)
        options = backend.parse_options(src.parse_options())
        context = ir.context(); ir.load_dialects(context); backend.load_dialects(context)
        module = src.make_ir(target, options, backend.get_codegen_implementation(options),
                             backend.get_module_map(), context)
        stages = {}; backend.add_stages(stages, options, src.language)
        stages["ttir"](module, metadata={})        # CUDABackend.make_ttir: target-independent passes
        module.str_nodebug()                       # custom syntax, no locations
    """
    from triton._C.libtriton import ir
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import ASTSource, make_backend

    gpu_target = GPUTarget(*target)
    backend = make_backend(gpu_target)
    src = ASTSource(fn=fn, signature=signature, constexprs=constexprs or {})
    options = backend.parse_options(src.parse_options())
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    module = src.make_ir(gpu_target, options, backend.get_codegen_implementation(options),
                         backend.get_module_map(), context)
    stages = {}
    backend.add_stages(stages, options, src.language)
    module = stages["ttir"](module, {})
    return generic_from_pretty_ttir(module.str_nodebug())
