"""The CPU backend: L0 module -> fuse, tile, `attn-lower-to-cpu` -> LLVM JIT, run on torch tensors.

The passes and their options are `ae_mlir.presets`' "cpu" pipeline, run in its two stages (L0 -> L1,
then L1 -> llvm) because the L1 kernel says in between whether it takes call-time tile tables; so
`ae-opt --pipeline=cpu` prints what `lowered_text` returns and the JIT compiles.

Compiled kernels are cached in memory and on disk (`cpu_cache`: the JIT's code linked into a
shared object, loaded with ctypes), so a later process calls a kernel without MLIR or a compile.
A compile that runs long says so, stage by stage (`ae_mlir.progress`).

Tensors are handed to the kernel in place (`cpu_launch`). The outputs are allocated here with
torch and passed as the kernel's destination arguments. The kernel's last two arguments are a
range of its programs, and its claiming entry takes programs from a shared counter: `cpu_threads`
runs either on several threads.
"""
from __future__ import annotations

import ctypes
import functools
import math
import threading
from dataclasses import dataclass

from .. import progress
from ..kernel_args import unit_last_stride
from ..core import abi
from ..core.context import CompileError
from . import cpu_cache, cpu_launch, cpu_threads

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

    def to_dict(self) -> dict:
        return {"shape": list(self.shape), "elt": self.elt}

    @classmethod
    def from_dict(cls, d: dict) -> _ArgSpec:
        return cls(tuple(int(n) for n in d["shape"]), str(d["elt"]))


@dataclass
class _Lowered:
    """An L0 module lowered to the llvm dialect, with what the caller needs to call it."""

    module: object
    name: str
    inputs: list[_ArgSpec]
    outputs: list[_ArgSpec]
    block_m: int
    block_n: int
    mask_program: str | None  # JSON, for a kernel that takes call-time tile tables
    mask_grid: list | None    # the (batch, query, key) grid it classifies, where q's shape does not give it
    programs: int             # the grid's size; the last two arguments take a range of [0, programs)
    accumulated: dict[int, str]  # output -> role: the closure gradients the kernel adds into (attn.scatter_add)
    output_roles: list[str]      # whose rows a packed output has (abi.sized_shape)
    mirrored: dict[int, int]     # input -> i: the copy of closure tensor c<i> reversed along its last dimension
    amx: bool                    # the kernel multiplies tiles on AMX units (needs `cpu_cache.request_amx`)


