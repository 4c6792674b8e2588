"""`LinalgOps`: handlers of linalg ops on tiles: fill (`tt.splat`), transpose (`tt.trans`), matmul
(`tt.dot`, f32 accumulator), reduce (`tt.reduce` combined with its init) and generic (its body on
whole tiles, lazily broadcast; a contraction is computed over its domain, then reduced)."""
from __future__ import annotations

from dataclasses import replace

from ...core import abi
from .builder import TileBuilder
from .values import (PRECISION, Value, constant_value, element_type, fail, is_index, logical_shape, padded_size,
                     tensor_type)

# Associative, commutative ops a contraction may accumulate with.
_COMBINERS = ("arith.addf", "arith.mulf", "arith.maximumf", "arith.minimumf", "arith.addi", "arith.maxsi",
              "arith.minsi")


class LinalgOps(TileBuilder):
    """Needs `precision` (tt.dot's default inputPrecision) from the kernel."""

    def fill(self, op) -> None:
        value = self.scalar(op.operands[0], op)
        shape = logical_shape(op.results[0].type)
        v = self.to_shape(value, tuple(padded_size(n) for n in shape))
        zero = constant_value(op.operands[0]) in (0, 0.0)
        self.values[op.results[0]] = replace(v, logical=shape, zero_pad=zero)

    def transpose(self, op) -> None:
        perm = list(op.attributes["permutation"])
        if perm != [1, 0]:
            raise fail(op, f"transposes 2-D tiles only (permutation [1, 0]), not {perm}")
        x = self.tile(op.operands[0], op)
        shape = (x.shape[1], x.shape[0])
        out = self.generic("tt.trans", [x], shape, x.elt, "order = array<i32: 1, 0>")
        self.values[op.results[0]] = replace(out, logical=(x.logical[1], x.logical[0]), zero_pad=x.zero_pad)

    def matmul(self, op) -> None:
        if "indexing_maps" in op.attributes:
            maps = [str(m) for m in op.attributes["indexing_maps"]]
            if maps != ["affine_map<(d0, d1, d2) -> (d0, d2)>", "affine_map<(d0, d1, d2) -> (d2, d1)>",
                        "affine_map<(d0, d1, d2) -> (d0, d1)>"]:
                raise fail(op, "with transposed or broadcast indexing maps is not supported")
        a, b = self.tile(op.operands[0], op), self.tile(op.operands[1], op)
        c = self.tile(op.operands[2], op)
        if len(a.shape) != 2 or a.shape[1] != b.shape[0] or c.shape != (a.shape[0], b.shape[1]):
            raise fail(op, f"has mismatched tile shapes {a.type} x {b.type} -> {c.type}")
        if a.elt != b.elt:
            raise fail(op, f"multiplies {a.elt} by {b.elt}; tt.dot needs one input type")
        if a.logical[1] != a.shape[1]:
            # Padding lanes of computed tiles hold whatever the computation gave them there.
            a = a if a.zero_pad else self.zero_beyond(a, 1)
            b = b if b.zero_pad else self.zero_beyond(b, 0)
        precision = self.precision
        if abi.PRECISION in op.attributes:
            chosen = op.attributes[abi.PRECISION].value
            if chosen not in PRECISION:
                raise fail(op, f"has attn.precision '{chosen}' (expected one of {', '.join(PRECISION)})")
            precision = PRECISION[chosen]
        attrs = f"inputPrecision = {precision} : i32, maxNumImpreciseAcc = 0 : i32"
        out = self.generic("tt.dot", [a, b, c], c.shape, c.elt, attrs)
        self.values[op.results[0]] = replace(out, logical=c.logical)

    def linalg_generic(self, op) -> None:
        """An elementwise generic, or a contraction whose body ends in `out <combine> value`
        (e.g. a sum over d2 of an expression of q[d0, d2], k[d1, d2]): the value is computed
        over the whole iteration domain, then reduced over the reduction dimensions."""
        from mlir import ir

        n_in, n_out = list(op.attributes["operandSegmentSizes"])
        if n_out != 1:
            raise fail(op, "must have exactly one output for the Triton lowering")
        iters = ["reduction" in str(t) for t in op.attributes["iterator_types"]]
        out_type = op.results[0].type
        logical = logical_shape(out_type)
        maps = [m.value for m in op.attributes["indexing_maps"]]
        out_dims = [e.position for e in maps[n_in].results if isinstance(e, ir.AffineDimExpr)]
        if out_dims != [d for d, red in enumerate(iters) if not red]:
            raise fail(op, f"has an output map the Triton lowering does not support: {maps[n_in]}")
        domain = [None] * len(iters)
        for value, amap in zip(op.operands, maps):
            for axis, e in enumerate(amap.results):
                if isinstance(e, ir.AffineDimExpr) and hasattr(value.type, "shape"):
                    domain[e.position] = value.type.shape[axis]
        if any(n is None for n in domain):
            raise fail(op, "has an iteration dimension no operand spans")
        padded = tuple(padded_size(n) for n in domain)
        block = op.regions[0].blocks[0]
        for k in range(n_in):
            self.values[block.arguments[k]] = self.map_input(op.operands[k], maps[k], len(padded), op)
        out_arg = block.arguments[n_in]
        ops = [o.operation for o in block.operations]
        combiner = None
        if any(iters):
            combiner = getattr(ops[-1].operands[0].owner, "operation", None)
            if (combiner is None or combiner.name not in _COMBINERS or out_arg not in list(combiner.operands)
                    or sum(1 for _ in out_arg.uses) != 1):
                raise fail(op, "with reduction iterators must yield `out <op> value` with <op> one of "
                               + ", ".join(_COMBINERS))
        elif any(True for _ in out_arg.uses):
            # The body reads the output's old value (an in-place update of a carried tile).
            self.values[out_arg] = self.map_input(op.operands[n_in], maps[n_in], len(padded), op)
        saved, self.generic_shape = self.generic_shape, padded
        try:
            for body_op in ops[:-1]:
                if combiner is None or body_op != combiner:
                    self.lower_op(body_op)
        finally:
            self.generic_shape = saved
        if combiner is None:
            result = self.get(ops[-1].operands[0], op)
        else:
            other = [v for v in combiner.operands if v != out_arg][0]
            result = self.to_shape(self.get(other, op), padded)
            for axis in reversed([d for d, red in enumerate(iters) if red]):
                if padded[axis] != domain[axis]:
                    result = self.neutral_beyond(result, axis, domain[axis], combiner.name, op)
                result = self.tt_reduce(result, axis, combiner.name)
            init = self.tile(op.operands[n_in], op)
            result = self.op(combiner.name, self.to_shape(result, init.shape), init)
        if result.elt == "i64" and is_index(out_type):
            # An index the body computed in 64 bits (TensorOps._wide_index) leaves as `index`, i32
            # here: the index tiles generics yield are closure reads' clamped indices, inside i32.
            result = self.cast_int(result, "i32")
        if result.elt != element_type(out_type):
            raise fail(op, f"yields {result.elt} for a {element_type(out_type)} tensor")
        if result.shape != tuple(padded_size(n) for n in logical) and not any(iters):
            # What the tile is before broadcasting ([M, 1] for a value of the row alone): an
            # atomic add uses it to add once per row (attn.scatter_add).
            self.lazy[op.results[0]] = result
        result = self.to_shape(result, tuple(padded_size(n) for n in logical))
        self.values[op.results[0]] = replace(result, logical=logical, zero_pad=False, const=False)

    def map_input(self, value, amap, rank: int, op) -> Value:
        from mlir import ir

        x = self.get(value, op)
        if isinstance(x, Value) and not x.shape:
            return x
        x = self.tile(value, op)
        dims = []
        for e in amap.results:
            if not isinstance(e, ir.AffineDimExpr):
                raise fail(op, f"has an indexing map that is not a projection: {amap}")
            dims.append(e.position)
        if dims != sorted(dims) or len(dims) != len(x.shape):
            raise fail(op, f"has an indexing map the Triton lowering does not support: {amap}")
        for axis in range(rank):
            if axis not in dims:
                x = self.expand(x, axis)
        return replace(x, logical=None)

    def linalg_index(self, op) -> None:
        if self.generic_shape is None:
            raise fail(op, "appears outside a linalg.generic body")
        dim = int(op.attributes["dim"].value)
        self.values[op.results[0]] = self.arange(self.generic_shape[dim], dim, len(self.generic_shape))

    def reduce(self, op) -> None:
        if len(op.results) != 1:
            raise fail(op, "must reduce one tensor")
        x = self.tile(op.operands[0], op)
        # A 1-D tile reduces into a 0-D tensor, which is a scalar here.
        init = self.tile(op.operands[1], op) if op.operands[1].type.rank else self.get(op.operands[1], op)
        dims = list(op.attributes["dimensions"])
        if len(dims) != 1 or len(x.shape) not in (1, 2):
            raise fail(op, "reduces one dimension of a 1-D or 2-D tile only")
        axis = dims[0]
        block = op.regions[0].blocks[0]
        if x.logical[axis] != x.shape[axis]:
            combine = [o.operation.name for o in block.operations][0]
            x = self.neutral_beyond(x, axis, x.logical[axis], combine, op)
        a, b = self.em.fresh("r"), self.em.fresh("r")
        self.values[block.arguments[0]] = Value(a, (), x.elt)
        self.values[block.arguments[1]] = Value(b, (), x.elt)
        with self.em.capture() as lines:
            terminator = self.lower_block(block)
            combined = self.get(terminator.operands[0], op)
            self.em.raw(f'"gpu.yield"({combined.name}) : ({combined.elt}) -> ()')
        rshape = tuple(n for i, n in enumerate(x.shape) if i != axis)
        body = "\n".join(lines)
        name = self.em(f'"tt.reduce"({x.name}) ({{\n^bb0({a}: {x.elt}, {b}: {x.elt}):\n{body}\n}}) '
                       f"{{axis = {axis} : i32}} : ({x.type}) -> {tensor_type(rshape, x.elt)}")
        reduced = Value(name, rshape, x.elt)
        self.values[block.arguments[0]] = reduced
        self.values[block.arguments[1]] = init
        terminator = self.lower_block(block)
        out = self.get(terminator.operands[0], op)
        self.values[op.results[0]] = replace(out, logical=init.logical, zero_pad=False, const=False)
