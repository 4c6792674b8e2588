"""The CPU backend: L0 module -> fuse, tile, `attn-lower-to-cpu` -> LLVM JIT, run on torch tensors.

Tensors are handed to the kernel in place: each becomes a ranked memref descriptor (ctypes) over
its own storage, with its sizes, strides and storage offset, so any strided layout runs without a
copy. The outputs are allocated here with torch and passed as the kernel's destination arguments.
"""
from __future__ import annotations

import ctypes
import functools
import threading
from dataclasses import dataclass

from ..core.context import CompileError

# Rows per program and keys per KV tile: a 64x64 f32 score tile (16 KiB) and the K, V and
# accumulator tiles stay in L1/L2 for head dims up to 128.
BLOCK_M = 64
BLOCK_N = 64

_TORCH_DTYPES = {
    "f32": "float32", "f16": "float16", "bf16": "bfloat16", "f64": "float64",
    "i64": "int64", "i32": "int32", "i16": "int16", "i8": "int8", "i1": "bool",
}


@dataclass(frozen=True)
class _ArgSpec:
    shape: tuple[int, ...]
    elt: str

    def torch_dtype(self):
        import torch

        return getattr(torch, _TORCH_DTYPES[self.elt])

    def describe(self) -> str:
        return f"[{', '.join(map(str, self.shape))}] {_TORCH_DTYPES.get(self.elt, self.elt)}"


@functools.lru_cache(maxsize=None)
def _descriptor_type(rank: int):
    fields = [("allocated", ctypes.c_void_p), ("aligned", ctypes.c_void_p), ("offset", ctypes.c_int64)]
    if rank:
        fields += [("sizes", ctypes.c_int64 * rank), ("strides", ctypes.c_int64 * rank)]
    return type(f"MemRef{rank}D", (ctypes.Structure,), {"_fields_": fields})


def _descriptor(tensor):
    """A memref descriptor viewing `tensor`'s storage; strides and offset are in elements."""
    desc = _descriptor_type(tensor.dim())()
    base = tensor.untyped_storage().data_ptr()
    desc.allocated = base
    desc.aligned = base
    desc.offset = tensor.storage_offset()
    for i, (size, stride) in enumerate(zip(tensor.shape, tensor.stride())):
        desc.sizes[i] = size
        desc.strides[i] = stride
    return desc


class CompiledKernel:
    """A JIT-compiled kernel and the argument types it was compiled for."""

    def __init__(self, module_text: str, block_m: int | None, block_n: int | None, unit_inner_stride: bool):
        from mlir import ir
        from mlir.execution_engine import ExecutionEngine

        from ..core.context import new_context, parse_module
        from ..core.verifier import check_module

        self._context = new_context()
        module = parse_module(module_text, self._context)
        check_module(module)
        funcs = [op.operation for op in module.body.operations if op.operation.name == "func.func"]
        if len(funcs) != 1:
            raise CompileError(f"the CPU backend runs a module with exactly one function, found {len(funcs)}")
        func = funcs[0]
        self.name = ir.StringAttr(func.attributes["sym_name"]).value
        ftype = ir.FunctionType(ir.TypeAttr(func.attributes["function_type"]).value)
        self.inputs = [_spec(t) for t in ftype.inputs]
        self.outputs = [_spec(t) for t in ftype.results]
        self.unit_inner_stride = unit_inner_stride
        default_m, default_n = _block_sizes(self.inputs)
        self.block_m, self.block_n = block_m or default_m, block_n or default_n
        to_l1, to_llvm = _pipeline(self.block_m, self.block_n, unit_inner_stride)
        self._run(to_l1, module)
        kernel = next(op.operation for op in module.body.operations if op.operation.name == "func.func")
        # A mask that reads closure tensors is classified per call (block_mask); its four tile
        # tables follow the inputs.
        self.call_time_tables = "attn.call_time_tables" in kernel.attributes
        if self.call_time_tables:
            l1_inputs = ir.FunctionType(ir.TypeAttr(kernel.attributes["function_type"]).value).inputs
            self.inputs += [_spec(t) for t in list(l1_inputs)[len(self.inputs):len(self.inputs) + 4]]
        self._run(to_llvm, module)
        self._module = module
        try:
            self._engine = ExecutionEngine(module, opt_level=3)
        except RuntimeError as err:
            raise CompileError(f"the LLVM JIT rejected the lowered module: {err}") from None
        address = self._engine.raw_lookup("_mlir_ciface_" + self.name)
        if not address:
            # The JIT reports unresolved symbols on stderr and hands back a null entry point.
            raise CompileError(f"the LLVM JIT could not link kernel '{self.name}' (unresolved symbols)")
        self._entry = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(address)

    def _run(self, pipeline: str, module) -> None:
        from mlir import ir

        from ..passes import build_pass_manager

        try:
            build_pass_manager(pipeline, self._context).run(module.operation)
        except ir.MLIRError as err:
            from ..core.context import diagnostic_from_mlir

            diags = [diagnostic_from_mlir(d) for d in err.error_diagnostics]
            raise CompileError("compiling for the CPU failed", diags) from None

    def __call__(self, inputs: list) -> list:
        import torch

        if len(inputs) != len(self.inputs):
            raise ValueError(f"the kernel takes {len(self.inputs)} tensors, got {len(inputs)}")
        for i, (t, spec) in enumerate(zip(inputs, self.inputs)):
            if not isinstance(t, torch.Tensor) or t.device.type != "cpu":
                raise ValueError(f"argument {i} of the CPU kernel must be a CPU torch.Tensor")
            if tuple(t.shape) != spec.shape or t.dtype != spec.torch_dtype():
                raise ValueError(f"argument {i} of the CPU kernel must be {spec.describe()}, got "
                                 f"[{', '.join(map(str, t.shape))}] {str(t.dtype).removeprefix('torch.')}")
            if self.unit_inner_stride and not _unit_inner_stride(t):
                raise ValueError(f"argument {i} of the CPU kernel needs unit stride in its last dimension "
                                 "(this kernel was compiled with unit-inner-stride)")
        outputs = [torch.empty(spec.shape, dtype=spec.torch_dtype()) for spec in self.outputs]
        descriptors = [_descriptor(t) for t in list(inputs) + outputs]
        pointers = [ctypes.pointer(d) for d in descriptors]
        packed = (ctypes.c_void_p * len(pointers))(*[ctypes.addressof(p) for p in pointers])
        self._entry(packed)
        return outputs