def _lower(module_text: str, context, block_m: int | None, block_n: int | None,
           unit_inner_stride: bool, report: progress.Compile | progress.Silent | None = None,
           backward: str | None = None, closure_grads: bool = True) -> _Lowered:
    from .. import presets
    from ..core.context import parse_module
    from ..core.verifier import check_module

    report = report or progress.Silent()
    module = parse_module(module_text, context)
    check_module(module)
    funcs = abi.functions(module)
    if len(funcs) != 1:
        raise CompileError(f"the CPU backend runs a module with exactly one function, found {len(funcs)}")
    inputs = [_spec(t) for t in abi.input_types(funcs[0])]
    outputs = [_spec(t) for t in abi.result_types(funcs[0])]
    accumulated = {}
    output_roles = list(abi.SOFTMAX_OUTPUTS[:len(outputs)])
    name = report.name = abi.name(funcs[0])
    overrides = {key: value for key, value in (("block_m", block_m), ("block_n", block_n)) if value}
    if backward is not None:
        overrides.update(backward=True, closure_grads=closure_grads)
    options = presets.options_for("cpu", presets.read_problem(module), "host",
                                  unit_inner_stride=unit_inner_stride, **overrides)
    report.stage("L0 -> L1: fuse, tile" if backward is None else "L0 -> L1: differentiate, tile the backward")
    _run(presets.pipeline_text("cpu", options, "l1"), module)
    kernel = abi.functions(module)[0]
    if backward is not None:
        # One kernel of the backward's two per compiled module (each has its own grid).
        kernel = _keep_kernel(module, abi.backward_kernel_name(name, backward))
        n_results = len(abi.result_types(kernel))
        inputs = [_spec(t) for t in abi.input_types(kernel)[:-n_results]]
        outputs = [_spec(t) for t in abi.result_types(kernel)]
        output_roles = abi.arg_roles(kernel)[-n_results:]
        accumulated = {i: role for i, role in enumerate(output_roles) if abi.is_closure_grad(role)}
        name = report.name = abi.name(kernel)
        # A backward kernel's call-time tables (abi.backward_table_roles) are among its inputs,
        # classified over its own blocks: the dK/dV kernel's may differ from the dQ kernel's.
        blocks = abi.backward_blocks(backward, {key: getattr(options, key) for key in
                                                ("block_m", "block_n", "dkdv_block_m", "dkdv_block_n")})
    else:
        # A mask that reads closure tensors is classified per call (block_mask); its four tile
        # tables follow the inputs.
        inputs += [_spec(t) for t in abi.call_time_table_types(kernel, len(inputs))]
        blocks = (options.block_m, options.block_n)
    # Closure tensors whose reads step back along a tile's vectorized axis are read forwards from
    # a mirrored copy (passes/mirror_reads.py): the vectorizer loads ascending indices contiguously
    # and gathers the rest lane by lane.
    mirrored = {position: int(abi.mirrored_capture(role)[1:])
                for position, role in enumerate(abi.arg_roles(kernel) or []) if abi.mirrored_capture(role)}
    if backward is None:
        inputs += [_spec(t) for t in abi.input_types(kernel)[len(inputs):len(inputs) + len(mirrored)]]
    lowered = _Lowered(module, name, inputs, outputs, *blocks, abi.mask_program(kernel), abi.call_time_grid(kernel),
                       math.prod(abi.grid(kernel)), accumulated, output_roles, mirrored, False)
    report.stage("L1 -> LLVM dialect")
    _run(presets.pipeline_text("cpu", options, "llvm"), module)
    # Whether any tile product took AMX (padded tiles and other shapes keep f32 products).
    lowered.amx = any(op.name == "llvm.func" and str(op.attributes["sym_name"]).strip('"').startswith(
        abi.AMX_PRODUCT_PREFIX) for op in module.body.operations)
    return lowered


def _keep_kernel(module, name: str):
    """Erase every function of the module but the kernel `name`, and return that one."""
    kept = None
    for func in abi.functions(module):
        if abi.name(func) == name:
            kept = func
        else:
            func.erase()
    if kept is None:
        raise CompileError(f"the backward pipeline made no kernel '{name}'")
    return kept


def _run(pipeline: str, module) -> None:
    from mlir import ir

    from ..passes import build_pass_manager

    try:
        build_pass_manager(pipeline, module.context).run(module.operation)
    except ir.MLIRError as err:
        from ..core.context import diagnostic_from_mlir

        diags = [diagnostic_from_mlir(d) for d in err.error_diagnostics]
        raise CompileError("compiling for the CPU failed", diags) from None


def lowered_text(module_text: str, block_m: int | None = None, block_n: int | None = None,
                 unit_inner_stride: bool = True) -> str:
    """The llvm-dialect module (generic form) that `compile_module` hands to the JIT."""
    from ..core.context import new_context

    lowered = _lower(module_text, new_context(), block_m, block_n, unit_inner_stride)
    return lowered.module.operation.get_asm(print_generic_op_form=True)


