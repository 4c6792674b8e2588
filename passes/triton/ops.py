"""`TensorOps`: handlers of the L1 ops that are not linalg: constants, program ids, slices and pads
(tile loads), insert_slice (tile stores), element reads, scf.for and the return; elementwise
arith/math ops through `ElementwiseOps`."""
from __future__ import annotations

import math
from dataclasses import replace

from ..index_bounds import I32
from .elementwise import ElementwiseOps
from .tables import Tables
from .values import (reassociation_of, reshaped_padding, DYNAMIC, Arg, Dest, Empty, Slice, Table, Value, constant_int, constant_value, element_type,
                     fail, is_index, padded_size, scalar_literal)

class TensorOps(Tables, ElementwiseOps):
    """Needs `grid`, `dests` and `dest_labels` (set by setup_args), `dest_of` and `loaded_slices`
    from the kernel."""

    def constant(self, op) -> None:
        from mlir import ir

        attr = op.attributes["value"]
        result = op.results[0]
        if isinstance(attr, ir.DenseElementsAttr):
            if isinstance(attr, ir.DenseIntElementsAttr) and not attr.is_splat:
                import numpy as np

                self.values[result] = Table(np.array(attr).astype(np.int64), str(attr))
                return
            if not attr.is_splat:
                raise fail(op, "non-splat float tensor constants are not supported by the Triton lowering")
            shape = tuple(result.type.shape)
            scalar = scalar_literal(attr.get_splat_value())
            if isinstance(attr, ir.DenseIntElementsAttr) and len(shape) <= 2:
                import numpy as np

                self.values[result] = Table(np.full(shape, int(scalar), np.int64), str(attr))
                return
            v = self.const(scalar, element_type(result.type), tuple(padded_size(n) for n in shape))
            zero = isinstance(attr.get_splat_value(), ir.FloatAttr) and attr.get_splat_value().value == 0
            self.values[result] = replace(v, logical=shape, zero_pad=zero)
            return
        value = scalar_literal(attr)
        elt = element_type(result.type)
        if elt == "i32" and is_index(result.type) and not I32[0] <= value <= I32[1]:
            elt = "i64"  # an index constant past i32 (a hash's factor) makes its ops 64-bit
        self.values[result] = self.const(value, elt)

    def program_id(self, op) -> None:
        axis = int(op.attributes["axis"].value)
        if axis not in (0, 1, 2):
            raise fail(op, f"has axis {axis}; L1 kernels have axes 0 (batch), 1 (head), 2 (query block)")
        if self.coordinates is None:
            if op.operation.parent.name != "func.func":
                raise fail(op, "must be in the kernel's entry block (all three ids are computed together)")
            self.coordinates = self.program_coordinates()
        self.values[op.results[0]] = self.coordinates[axis]

    def empty(self, op) -> None:
        self.values[op.results[0]] = Empty()

    def extract_slice(self, op) -> None:
        src = self.get(op.operands[0], op)
        offsets, sizes, strides = _mixed(self, op, 1)
        if any(s != 1 for s in strides):
            raise fail(op, "must have unit strides")
        rtype = op.results[0].type
        if isinstance(src, Arg):
            sl = Slice(src, offsets, sizes, _descriptor_spans(op, src.shape))
            # canonicalize makes a ragged slice of constant size (the last KV tile, or a whole
            # sequence shorter than the block) static while the tensor.pad after it still pads to
            # the block: loaded here at the slice's own power of two, the pad could not widen it.
            if rtype.has_static_shape and not _only_padded(op.results[0]):
                self.values[op.results[0]] = self.load_slice(sl, tuple(rtype.shape), op)
                self.loaded_slices[op.results[0]] = sl
            else:
                self.values[op.results[0]] = sl
            return
        if isinstance(src, Value) and src.shape and all(isinstance(o, int) and o == 0 for o in offsets):
            src = self.full(src)
            rank = len(src.shape)
            dims = tuple(n if n != DYNAMIC else src.logical[i] for i, n in enumerate(rtype.shape))
            exact = tuple(1 << (n - 1).bit_length() for n in dims)
            if len(dims) != rank or src.shape not in (tuple(padded_size(n) for n in dims), exact):
                raise fail(op, "may only trim a computed tile within its padded power-of-two shape")
            self.values[op.results[0]] = replace(src, logical=dims, zero_pad=False)
            return
        raise fail(op, "slices a function argument or the origin of a computed tile only")

    def pad(self, op) -> None:
        src = self.get(op.operands[0], op)
        low = list(op.attributes["static_low"])
        if any(x != 0 for x in low):
            raise fail(op, "pads at the high end only")
        terminator = list(op.regions[0].blocks[0].operations)[-1].operation
        if constant_value(terminator.operands[0]) not in (0, 0.0):
            raise fail(op, "must pad with zeros (the tile load fills masked lanes with 0)")
        shape = tuple(op.results[0].type.shape)
        if isinstance(src, Slice):
            collapse = _collapsed_by(op.results[0])
            padded = reshaped_padding(shape, reassociation_of(collapse)) if collapse is not None else None
            self.values[op.results[0]] = self.load_slice(src, shape, op, padded)
            return
        if isinstance(src, Value) and src.zero_pad and src.shape == tuple(padded_size(n) for n in shape):
            self.values[op.results[0]] = replace(src, logical=shape)
            return
        if op.operands[0] in self.loaded_slices:
            # Also read unpadded, the slice was loaded at its own shape; the pad needs a wider tile.
            self.values[op.results[0]] = self.load_slice(self.loaded_slices[op.operands[0]], shape, op)
            return
        raise fail(op, "pads a slice of a function argument only")

    def insert_slice(self, op) -> None:
        value = self.tile(op.operands[0], op)
        dest = self.destination(self.get(op.operands[1], op))
        if dest is None:
            raise fail(op, "inserts into a destination argument only")
        arg = dest.arg
        offsets, sizes, strides = _mixed(self, op, 2)
        if any(s != 1 for s in strides):
            raise fail(op, "must have unit strides")
        rank, t = len(arg.shape), len(value.shape)
        if any(s != 1 for s in sizes[: rank - t]):
            raise fail(op, "must write a tile into the trailing dimensions (leading sizes must be 1)")
        if value.elt != arg.elt:
            raise fail(op, f"stores {value.elt} into a {arg.elt} tensor")
        ptrs, mask = self.tile_pointers(arg, self.origin(arg, offsets), value.shape, sizes[rank - t:])
        self.store(ptrs, value, mask)
        self.values[op.results[0]] = dest

    def reshape(self, op) -> None:
        """tensor.collapse_shape / expand_shape of a tile as tt.reshape (row-major, as both are)."""
        if isinstance(self.get(op.operands[0], op), Empty):
            # Canonicalization moves a fill past the reshape of its tensor.empty (a kernel whose
            # every KV tile is masked zero-fills its output so): still an uninitialized outs.
            self.values[op.results[0]] = Empty()
            return
        x = self.tile(op.operands[0], op)
        logical = tuple(op.results[0].type.shape)
        if op.name == "tensor.expand_shape":
            shape = reshaped_padding(logical, reassociation_of(op))
        else:
            shape = tuple(padded_size(n) for n in logical)
        if math.prod(shape) != math.prod(x.shape):
            raise fail(op, "reshapes tiles only where the dimensions it merges or splits are powers of two")
        out = self.generic("tt.reshape", [x], shape, x.elt)
        self.values[op.results[0]] = replace(out, logical=logical, zero_pad=x.zero_pad)

    def extract(self, op) -> None:
        src = self.get(op.operands[0], op)
        indices = list(op.operands[1:])
        lowered = [self.get(i, op) for i in indices]
        if not all(isinstance(v, Value) for v in lowered):
            raise fail(op, "has an index that is not an integer value")
        if isinstance(src, Table) and not any(v.shape for v in lowered):
            self.values[op.results[0]] = self.table_lookup(src, indices, op)
            return
        if isinstance(src, Value) and not src.shape and not indices:
            self.values[op.results[0]] = src  # the element of a 0-D tensor (a reduced tile) is its scalar
            return
        if isinstance(src, Table):
            src = self.table_arg(src)
        if not isinstance(src, Arg):
            raise fail(op, "reads elements of closure tensors, block tables or 0-D tensors only")
        inside = [self.index_bounds.within(i, 0, n - 1) for i, n in zip(indices, src.shape)]
        self.values[op.results[0]] = self.gather(src, lowered, op, inside)

    def dim(self, op) -> None:
        """tensor.dim of an argument: the size argument of a dimension that takes any size (a
        packed batch's rows), else the static size."""
        src, d = self.get(op.operands[0], op), constant_int(op.operands[1])
        if not isinstance(src, Arg) or d is None:
            raise fail(op, "reads the size of a kernel argument's dimension, named by a constant, only")
        self.values[op.results[0]] = src.sizes.get(d) or self.const(src.shape[d], "i32")

    def scf_for(self, op) -> None:
        lb, ub, step = (self.scalar(v, op) for v in list(op.operands)[:3])
        block = op.regions[0].blocks[0]
        iv = self.em.fresh("iv")
        self.values[block.arguments[0]] = Value(iv, (), "i32")
        # A destination tensor threaded through the loop (stores inside it) is memory, not a
        # loop-carried value: only tiles and scalars become iter_args.
        carried = []
        for k, value in enumerate(list(op.operands)[3:]):
            init = self.get(value, op)
            dest = self.destination(init)
            if dest is not None:
                self.values[block.arguments[k + 1]] = dest
                self.values[op.results[k]] = dest
            else:
                carried.append(k)
        inits = [self.carried(self.get(op.operands[3 + k], op), op) for k in carried]
        names = [self.em.fresh("it") for _ in inits]
        for k, init, name in zip(carried, inits, names):
            self.values[block.arguments[k + 1]] = replace(init, name=name, const=False)
        with self.em.capture() as lines:
            terminator = self.lower_block(block)
            for k, value in enumerate(terminator.operands):
                if k not in carried and self.destination(self.get(value, op)) is not self.values[op.results[k]]:
                    raise fail(op, "must yield the destination it carries, updated by tensor.insert_slice")
            yields = [self.carried(self.get(terminator.operands[k], op), op) for k in carried]
            for y, init in zip(yields, inits):
                if y.type != init.type:
                    raise fail(op, f"carries {init.type} into the loop but yields {y.type}")
            if yields:
                self.em.raw(f"scf.yield {', '.join(y.name for y in yields)} : {', '.join(y.type for y in yields)}")
        types = ", ".join(i.type for i in inits)
        head = f"scf.for {iv} = {lb.name} to {ub.name} step {step.name}"
        if inits:
            result = self.em.fresh("for")
            bindings = ", ".join(f"{n} = {i.name}" for n, i in zip(names, inits))
            self.em.raw(f"{result}:{len(inits)} = {head} iter_args({bindings}) -> ({types}) : i32 {{")
        else:
            self.em.raw(f"{head} : i32 {{")
        self.em.lines.extend(lines)
        self.em.raw("}")
        for j, (k, init) in enumerate(zip(carried, inits)):
            self.values[op.results[k]] = replace(init, name=f"{result}#{j}", const=False)

    def destination(self, v) -> Dest | None:
        """The destination a value stands for (a trailing destination argument or an update of
        one), or None."""
        if isinstance(v, Dest):
            return v
        if isinstance(v, Arg) and v.label in self.dest_labels:
            return self.dest_of.setdefault(v.label, Dest(v))
        return None

    def carried(self, v, op) -> Value:
        if not isinstance(v, Value):
            raise fail(op, "carries a value that is neither a scalar nor a tile through the loop")
        return self.full(v)

    def func_return(self, op) -> None:
        for k, value in enumerate(op.operands):
            dest = self.destination(self.get(value, op))
            if dest is None:
                raise fail(op, "must return the destination arguments, updated by tensor.insert_slice")
            if dest.arg is not self.values[self.dests[k]]:
                raise fail(op, f"returns result {k} from the wrong destination")