def _pipeline(block_m: int, block_n: int, unit_inner_stride: bool) -> tuple[str, str]:
    """The cpu preset split where L1 is complete: (L0 -> L1, L1 -> llvm)."""
    from ..passes import PIPELINES

    to_l1, to_llvm = [], []
    for name in PIPELINES["cpu"]:
        if name == "attn-tile":
            to_l1.append(f"attn-tile{{block-m={block_m} block-n={block_n} call-time-tables=true}}")
        elif name == "attn-lower-to-cpu":
            to_llvm.append(f"attn-lower-to-cpu{{unit-inner-stride={str(unit_inner_stride).lower()}}}")
        else:
            to_l1.append(name)
    return "builtin.module(" + ",".join(to_l1) + ")", "builtin.module(" + ",".join(to_llvm) + ")"


def _block_sizes(inputs: list[_ArgSpec]) -> tuple[int, int]:
    """BLOCK_M x BLOCK_N, shrunk to the power of two at or above a shorter Lq or Lk (q and k are
    the first two inputs, [B, H, L, D])."""
    def pow2(n: int) -> int:
        return 1 << max(0, n - 1).bit_length()

    if len(inputs) < 2 or len(inputs[0].shape) != 4 or len(inputs[1].shape) != 4:
        return BLOCK_M, BLOCK_N
    return min(BLOCK_M, pow2(inputs[0].shape[2])), min(BLOCK_N, pow2(inputs[1].shape[2]))


def _unit_inner_stride(t) -> bool:
    return t.dim() == 0 or t.shape[-1] <= 1 or t.stride(-1) == 1


def _spec(mlir_type) -> _ArgSpec:
    from mlir import ir

    shaped = ir.RankedTensorType(mlir_type)
    return _ArgSpec(tuple(shaped.shape), str(shaped.element_type))


_CACHE: dict[tuple, CompiledKernel] = {}
_CACHE_LOCK = threading.Lock()


def compile_module(module_text: str, block_m: int | None = None, block_n: int | None = None,
                   unit_inner_stride: bool = True) -> CompiledKernel:
    """The compiled kernel for an L0 module, from the in-memory cache when it was built before.

    Block sizes default to BLOCK_M x BLOCK_N (less for short sequences). With `unit_inner_stride`
    (the usual case: torch's layouts, transposes of them included) tile rows load as vectors;
    without it any strides work, with element-wise tile loads.
    """
    key = (module_text, block_m, block_n, unit_inner_stride)
    with _CACHE_LOCK:
        kernel = _CACHE.get(key)
        if kernel is None:
            kernel = CompiledKernel(module_text, block_m, block_n, unit_inner_stride)
            _CACHE[key] = kernel
    return kernel


def run_module_text(module_text: str, inputs: list, out_dtype, mask_mod=None) -> list:
    """Compile (once) and run `module_text` on CPU tensors; the first result takes `out_dtype`;
    `mask_mod` classifies the tiles per call when the kernel asks for tile tables."""
    unit = all(_unit_inner_stride(t) for t in inputs)
    kernel = compile_module(module_text, unit_inner_stride=unit)
    if kernel.call_time_tables:
        if mask_mod is None:
            raise CompileError(f"kernel '{kernel.name}' classifies its mask at call time; pass the mask_mod")
        from ..block_mask import classify_cached

        inputs = list(inputs) + classify_cached(mask_mod, inputs[0].shape[2], inputs[1].shape[2],
                                                kernel.block_m, kernel.block_n, "cpu")
    results = kernel(inputs)
    return [results[0].to(out_dtype)] + results[1:]
