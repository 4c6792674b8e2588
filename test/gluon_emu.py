"""An emulator of the Gluon kernels `attn-lower-to-gluon` instantiates, so CI checks their numerics
on a CPU (Triton has no Gluon interpreter).

It runs a `@gluon.jit` kernel's own Python code with the Gluon names it reads bound to torch
models instead of Triton's builders: register tensors are torch tensors (layouts are accepted and
ignored), shared memory is a torch buffer, TMA copies read whole tensors through their host
descriptors (zeros past the edges, as TMA fills them), and pointers are a storage plus offsets.
Each `gl.warp_specialize` partition runs in its own thread and mbarriers block as the hardware's
do (arrivals, expected bytes, phase parity), so a protocol that deadlocks hangs here too (an
error after `TIMEOUT` seconds) and an over-arrival is an error. An async `warpgroup_mma` reads its
shared-memory operands when it is waited for, not when issued, so releasing a buffer before its
product finished reading it can show up as a wrong result. What it does not model: layouts,
register or shared-memory limits, and timing.
"""
from __future__ import annotations

import threading
import time
import types

import numpy as np
import torch
from triton.experimental.gluon._runtime import GluonJITFunction
from triton.experimental.gluon import language as real_gl
from triton.experimental.gluon.language.nvidia import hopper
from triton.experimental.gluon.language.nvidia.hopper import mbarrier as real_mbarrier, tma as real_tma

from ae_mlir.passes.gluon import pipeline as gluon_pipeline, score_mod as gluon_score_mod

TIMEOUT = 20.0
_ATOMICS = threading.Lock()  # partitions run as threads: TMA's reduce-adds must not interleave
RACE_WINDOW = 0.002


class EmulationError(RuntimeError):
    pass


class _State(threading.local):
    def __init__(self):
        self.pending_mma = []


_STATE = _State()
_PROGRAM = {"ids": (0, 0, 0), "grid": (1, 1, 1), "abort": None}
# The tensor-core products the last launch computed, over every program and partition (a test
# counts the work a kernel skips).
PRODUCTS = {"count": 0}


class _Layout:
    """Any layout: the emulator computes values, not their placement."""

    def __init__(self, *args, **kwargs):
        pass

    @staticmethod
    def get_default_for(*args, **kwargs):
        return _Layout()


class Barrier:
    """An mbarrier: a phase completes when its arrivals and its expected bytes are both in."""

    def __init__(self):
        self.cond = threading.Condition()
        self.count = None

    def init(self, count):
        with self.cond:
            self.count, self.pending, self.tx, self.completed = count, count, 0, 0

    def _settle(self) -> bool:
        if self.pending == 0 and self.tx == 0:
            self.completed += 1
            self.pending = self.count
            self.cond.notify_all()
            return True
        return False

    def arrive(self, count=1, nbytes=0):
        with self.cond:
            if self.count is None:
                raise EmulationError("arrive on an mbarrier that was never initialized")
            if count > self.pending:
                raise EmulationError(f"{count} arrivals on an mbarrier expecting {self.pending}")
            self.pending -= count
            self.tx += nbytes
            released = self._settle()
        _let_waiters_run(released)

    def complete_tx(self, nbytes):
        with self.cond:
            self.tx -= nbytes
            released = self._settle()
        _let_waiters_run(released)

    def wait(self, parity):
        # The hardware's try_wait.parity: done once the phase of that parity has completed.
        with self.cond:
            if self.count is None:
                raise EmulationError("wait on an mbarrier that was never initialized")
            waited = 0.0
            while self.completed & 1 == parity:
                if _PROGRAM["abort"] is not None:
                    raise EmulationError("another partition failed")
                if waited >= TIMEOUT:
                    raise EmulationError(f"deadlock: an mbarrier's phase {parity} never completed")
                self.cond.wait(0.05)
                waited += 0.05


def _let_waiters_run(released: bool) -> None:
    # The thread that completed a phase pauses, so the partitions it released run first: a
    # buffer released before an in-flight product read it then gets overwritten before that
    # product is evaluated, and the result is wrong.
    if released:
        time.sleep(RACE_WINDOW)


