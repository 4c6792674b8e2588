"""A torch interpreter for L1 kernels, an independent numerical check of the middle of the compiler.

`run_kernel(module, inputs)` runs the kernel functions of an L1 module (the output of `attn-tile`
or `attn-chunk-recurrence`) on torch tensors, in module order: once per program of each one's
`attn.grid`, the destination arguments threaded from one program to the next, as the CPU
lowering's loop nest does.

Value model
- Float tensors and scalars are torch tensors of `float_dtype` (float64 by default: the L1
  algorithm is then checked nearly exactly; float32 mimics the kernels' f32 arithmetic, e.g. to
  show that no intermediate overflows). `arith.truncf` rounds to its result type (bf16, f16), so
  stored outputs carry the rounding a backend gives them.
- Integers and indices are int64 tensors, i1 is bool. Index arithmetic that shapes a slice is
  read back with int().
- `linalg.generic` evaluates its body once, vectorized over the whole iteration domain, with each
  operand viewed through its indexing map; reduction dimensions are walked one index at a time,
  the output element (%out) carrying the accumulator. `linalg.reduce` likewise walks its reduced
  dimension.

The interpreter supports the ops L1 kernels use (attn.program_id, attn.scatter_add, arith, math, tensor.empty /
extract / extract_slice / insert_slice / pad, linalg.fill / matmul / transpose / generic / reduce /
index, scf.for) and raises NotImplementedError naming any other op.
"""
from __future__ import annotations

import itertools

import torch

from ae_mlir.core.regions import ScalarOp
from ae_mlir.core.scalar_eval import eval_op

__all__ = ["run_kernel", "run_by_role", "kernel_of", "kernels_of"]

_INT_TYPES = ("index", "i64", "i32", "i16", "i8")
_ROUNDING = {"bf16": torch.bfloat16, "f16": torch.float16}


def kernels_of(module) -> list:
    """The kernel functions (those with `attn.grid`) of an L1 module, in module order."""
    funcs = [op.operation for op in module.body.operations if op.operation.name == "func.func"]
    kernels = [f for f in funcs if "attn.grid" in f.attributes]
    if not kernels:
        raise ValueError("the module holds no kernel function with attn.grid")
    return kernels


def kernel_of(module):
    """The kernel function of an L1 module that holds one."""
    kernels = kernels_of(module)
    if len(kernels) != 1:
        raise ValueError(f"expected one kernel function with attn.grid, found {len(kernels)}")
    return kernels[0]


def run_kernel(module, inputs: list, float_dtype=torch.float64) -> list:
    """Run the module's kernels in order on `inputs` (the non-destination arguments of the
    first); return the destinations after every program ran, as tensors of `float_dtype`
    (integers stay int64). Kernels that name their arguments' roles (`attn.arg_roles`) share
    tensors by role: a workspace one kernel writes, another reads; then the result is the "out"
    and "state" tensors."""
    kernels = kernels_of(module)
    interp = _Interpreter(float_dtype)
    if "attn.arg_roles" not in kernels[0].attributes:
        return _run_grid(interp, kernel_of(module), [interp.convert_in(t) for t in inputs], None)
    tensors = {}
    for i, t in enumerate(inputs):
        tensors["q k v".split()[i] if i < 3 else f"c{i - 3}"] = interp.convert_in(t)
    for kernel in kernels:
        roles = [str(r).strip('"') for r in kernel.attributes["attn.arg_roles"]]
        n_dest = len(kernel.attributes["function_type"].value.results)
        ins = [tensors[r] for r in roles[:-n_dest]]
        dests = _run_grid(interp, kernel, ins, [tensors.get(r) for r in roles[-n_dest:]])
        tensors.update(zip(roles[-n_dest:], dests))
    return [tensors[r] for r in ("out", "state") if r in tensors]


def run_by_role(module, tensors: dict, float_dtype=torch.float64) -> dict:
    """Run the module's kernels in order, each on the tensors its `attn.arg_roles` name, taken
    from `tensors` (by role) and from what earlier kernels wrote; returns every tensor by role,
    the destinations as the kernels left them (the backward's: dq, delta, dk, dv)."""
    interp = _Interpreter(float_dtype)
    values = {role: interp.convert_in(t) for role, t in tensors.items()}
    for kernel in kernels_of(module):
        roles = [str(r).strip('"') for r in kernel.attributes["attn.arg_roles"]]
        n_dest = len(kernel.attributes["function_type"].value.results)
        dests = _run_grid(interp, kernel, [values[r] for r in roles[:-n_dest]], None)
        values.update(zip(roles[-n_dest:], dests))
    return values