def _collapsed_by(value):
    """The tensor.collapse_shape that is the only user of `value`, or None."""
    users = [getattr(use.owner, "operation", use.owner) for use in value.uses]
    return users[0] if len(users) == 1 and users[0].name == "tensor.collapse_shape" else None


def _only_padded(value) -> bool:
    users = [getattr(use.owner, "operation", use.owner) for use in value.uses]
    return bool(users) and all(user.name == "tensor.pad" for user in users)


def _descriptor_spans(op, shape: tuple) -> tuple | None:
    """`Slice.spans` of a tensor.extract_slice of an argument of `shape` (see there): read from
    the L1 ops, where a ragged tile's size is `min(size - offset, block)`."""
    rank = len(shape)
    if rank < 2:
        return None
    offsets, sizes, _ = _mixed_l1(op, 1)
    if any(not isinstance(o, int) and not _at_function_level(o) for o in offsets[: rank - 2]):
        return None
    spans = []
    for d in (rank - 2, rank - 1):
        offset, size = offsets[d], sizes[d]
        if isinstance(size, int):
            spans.append(None if isinstance(offset, int) and offset + size == shape[d] else size)
            continue
        block = _block_up_to_end(size, offset, shape[d])
        if block is None:
            return None
        spans.append(block)
    return tuple(spans)


