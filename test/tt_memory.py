"""The TTIR interpreter's memory ops (tt_interp.py): pointer arithmetic, masked loads and stores
that check every active lane against its argument, TMA descriptors and atomics."""

import numpy as np

from tt_values import _Type, _finisher


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