class Shared:
    """A shared-memory buffer (or a view of one); mbarrier buffers hold Barrier objects."""

    def __init__(self, data):
        self.data = data

    @property
    def shape(self):
        return list(self.data.shape)

    @property
    def dtype(self):
        return self.data.dtype

    def index(self, i):
        return Shared(self.data[int(i)])

    def reshape(self, shape):
        return Shared(self.data.reshape(list(shape)))

    def permute(self, order):
        return Shared(self.data.transpose(*order) if isinstance(self.data, np.ndarray) else self.data.permute(*order))

    def slice(self, start, length, dim=0):
        return Shared(self.data.narrow(int(dim), int(start), int(length)))

    def load(self, layout=None):
        return self.data.clone()

    def store(self, value):
        self.data.copy_(value.to(self.data.dtype))

    def barrier(self) -> Barrier:
        if not isinstance(self.data, np.ndarray) or self.data.size != 1:
            raise EmulationError("an mbarrier operation on a buffer that is not one mbarrier")
        return self.data.reshape(-1)[0]


def _value(x):
    """A register operand: an async product's result must have been waited for."""
    if isinstance(x, _Token):
        raise EmulationError("an async warpgroup_mma result used before warpgroup_mma_wait")
    return x.data.clone() if isinstance(x, Shared) else x


class _Token:
    def __init__(self, compute):
        self.compute, self.result = compute, None


def _mma(a, b, acc, use_acc):
    # Tensor cores multiply the 16-bit operands exactly and accumulate in float32. An async
    # product may accumulate into one still in flight (a chain): that one finished first.
    with _ATOMICS:
        PRODUCTS["count"] += 1
    product = _value(a).float() @ _value(b).float()
    if isinstance(acc, _Token) and acc.result is not None:
        acc = acc.result
    return product + _value(acc) if use_acc else product


def _drain(outstanding):
    while len(_STATE.pending_mma) > outstanding:
        token = _STATE.pending_mma.pop(0)
        token.result = token.compute()


class _Hopper:
    @staticmethod
    def warpgroup_mma(a, b, acc, *, use_acc=True, is_async=False, **_):
        if not is_async:
            _drain(0)
            return _mma(a, b, acc, use_acc)
        token = _Token(lambda: _mma(a, b, acc, use_acc))
        _STATE.pending_mma.append(token)
        return token

    @staticmethod
    def warpgroup_mma_wait(num_outstanding=0, deps=None):
        if deps is None:
            raise EmulationError("warpgroup_mma_wait deps must be given")
        _drain(int(num_outstanding))
        results = []
        for dep in deps:
            if isinstance(dep, _Token):
                if dep.result is None:
                    raise EmulationError("warpgroup_mma_wait returned a product still in flight")
                dep = dep.result
            results.append(dep)
        return results[0] if len(results) == 1 else tuple(results)


class _MBarrierLayout(_Layout):
    pass


class _MBarrier:
    MBarrierLayout = _MBarrierLayout

    @staticmethod
    def init(bar, count):
        bar.barrier().init(int(count))

    @staticmethod
    def expect(bar, nbytes, pred=True):
        if pred:
            bar.barrier().arrive(1, int(nbytes))

    @staticmethod
    def arrive(bar, *, count=1, pred=True):
        if pred:
            bar.barrier().arrive(int(count))

    @staticmethod
    def wait(bar, phase, pred=True, deps=()):
        if pred:
            bar.barrier().wait(int(phase) & 1)


class BlockType:
    def __init__(self, shape, dtype):
        self.shape, self.dtype = list(shape), dtype
        self.nbytes = int(np.prod(shape)) * torch.empty((), dtype=dtype).element_size()


class Descriptor:
    """A TMA descriptor: the host's (base tensor, shape, strides) and the kernel's block shape."""

    def __init__(self, host, block_shape):
        self.view = torch.as_strided(host.base, tuple(host.shape), tuple(host.strides), host.base.storage_offset())
        self.block_type = BlockType(block_shape, host.base.dtype)
        self.dtype, self.layout = host.base.dtype, _Layout()

    def read(self, coords):
        block = torch.zeros(self.block_type.shape, dtype=self.dtype)
        src, dst = [], []
        for start, extent, size in zip(coords, self.block_type.shape, self.view.shape):
            lo, hi = max(int(start), 0), min(int(start) + extent, size)
            if lo >= hi:
                return block
            src.append(slice(lo, hi))
            dst.append(slice(lo - int(start), hi - int(start)))
        block[tuple(dst)] = self.view[tuple(src)]
        return block

    def add(self, coords, block):
        # TMA's reduce-add: the block's part inside the tensor added in, the rest dropped.
        src, dst = [], []
        for start, extent, size in zip(coords, self.block_type.shape, self.view.shape):
            lo, hi = max(int(start), 0), min(int(start) + extent, size)
            if lo >= hi:
                return
            dst.append(slice(lo, hi))
            src.append(slice(lo - int(start), hi - int(start)))
        with _ATOMICS:
            self.view[tuple(dst)] += block[tuple(src)].to(self.dtype)


