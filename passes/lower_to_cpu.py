"""`attn-lower-to-cpu`: L1 kernels become LLVM-dialect code for the host CPU.

Everything happens inside this one pass, so that `attn-tile,attn-lower-to-cpu` (or
`attn-chunk-recurrence,attn-lower-to-cpu`) ends in the llvm dialect, ready for the JIT. In order:

1. The grid (`lower_grid`). A kernel (`attn.grid = array<i64: ...>`) runs once per program; a nest
   of `scf.for` loops over the grid runs them all in turn, carrying the destination tensors (the
   trailing arguments, one per result) so each program's `tensor.insert_slice` stays in
   destination-passing style; `attn.program_id` becomes the induction variable of its axis.
   `stage=loops` stops here.
2. Tiling and vectorization on tensors (transform script, `VECTORIZE_SCRIPT`): matmuls to
   register tiles, elementwise ops and row reductions to row blocks, then every linalg op to
   vector ops; a tile load (`tensor.pad` of a slice) becomes a masked transfer.
3. One-shot bufferization (`BUFFERIZE_SCRIPT`) with fully dynamic layouts at function boundaries:
   a strided torch tensor is passed as is and a tile load from an argument is a subview, so
   nothing of size L is copied and every allocation is tile-sized. Then
   `drop-equivalent-buffer-results`: the kernel writes its destination arguments and returns
   nothing.
4. Vector lowering (`VECTOR_LOWERING_SCRIPT`): accumulators are hoisted out of reduction loops
   into registers, contractions become outer products, transfers 1-D loads and stores. Buffers
   leave the loops and get their deallocations (`LOOPS_PIPELINE`). `stage=memrefs` stops here.
5. Upstream conversions to the llvm dialect (`LLVM_PIPELINE`); the kernel carries
   `llvm.emit_c_interface`, so a C caller passes one memref descriptor per argument.

Hand-written, because no upstream pass or transform op does it (each says why): `lower_grid`,
`widen_bool_arguments`, `split_empty_tensors`, `carry_loop_state_in_place` (with
`mark_state_loops`), `pin_unit_inner_stride`, `lower_gathers`, `align_vector_views`, `expand_exponentials` and
`flatten_math_vectors`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Literal

from ..core.context import CompileError, Diagnostic, diagnostic_from_mlir, location_parts
from . import ModulePass, option

GRID_ATTR = "attn.grid"

# Before bufferization, on tensors.
TENSOR_PIPELINE = "canonicalize,cse"

# Register tiles: a matmul runs as 8x32 (rows x columns) outer products, one reduction step at a
# time, so its accumulator stays in vector registers (16 x 16-lane or 32 x 8-lane); elementwise and
# row-reduction ops run 8 rows at a time, at most ROW_LENGTH elements of a row at once.
MATMUL_TILE = (8, 32)
ROW_TILE = 8
ROW_LENGTH = 256
TRANSPOSE_TILE = 8
TILE_ATTR = "ae.cpu_tile"

# Tile and vectorize, through the transform dialect (upstream has no pass that tiles linalg ops).
VECTORIZE_SCRIPT = """
module attributes {{transform.with_named_sequence}} {{
  transform.named_sequence @__transform_main(%root: !transform.any_op {{transform.readonly}}) {{
{tiling}
    %func = transform.structured.match ops{{["func.func"]}} in %root : (!transform.any_op) -> !transform.any_op
    %vectorized = transform.structured.vectorize_children_and_apply_patterns %func
        {{vectorize_padding, vectorize_nd_extract}} : (!transform.any_op) -> !transform.any_op
    transform.yield
  }}
}}
"""

# Bufferize, also through the transform dialect: only the transform op of one-shot bufferization
# exposes `memcpy_op`, and with linalg.copy the copies bufferization adds (tile stores into strided
# outputs) are vectorized like the rest instead of becoming calls to `memrefCopy` in the MLIR
# runner-utils library. Canonicalization first erases the copies that bufferized in place.
BUFFERIZE_SCRIPT = """
module attributes {transform.with_named_sequence} {
  transform.named_sequence @__transform_main(%root: !transform.any_op {transform.consumed}) {
    %0 = transform.bufferization.one_shot_bufferize layout{FullyDynamicLayoutMap} %root
        {bufferize_function_boundaries = true, memcpy_op = "linalg.copy"} : (!transform.any_op) -> !transform.any_op
    %func = transform.structured.match ops{["func.func"]} in %0 : (!transform.any_op) -> !transform.any_op
    transform.apply_patterns to %func { transform.apply_patterns.canonicalization } : !transform.any_op
    %copies = transform.structured.vectorize_children_and_apply_patterns %func : (!transform.any_op) -> !transform.any_op
    transform.yield
  }
}
"""

STATE_LOOP_ATTR = "ae.cpu_state_loop"

TILE_STEP = """    %t{n} = transform.structured.match attributes{{{attr} = {n} : i64}} in %root : (!transform.any_op) -> !transform.any_op
    %tiled{n}, %loops{n}:{loops} = transform.structured.tile_using_for %t{n} tile_sizes [{sizes}]
        : (!transform.any_op) -> ({results})"""

# After bufferization: accumulators stay in registers across the reduction loop, and vector ops
# are lowered to the 1-D forms the LLVM conversion takes. Each pattern set is applied on its own,
# in this order (the order upstream's former `lower_vectors` transform used); applied together,
# some of them undo each other forever.
VECTOR_LOWERING = (
    'vector.lower_contraction lowering_strategy = "outerproduct"',
    "vector.transfer_permutation_patterns",
    'vector.lower_multi_reduction lowering_strategy = "innerreduction"',
    'vector.split_transfer_full_partial split_transfer_strategy = "vector-transfer"',
    "vector.transfer_to_scf max_transfer_rank = 1 full_unroll = true",
    "vector.lower_transfer max_transfer_rank = 1",
    "vector.lower_shape_cast",
    'vector.lower_transpose lowering_strategy = "shuffle_1d"',
    "vector.lower_outerproduct",
    "vector.lower_broadcast",
    "canonicalization",
)
VECTOR_LOWERING_SCRIPT = """
module attributes {{transform.with_named_sequence}} {{
  transform.named_sequence @__transform_main(%root: !transform.any_op {{transform.readonly}}) {{
    %func = transform.structured.match ops{{["func.func"]}} in %root : (!transform.any_op) -> !transform.any_op
    %hoisted = transform.structured.hoist_redundant_vector_transfers %func : (!transform.any_op) -> !transform.any_op
{steps}
    transform.yield
  }}
}}
""".format(steps="\n".join(f"    transform.apply_patterns to %hoisted {{ transform.apply_patterns.{p} }} : !transform.any_op"
                           for p in VECTOR_LOWERING))

# `drop-equivalent-buffer-results` leaves public functions alone (their callers are unknown), so
# the kernels are private while it runs; their results are then their destination arguments.
DROP_RESULTS_PIPELINE = "canonicalize,drop-equivalent-buffer-results"

# After bufferization and vector lowering: tile buffers out of the loops, deallocation, the
# remaining linalg ops (those that did not vectorize) to loops.
LOOPS_PIPELINE = ",".join([
    "func.func(buffer-loop-hoisting)",
    "buffer-deallocation-pipeline",
    "convert-bufferization-to-memref",
    "convert-linalg-to-loops",
    "convert-vector-to-scf",
    "canonicalize",
    "cse",
])

# To the llvm dialect. bf16 has no LLVM arithmetic on most CPUs, and the L1 kernel only converts to
# and from it (all arithmetic is f32), so `arith-expand{include-bf16}` turning extf/truncf into
# integer bit operations is enough; f16 conversions are native (F16C, NEON). Row sums may be
# added in any order (a tree of vector adds instead of one scalar add per element); math ops LLVM
# has no intrinsic for become libm calls.
LLVM_PIPELINE = ",".join([
    "lower-affine",
    "convert-scf-to-cf",
    "arith-expand{include-bf16}",
    "expand-strided-metadata",
    "lower-affine",
    "convert-vector-to-llvm{reassociate-fp-reductions}",
    "finalize-memref-to-llvm",
    "convert-math-to-llvm",
    "convert-math-to-libm",
    "convert-arith-to-llvm",
    "convert-index-to-llvm",
    "convert-cf-to-llvm",
    "convert-func-to-llvm",
    "convert-ub-to-llvm",
    "reconcile-unrealized-casts",
    "canonicalize",
])

# exp2(r) on [-1/2, 1/2] (Cephes exp2f), highest degree first.
EXP2_POLYNOMIAL = (1.535336188319500e-4, 1.339887440266574e-3, 9.618437357674640e-3,
                   5.550332471162809e-2, 2.402264791363012e-1, 6.931472028550421e-1, 1.0)
# (exp(r) - 1 - r) / r^2 on [-ln(2)/2, ln(2)/2] (Cephes expf); ln 2 = LN2_HIGH + LN2_LOW, the high
# part exact in a few bits so that n * LN2_HIGH is exact.
EXP_POLYNOMIAL = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
                  1.6666665459e-1, 5.0000001201e-1)
LN2_HIGH = 0.693359375
LN2_LOW = -2.12194440e-4
LOG2E = 1.4426950408889634


def _fail(op, message: str) -> CompileError:
    filename, line, col = location_parts(op.location)
    return CompileError(message, [Diagnostic("error", f"'{op.name}' op {message}", filename, line, col)])


def _ops(block) -> list:
    return [op.operation for op in block.operations]


def _walk(op, name: str) -> list:
    from mlir import ir

    found = []

    def visit(inner):
        if inner.name == name or (name.endswith(".") and inner.name.startswith(name)):
            found.append(inner)
        return ir.WalkResult.ADVANCE

    op.walk(visit)
    return found


def lower_grid(func) -> list:
    """Replace `attn.program_id` in kernel `func` by the induction variables of a loop nest over
    its `attn.grid`, the loops carrying the destination arguments; returns the loops, outermost
    first."""
    from mlir import ir
    from mlir.dialects import arith, scf

    op = func.operation
    grid = [int(x) for x in op.attributes[GRID_ATTR]]
    if not grid or any(n < 0 for n in grid):
        raise _fail(op, f"'{GRID_ATTR}' must list at least one extent, none negative, got {grid}")
    block = func.regions[0].blocks[0]
    body = _ops(block)
    ret = body[-1]
    if ret.name != "func.return":
        raise _fail(op, "a kernel must end with func.return")
    n_out = len(ret.operands)
    args = list(block.arguments)
    if n_out == 0 or n_out > len(args):
        raise _fail(op, "a kernel returns its destination arguments updated; this one returns "
                        f"{n_out} values for {len(args)} arguments")
    dests = args[len(args) - n_out:]
    for dest, result in zip(dests, ret.operands):
        if dest.type != result.type:
            raise _fail(op, f"result type {result.type} does not match its destination argument type {dest.type}")
    program_ids = _walk(op, "attn.program_id")
    for pid in program_ids:
        axis = int(pid.attributes["axis"].value)
        if not 0 <= axis < len(grid):
            raise _fail(pid, f"axis {axis} is outside the {len(grid)}-d grid")

    with op.context, op.location:
        index = ir.IndexType.get()
        ip = ir.InsertionPoint.at_block_begin(block)
        zero = arith.ConstantOp(index, 0, ip=ip).result
        one = arith.ConstantOp(index, 1, ip=ip).result
        carried = list(dests)
        loops = []
        for extent in grid:
            upper = arith.ConstantOp(index, extent, ip=ip).result
            loop = scf.ForOp(zero, upper, one, carried, ip=ip)
            if loops:
                scf.YieldOp(loop.results, ip=ip)
            loops.append(loop)
            carried = list(loop.inner_iter_args)
            ip = ir.InsertionPoint(loop.body)
        innermost = loops[-1]
        terminator = scf.YieldOp(list(ret.operands), ip=ip)
        for moved in body[:-1]:
            moved.move_before(terminator)
        for dest, inner in zip(dests, innermost.inner_iter_args):
            dest.replace_all_uses_except(inner, loops[0].operation)
        for i, result in enumerate(loops[0].results):
            ret.operands[i] = result
        for pid in program_ids:
            axis = int(pid.attributes["axis"].value)
            pid.results[0].replace_all_uses_with(loops[axis].induction_variable)
            pid.erase()
        del op.attributes[GRID_ATTR]
        op.attributes["llvm.emit_c_interface"] = ir.UnitAttr.get()
    return [loop.operation for loop in loops]


@dataclass(frozen=True)
class LowerToCpu(ModulePass):
    name: ClassVar[str] = "attn-lower-to-cpu"
    summary: ClassVar[str] = ("Lower L1 kernels to the llvm dialect for the host CPU: loops over the grid, "
                              "then upstream tiling, vectorization, bufferization and conversion to LLVM")

    unit_inner_stride: bool = option(
        True, "the caller passes arrays whose innermost dimension has unit stride (any other strides "
              "stay dynamic); false accepts any strides, at the cost of element-wise tile loads")

    stage: Literal["loops", "memrefs", "llvm"] = option(
        "llvm", "where to stop: after the grid loops (tensors), before the conversion to LLVM "
                "(memrefs, vectors), or in the llvm dialect")

    def apply(self, module_op) -> None:
        kernels = []
        for op in _ops(module_op.regions[0].blocks[0]):
            if op.name == "func.func" and GRID_ATTR in op.attributes:
                kernels.append(op)
        for stray in _walk(module_op, "attn."):
            inside = stray.parent
            while inside is not None and inside.name != "func.func":
                inside = inside.parent
            if stray.name != "attn.program_id" or inside is None or GRID_ATTR not in inside.attributes:
                raise _fail(stray, "is not L1 input for the CPU lowering; run attn-fuse-online-softmax and "
                                   "attn-tile (or attn-chunk-recurrence) first (attn.program_id may appear "
                                   f"only in a function with '{GRID_ATTR}')")
        for kernel in kernels:
            grid_loops = lower_grid(kernel)
            widen_bool_arguments(kernel)
            mark_state_loops(kernel, grid_loops)
        _run_pipeline(module_op, TENSOR_PIPELINE)
        split_empty_tensors(module_op)
        if self.stage == "loops":
            for loop in _walk(module_op, "scf.for"):
                if STATE_LOOP_ATTR in loop.attributes:
                    del loop.attributes[STATE_LOOP_ATTR]
            return
        _run_transform(module_op, _vectorize_script(kernels))
        carry_loop_state_in_place(module_op)
        _run_transform(module_op, BUFFERIZE_SCRIPT)
        _drop_results(module_op, kernels)
        if self.unit_inner_stride:
            for kernel in kernels:
                pin_unit_inner_stride(kernel)
        _run_pipeline(module_op, "canonicalize,cse")
        _run_transform(module_op, VECTOR_LOWERING_SCRIPT)
        lower_gathers(module_op)
        _run_pipeline(module_op, LOOPS_PIPELINE)
        _reject_bool_buffers(module_op)
        _reject_padded_vector_views(module_op)
        align_vector_views(module_op)
        expand_exponentials(module_op)
        flatten_math_vectors(module_op)
        if self.stage == "memrefs":
            return
        _run_pipeline(module_op, LLVM_PIPELINE)
        define_bf16_truncation(module_op)


# LLVM's x86 backend, without AVX512-BF16, moves bf16 vectors (loads, shuffles) through f32 and
# calls compiler-rt's `__truncsfbf2` on the way back; the JIT finds no such symbol in this process
# (libgcc has it only from GCC 13). The module defines it, rounding to nearest even as
# `arith-expand{include-bf16}` does, with a quiet NaN kept quiet.
TRUNCSFBF2 = """
llvm.func @__truncsfbf2(%x: f32) -> bf16 {
  %bits = llvm.bitcast %x : f32 to i32
  %c16 = llvm.mlir.constant(16 : i32) : i32
  %one = llvm.mlir.constant(1 : i32) : i32
  %bias = llvm.mlir.constant(32767 : i32) : i32
  %qnan = llvm.mlir.constant(32704 : i16) : i16
  %high = llvm.lshr %bits, %c16 : i32
  %odd = llvm.and %high, %one : i32
  %round = llvm.add %bias, %odd : i32
  %sum = llvm.add %bits, %round : i32
  %shifted = llvm.lshr %sum, %c16 : i32
  %narrow = llvm.trunc %shifted : i32 to i16
  %nan = llvm.fcmp "uno" %x, %x : f32
  %pick = llvm.select %nan, %qnan, %narrow : i1, i16
  %out = llvm.bitcast %pick : i16 to bf16
  llvm.return %out : bf16
}
"""


def define_bf16_truncation(module_op) -> None:
    """Add `__truncsfbf2` to a module in the llvm dialect that has none."""
    from mlir import ir

    body = module_op.regions[0].blocks[0]
    for op in _ops(body):
        if op.name == "llvm.func" and ir.StringAttr(op.attributes["sym_name"]).value == "__truncsfbf2":
            return
    with module_op.context, ir.Location.unknown():
        library = ir.Module.parse(TRUNCSFBF2)
        for op in library.body.operations:
            op.operation.clone(ip=ir.InsertionPoint(body))


def split_empty_tensors(module_op) -> None:
    """Give each use of a `tensor.empty` its own op.

    CSE merges equal tensor.empty ops; bufferization then allocates one buffer for all of their
    uses, so unrelated tiles (K^T, the accumulator, the output tile) share memory. Sharing costs
    nothing by itself, but the output tile is read through a subview, and a buffer with a view is
    one whose accumulator `hoist_redundant_vector_transfers` will not keep in registers.
    """
    from mlir import ir

    for op in _walk(module_op, "tensor.empty"):
        uses = [(use.owner, use.operand_number) for use in op.results[0].uses]
        for owner, number in uses[1:]:
            owner.operation.operands[number] = op.clone(ip=ir.InsertionPoint(op)).results[0]


def mark_state_loops(kernel, grid_loops) -> None:
    """Tag the kernel's own loops (those of L1, not the grid) for `carry_loop_state_in_place`,
    which runs after tiling has added loops of its own."""
    from mlir import ir

    for loop in _walk(kernel, "scf.for"):
        if loop not in grid_loops:
            loop.attributes[STATE_LOOP_ATTR] = ir.UnitAttr.get(kernel.context)


def carry_loop_state_in_place(module_op) -> None:
    """End each iteration of a tagged loop by copying its new loop-carried tensors into the ones
    the iteration received (a `linalg.copy` into the iter_arg, yielded instead).

    The online-softmax state is computed out of place (the new row max is needed next to the old
    one), so one-shot bufferization would yield a fresh buffer from each iteration and chain the
    buffers across loops; their deallocation then needs ownership flags at run time, which
    `bufferization-lower-deallocations` keeps in i1 memrefs that the LLVM conversion cannot store.
    With the copy, every yield is equivalent to its iter_arg: the loop updates one buffer per state
    tensor and every other buffer is a temporary, hoisted out of the loop. A value stored into its
    iter_arg by insert_slice (an output carried through the loop) is in place already. Runs after
    vectorization, whose folds would remove a copy that overwrites a whole tensor.
    """
    from mlir import ir
    from mlir.dialects import linalg

    for loop in _walk(module_op, "scf.for"):
        if STATE_LOOP_ATTR not in loop.attributes:
            continue
        del loop.attributes[STATE_LOOP_ATTR]
        body = loop.regions[0].blocks[0]
        terminator = _ops(body)[-1]
        carried = list(body.arguments)[1:]
        for i, (arg, value) in enumerate(zip(carried, terminator.operands)):
            if not isinstance(arg.type, ir.RankedTensorType) or _stored_into(value, arg):
                continue
            with loop.context, loop.location, ir.InsertionPoint(terminator):
                terminator.operands[i] = linalg.copy(value, outs=[arg])


def _stored_into(value, arg) -> bool:
    """Whether `value` is `arg` with slices inserted (tensor.insert_slice / tensor.insert chains)."""
    from mlir import ir

    while value != arg:
        owner = value.owner
        if not isinstance(owner, ir.OpView) or owner.operation.name not in ("tensor.insert_slice", "tensor.insert"):
            return False
        value = owner.operation.operands[1]
    return True


def widen_bool_arguments(kernel) -> None:
    """Give i1 tensor arguments (captured torch.bool tensors, one byte per element) i8 elements.

    The memref-to-LLVM conversion cannot load i1 from memory (it asserts on sub-byte loads), and
    a bool array is bytes anyway; each `tensor.extract` of one becomes an i8 extract and a
    comparison with zero.
    """
    from mlir import ir
    from mlir.dialects import arith, tensor

    block = kernel.regions[0].blocks[0]
    i1 = ir.IntegerType.get_signless(1, kernel.context)
    i8 = ir.IntegerType.get_signless(8, kernel.context)
    for arg in block.arguments:
        if not isinstance(arg.type, ir.RankedTensorType) or arg.type.element_type != i1:
            continue
        uses = [use.owner for use in arg.uses]
        for user in uses:
            if user.operation.name != "tensor.extract":
                raise _fail(user.operation, "reads a captured bool tensor other than by tensor.extract, "
                                            "which the CPU lowering does not support")
        arg.set_type(ir.RankedTensorType.get(arg.type.shape, i8, loc=kernel.location))
        for user in uses:
            op = user.operation
            with kernel.context, op.location, ir.InsertionPoint(op):
                byte = tensor.extract(arg, list(op.operands)[1:])
                flag = arith.cmpi(arith.CmpIPredicate.ne, byte, arith.constant(i8, 0))
            op.results[0].replace_all_uses_with(flag)
            op.erase()
    with kernel.context:
        results = ir.FunctionType(ir.TypeAttr(kernel.attributes["function_type"]).value).results
        kernel.attributes["function_type"] = ir.TypeAttr.get(
            ir.FunctionType.get([a.type for a in block.arguments], results))


def flatten_math_vectors(module_op) -> None:
    """Run math ops on n-D vectors as 1-D ones (shape casts around them).

    The math-to-LLVM conversion takes some ops (math.absi, for one) only on scalars and 1-D
    vectors, and the libm conversion only on scalars and vectors it can unroll; vectorized mods
    (`(q_idx - kv_idx).abs()`) produce them on the 2-D vectors of a row block.
    """
    from mlir import ir
    from mlir.dialects import vector

    for op in _walk(module_op, "math."):
        types = [v.type for v in list(op.operands) + list(op.results)]
        if not any(isinstance(t, ir.VectorType) and t.rank > 1 for t in types):
            continue
        with op.context, op.location, ir.InsertionPoint(op):
            def flat(t):
                return ir.VectorType.get([math.prod(t.shape)], t.element_type)

            operands = [vector.shape_cast(flat(v.type), v) for v in op.operands]
            result_types = [flat(r.type) for r in op.results]
            attributes = {name: op.attributes[name] for name in op.attributes}
            flat_op = ir.Operation.create(op.name, results=result_types, operands=operands, attributes=attributes)
            for old, new in zip(op.results, flat_op.results):
                old.replace_all_uses_with(vector.shape_cast(old.type, new))
        op.erase()


def _reject_padded_vector_views(module_op) -> None:
    """A buffer of scalars viewed as vectors whose rows LLVM pads in memory (rows of 24 floats
    take 32) would be overrun by the vector stores; `_tile_sizes` keeps tile rows to powers of two,
    and this says so if some other op still made one, rather than corrupting memory."""
    from mlir import ir

    for op in _walk(module_op, "vector.type_cast"):
        source = op.operands[0].type
        vector = ir.MemRefType(op.results[0].type).element_type
        if isinstance(source.element_type, ir.VectorType) or not isinstance(vector, ir.VectorType):
            continue
        row = vector.shape[-1]
        if row & (row - 1):
            raise _fail(op, f"views a buffer as {vector}, whose rows LLVM pads in memory; the CPU lowering "
                            "needs power-of-two vector rows here")


def align_vector_views(module_op) -> None:
    """Align each buffer viewed as vectors (`vector.type_cast`) to the vector rows' own size.

    The whole-vector load or store through such a view becomes an LLVM load or store with the
    vector's ABI alignment (its size: 64 bytes for 16 floats), but the staging buffers that
    `split_transfer_full_partial` allocates for partial tiles are 32-byte aligned. With AVX-512,
    LLVM then emits an aligned 64-byte move into a 32-byte-aligned stack slot, which faults
    whenever the incoming stack pointer happens to be an odd multiple of 32.
    """
    from mlir import ir

    for op in _walk(module_op, "vector.type_cast"):
        vector = ir.MemRefType(op.results[0].type).element_type
        if not isinstance(vector, ir.VectorType):
            continue
        row_bytes = vector.shape[-1] * max(1, vector.element_type.width // 8)
        alignment = 1 << (row_bytes - 1).bit_length()
        buffer = op.operands[0].owner
        if not isinstance(buffer, ir.OpView) or buffer.operation.name not in ("memref.alloca", "memref.alloc"):
            raise _fail(op, f"views a buffer not allocated here as {vector}, whose alignment the CPU lowering "
                            "cannot raise to the vector's")
        buffer = buffer.operation
        if "alignment" in buffer.attributes and ir.IntegerAttr(buffer.attributes["alignment"]).value >= alignment:
            continue
        buffer.attributes["alignment"] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64, op.context), alignment)


def _reject_bool_buffers(module_op) -> None:
    """The LLVM conversion aborts the process on an i1 load or store (it asserts on sub-byte
    elements); deallocation with run-time ownership flags is what makes i1 buffers (see
    `carry_loop_state_in_place`), so report one instead of crashing."""
    from mlir import ir

    for name in ("memref.alloc", "memref.alloca"):
        for op in _walk(module_op, name):
            elt = op.results[0].type.element_type
            if isinstance(elt, ir.IntegerType) and elt.width == 1:
                raise _fail(op, "is a buffer of i1 (run-time buffer ownership), which the LLVM conversion "
                                "cannot load or store")


def _drop_results(module_op, kernels) -> None:
    from mlir import ir

    with module_op.context:
        for kernel in kernels:
            kernel.attributes["sym_visibility"] = ir.StringAttr.get("private")
        _run_pipeline(module_op, DROP_RESULTS_PIPELINE)
        for kernel in kernels:
            del kernel.attributes["sym_visibility"]
            if ir.FunctionType(ir.TypeAttr(kernel.attributes["function_type"]).value).results:
                raise _fail(kernel, "a kernel result did not bufferize into its destination argument")


def expand_exponentials(module_op) -> None:
    """Replace f32 `math.exp2` and `math.exp` (scalar or vector) by polynomials and exponent
    arithmetic.

    LLVM turns a vector exp into one libm call per lane, which would cost more than the matmuls of
    a tile; upstream's polynomial approximations (MathPolynomialApproximation) are not exposed as
    a pass or transform op. With n = round(x) (exp2) or round(x / ln 2) (exp), the result is
    p(r) * 2^(n >> 1) * 2^(n - (n >> 1)) for the reduced argument r (Cephes exp2f and expf, within
    2 ulp): the split keeps both scales normal, so results underflow to 0 (x = -inf included) and
    overflow to inf as the exact functions do; NaN passes through.
    """
    from mlir import ir
    from mlir.dialects import arith
    from mlir.dialects import math as math_ops

    for name in ("math.exp2", "math.exp"):
        for op in _walk(module_op, name):
            x = op.operands[0]
            ftype = x.type
            shape = list(ftype.shape) if isinstance(ftype, ir.VectorType) else None
            if (ftype.element_type if shape is not None else ftype) != ir.F32Type.get(op.context):
                continue
            with op.context, op.location, ir.InsertionPoint(op):
                itype = ir.IntegerType.get_signless(32)
                if shape is not None:
                    itype = ir.VectorType.get(shape, itype)

                def const(t, value):
                    elt = t.element_type if shape is not None else t
                    attr = ir.FloatAttr.get(elt, value) if isinstance(value, float) else ir.IntegerAttr.get(elt, value)
                    return arith.constant(t, ir.DenseElementsAttr.get_splat(t, attr) if shape is not None else attr)

                def horner(coefficients, r):
                    p = const(ftype, coefficients[0])
                    for c in coefficients[1:]:
                        p = arith.addf(arith.mulf(p, r), const(ftype, c))
                    return p

                clamped = arith.minimumf(arith.maximumf(x, const(ftype, -160.0)), const(ftype, 160.0))
                if name == "math.exp2":
                    n = math_ops.floor(arith.addf(clamped, const(ftype, 0.5)))
                    p = horner(EXP2_POLYNOMIAL, arith.subf(clamped, n))
                else:
                    n = math_ops.floor(arith.addf(arith.mulf(clamped, const(ftype, LOG2E)), const(ftype, 0.5)))
                    r = arith.subf(arith.subf(clamped, arith.mulf(n, const(ftype, LN2_HIGH))),
                                   arith.mulf(n, const(ftype, LN2_LOW)))
                    p = arith.addf(arith.addf(arith.mulf(horner(EXP_POLYNOMIAL, r), arith.mulf(r, r)), r),
                                   const(ftype, 1.0))
                ni = arith.fptosi(itype, n)
                half = arith.shrsi(ni, const(itype, 1))
                for part in (half, arith.subi(ni, half)):
                    bits = arith.shli(arith.addi(part, const(itype, 127)), const(itype, 23))
                    p = arith.mulf(p, arith.bitcast(ftype, bits))
                result = arith.select(arith.cmpf(arith.CmpFPredicate.UNO, x, x), x, p)
            op.results[0].replace_all_uses_with(result)
            op.erase()


def lower_gathers(module_op) -> None:
    """Replace each `vector.gather` from a memref by one scalar load per lane.

    The vectorizer turns a closure-tensor read inside a linalg body (`doc[kv_idx]`) into a gather.
    Upstream lowers gathers to LLVM only from memrefs of static unit innermost stride, and its
    scalarizing pattern (Gather1DToConditionalLoads) is neither a pass nor a transform op; a
    closure tensor has dynamic strides. `memref.load` takes any strides; masked-off lanes load
    nothing.
    """
    from mlir import ir
    from mlir.dialects import arith, memref, scf, vector

    for op in _walk(module_op, "vector.gather"):
        gather = op.opview
        base = gather.base
        if not isinstance(base.type, ir.MemRefType):
            continue
        shape = list(base.type.shape)
        if any(ir.ShapedType.is_dynamic_size(d) for d in shape):
            raise _fail(op, "a gather from a dynamically shaped memref is not supported")
        result_type = op.results[0].type
        elt = result_type.element_type
        lanes = _lane_positions(list(result_type.shape))
        all_true = _is_true_splat(gather.mask)
        with op.context, op.location, ir.InsertionPoint(op):
            index = ir.IndexType.get()

            def idx(n):
                return arith.constant(index, n)

            flat = None
            for d, offset in enumerate(gather.offsets):
                stride = 1
                for extent in shape[d + 1:]:
                    stride *= extent
                term = arith.muli(offset, idx(stride)) if stride != 1 else offset
                flat = term if flat is None else arith.addi(flat, term)
            elements = []
            for lane in lanes:
                lane_index = vector.extract(gather.indices, [], lane)
                if lane_index.type != index:
                    lane_index = arith.index_cast(index, lane_index)
                position = arith.addi(flat, lane_index)
                coords = []
                for d in reversed(range(len(shape))):
                    coords.append(arith.remui(position, idx(shape[d])) if d else position)
                    if d:
                        position = arith.divui(position, idx(shape[d]))
                coords.reverse()
                if all_true:
                    elements.append(memref.load(base, coords))
                    continue
                keep = vector.extract(gather.mask, [], lane)
                branch = scf.IfOp(keep, [elt], has_else=True)
                with ir.InsertionPoint(branch.then_block):
                    scf.YieldOp([memref.load(base, coords)])
                with ir.InsertionPoint(branch.else_block):
                    scf.YieldOp([vector.extract(gather.pass_thru, [], lane)])
                elements.append(branch.results[0])
            result = vector.from_elements(result_type, elements)
        op.results[0].replace_all_uses_with(result)
        op.erase()


def _lane_positions(shape: list[int]) -> list[list[int]]:
    positions = [[]]
    for extent in shape:
        positions = [p + [i] for p in positions for i in range(extent)]
    return positions


def _is_true_splat(value) -> bool:
    from mlir import ir

    owner = value.owner
    if not isinstance(owner, ir.OpView) or owner.operation.name != "arith.constant":
        return False
    attr = owner.operation.attributes["value"]
    return isinstance(attr, ir.DenseIntElementsAttr) and attr.is_splat and bool(attr.get_splat_value())


def pin_unit_inner_stride(kernel) -> None:
    """Give every memref argument of `kernel` unit stride in its innermost dimension.

    Fully dynamic layouts let a caller pass any strided tensor, but with an unknown innermost
    stride no tile row is a contiguous vector: loads and gathers would go element by element. The
    caller promises unit innermost strides instead (torch's layouts, [B, L, H, D] transposed to
    [B, H, L, D] included); a memref.cast back to the dynamic layout keeps the body valid, and
    canonicalization folds it into the subviews, transfers and loads.
    """
    from mlir import ir
    from mlir.dialects import memref

    block = kernel.regions[0].blocks[0]
    dynamic = ir.ShapedType.get_dynamic_stride_or_offset()
    with kernel.context, kernel.location:
        entry = ir.InsertionPoint.at_block_begin(block)
        for arg in block.arguments:
            wide = arg.type
            if not isinstance(wide, ir.MemRefType) or wide.rank == 0:
                continue
            layout = ir.StridedLayoutAttr.get(dynamic, [dynamic] * (wide.rank - 1) + [1])
            arg.set_type(ir.MemRefType.get(wide.shape, wide.element_type, layout, wide.memory_space))
            cast = memref.cast(wide, arg, ip=entry)
            arg.replace_all_uses_except(cast, cast.owner.operation)
        results = ir.FunctionType(ir.TypeAttr(kernel.attributes["function_type"]).value).results
        kernel.attributes["function_type"] = ir.TypeAttr.get(
            ir.FunctionType.get([a.type for a in block.arguments], results))


def _tile_sizes(op) -> list[int] | None:
    """Tile sizes for one linalg op of a kernel (0: untiled), or None to vectorize it whole.

    Vectors stay near register size (LLVM unrolls a long vector into one instruction per
    register, so an op vectorized whole over thousands of elements takes seconds to compile), and
    every tile extent is a power of two: the vector lowering stages partial tiles in a buffer of
    scalars viewed as a vector (`vector.type_cast`), and LLVM pads a vector of 24 floats to 32 in
    memory, so a tile row of 24 would overrun that buffer.
    """
    from mlir import ir

    def fit(extent: int, cap: int) -> int:
        """The largest power of two that divides `extent` and is at most `cap`."""
        return min(extent & -extent, cap)

    def tile(extent: int, cap: int) -> int:
        size = fit(extent, cap)
        return 0 if size == extent else size

    shapes = [ir.ShapedType(v.type).shape for v in op.operands if isinstance(v.type, ir.ShapedType)]
    if op.name == "linalg.matmul":
        (m, _), (_, n) = shapes[0], shapes[1]
        return [fit(m, MATMUL_TILE[0]), fit(n, MATMUL_TILE[1]), 1]
    if op.name == "linalg.transpose":
        rows, cols = shapes[0]
        return [fit(rows, TRANSPOSE_TILE), fit(cols, TRANSPOSE_TILE)]
    if op.name not in ("linalg.generic", "linalg.reduce", "linalg.fill", "linalg.copy"):
        return None
    domain = max(shapes, key=len)
    if len(domain) == 1:
        size = tile(domain[0], ROW_LENGTH)
        return [size] if size else None
    if len(domain) == 2:
        return [fit(domain[0], ROW_TILE), tile(domain[1], ROW_LENGTH)]
    return None


def _vectorize_script(kernels) -> str:
    """The tile-vectorize-bufferize transform script; tags each tiled op with its group."""
    from mlir import ir

    groups: dict[tuple[int, ...], int] = {}
    for kernel in kernels:
        for op in _walk(kernel, "linalg."):
            if any(isinstance(v.type, ir.ShapedType) and not ir.ShapedType(v.type).has_static_shape
                   for v in op.operands):
                continue
            sizes = _tile_sizes(op)
            if sizes is None:
                continue
            group = groups.setdefault(tuple(sizes), len(groups))
            op.attributes[TILE_ATTR] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64, op.context), group)
    steps = []
    for sizes, n in groups.items():
        loops = sum(1 for x in sizes if x)
        results = ", ".join(["!transform.any_op"] * (loops + 1))
        steps.append(TILE_STEP.format(n=n, attr=TILE_ATTR, loops=loops, sizes=", ".join(map(str, sizes)),
                                      results=results))
    return VECTORIZE_SCRIPT.format(tiling="\n".join(steps))


def _errors(err, what: str) -> CompileError:
    summary = f"the upstream CPU lowering failed in {what}"
    if isinstance(err, ValueError):
        return CompileError(f"{summary}: {err}")
    return CompileError(summary, [diagnostic_from_mlir(d) for d in err.error_diagnostics])


def _run_pipeline(module_op, pipeline: str) -> None:
    from mlir import ir, passmanager

    pm = passmanager.PassManager.parse(f"builtin.module({pipeline})", context=module_op.context)
    try:
        pm.run(module_op)
    except ir.MLIRError as err:
        raise _errors(err, pipeline) from None


def _run_transform(module_op, script: str) -> None:
    from mlir import ir
    from mlir.dialects.transform import interpreter

    with module_op.context:
        library = ir.Module.parse(script)
        main = next(op for op in library.body.operations if op.operation.name == "transform.named_sequence")
        try:
            interpreter.apply_named_sequence(module_op, main, library)
        except (ir.MLIRError, ValueError) as err:
            raise _errors(err, "the transform script") from None