class CompiledKernel:
    """A compiled kernel (JIT-built, or loaded from the disk cache) and the argument types it
    was compiled for."""

    def __init__(self, record: dict, address: int, owner, claiming: int | None = None):
        self.name = record["name"]
        self.inputs = [_ArgSpec.from_dict(d) for d in record["inputs"]]
        self.outputs = [_ArgSpec.from_dict(d) for d in record["outputs"]]
        self.block_m, self.block_n = int(record["block_m"]), int(record["block_n"])
        self.mask_program = record["mask_program"]
        self.mask_grid = record["mask_grid"]
        self.unit_inner_stride = bool(record["unit_inner_stride"])
        self.programs = int(record["programs"])
        self.accumulated = {int(i): role for i, role in record.get("accumulated", {}).items()}
        self.output_roles = list(record["output_roles"])
        self.mirrored = {int(position): i for position, i in record.get("mirrored", {}).items()}
        self.amx = bool(record.get("amx"))  # its tile products run on AMX units
        if self.amx and not cpu_cache.request_amx():
            raise CompileError(f"kernel '{self.name}' multiplies tiles on AMX units, which this process may "
                               "not use (the Linux kernel refused arch_prctl(ARCH_REQ_XCOMP_PERM))")
        # A packed batch's kernel takes any row count (-1 in its shapes): each call sizes its
        # outputs and descriptors from q's and k's rows.
        self.any_rows = any(-1 in spec.shape for spec in self.inputs + self.outputs)
        self._owner = owner  # the JIT engine or the loaded library: keeps the code mapped
        self._entry = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(address)
        # The entry through which threads claim programs (`attn-cpu-claim-programs`).
        self._claiming = None if claiming is None else ctypes.CFUNCTYPE(None, ctypes.c_void_p)(claiming)
        # What a call checks its tensors against and allocates, made on the first call (torch is
        # imported late: building a kernel needs no torch).
        self._expected: list | None = None
        self._results: list | None = None
        self._output_strides: list | None = None
        self.output_dtypes: list | None = None  # the outputs' torch dtypes

    def _prepare_call(self) -> None:
        import torch

        self._expected = [(spec.shape, spec.torch_dtype()) for spec in self.inputs]
        self._results = [((torch.zeros if i in self.accumulated else torch.empty), spec.shape, spec.torch_dtype())
                         for i, spec in enumerate(self.outputs)]
        self._output_strides = [cpu_launch.contiguous_strides(spec.shape) for spec in self.outputs]
        self.output_dtypes = [dtype for _, _, dtype in self._results]

    def __call__(self, inputs: list) -> list:
        """Run the kernel on `inputs` after checking each against the types it was compiled for."""
        import torch

        if self._expected is None:
            self._prepare_call()
        if len(inputs) != len(self.inputs) - len(self.mirrored):
            raise ValueError(f"the kernel takes {len(self.inputs) - len(self.mirrored)} tensors, got {len(inputs)}")
        inputs = self.with_mirrors(inputs)
        for i, (t, (shape, dtype)) in enumerate(zip(inputs, self._expected)):
            if not isinstance(t, torch.Tensor) or t.device.type != "cpu":
                raise ValueError(f"argument {i} of the CPU kernel must be a CPU torch.Tensor")
            fits = t.shape == shape or (self.any_rows and abi.fits_shape(shape, t.shape))
            if not fits or t.dtype != dtype:
                raise ValueError(f"argument {i} of the CPU kernel must be {self.inputs[i].describe()}, got "
                                 f"[{', '.join(map(str, t.shape))}] {str(t.dtype).removeprefix('torch.')}")
            if self.unit_inner_stride and not unit_last_stride(t):
                raise ValueError(f"argument {i} of the CPU kernel needs unit stride in its last dimension "
                                 "(this kernel was compiled with unit-inner-stride)")
        return self.run_unchecked(inputs)

    def with_mirrors(self, inputs: list) -> list:
        """`inputs` with the mirrored closure tensors the kernel reads inserted where it takes them
        (`mirrored`); the caller gives every other input in the kernel's order."""
        if not self.mirrored:
            return inputs
        from ..kernel_args import mirrored_copy

        inputs = list(inputs)
        for position, i in sorted(self.mirrored.items()):
            inputs.insert(position, mirrored_copy(inputs[len(abi.INPUTS) + i]))
        return inputs

    def run_unchecked(self, inputs: list) -> list:
        """Run the kernel on `inputs` that its caller made match the types it was compiled for
        (the module it compiled was written from them; wrong shapes would be read out of
        bounds). Each torch call costs a call from Python several microseconds, more right after
        a kernel has swept the caches: this path makes the fewest (the inputs' strides and
        addresses, the outputs' allocation)."""
        if self._expected is None:
            self._prepare_call()
        if self.any_rows:
            rows = inputs[0].shape[2], inputs[1].shape[2]
            shapes = [abi.sized_shape(role, spec.shape, *rows) for role, spec in zip(self.output_roles, self.outputs)]
            outputs = [make(shape, dtype=dtype) for (make, _, dtype), shape in zip(self._results, shapes)]
            layouts = [(t.shape, t.stride()) for t in inputs] + [
                (shape, cpu_launch.contiguous_strides(shape)) for shape in shapes]
        else:
            outputs = [make(shape, dtype=dtype) for make, shape, dtype in self._results]
            layouts = [(spec.shape, t.stride()) for spec, t in zip(self.inputs, inputs)] + [
                (spec.shape, strides) for spec, strides in zip(self.outputs, self._output_strides)]
        tensors = list(inputs) + outputs
        if self._claiming is not None and not self.accumulated:
            launch = cpu_launch.ClaimingLaunch(self._claiming, tensors, layouts, self.programs, owner=self)
            cpu_threads.run_claiming(launch, self.programs)
            return outputs
        launch = cpu_launch.RangeLaunch(self._entry, tensors, [len(inputs) + i for i in self.accumulated],
                                        self.programs, layouts)
        # A copy per piece: one piece per thread keeps the copies few.
        cpu_threads.run(launch, self.programs, 1 if self.accumulated else cpu_threads.PIECES_PER_THREAD)
        launch.sum_private_copies()
        return outputs