class _TMA:
    @staticmethod
    def store_wait(pendings):
        # The emulator's TMA operations complete when issued.
        pass

    @staticmethod
    def async_reduce_add(desc, coords, src):
        desc.add(coords, src.data)

    @staticmethod
    def async_copy_global_to_shared(desc, coords, bar, result, pred=True):
        if pred:
            result.data.copy_(desc.read(coords))
            bar.barrier().complete_tx(desc.block_type.nbytes)


class Pointer:
    """A pointer (or a tensor of pointers): a tensor's whole storage and element offsets into it."""

    def __init__(self, storage, offsets):
        self.storage, self.offsets = storage, offsets

    @classmethod
    def to(cls, t: torch.Tensor):
        size = t.untyped_storage().nbytes() // t.element_size()
        return cls(torch.as_strided(t, (size, ), (1, ), 0), torch.tensor(t.storage_offset()))

    def __add__(self, offsets):
        return Pointer(self.storage, self.offsets + offsets)

    @property
    def dtype(self):
        return types.SimpleNamespace(element_ty=self.storage.dtype)

    __radd__ = __add__


def _store(ptr, value, mask=None):
    offsets = ptr.offsets.expand(value.shape) if isinstance(value, torch.Tensor) else ptr.offsets
    value = torch.as_tensor(value).to(ptr.storage.dtype).expand(offsets.shape)
    keep = torch.ones(offsets.shape, dtype=torch.bool) if mask is None else torch.as_tensor(mask).expand(offsets.shape)
    ptr.storage[offsets[keep]] = value[keep]


def _load(ptr, mask=None, other=0):
    offsets = ptr.offsets
    keep = torch.ones(offsets.shape, dtype=torch.bool) if mask is None else torch.as_tensor(mask).expand(offsets.shape)
    out = torch.full(offsets.shape, other, dtype=ptr.storage.dtype)
    out[keep] = ptr.storage[offsets[keep]]
    return out


def _allocate_shared_memory(dtype, shape, layout, value=None):
    if isinstance(layout, _MBarrierLayout):
        cells = np.empty(int(np.prod(shape)), dtype=object)
        for i in range(cells.size):
            cells[i] = Barrier()
        return Shared(cells.reshape(shape))
    buffer = Shared(torch.zeros(list(shape), dtype=dtype))
    if value is not None:
        buffer.store(value)
    return buffer


def _warp_specialize(functions_and_args, worker_num_warps, worker_num_regs):
    errors = []

    def run(fn, args):
        try:
            fn(*args)
        except BaseException as error:  # noqa: B036 -- re-raised in the caller's thread
            errors.append(error)
            _PROGRAM["abort"] = error

    threads = [threading.Thread(target=run, args=(fn, args)) for fn, args in functions_and_args]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def _gl() -> types.SimpleNamespace:
    program = _PROGRAM
    return types.SimpleNamespace(
        float32=torch.float32, float16=torch.float16, bfloat16=torch.bfloat16, int64=torch.int64,
        int32=torch.int32, int16=torch.int16, int8=torch.int8, int1=torch.bool,
        constexpr=lambda value: value,
        SliceLayout=_Layout, NVMMADistributedLayout=_Layout, DotOperandLayout=_Layout,
        NVMMASharedLayout=_Layout, BlockedLayout=_Layout,
        program_id=lambda axis: torch.tensor(program["ids"][axis], dtype=torch.int32),
        num_programs=lambda axis: torch.tensor(program["grid"][axis], dtype=torch.int32),
        cdiv=lambda a, b: (a + b - 1) // b,
        minimum=lambda a, b, propagate_nan=None: torch.minimum(torch.as_tensor(a), torch.as_tensor(b)),
        maximum=lambda a, b, propagate_nan=None: torch.maximum(torch.as_tensor(a), torch.as_tensor(b)),
        static_range=range,
        arange=lambda start, end, layout=None: torch.arange(start, end, dtype=torch.int32),
        zeros=lambda shape, dtype, layout=None: torch.zeros(list(shape), dtype=dtype),
        full=lambda shape, value, dtype, layout=None: torch.full(list(shape), value, dtype=dtype),
        where=lambda cond, a, b: torch.where(torch.as_tensor(cond), _value(a), _value(b)),
        max=lambda x, axis: _value(x).amax(dim=axis),
        sum=lambda x, axis: _value(x).sum(dim=axis),
        exp2=lambda x: torch.exp2(_value(x)),
        log2=lambda x: torch.log2(_value(x)),
        exp=lambda x: torch.exp(_value(x)),
        **{name: (lambda fn: lambda x: fn(torch.as_tensor(_value(x))))(getattr(torch, torch_name))
           for name, torch_name in (("log", "log"), ("sqrt", "sqrt"), ("rsqrt", "rsqrt"), ("sin", "sin"),
                                    ("cos", "cos"), ("floor", "floor"), ("ceil", "ceil"), ("erf", "erf"),
                                    ("abs", "abs"))},
        zeros_like=lambda x: torch.zeros_like(torch.as_tensor(_value(x))),
        convert_layout=lambda x, layout: _value(x),
        allocate_shared_memory=_allocate_shared_memory,
        warp_specialize=_warp_specialize,
        store=_store,
        load=_load,
    )