def _run_grid(interp, kernel, values: list, dests: list | None) -> list:
    """Every program of the kernel's grid in turn, the destinations threaded through; missing
    destinations start as zeros."""
    block = kernel.regions[0].blocks[0]
    args = list(block.arguments)
    if len(args) <= len(values):
        raise ValueError(f"the kernel takes {len(args)} arguments; {len(values)} inputs leave no destination")
    dests = [d if d is not None else torch.zeros(_shape(a.type), dtype=interp.dtype_of(str(a.type.element_type)))
             for a, d in zip(args[len(values):], dests or [None] * (len(args) - len(values)))]
    grid = [int(x) for x in kernel.attributes["attn.grid"]]
    for pid in itertools.product(*(range(n) for n in grid)):
        interp.pid = pid
        env = dict(zip(args, values + dests))
        dests = interp.run_block(block, env)
    return dests


def _shape(mlir_type) -> list[int]:
    return list(mlir_type.shape)


def _elt(value) -> str:
    return str(value.type.element_type) if hasattr(value.type, "element_type") else str(value.type)


def _affine_dims(attr) -> list[int]:
    from mlir import ir

    dims = []
    for expr in ir.AffineMapAttr(attr).value.results:
        if not isinstance(expr, ir.AffineDimExpr):
            raise NotImplementedError(f"indexing map result {expr} is not a dimension")
        dims.append(expr.position)
    return dims


def _static_list(attr) -> list[int]:
    return [int(x) for x in attr]


