"""`attn-cpu-grid-loops`: each L1 kernel runs a range of its programs in one loop.

A kernel (`attn.grid = array<i64: ...>`) runs once per program. Its programs are numbered in
row-major order over the grid, and the kernel takes a range [first, last) of those flat ids as two
index arguments after its arrays; one `scf.for` over the range runs them in turn, carrying the
destination tensors (the trailing tensor arguments, one per result) so each program's
`tensor.insert_slice` stays in destination-passing style. `attn.program_id` becomes the id of its
axis, decoded from the induction variable, the blocks counted from the last where the tiling
marked those the heaviest (`attn.heavy_blocks`), so that they run first. The kernel then carries `llvm.emit_c_interface` instead
of `attn.grid`. Captured bool tensors get byte elements, and the kernel's own loops are tagged
`ae.cpu_state_loop` for `attn-cpu-carry-state-in-place`.

The range is what lets the CPU backend run the grid on several threads: it calls the kernel with
disjoint ranges, or through the claiming entry that `attn-cpu-claim-programs` adds beside it. An
OpenMP lowering (scf.parallel to omp.parallel) would spread the loop inside the kernel, but its
code calls the OpenMP runtime, which neither the JIT nor the `cc`-linked shared object of the disk
cache can count on finding; calls over ranges need nothing but the kernel.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..core import abi
from . import ModulePass
from .cpu_support import GRID_ATTR, KERNEL_ATTR, STATE_LOOP_ATTR, fail, ops, walk
from .tile_tables import heavy_blocks_of


@dataclass(frozen=True)
class GridLoops(ModulePass):
    name: ClassVar[str] = "attn-cpu-grid-loops"
    summary: ClassVar[str] = ("CPU lowering: one loop over a range of each L1 kernel's programs (two index "
                              "arguments), carrying the destination tensors; program ids decoded from it")

    def apply(self, module_op) -> None:
        kernels = [op for op in ops(module_op.regions[0].blocks[0])
                   if op.name == "func.func" and GRID_ATTR in op.attributes]
        for stray in walk(module_op, "attn."):
            inside = stray.parent
            while inside is not None and inside.name != "func.func":
                inside = inside.parent
            if stray.name != "attn.program_id" or inside is None or GRID_ATTR not in inside.attributes:
                raise fail(stray, "is not L1 input for the CPU lowering; run attn-fuse-online-softmax and "
                                  "attn-tile (or attn-chunk-recurrence) first (attn.program_id may appear "
                                  f"only in a function with '{GRID_ATTR}')")
        for kernel in kernels:
            grid_loop = lower_grid(kernel)
            widen_bool_arguments(kernel)
            mark_state_loops(kernel, grid_loop)


def lower_grid(func):
    """Replace `attn.program_id` in kernel `func` by ids decoded from the induction variable of
    one loop over a range of flat program ids, the range two index arguments appended to the
    kernel and the loop carrying the destination arguments; returns the loop.

    The flat id enumerates the grid in row-major order (the last axis fastest), the order in which
    a nest of one loop per axis would run the programs; each axis's id is a remainder and a
    quotient of it. A caller runs the whole grid as [0, product of the extents), or disjoint
    ranges of it on several threads: each program writes only its own slices of the destinations
    and allocates its own scratch buffers, so ranges run in parallel without sharing anything.
    """
    from mlir import ir
    from mlir.dialects import arith, scf

    op = func.operation
    grid = [int(x) for x in op.attributes[GRID_ATTR]]
    if not grid or any(n < 0 for n in grid):
        raise fail(op, f"'{GRID_ATTR}' must list at least one extent, none negative, got {grid}")
    block = func.regions[0].blocks[0]
    body = ops(block)
    ret = body[-1]
    if ret.name != "func.return":
        raise fail(op, "a kernel must end with func.return")
    n_out = len(ret.operands)
    args = list(block.arguments)
    if n_out == 0 or n_out > len(args):
        raise fail(op, "a kernel returns its destination arguments updated; this one returns "
                       f"{n_out} values for {len(args)} arguments")
    dests = args[len(args) - n_out:]
    for dest, result in zip(dests, ret.operands):
        if dest.type != result.type:
            raise fail(op, f"result type {result.type} does not match its destination argument type {dest.type}")
    program_ids = walk(op, "attn.program_id")
    for pid in program_ids:
        axis = int(pid.attributes["axis"].value)
        if not 0 <= axis < len(grid):
            raise fail(pid, f"axis {axis} is outside the {len(grid)}-d grid")

    with op.context, op.location:
        index = ir.IndexType.get()
        first = block.add_argument(index, op.location)
        last = block.add_argument(index, op.location)
        one = arith.ConstantOp(index, 1, ip=ir.InsertionPoint.at_block_begin(block)).result
        loop = scf.ForOp(first, last, one, dests, ip=ir.InsertionPoint(ret))
        ip = ir.InsertionPoint(loop.body)
        ids = program_ids_of(loop.induction_variable, grid, ip)
        if heavy_blocks_of(op) == "last" and grid[-1] > 1:
            # The threads claim ranges of programs in order: the heaviest blocks go first, so the
            # last ranges claimed are short (a causal kernel of 16 blocks a head on 2 threads
            # spent ~4% of its time on the tail, in a greedy schedule of the tiles' counts).
            last_block = arith.ConstantOp(index, grid[-1] - 1, ip=ip).result
            ids[-1] = arith.SubIOp(last_block, ids[-1], ip=ip).result
        terminator = scf.YieldOp(list(ret.operands), ip=ip)
        for moved in body[:-1]:
            moved.move_before(terminator)
        for dest, inner in zip(dests, loop.inner_iter_args):
            dest.replace_all_uses_except(inner, loop.operation)
        for i, result in enumerate(loop.results):
            ret.operands[i] = result
        for pid in program_ids:
            pid.results[0].replace_all_uses_with(ids[int(pid.attributes["axis"].value)])
            pid.erase()
        results = ir.FunctionType(ir.TypeAttr(op.attributes["function_type"]).value).results
        op.attributes["function_type"] = ir.TypeAttr.get(
            ir.FunctionType.get([a.type for a in block.arguments], results))
        if "arg_attrs" in op.attributes:
            op.attributes["arg_attrs"] = ir.ArrayAttr.get(
                list(op.attributes["arg_attrs"]) + [ir.DictAttr.get({})] * 2)
        del op.attributes[GRID_ATTR]
        if abi.HEAVY_BLOCKS in op.attributes:
            del op.attributes[abi.HEAVY_BLOCKS]
        op.attributes[KERNEL_ATTR] = ir.UnitAttr.get()
    return loop.operation


def program_ids_of(flat, grid: list[int], ip) -> list:
    """The id on each axis of `grid` of the program whose row-major flat id is `flat`."""
    from mlir.dialects import arith

    index = flat.type
    ids = [flat] * len(grid)
    rest = flat
    for axis in range(len(grid) - 1, 0, -1):
        extent = arith.ConstantOp(index, grid[axis], ip=ip).result
        ids[axis] = arith.RemUIOp(rest, extent, ip=ip).result
        rest = arith.DivUIOp(rest, extent, ip=ip).result
    ids[0] = rest
    return ids


def mark_state_loops(kernel, grid_loop) -> None:
    """Tag the kernel's own loops (those of L1, not the grid's) for `carry_loop_state_in_place`,
    which runs after tiling has added loops of its own."""
    from mlir import ir

    for loop in walk(kernel, "scf.for"):
        if loop != grid_loop:
            loop.attributes[STATE_LOOP_ATTR] = ir.UnitAttr.get(kernel.context)


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
                raise fail(user.operation, "reads a captured bool tensor other than by tensor.extract, "
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