_MOCKS = {id(real_gl): _gl(), id(real_mbarrier): _MBarrier, id(real_tma): _TMA,
          id(hopper.warpgroup_mma): _Hopper.warpgroup_mma,
          id(hopper.warpgroup_mma_wait): _Hopper.warpgroup_mma_wait,
          # Shared-memory stores are visible to the emulator's products without a fence.
          id(hopper.fence_async_shared): lambda cluster=False: None,
          id(gluon_pipeline.async_reduce_add): _TMA.async_reduce_add,
          # The score mods' helpers: C's integer division and float remainder, the exact tanh.
          id(gluon_score_mod.divsi): lambda a, b: torch.div(a, b, rounding_mode="trunc"),
          id(gluon_score_mod.remsi): torch.fmod, id(gluon_score_mod.remf): torch.fmod,
          id(gluon_score_mod.approximate_tanh): torch.tanh}
_EMULATED: dict = {}


def _loop_range(*bounds):
    # A Gluon loop's induction variable is an i32 scalar tensor, not a Python int.
    for i in range(*(int(b) for b in bounds)):
        yield torch.tensor(i, dtype=torch.int32)


def emulated(jit_fn):
    """The jit function's Python code with the Gluon names it reads bound to the emulator's."""
    # Keyed by id with the function kept alive: the copies a score mod's kernels are (passes/
    # gluon/score_mod.instantiate) come and go, and a freed one's id may be taken again.
    if id(jit_fn) in _EMULATED:
        return _EMULATED[id(jit_fn)][1]
    fn = jit_fn.fn
    scope = dict(fn.__globals__)
    fn_copy = types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__, fn.__closure__)
    _EMULATED[id(jit_fn)] = (jit_fn, fn_copy)
    scope["range"] = _loop_range
    for name, value in fn.__globals__.items():
        if id(value) in _MOCKS:
            scope[name] = _MOCKS[id(value)]
        elif isinstance(value, real_gl.constexpr):
            scope[name] = value.value
        elif isinstance(value, GluonJITFunction):
            scope[name] = emulated(value)
    return fn_copy


def _argument(value):
    if isinstance(value, torch.Tensor):
        return Pointer.to(value)
    if isinstance(value, tuple):
        return tuple(_argument(v) for v in value)
    return value


def launch(kernel, grid, args, descriptor_blocks, constants):
    """Run `kernel` over `grid` with `args` as Triton's launcher receives them (host descriptors
    whole: `descriptor_blocks` gives each one's block shape, in order) and its constexprs."""
    fn = emulated(kernel)
    blocks = iter(descriptor_blocks)
    values = [Descriptor(a, next(blocks)) if hasattr(a, "strides") and hasattr(a, "base") else _argument(a)
              for a in args]
    _PROGRAM["grid"] = tuple(grid)
    PRODUCTS["count"] = 0
    for z in range(grid[2]):
        for y in range(grid[1]):
            for x in range(grid[0]):
                _PROGRAM["ids"], _PROGRAM["abort"] = (x, y, z), None
                _STATE.pending_mma = []
                fn(*values, **constants)