class _Interpreter:
    def __init__(self, float_dtype):
        self.float_dtype = float_dtype
        self.pid = ()

    def dtype_of(self, elt: str):
        if elt in _INT_TYPES:
            return torch.int64
        if elt == "i1":
            return torch.bool
        return self.float_dtype

    def convert_in(self, t):
        if t.dtype.is_floating_point:
            return t.detach().to(self.float_dtype)
        return t.detach().to(torch.int64) if t.dtype != torch.bool else t.detach()

    # --- blocks and ops ------------------------------------------------------------------------
    def run_block(self, block, env: dict) -> list:
        for op in block.operations:
            op = op.operation
            if op.name in ("func.return", "scf.yield", "linalg.yield", "tensor.yield"):
                return [env[v] for v in op.operands]
            results = self.run_op(op, env)
            for r, value in zip(op.results, results):
                env[r] = value
        raise ValueError("block has no terminator")

    def run_op(self, op, env: dict) -> list:
        name = op.name
        vals = [env[v] for v in op.operands]
        handler = getattr(self, "op_" + name.replace(".", "_"), None)
        if handler is not None:
            return handler(op, vals, env)
        if name.startswith(("arith.", "math.")):
            return [self.scalar(op, vals)]
        raise NotImplementedError(f"l1_interp: unsupported op '{name}'")

    def scalar(self, op, vals):
        name = op.name
        if name == "arith.constant":
            return self.constant(op)
        if name == "arith.truncf":
            target = _ROUNDING.get(str(op.results[0].type))
            return vals[0].to(target).to(self.float_dtype) if target is not None else vals[0]
        if name == "arith.extf":
            return vals[0]
        if name == "arith.divui":
            return torch.div(vals[0], vals[1], rounding_mode="floor")
        if name == "arith.ceildivsi":
            return -torch.div(-vals[0], vals[1], rounding_mode="floor")
        out = eval_op(_scalar_op(op), vals)
        return out.to(self.float_dtype) if out.dtype.is_floating_point else out

    def constant(self, op):
        from mlir import ir

        attr = op.attributes["value"]
        if isinstance(attr, ir.DenseElementsAttr):
            dense = attr
            shape = _shape(dense.type)
            dtype = self.dtype_of(str(dense.type.element_type))
            if dense.is_splat:
                value = dense.get_splat_value()
                return torch.full(shape, float(value.value) if dtype.is_floating_point else int(value.value),
                                  dtype=dtype)
            import numpy as np

            return torch.from_numpy(np.array(dense).copy()).to(dtype).reshape(shape)
        # The attribute's own value: its printed form rounds f32 constants to 7 digits.
        if str(attr.type) == "i1":
            return torch.tensor(bool(attr.value))
        if str(attr.type) in ("index", "i64", "i32", "i16", "i8"):
            return torch.tensor(int(attr.value), dtype=torch.int64)
        return torch.tensor(float(attr.value), dtype=torch.float64).to(self.dtype_of(str(attr.type)))

    def op_attn_program_id(self, op, vals, env):
        return [torch.tensor(self.pid[int(op.attributes["axis"].value)], dtype=torch.int64)]

    def op_attn_scatter_add(self, op, vals, env):
        """dest[indices...] += values, elementwise over the tile; indices outside dest add nothing."""
        dest, values, indices = vals[0].clone(), vals[1], vals[2:]
        keep = torch.ones(values.shape, dtype=torch.bool)
        for axis, i in enumerate(indices):
            keep &= (i >= 0) & (i < dest.shape[axis])
        dest.index_put_(tuple(i[keep] for i in indices), values[keep].to(dest.dtype), accumulate=True)
        return [dest]

    def op_tensor_empty(self, op, vals, env):
        return [torch.zeros(_shape(op.results[0].type), dtype=self.dtype_of(_elt(op.results[0])))]

    def op_tensor_extract(self, op, vals, env):
        """A scalar read, or inside a linalg.generic body a gather with broadcast index tensors."""
        tensor, idx = vals[0], vals[1:]
        for axis, i in enumerate(idx):
            if bool(((i < 0) | (i >= tensor.shape[axis])).any()):
                raise IndexError(f"tensor.extract index out of bounds on axis {axis} of {tuple(tensor.shape)}")
        if not idx:
            return [tensor.clone()]
        return [tensor[tuple(torch.broadcast_tensors(*idx))]]

    def slice_params(self, op, dynamic: list) -> tuple[list[int], list[int], list[int]]:
        from mlir import ir

        dyn = iter(int(v) for v in dynamic)
        marker = ir.ShapedType.get_dynamic_size()
        stride_marker = ir.ShapedType.get_dynamic_stride_or_offset()
        out = []
        for key in ("static_offsets", "static_sizes", "static_strides"):
            out.append([next(dyn) if x in (marker, stride_marker) else x
                        for x in _static_list(op.attributes[key])])
        return out[0], out[1], out[2]

    @staticmethod
    def _window(offsets, sizes, strides):
        return tuple(slice(o, o + s * st, st) for o, s, st in zip(offsets, sizes, strides))

    @staticmethod
    def _reduced_shape(sizes: list[int], rank: int) -> list[int]:
        """Rank-reducing slices here drop leading unit dimensions."""
        drop = len(sizes) - rank
        if any(s != 1 for s in sizes[:drop]):
            raise NotImplementedError(f"rank-reducing slice of sizes {sizes} to rank {rank}")
        return sizes[drop:]

    def op_tensor_extract_slice(self, op, vals, env):
        offsets, sizes, strides = self.slice_params(op, vals[1:])
        src = vals[0]
        for axis, (o, s) in enumerate(zip(offsets, sizes)):
            if o < 0 or o + s > src.shape[axis]:
                raise IndexError(f"extract_slice [{o}, {o + s}) out of bounds on axis {axis} of {tuple(src.shape)}")
        piece = src[self._window(offsets, sizes, strides)]
        rank = len(op.results[0].type.shape)
        return [piece.reshape(self._reduced_shape(sizes, rank)).clone()]

    def op_tensor_insert_slice(self, op, vals, env):
        offsets, sizes, strides = self.slice_params(op, vals[2:])
        src, dest = vals[0], vals[1].clone()
        for axis, (o, s) in enumerate(zip(offsets, sizes)):
            if o < 0 or o + s > dest.shape[axis]:
                raise IndexError(f"insert_slice [{o}, {o + s}) out of bounds on axis {axis} of {tuple(dest.shape)}")
        dest[self._window(offsets, sizes, strides)] = src.reshape(sizes).to(dest.dtype)
        return [dest]

    def op_tensor_pad(self, op, vals, env):
        from mlir import ir

        src = vals[0]
        rank = src.dim()
        dyn = iter(int(v) for v in vals[1:])
        marker = ir.ShapedType.get_dynamic_size()
        low = [next(dyn) if x == marker else x for x in _static_list(op.attributes["static_low"])]
        high = [next(dyn) if x == marker else x for x in _static_list(op.attributes["static_high"])]
        region = op.regions[0].blocks[0]
        index_args = [torch.tensor(0, dtype=torch.int64)] * rank
        (value,) = self.run_block(region, {**env, **dict(zip(region.arguments, index_args))})
        widths = []
        for lo, hi in reversed(list(zip(low, high))):
            widths += [lo, hi]
        return [torch.nn.functional.pad(src, widths, value=float(value))]

    def op_tensor_collapse_shape(self, op, vals, env):
        return [vals[0].reshape(_shape(op.results[0].type)).clone()]

    def op_tensor_expand_shape(self, op, vals, env):
        return [vals[0].reshape(_shape(op.results[0].type)).clone()]

    def op_linalg_fill(self, op, vals, env):
        return [torch.full_like(vals[1], float(vals[0]))]

    def op_linalg_matmul(self, op, vals, env):
        a, b, c = vals
        return [c + a.to(c.dtype) @ b.to(c.dtype)]

    def op_linalg_transpose(self, op, vals, env):
        perm = _static_list(op.attributes["permutation"])
        return [vals[0].permute(perm).contiguous()]

    def op_linalg_reduce(self, op, vals, env):
        src, init = vals
        dims = _static_list(op.attributes["dimensions"])
        kept = [d for d in range(src.dim()) if d not in dims]
        moved = src.permute(dims + kept).reshape(-1, *[src.shape[d] for d in kept])
        block = op.regions[0].blocks[0]
        acc = init
        for row in moved:
            (acc,) = self.run_block(block, {**env, block.arguments[0]: row, block.arguments[1]: acc})
        return [acc]

    def op_linalg_generic(self, op, vals, env):
        maps = [_affine_dims(m) for m in op.attributes["indexing_maps"]]
        iterators = [str(it).split("<")[-1].rstrip(">").strip('"') for it in op.attributes["iterator_types"]]
        rank = len(iterators)
        n_in = len(vals) - 1
        sizes = [None] * rank
        for value, dims in zip(vals, maps):
            for axis, d in enumerate(dims):
                sizes[d] = value.shape[axis]
        if None in sizes:
            raise NotImplementedError("a loop dimension of a linalg.generic is read by no operand")
        parallel = [d for d in range(rank) if iterators[d] == "parallel"]
        reduction = [d for d in range(rank) if iterators[d] == "reduction"]
        out_dims = maps[-1]
        if out_dims != parallel:
            raise NotImplementedError(f"output map {out_dims} must list the parallel dimensions {parallel} in order")
        block = op.regions[0].blocks[0]
        out = vals[-1]
        # Views of each input over the parallel dimensions, for one fixed point of the reduction ones.
        def view(value, dims, point):
            index = tuple(point.get(d, slice(None)) for d in dims)
            picked = value[index]
            remaining = [d for d in dims if d not in point]
            order = sorted(range(len(remaining)), key=lambda i: parallel.index(remaining[i]))
            picked = picked.permute(order) if picked.dim() else picked
            shape = [sizes[d] if d in remaining else 1 for d in parallel]
            return picked.reshape(shape)

        def index_value(d, point):
            if d in point:
                return torch.tensor(point[d], dtype=torch.int64)
            shape = [1] * len(parallel)
            shape[parallel.index(d)] = sizes[d]
            return torch.arange(sizes[d], dtype=torch.int64).view(shape)

        acc = out
        for combo in itertools.product(*(range(sizes[d]) for d in reduction)):
            point = dict(zip(reduction, combo))
            local = dict(env)
            for arg, value, dims in zip(block.arguments, vals[:n_in], maps):
                local[arg] = view(value, dims, point)
            local[block.arguments[n_in]] = acc
            (result,) = self._generic_body(block, local, point, index_value)
            acc = result.expand(out.shape).to(out.dtype).clone()
        return [acc]

    def _generic_body(self, block, env, point, index_value):
        for inner in block.operations:
            inner = inner.operation
            if inner.name == "linalg.yield":
                return [env[v] for v in inner.operands]
            if inner.name == "linalg.index":
                env[inner.results[0]] = index_value(int(inner.attributes["dim"].value), point)
                continue
            for r, value in zip(inner.results, self.run_op(inner, env)):
                env[r] = value
        raise ValueError("linalg.generic body has no linalg.yield")

    def op_scf_for(self, op, vals, env):
        lower, upper, step = (int(v) for v in vals[:3])
        carried = vals[3:]
        block = op.regions[0].blocks[0]
        for i in range(lower, upper, step):
            local = dict(env)
            local[block.arguments[0]] = torch.tensor(i, dtype=torch.int64)
            for arg, value in zip(list(block.arguments)[1:], carried):
                local[arg] = value
            carried = self.run_block(block, local)
        return carried


def _scalar_op(op) -> ScalarOp:
    """An L1 scalar op as the shared evaluator's `ScalarOp` (operands are passed positionally)."""
    attrs = tuple((name, str(op.attributes[name])) for name in op.attributes)
    return ScalarOp(op.name, tuple(f"arg{i}" for i in range(len(op.operands))), attrs,
                    tuple(str(r.type) for r in op.results), tuple(str(v.type) for v in op.operands))
