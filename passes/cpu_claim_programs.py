"""`attn-cpu-claim-programs`: beside each CPU kernel, an entry point through which several threads
share its programs by claiming them from a counter, and return together.

A kernel after `attn-cpu-grid-loops` runs the programs [first, last) its last two arguments give.
Its claiming entry, `abi.claiming_entry_name(kernel)`, takes the kernel's arrays, then a
`memref<3xi64>` of counters (zeroed by the caller: the next unclaimed program, the threads that
entered, the threads that finished), the programs per claim and the number of programs:

    entered += 1
    while (first = fetch_add(next, chunk)) < programs: kernel(arrays..., first, min(first + chunk, programs))
    finished += 1
    while finished < entered: (spin; after SPINS rounds, sleep SLEEP_US microseconds a round)

Every thread of a call runs it on the same arrays and counters. Claims are dynamic, so a thread
that starts late, or is descheduled, leaves its share to the others, and a thread that never
starts is not waited for; the final spin returns each thread once every thread that entered has
finished, so the caller's thread sees all outputs written when its own call returns, without
sleeping on a lock (a thread woken from sleep on a virtual machine's idle core costs tens of
microseconds, and the runtime would otherwise pay that per call and per range).

Hand-written: no upstream pass distributes a loop's iterations over threads without a runtime
library (the OpenMP lowering calls libomp, which neither the JIT nor the cached shared objects can
count on; see `attn-cpu-grid-loops`). The counters are read with atomic read-modify-writes, which
LLVM does not hoist out of the spin loop as it could a plain load.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..core import abi
from . import ModulePass
from .cpu_support import KERNEL_ATTR, lowered_kernels, ops

# Positions in the counters array.
NEXT, ENTERED, FINISHED = 0, 1, 2
# A thread that has waited SPINS rounds of the final spin (two atomic reads each: about a
# millisecond) sleeps SLEEP_US microseconds a round from then on: a wait that long is the rest of
# another thread's claim (milliseconds on long sequences), and spinning through it would take a
# core from that thread wherever threads outnumber cores. Shorter waits, the usual imbalance at
# a call's end, spin: a sleep would add the tens of microseconds a wake-up costs.
SPINS = 65536
SLEEP = "usleep"
SLEEP_US = 20


@dataclass(frozen=True)
class ClaimPrograms(ModulePass):
    name: ClassVar[str] = "attn-cpu-claim-programs"
    summary: ClassVar[str] = ("CPU lowering: beside each kernel, an entry point through which threads claim "
                              "its programs from a shared counter and return together")

    def apply(self, module_op) -> None:
        kernels = lowered_kernels(module_op)
        if kernels:
            declare_sleep(module_op)
        for kernel in kernels:
            add_claiming_entry(kernel)


def add_claiming_entry(kernel):
    """Add the claiming entry of `kernel` (a lowered kernel: arrays, then first and last) after it;
    returns it."""
    from mlir import ir
    from mlir.dialects import arith, func, memref, scf

    name = ir.StringAttr(kernel.attributes["sym_name"]).value
    arrays = list(ir.FunctionType(ir.TypeAttr(kernel.attributes["function_type"]).value).inputs)[:-2]
    with kernel.context, kernel.location:
        index = ir.IndexType.get()
        i64 = ir.IntegerType.get_signless(64)
        counters_type = ir.MemRefType.get([3], i64)
        entry = func.FuncOp(abi.claiming_entry_name(name), (arrays + [counters_type, index, index], []),
                            ip=ir.InsertionPoint.after(kernel))
        entry.attributes[KERNEL_ATTR] = ir.UnitAttr.get()
        block = entry.add_entry_block()
        *args, counters, chunk, programs = block.arguments
        with ir.InsertionPoint(block):
            at = {slot: arith.constant(index, slot) for slot in (NEXT, ENTERED, FINISHED)}
            zero, one = arith.constant(i64, 0), arith.constant(i64, 1)
            # A claim of no programs would never advance the counter.
            chunk = arith.maxui(chunk, at[ENTERED])

            def fetch_add(slot, value):
                return memref.atomic_rmw(arith.AtomicRMWKind.addi, value, counters, [at[slot]])

            fetch_add(ENTERED, one)
            claims = scf.WhileOp([index], [])
            before = claims.before.blocks.append()
            with ir.InsertionPoint(before):
                first = arith.index_cast(index, fetch_add(NEXT, arith.index_cast(i64, chunk)))
                scf.condition(arith.cmpi(arith.CmpIPredicate.ult, first, programs), [first])
            after = claims.after.blocks.append(index)
            with ir.InsertionPoint(after):
                first = after.arguments[0]
                last = arith.minui(arith.addi(first, chunk), programs)
                func.call([], ir.FlatSymbolRefAttr.get(name), [*args, first, last])
                scf.yield_([])
            fetch_add(FINISHED, one)
            barrier = scf.WhileOp([i64], [zero])
            before = barrier.before.blocks.append(i64)
            with ir.InsertionPoint(before):
                finished, entered = fetch_add(FINISHED, zero), fetch_add(ENTERED, zero)
                scf.condition(arith.cmpi(arith.CmpIPredicate.ult, finished, entered), [before.arguments[0]])
            after = barrier.after.blocks.append(i64)
            with ir.InsertionPoint(after):
                spins = after.arguments[0]
                waited_long = scf.IfOp(arith.cmpi(arith.CmpIPredicate.uge, spins, arith.constant(i64, SPINS)))
                with ir.InsertionPoint(waited_long.then_block):
                    i32 = ir.IntegerType.get_signless(32)
                    func.call([i32], ir.FlatSymbolRefAttr.get(SLEEP), [arith.constant(i32, SLEEP_US)])
                    scf.yield_([])
                scf.yield_([arith.addi(spins, one)])
            func.ReturnOp([])
    return entry


def declare_sleep(module_op) -> None:
    """Declare libc's `usleep(useconds_t) -> int` in the module, once."""
    from mlir import ir
    from mlir.dialects import func

    body = module_op.regions[0].blocks[0]
    if any(op.name == "func.func" and ir.StringAttr(op.attributes["sym_name"]).value == SLEEP for op in ops(body)):
        return
    with module_op.context, module_op.location:
        i32 = ir.IntegerType.get_signless(32)
        func.FuncOp(SLEEP, ([i32], [i32]), visibility="private", ip=ir.InsertionPoint.at_block_begin(body))
