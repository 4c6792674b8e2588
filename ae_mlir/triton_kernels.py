"""Compiling Triton IR for a target and launching the compiled kernels: Triton's compile and
launcher as the runtime uses them (the in-memory kernel cache, host-made TMA descriptors, scratch
memory for device-made ones, a retry with fewer pipeline stages). Needs only torch and triton,
both imported on first use."""
from __future__ import annotations

import hashlib
import re
import threading

from .disk_cache import atomic_write, cache_dir
from .kernel_args import launcher_positions


def parse_target(text: str):
    """`cuda:90` or `hip:gfx942` -> triton's GPUTarget."""
    from triton.backends.compiler import GPUTarget

    backend, _, arch = text.partition(":")
    if backend == "cuda" and arch.isdigit():
        return GPUTarget("cuda", int(arch), 32)
    if backend == "hip" and arch.startswith("gfx"):
        return GPUTarget("hip", arch, 64)
    raise ValueError(f"unknown target '{text}' (expected cuda:<sm>, e.g. cuda:90, or hip:<gfx arch>)")


_TARGETS: dict = {}


def current_target(device=None) -> str:
    """The target string of `device` (a torch.device), by default the active GPU."""
    import torch

    index = device.index if device is not None and device.index is not None else torch.cuda.current_device()
    target = _TARGETS.get(index)
    if target is None:
        from triton.runtime import driver

        with torch.cuda.device(index):
            t = driver.active.get_current_target()
        target = _TARGETS[index] = f"{t.backend}:{t.arch}"
    return target


_KERNELS: dict = {}
_KERNELS_LOCK = threading.Lock()


def compile_ttir(ttir: str, target: str, num_warps: int = 4, num_stages: int = 2, ir: str = "ttir",
                 max_registers: int = 0):
    """triton.compile the Triton IR text (`ir` "ttir", or Triton GPU IR: "ttgir", whose warps
    its module states) for `target`; compiled kernels are kept in memory here and Triton's own
    cache keeps the binaries on disk."""
    import triton

    digest = hashlib.sha256(ttir.encode()).hexdigest()
    key = (digest, target, num_warps, num_stages, max_registers)
    with _KERNELS_LOCK:
        if key in _KERNELS:
            return _KERNELS[key]
    path = cache_dir() / "ttir" / f"{digest}.{ir}"
    if not path.exists():
        atomic_write(path, ttir)
    options = {"num_warps": num_warps, "num_stages": num_stages}
    if max_registers:
        options["maxnreg"] = max_registers
    kernel = triton.compile(str(path), target=parse_target(target), options=options)
    if ir == "ttgir":
        _descriptor_metadata(kernel, path)
    _host_descriptor_signature(kernel)
    with _KERNELS_LOCK:
        _KERNELS[key] = kernel
    return kernel


def compile_variant(variant, target: str, num_warps: int = 4, num_stages: int = 2):
    """compile_ttir for a bundle's KernelVariant, at its IR level and register cap."""
    return compile_ttir(variant.ttir, target, num_warps, num_stages, variant.ir, variant.max_registers)


def _descriptor_metadata(kernel, path) -> None:
    """Triton's launcher encodes a host descriptor from the swizzle and block its kernel's
    metadata records, which the Triton GPU IR stage writes; a kernel compiled from Triton GPU IR
    skips that stage, so read them from the source as that stage does."""
    from collections import namedtuple

    from triton._C.libtriton import ir as triton_ir
    from triton.compiler.compiler import make_backend

    context = triton_ir.context()
    triton_ir.load_dialects(context)
    make_backend(kernel.metadata.target).load_dialects(context)
    fields = kernel.metadata._asdict()
    fields["tensordesc_meta"] = triton_ir.parse_mlir_module(str(path), context).get_tensordesc_metadata()
    kernel.metadata = namedtuple("KernelMetadata", sorted(fields))(**fields)


def _host_descriptor_signature(kernel) -> None:
    """Triton's launcher knows a host descriptor by the Python frontend's signature entry,
    "tensordesc<dtype[block]>", which stands for the descriptor and the sizes and strides that
    follow it; a Triton IR source lists all of them. Rewrite the source's signature that way (the
    launcher is made from it on the first launch), so the launcher encodes each descriptor from a
    HostDescriptor (kernel_args.launcher_positions gives the arguments it takes)."""
    signature = kernel.src.signature
    if not any(str(t).startswith("!tt.tensordesc") for t in signature.values()):
        return
    collapsed, skip = {}, 0
    for i in sorted(signature):
        if skip:
            skip -= 1
            continue
        # Triton GPU IR adds the shared-memory layout: tensor<1x1x64x128xbf16, #ttg.nvmma_shared<...>>.
        m = re.fullmatch(r"!tt\.tensordesc<tensor<((?:\d+x)+)(\w+)(?:, .*)?>>", str(signature[i]))
        if m is None:
            collapsed[len(collapsed)] = signature[i]
            continue
        block = [int(n) for n in m.group(1).split("x") if n]
        collapsed[len(collapsed)] = f"tensordesc<{m.group(2)}[{', '.join(map(str, block))}]>"
        skip = 2 * len(block)
    kernel.src.signature = collapsed


def _out_of_resources():
    from triton.runtime.errors import OutOfResources

    return OutOfResources


def _fewer_stages(variant, target: str, launched, err):
    """The kernel recompiled with fewer pipeline stages: gathers from closure tensors add shared
    memory the fixed per-head-dim configuration did not plan for (found on an H200 with the T5
    bucketed bias: 256 KiB wanted, 227 KiB available)."""
    if variant.ir != "ttir":  # Triton GPU IR has its pipelining done
        raise err
    for stages in range(launched.num_stages - 1, 0, -1):
        kernel = compile_variant(variant, target, launched.num_warps, stages)
        try:
            kernel._init_handles()
        except _out_of_resources():
            continue
        return kernel
    raise err


_LAUNCHABLE: dict = {}


def _scratch(size: int, alignment: int, stream):
    import torch

    return torch.empty(size, dtype=torch.int8, device="cuda")


def _ensure_scratch_allocator() -> None:
    """A kernel that makes TMA descriptors on the device writes them to global scratch memory,
    which Triton's launcher asks the allocator set in the launching thread's context for
    (autograd runs the backward on threads of its own, whose context starts with none). Where
    none is set, torch's caching allocator serves it (CUDA-graph capture included); an allocator
    the caller set is left alone. Triton keeps the current one in a private ContextVar."""
    import triton
    from triton.runtime import _allocation

    if _allocation._allocator.get() is _allocation._NULL_ALLOCATOR:
        triton.set_allocator(_scratch)


def launch_one(kernel, variant, target: str, args: list) -> None:
    """Launch one kernel (a Bundle or a Stage) with its compile options."""
    # Hashing the Triton IR on every call would cost more than a short kernel runs.
    entry = _LAUNCHABLE.get((id(variant), target))
    if entry is None or entry[0] is not variant:
        entry = (variant, compile_variant(variant, target, kernel.num_warps, kernel.num_stages))
        _LAUNCHABLE[id(variant), target] = entry
    compiled = entry[1]
    if getattr(compiled.metadata, "global_scratch_size", 0):
        _ensure_scratch_allocator()
    positions = launcher_positions(variant)
    if positions is not None:
        args = [args[i] for i in positions]
    grid = tuple(variant.grid or kernel.grid)
    try:
        compiled[grid](*args)
    except _out_of_resources() as err:
        compiled = _fewer_stages(variant, target, kernel, err)
        _LAUNCHABLE[id(variant), target] = (variant, compiled)
        compiled[grid](*args)