def _spec(mlir_type) -> _ArgSpec:
    from mlir import ir

    shaped = ir.RankedTensorType(mlir_type)
    # -1: a dimension of any size (a packed batch's rows, abi.PACKED_ROWS_DIM).
    return _ArgSpec(tuple(max(n, -1) for n in shaped.shape), str(shaped.element_type))


def _build(module_text: str, block_m: int | None, block_n: int | None, unit_inner_stride: bool,
           key: str, backward: str | None = None, closure_grads: bool = True) -> CompiledKernel:
    """JIT-compile the kernel and store it in the disk cache; the stored library runs it where it
    loads (the same machine code), else the JIT's."""
    from mlir.execution_engine import ExecutionEngine

    from ..core.context import new_context

    with progress.Compile("for the CPU", "L0 -> L1 -> LLVM -> native code") as report:
        context = new_context()
        lowered = _lower(module_text, context, block_m, block_n, unit_inner_stride, report, backward, closure_grads)
        record = {"name": lowered.name, "inputs": [a.to_dict() for a in lowered.inputs],
                  "outputs": [a.to_dict() for a in lowered.outputs], "block_m": lowered.block_m,
                  "block_n": lowered.block_n, "mask_program": lowered.mask_program, "mask_grid": lowered.mask_grid,
                  "unit_inner_stride": unit_inner_stride, "programs": lowered.programs,
                  "accumulated": {str(i): role for i, role in lowered.accumulated.items()},
                  "output_roles": lowered.output_roles,
                  "mirrored": {str(position): i for position, i in lowered.mirrored.items()},
                  "claiming": abi.claiming_entry_name(lowered.name), "amx": lowered.amx}
        report.stage("LLVM -> native code (JIT, -O3)")
        try:
            engine = ExecutionEngine(lowered.module, opt_level=3)
        except RuntimeError as err:
            raise CompileError(f"the LLVM JIT rejected the lowered module: {err}") from None
        address = engine.raw_lookup("_mlir_ciface_" + lowered.name)
        claiming = engine.raw_lookup("_mlir_ciface_" + record["claiming"])
        if not address or not claiming:
            # The JIT reports unresolved symbols on stderr and hands back a null entry point.
            raise CompileError(f"the LLVM JIT could not link kernel '{lowered.name}' (unresolved symbols)")
        report.stage("caching the kernel (shared object)")
        stored = cpu_cache.store(key, engine, record)
    if stored is not None:
        return CompiledKernel(*stored)
    return CompiledKernel(record, address, (context, lowered.module, engine), claiming)


