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

The value model's tables live in tt_values.py, the memory ops in tt_memory.py; Triton's own TTIR
in the generic form this interpreter parses comes from tt_pretty.py.
"""

import itertools

import numpy as np

__all__ = ["OutOfBoundsError", "run_ttir"]


from tt_memory import (_Descriptor, _op_addptr, _op_atomic_rmw, _op_descriptor_load, _op_load,
                       _op_make_tensor_descriptor, _op_store)
from tt_values import (_ADDR_BITS, _ADDR_HALF, _CASTS, _CMPF, _CMPI, _DTYPES, _ELEMENTWISE, OutOfBoundsError,
                       _Type, _finisher, _fp_to_fp)


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
