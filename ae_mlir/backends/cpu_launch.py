"""How the CPU backend hands torch tensors to a compiled kernel and calls it.

Tensors are handed to the kernel in place: each becomes a ranked memref descriptor (ctypes) over
its own storage, with its sizes, strides and storage offset, so any strided layout runs without a
copy. A kernel is called through its packed entry point (one argument: the address of each
argument), on a range of its programs (`RangeLaunch`) or through its claiming entry, where the
threads of a call claim programs from shared counters (`ClaimingLaunch`, `attn-cpu-claim-programs`).

This module imports neither the MLIR bindings nor torch (a call's private copies excepted).
"""
from __future__ import annotations

import ctypes
import threading

_WORD = ctypes.c_int64


def descriptors(tensors: list, layouts: list | None = None) -> tuple[ctypes.Array, list[int]]:
    """The ranked memref descriptors of `tensors` (two base pointers, an offset, the sizes and
    the strides, in elements) in one block of 64-bit words, and each descriptor's address. The
    base pointer is the tensor's first element and the offset 0, which addresses the same
    elements as its storage and storage offset would; one block per call keeps the ctypes work
    of a call small (it is part of what a short CPU kernel call costs). `layouts` gives each
    tensor's (sizes, strides) where the caller knows them, else they are read from the tensors."""
    words, starts = [], []
    for i, t in enumerate(tensors):
        starts.append(len(words))
        base = t.data_ptr()
        sizes, strides = layouts[i] if layouts else (t.shape, t.stride())
        words += (base, base, 0, *sizes, *strides)
    block = (_WORD * len(words))(*words)
    origin = ctypes.addressof(block)
    return block, [origin + 8 * start for start in starts]


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


class RangeLaunch:
    """One call's arguments, run a range of programs at a time. A range running on a pool thread
    holds it, and so the tensors its descriptors point into.

    Programs add into the `accumulated` tensors (closure gradients) at elements other programs
    add into too, with plain loads and stores: each range of programs adds into a zeroed copy of
    its own, and `sum_private_copies` adds the copies into the tensors after the call in the
    order of the ranges, so a call gives the same bits whichever thread ran which range (the
    ranges, and so the rounding, depend on the thread count). One range alone adds in place."""

    def __init__(self, entry, tensors: list, accumulated: list[int] | None = None, programs: int = 0,
                 layouts: list | None = None):
        self.entry = entry
        self.tensors = tensors
        self.layouts = layouts
        # Held until the call returns: the kernel reads the descriptors in this block.
        self.block, self.addresses = descriptors(tensors, layouts)
        self.accumulated = accumulated or []
        self.total = programs
        self.private: dict[int, list] = {}  # first program of a range -> its copies
        self.lock = threading.Lock()

    def _addresses(self, first: int, last: int) -> tuple[list[int], object]:
        """The descriptor addresses for a range, and what must live while it runs."""
        if not self.accumulated or (first == 0 and last == self.total):
            return self.addresses, None
        import torch

        copies = [torch.zeros_like(self.tensors[i]) for i in self.accumulated]
        with self.lock:
            self.private[first] = copies
        block, copied = descriptors(copies, self.layouts and [self.layouts[i] for i in self.accumulated])
        addresses = list(self.addresses)
        for i, address in zip(self.accumulated, copied):
            addresses[i] = address
        return addresses, block

    def __call__(self, first: int, last: int) -> None:
        addresses, held = self._addresses(first, last)
        call_packed(self.entry, [*addresses, first, last])
        del held

    def sum_private_copies(self) -> None:
        for first in sorted(self.private):
            for i, copy in zip(self.accumulated, self.private[first]):
                self.tensors[i] += copy


class ClaimingLaunch:
    """One call's arguments for the kernel's claiming entry: the tensors' descriptors, the
    counters the threads claim programs from (zeroed), the programs per claim and the number of
    programs. Every thread of the call runs it with the same arguments; each holds it, and so the
    tensors and the kernel's code (`owner`), while it runs: a pool thread may start it after the
    call has returned and its caller has dropped the kernel."""

    def __init__(self, entry, tensors: list, layouts: list, programs: int, owner=None):
        self.entry = entry
        self.owner = owner
        self.tensors = tensors
        self.counters = (_WORD * 3)()
        counters = ctypes.addressof(self.counters)
        self.block, self.addresses = descriptors(tensors, layouts)
        self.counters_descriptor = (_WORD * 5)(counters, counters, 0, 3, 1)
        self.addresses.append(ctypes.addressof(self.counters_descriptor))
        self.programs = programs

    def __call__(self, chunk: int) -> None:
        call_packed(self.entry, [*self.addresses, chunk, self.programs])

    def packed(self, chunk: int) -> tuple[int, int]:
        """The entry's address and the address of its packed arguments (claims of `chunk`
        programs), for every thread of an OpenMP team to call it with: held until the launch
        is dropped."""
        self.arguments, address = packed_arguments([*self.addresses, chunk, self.programs])
        return ctypes.cast(self.entry, ctypes.c_void_p).value, address


def packed_arguments(values: list[int]) -> tuple[ctypes.Array, int]:
    """A packed entry point's one argument for these values (a pointer to each descriptor, as
    the C interface takes memrefs by pointer, then the integers): the address of each value,
    in a block after the values; returns the block and that argument."""
    n = len(values)
    args = (_WORD * (2 * n))()
    origin = ctypes.addressof(args)
    args[:] = [*values, *range(origin, origin + 8 * n, 8)]
    return args, origin + 8 * n


def call_packed(entry, values: list[int]) -> None:
    """Call a kernel's packed entry point with its arguments' values."""
    args, address = packed_arguments(values)
    entry(address)
