"""`ClosureAdds`: attn.scatter_add, the closure tensors' gradients added into their destinations
with atomics, as few as the tile's indices allow."""
from __future__ import annotations

import math

from .memory import Memory
from .values import Arg, Value, fail

# The most destination elements a tile's varying indices may reach for the tile to be summed per
# element (one loop iteration and one atomic each) rather than added lane by lane: a loop
# iteration costs a compare, a select and a sum over the tile, which pays where many lanes would
# serialize on few addresses.
ONE_HOT_REACH = 64


class ClosureAdds(Memory):
    def scatter_add(self, op) -> None:
        """attn.scatter_add: relaxed atomic f32 adds into the destination argument; indices outside
        it add nothing. Atomics on one address serialize, so a tile adds as few as it can: where
        every index is the same along a tile axis (it depends on the head, or on the row alone)
        the values are summed along it first, and where the indices that vary inside the tile
        reach at most ONE_HOT_REACH elements (T5's 32 buckets) the tile is summed per element
        they reach, one atomic each; otherwise one atomic per lane."""
        dest = self.destination(self.get(op.operands[0], op))
        if dest is None:
            raise fail(op, "adds into a destination argument only")
        arg = dest.arg
        if arg.elt != "f32":
            raise fail(op, f"adds into a {arg.elt} tensor; atomic adds are f32 here")
        if arg.sizes:
            raise fail(op, "adds into a tensor of any rows; its destination must be statically shaped")
        indices = [self.lazy_value(v, op) for v in op.operands[2:]]
        if len(indices) != len(arg.shape):
            raise fail(op, f"indexes a rank-{len(arg.shape)} tensor with {len(indices)} index tiles")
        values = self.tile(op.operands[1], op)
        if values.elt != "f32" or len(values.shape) != 2:
            raise fail(op, "adds a 2-D f32 tile")
        for axis in range(2):
            if values.logical[axis] != values.shape[axis]:
                values = self.zero_beyond(values, axis)
        shapes = [i.shape for i in indices if i.shape]
        for axis in reversed(range(2)):
            if all(s[axis] == 1 for s in shapes):
                values = self.tt_reduce(values, axis, "arith.addf")
                if shapes:
                    values = self.expand(values, axis)
        varying = [d for d, idx in enumerate(indices) if idx.shape]
        reach = math.prod(arg.shape[d] for d in varying)
        if varying and reach <= ONE_HOT_REACH and math.prod(values.shape) > reach:
            self._add_per_element(arg, values, indices, varying)
        else:
            offset, mask = self._offset(arg, indices, range(len(indices)))
            shape = self.join([values, offset, mask])
            ptrs = self.addptr(self.to_shape(arg.ptr, shape), self.to_shape(offset, shape))
            self._atomic_add(ptrs, self.to_shape(values, shape), self.to_shape(mask, shape))
        self.values[op.results[0]] = dest

    def _add_per_element(self, arg: Arg, values: Value, indices: list, varying: list[int]) -> None:
        """A loop over the elements the varying indices can reach (row-major over those
        dimensions): each sums the tile's values whose indices name it and adds the sum, if not
        zero, with one scalar atomic."""
        flat = None
        for d in varying:
            idx = self.cast_int(indices[d], "i32")
            flat = idx if flat is None else self.op(
                "arith.addi", self.op("arith.muli", flat, self.const(arg.shape[d], "i32")), idx)
        _, inside = self._offset(arg, indices, varying)
        zeros = self.const(0.0, "f32", values.shape)
        values = self.select(self.to_shape(inside, values.shape), values, zeros)
        flat = self.to_shape(flat, values.shape)
        base, uniform_ok = self._offset(arg, indices, [d for d in range(len(indices)) if d not in varying])
        element = Value(self.em.fresh("element"), (), "i32")
        with self.em.capture() as lines:
            total = self.select(self.cmpi("eq", flat, element), values, zeros)
            while total.shape:
                total = self.tt_reduce(total, len(total.shape) - 1, "arith.addf")
            offset, rest = base, element
            for d in reversed(varying):
                size = self.const(arg.shape[d], "i32")
                term = self.cast_int(self.op("arith.remsi", rest, size), "i64")
                if arg.strides[d] != 1:
                    term = self.op("arith.muli", term, self.cast_int(arg.strides[d], "i64"))
                offset = self.op("arith.addi", offset, term)
                rest = self.op("arith.divsi", rest, size)
            nonzero = self.cmpf("une", total, self.const(0.0, "f32"))
            self._atomic_add(self.addptr(arg.ptr, offset), total, self.op("arith.andi", uniform_ok, nonzero))
        self.em.raw(f"scf.for {element.name} = {self.const(0, 'i32').name} to "
                    f"{self.const(math.prod(arg.shape[d] for d in varying), 'i32').name} step "
                    f"{self.const(1, 'i32').name} : i32 {{")
        self.em.lines.extend(lines)
        self.em.raw("}")

    def _atomic_add(self, ptrs: Value, values: Value, mask: Value) -> None:
        operands = [ptrs, values, mask]
        types = ", ".join(o.type for o in operands)
        self.em(f'"tt.atomic_rmw"({", ".join(o.name for o in operands)}) '
                f"{{atomic_rmw_op = 5 : i32, scope = 1 : i32, sem = 1 : i32}} : ({types}) -> {values.type}")