def _block_up_to_end(size, offset, extent: int) -> int | None:
    """C where the L1 value `size` is arith.minsi(extent - offset, C) (either operand order), else None."""
    owner = getattr(size.owner, "operation", None)
    if owner is None or owner.name != "arith.minsi":
        return None
    for rest, block in (tuple(owner.operands), tuple(owner.operands)[::-1]):
        c = constant_int(block)
        sub = getattr(rest.owner, "operation", None)
        if c is None or sub is None or sub.name != "arith.subi" or constant_int(sub.operands[0]) != extent:
            continue
        other = sub.operands[1]
        if (constant_int(other) == offset) if isinstance(offset, int) else other == offset:
            return c
    return None


def _at_function_level(value) -> bool:
    """Whether an L1 value is defined by an op in the function's own block (so it holds one value
    for the whole program)."""
    owner = getattr(value.owner, "operation", None)
    return owner is not None and owner.parent is not None and owner.parent.name == "func.func"


def _mixed_l1(op, first: int) -> tuple[list, list, list]:
    """Offsets, sizes and strides of a slice op: ints where static or constant, L1 values where not."""
    dynamic = iter(list(op.operands)[first:])
    groups = []
    for key in ("static_offsets", "static_sizes", "static_strides"):
        out = []
        for s in op.attributes[key]:
            if s == DYNAMIC:
                v = next(dynamic)
                c = constant_int(v)
                out.append(c if c is not None else v)
            else:
                out.append(int(s))
        groups.append(out)
    return groups[0], groups[1], groups[2]


def _mixed(kernel: TensorOps, op, first: int) -> tuple[list, list, list]:
    """Offsets, sizes and strides of a slice op: ints where static, lowered scalars where not."""
    return tuple([x if isinstance(x, int) else kernel.scalar(x, op) for x in group]
                 for group in _mixed_l1(op, first))