_CACHE: dict[tuple, CompiledKernel] = {}
_CACHE_LOCK = threading.Lock()


def compile_module(module_text: str, block_m: int | None = None, block_n: int | None = None,
                   unit_inner_stride: bool = True, backward: str | None = None,
                   closure_grads: bool = True) -> CompiledKernel:
    """The compiled kernel for an L0 module: from the in-memory cache, else the disk cache
    (`cpu_cache`, no MLIR needed), else compiled and stored in both.

    Block sizes default to the cpu preset's (`launch_defaults.cpu_config`). With `unit_inner_stride`
    (the usual case: torch's layouts, transposes of them included) tile rows load as vectors;
    without it any strides work, with element-wise tile loads.
    """
    from ..core.regions import strip_locations

    # Source locations (the traced call site's among them) change no code: the same attention
    # called from two lines is one kernel. The compile still sees them, for its diagnostics.
    bare = strip_locations(module_text)
    memory_key = (bare, block_m, block_n, unit_inner_stride, backward, closure_grads, cpu_cache.vector_bits(),
                  cpu_cache.uses_amx())
    with _CACHE_LOCK:
        kernel = _CACHE.get(memory_key)
        if kernel is None:
            options = {"block_m": block_m, "block_n": block_n, "unit_inner_stride": unit_inner_stride}
            if backward is not None:
                options["backward"] = backward
                if not closure_grads:
                    options["closure_grads"] = False
            key = cpu_cache.key(bare, options)
            loaded = cpu_cache.load(key)
            kernel = CompiledKernel(*loaded) if loaded else _build(module_text, block_m, block_n,
                                                                   unit_inner_stride, key, backward, closure_grads)
            _CACHE[memory_key] = kernel
    return kernel


def clear_memory_cache() -> None:
    """Forget the kernels held in memory (the disk cache stays)."""
    with _CACHE_LOCK:
        _CACHE.clear()


def run_module_text(module_text: str, inputs: list, out_dtype, autotune: bool = False) -> list:
    """Compile (once) and run `module_text` on CPU tensors; the first result takes `out_dtype`.
    With `autotune`, at the tiles of the fastest candidate (`tuned_blocks`)."""
    unit = all(unit_last_stride(t) for t in inputs)
    blocks = tuned_blocks(module_text, inputs, unit) if autotune else {}
    kernel = compile_module(module_text, unit_inner_stride=unit, **blocks)
    results = _launch(kernel, inputs)
    if kernel.output_dtypes[0] != out_dtype:
        results[0] = results[0].to(out_dtype)
    return results


def _launch(kernel: CompiledKernel, inputs: list) -> list:
    """Run a compiled forward kernel on the tensors whose module it compiled; one whose mask reads
    closure tensors gets its tile tables classified per call from the mask program it carries."""
    if kernel.mask_program is not None:
        from ..block_mask import call_time_tables

        batch, seq_q, seq_k = abi.classification_grid(kernel.mask_grid, inputs[0].shape[2], inputs[1].shape[2])
        inputs = list(inputs) + call_time_tables(kernel.mask_program, inputs, seq_q, seq_k, kernel.block_m,
                                                 kernel.block_n, "cpu", batch=batch)
    return kernel.run_unchecked(kernel.with_mirrors(inputs))


def tuned_blocks(module_text: str, inputs: list, unit_inner_stride: bool = True) -> dict:
    """The block sizes (block_m, block_n) of the fastest autotuning candidate of an L0 module on
    this host, searched on `inputs` the first time (`ae_mlir.autotune`) and kept on disk."""
    from .. import autotune, presets
    from ..core.context import new_context, parse_module
    from ..core.regions import strip_locations

    # Hashed per call, as compile_module strips every call's module: a CPU kernel runs for
    # milliseconds, not the microseconds a GPU launch path is measured in.
    text = strip_locations(module_text)
    key = cpu_cache.key(text, {"autotune": True, "unit_inner_stride": unit_inner_stride})
    record = autotune.load(key)
    if record is not None and record.get("chosen") is not None:
        return record["chosen"]
    bucket = cpu_cache.key(autotune.shape_bucket(text), {"autotune": "bucket", "unit_inner_stride": unit_inner_stride})
    module = parse_module(module_text, new_context())
    name = abi.name(abi.functions(module)[0])
    chosen = autotune.bucket_choice(bucket)
    if chosen is not None:
        # The candidates' tiles are capped at the power of two a bucket's lengths round up to, so
        # the bucket's choice suits each of them.
        autotune.adopt(key, name, bucket)
        return chosen
    problem = presets.read_problem(module)
    if problem is None:
        raise CompileError("autotuning needs an attention module (q, k, v tensors) at L0")

    def launcher(config):
        return functools.partial(_launch, compile_module(module_text, unit_inner_stride=unit_inner_stride, **config),
                                 inputs)

    return autotune.choose(key, name, "host", autotune.candidates(problem, "host"), launcher,
                           timer=autotune.median_wall_ms, bucket=bucket)


def run_backward(module_text: str, tensors: dict, closure_grads: bool = True, kind: str | None = None,
                 stat: str = "none") -> dict:
    """dq, dk and dv of the attention `module_text` from its backward kernels (attn-tile-backward),
    run in order; `tensors` holds q, k, v, the closure tensors c0, c1, ..., do, and for softmax
    out, lse and dlse, by role. Returns the three gradients by role, in q's, k's and v's dtypes,
    and the gradients dc<i> (float32) of the closure tensors the score_mod reads."""
    tensors = dict(tensors)
    n_closures = sum(1 for r in tensors if r.startswith("c") and r[1:].isdigit())
    first = abi.input_roles(3 + n_closures)
    kernels = abi.backward_kernels(kind or ("softmax" if "lse" in tensors else "none"), stat)
    missing = sorted({r for _, reads, _ in kernels for r in reads} - set(tensors) - {w for *_, ws in kernels for w in ws})
    if missing:
        raise ValueError(f"the backward kernels need the tensors {', '.join(missing)}")
    for part, reads, writes in kernels:
        inputs = [tensors[r] for r in first + list(reads)]
        unit = all(unit_last_stride(t) for t in inputs)
        kernel = compile_module(module_text, unit_inner_stride=unit, backward=part, closure_grads=closure_grads)
        if kernel.mask_program is not None:
            # A mask that reads closure tensors: the tiles this kernel visits, classified per call
            # in its layout (dQ: per query block; dK/dV: per KV block) at its blocks.
            from ..block_mask import call_time_tables

            operands = [tensors[r] for r in first]
            batch, seq_q, seq_k = abi.classification_grid(kernel.mask_grid, tensors["q"].shape[2],
                                                         tensors["k"].shape[2])
            inputs += call_time_tables(kernel.mask_program, operands, seq_q, seq_k, kernel.block_m, kernel.block_n,
                                       "cpu", part, batch)
        n_writes = len(writes)
        results = kernel(inputs)
        tensors.update(zip(writes, results[:n_writes]))
        tensors.update((kernel.accumulated[i], t) for i, t in enumerate(results) if i in kernel.accumulated)
    return {role: t for role, t in tensors.items() if role in abi.BACKWARD_OUTPUTS or abi.is_closure_grad(role)}
