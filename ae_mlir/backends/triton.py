"""The Triton backend, compile side: an L0 module becomes a runtime `Bundle`.

    L0 --stage "l1" of the triton preset--> L1 --stage "ttir", assume-aligned=true|false--> Triton IR

With the preset's `warp_specialize` (sm90, plain and causal 16-bit attention at D 128) the aligned
variant is instead attn-lower-to-gluon's Triton GPU IR, made from L0 (`_lower_gluon`).

The passes, their order and options, and the launch options are `ae_mlir.presets`' ("triton"), so
`ae-opt --pipeline=triton` runs what this backend runs. Both Triton IR variants go into the bundle
with the launch grid, argument labels, block tables and the compile options. `run` is what
`ae.attention(...)(q, k, v)` calls on GPU tensors: the bundle comes from the cache (memory, then
disk) when it can, so MLIR is imported only to build a missing one. `compile_bundle` builds a
bundle ahead of time from shapes or "meta" tensors, on a machine without a GPU.
"""
from __future__ import annotations

import dataclasses

from .. import progress, runtime
from ..core import abi
from ..core.context import CompileError
from ..core.memo import kept
from ..core.regions import strip_locations
from .call_time_tiles import backward_call_time_tiles, call_time_tiles

_ELT_DTYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16", "f64": "float64", "i64": "int64",
               "i32": "int32", "i16": "int16", "i8": "int8", "i1": "bool"}


def preset_options(module, target: str, config: dict | None = None, input_precision: str = "ieee"):
    """The triton preset's options for a parsed L0 module; `config` overrides them (block sizes,
    launch options: any `PresetOptions` field)."""
    from .. import presets

    problem = presets.read_problem(module)
    if problem is None:
        raise CompileError("the Triton backend needs an attention module (q, k, v tensors) at L0")
    return presets.options_for("triton", problem, target, **dict(config or {}, input_precision=input_precision))


def _specs(types: list, roles: list[str]) -> list[runtime.TensorSpec]:
    specs = []
    for role, ty in zip(roles, types):
        elt = str(ty.element_type)
        # -1: a dimension of any size (a packed batch's rows, abi.PACKED_ROWS_DIM).
        specs.append(runtime.TensorSpec(role, [max(int(n), -1) for n in ty.shape], _ELT_DTYPES.get(elt, elt)))
    return specs


def _parse_l0(l0_text: str):
    from ..core.context import new_context, parse_module
    from ..core.verifier import check_module

    ctx = new_context()
    module = parse_module(l0_text, ctx, "<l0>")
    check_module(module)
    return module


def _run(pipeline: str, module, what: str) -> None:
    from mlir import ir

    from ..passes import build_pass_manager

    try:
        build_pass_manager(pipeline, module.context).run(module.operation)
    except ir.MLIRError as err:
        from ..core.context import diagnostic_from_mlir

        raise CompileError(what, [diagnostic_from_mlir(d) for d in err.error_diagnostics]) from None


def lower(module, options) -> tuple:
    """Run the preset's "l1" stage on a parsed L0 module; returns (L1 module text, input, output
    and workspace specs, whether the kernel takes call-time tables)."""
    from .. import presets

    funcs = abi.functions(module)
    if len(funcs) != 1:
        raise CompileError(f"the Triton backend compiles a module with one function, found {len(funcs)}")
    n_inputs = len(abi.input_types(funcs[0]))
    inputs = _specs(abi.input_types(funcs[0]), abi.input_roles(n_inputs))
    outputs = _specs(abi.result_types(funcs[0]), abi.output_roles(options.linear))
    _run(presets.pipeline_text("triton", options, "l1"), module, "the Triton pipeline failed")
    kernel = abi.functions(module)[-1]
    # The tile tables of a mask that reads closure tensors follow the inputs; the caller
    # computes them with ae_mlir.block_mask when it launches the kernel.
    inputs += _specs(abi.call_time_table_types(kernel, n_inputs), abi.call_time_table_roles(n_inputs - 3))
    workspace, mirrored, rows = {}, {}, {}
    for func in abi.functions(module):
        for role, ty in zip(abi.arg_roles(func) or [], abi.input_types(func)):
            if abi.is_workspace(role):
                workspace.setdefault(role, ty)
            elif abi.mirrored_capture(role):
                mirrored.setdefault(role, ty)
        rows.update(abi.workspace_rows(func))
    # Closure tensors read mirrored (passes/mirror_reads.py) come last; the runtime makes them.
    inputs += _specs(list(mirrored.values()), list(mirrored))
    workspace_specs = _specs(list(workspace.values()), list(workspace))
    for spec in workspace_specs:
        spec.rows = rows.get(spec.role)
    # With its locations, so that a diagnostic of the Triton lowering points at the user's mods.
    return (module.operation.get_asm(enable_debug_info=True), inputs, outputs, workspace_specs,
            abi.takes_call_time_tables(kernel))


def _lower_l1(l1_text: str, options) -> list[tuple[runtime.KernelVariant, dict]]:
    """One Triton IR variant (`options.assume_aligned`) of each kernel of an L1 module, in launch
    order, with the launch facts its tt.func records."""
    from .. import presets
    from ..core.context import new_context, parse_module

    module = parse_module(l1_text, new_context(), "<l1>")
    _run(presets.pipeline_text("triton", options, "ttir"), module, "attn-lower-to-triton failed")
    lowered = []
    for kernel in kernel_ops(module):
        facts = {"name": abi.name(kernel), "grid": abi.grid(kernel), "tables": _tables(kernel),
                 "chunk_stage": abi.chunk_stage(kernel)}
        lowered.append((kernel_variant(module, kernel, options.assume_aligned), facts))
    return lowered


def kernel_variant(module, kernel, aligned: bool) -> runtime.KernelVariant:
    """A lowered tt.func as the runtime compiles it: Triton IR, or the Triton GPU IR that
    attn-lower-to-gluon's stub carries, with that kernel's own grid and register cap."""
    from ..passes.lower_to_gluon import MAX_REGISTERS, TTGIR
    from ..passes.lower_to_triton import triton_text

    text, args = triton_text(module, kernel), abi.kernel_args(kernel)
    if TTGIR not in kernel.attributes:
        return runtime.KernelVariant(text, args, aligned)
    return runtime.KernelVariant(text, args, aligned, ir="ttgir", grid=abi.grid(kernel),
                                 max_registers=abi.int_attr(kernel, MAX_REGISTERS))


def _lower_gluon(l0_text: str, options, generic: list) -> list[tuple[runtime.KernelVariant, dict]]:
    """The aligned variants from attn-lower-to-gluon: Triton GPU IR kernels in place of the general
    variant's (the forward's one, the backward's two), each with its own grid and register cap;
    the five-product backward's third kernel (its facts only a name) after them."""
    from .. import presets

    module = _parse_l0(l0_text)
    _run(presets.pipeline_text("triton", options), module, "attn-lower-to-gluon failed")
    kernels = kernel_ops(module)
    names = [facts["name"] for _, facts in generic]
    made = [abi.name(kernel) for kernel in kernels]
    # The five-product backward's kernels (delta, fused, convert) stand in for the general
    # variant's two (dQ, dK/dV), the last launched after them (Bundle.finish).
    expected = names if not options.reduce_dq else [abi.backward_kernel_name(names[0].rpartition("_bwd_")[0], part)
                                                    for part in ("delta", "dkdvdq", "convert")]
    if made != expected:
        raise CompileError(f"attn-lower-to-gluon made kernels {made}, the general variant has {names}")
    facts = [f for _, f in generic] + [{"name": name} for name in made[len(generic):]]
    return [(kernel_variant(module, kernel, True), f) for kernel, f in zip(kernels, facts)]


def _variants(l0_text: str, l1_text: str, options, general, report) -> tuple[list, list]:
    """The bundle's aligned and general variants of each kernel: the general from L1; the aligned
    from L1 too, or from L0 through attn-lower-to-gluon where `warp_specialize` is on."""
    report.stage("L1 -> Triton IR (aligned and general variants)")
    generic = _lower_l1(l1_text, general)
    if not options.warp_specialize:
        return _lower_l1(l1_text, options), generic
    report.stage("L0 -> Triton GPU IR (attn-lower-to-gluon, the aligned variant)")
    return _lower_gluon(l0_text, options, generic), generic


def kernel_ops(module) -> list:
    """The tt.func kernels of a lowered module, in launch order."""
    kernels = [op.operation for op in module.body.operations if op.operation.name == "tt.func"]
    if not kernels:
        raise CompileError("the module holds no tt.func kernel; run attn-lower-to-triton first")
    return kernels


def _tables(kernel) -> list[dict]:
    import numpy as np

    tables = []
    for attr in kernel.attributes[abi.TABLES]:
        data = np.array(attr).astype(np.int64)
        if attr.is_splat:
            data = np.full(tuple(attr.type.shape), int(attr.get_splat_value().value), np.int64)
        tables.append({"shape": list(data.shape), "data": data.reshape(-1).tolist()})
    return tables


def build_bundle(l0_text: str, target: str, config: dict | None = None,
                 input_precision: str = "ieee") -> runtime.Bundle:
    """Compile an L0 module into a bundle (needs the MLIR bindings, no GPU); `config` overrides
    the preset's options (`preset_options`)."""
    with progress.Compile(f"for {target}", "L0 -> L1 -> Triton IR") as report:
        module = _parse_l0(l0_text)
        options = preset_options(module, target, config, input_precision)
        general = dataclasses.replace(options, assume_aligned=False)
        report.stage("L0 -> L1: fuse, tile")
        l1_text, inputs, outputs, workspace, call_time_tables = lower(module, general)
        aligned, generic = _variants(l0_text, l1_text, options, general, report)
    kernels = [(a, g, facts) for (a, _), (g, facts) in zip(aligned, generic)]
    # The L0 module itself: what the bundle compiled (ae-opt reproduces any kernel from it).
    meta = {"input_precision": input_precision, "config": options.launch_config(), "l0": l0_text}
    if call_time_tables:
        meta[runtime.MASK_PROGRAM] = abi.mask_program(abi.functions(module)[-1])
        grid = abi.call_time_grid(abi.functions(module)[-1])
        if grid is not None:
            meta[runtime.CALL_TIME_GRID] = grid
    stages = [runtime.Stage(facts["name"], facts["grid"], {"aligned": aligned, "generic": generic},
                            *options.kernel_launch(facts["name"], facts["chunk_stage"]), facts["tables"])
              for aligned, generic, facts in kernels[:-1]]
    aligned, generic, facts = kernels[-1]
    return runtime.Bundle(
        name=facts["name"], grid=facts["grid"], inputs=inputs, outputs=outputs,
        variants={"aligned": aligned, "generic": generic}, tables=facts["tables"],
        num_warps=options.num_warps, num_stages=options.num_stages, block_m=options.block_m,
        block_n=options.block_n, target=target, meta=meta, stages=stages, workspace=workspace)


def build_backward_bundle(l0_text: str, target: str, config: dict | None = None,
                          input_precision: str = "ieee") -> runtime.Bundle:
    """The backward kernels of an L0 module (attn-tile-backward: softmax or an element-wise
    normalizer) as one bundle: the dQ kernel (for softmax it also writes delta, the bundle's
    workspace, and the closure tensors' gradients dc<i>, outputs) as its stage, the dK/dV kernel as its own, each with its own launch options;
    `runtime.launch_roles` runs it."""
    from .. import presets

    with progress.Compile(f"the backward for {target}", "L0 -> L1 -> Triton IR") as report:
        module = _parse_l0(l0_text)
        options = preset_options(module, target, dict(config or {}, backward=True), input_precision)
        report.stage("L0 -> L1: differentiate, tile the backward")
        general = dataclasses.replace(options, assume_aligned=False)
        _run(presets.pipeline_text("triton", general, "l1"), module, "the Triton backward pipeline failed")
        first = abi.kernels(module)[0]
        n_results = len(abi.result_types(first))
        roles = abi.arg_roles(first)
        inputs = _specs(abi.input_types(first)[:-n_results], roles[:-n_results])
        # The dK/dV kernel's call-time tables and mirrored closure tensors are inputs too (the
        # runtime makes them).
        for kernel in abi.kernels(module)[1:]:
            for role, ty in zip(abi.arg_roles(kernel), abi.input_types(kernel)):
                made = abi.backward_table_part(role) or abi.mirrored_capture(role)
                if made and role not in [spec.role for spec in inputs]:
                    inputs += _specs([ty], [role])
        program = abi.mask_program(first)
        written = []
        for kernel in abi.kernels(module):
            written += _specs(abi.result_types(kernel), abi.arg_roles(kernel)[-len(abi.result_types(kernel)):])
        returned = [spec.role in abi.BACKWARD_OUTPUTS or abi.is_closure_grad(spec.role) for spec in written]
        outputs = [spec for spec, out in zip(written, returned) if out]
        workspace = [spec for spec, out in zip(written, returned) if not out]
        l1_text = module.operation.get_asm(enable_debug_info=True)
        variants = _variants(l0_text, l1_text, options, general, report)
    kernels = [(aligned, generic, facts) for (aligned, facts), (generic, _) in zip(*variants)]
    # Aligned kernels past the general variant's (the five-product form's conversion) run last,
    # with the aligned variants alone (Triton GPU IR: they launch with the warps their IR states,
    # whatever the Stage records); their float32 dQ sums are the bundle's workspace too.
    finish = [runtime.Stage(facts["name"], list(aligned.grid), {"aligned": aligned}, 4, 1, only="aligned")
              for aligned, facts in variants[0][len(variants[1]):]]
    if finish:
        q_spec = next(spec for spec in inputs if spec.role == "q")
        workspace.append(runtime.TensorSpec(abi.DQ_SUMS, list(q_spec.shape), "float32"))
    stages = [runtime.Stage(facts["name"], facts["grid"], {"aligned": aligned, "generic": generic},
                            *options.kernel_launch(facts["name"], facts["chunk_stage"]), facts["tables"])
              for aligned, generic, facts in kernels[:-1]]
    aligned, generic, facts = kernels[-1]
    warps, n_stages = options.kernel_launch(facts["name"], facts["chunk_stage"])
    meta = {"input_precision": input_precision, "config": options.launch_config(), "backward": True, "l0": l0_text}
    if program is not None:
        meta[runtime.MASK_PROGRAM] = program
        grid = abi.call_time_grid(first)
        if grid is not None:
            meta[runtime.CALL_TIME_GRID] = grid
    return runtime.Bundle(
        name=facts["name"], grid=facts["grid"], inputs=inputs, outputs=outputs,
        variants={"aligned": aligned, "generic": generic}, tables=facts["tables"],
        num_warps=warps, num_stages=n_stages, block_m=options.block_m,
        block_n=options.block_n, target=target, meta=meta, stages=stages, workspace=workspace, finish=finish)


def compile_bundle(attn, q, k, v, *, target: str = "cuda:90", config: dict | None = None,
                   input_precision: str = "ieee", kv_len=None, block_table=None, **sequences) -> runtime.Bundle:
    """Build the bundle of `attn` (an `ae.attention`) for these q/k/v ahead of time.

    q, k, v (and `kv_len`, `block_table`, packed batches' cu_seqlens_q/k as for a call) may be
    tensors on any device (including "meta") or (shape, dtype) pairs; closure tensors the mods
    capture are read from `attn` itself. No GPU is needed. A mask that reads closure tensors gets
    the preset's tiles here, where a call may take others from its tables (`call_time_tiles`).
    """
    q, k, v = (_as_tensor(x) for x in (q, k, v))
    kv_len, block_table = (None if x is None else _as_tensor(x) for x in (kv_len, block_table))
    for name in ("cu_seqlens_q", "cu_seqlens_k"):
        if sequences.get(name) is not None:
            sequences[name] = _as_tensor(sequences[name])
    text = attn.mlir(q, k, v, kv_len=kv_len, block_table=block_table, **sequences)
    bundle = build_bundle(text, target, config, input_precision)
    bundle.key = _key(text, target, config, input_precision)
    return bundle


def _as_tensor(x):
    import torch

    if isinstance(x, torch.Tensor):
        return x
    shape, dtype = x
    return torch.empty(tuple(shape), dtype=dtype, device="meta")


def _key(l0_text: str, target: str, config: dict | None, input_precision: str) -> str:
    # The preset's defaults are a function of the IR, the target and the compiler's sources (which
    # the key hashes), so only the overrides go in: a cache hit needs no MLIR to derive them.
    return runtime.cache_key(strip_locations(l0_text), target,
                             {"config": dict(config or {}), "input_precision": input_precision})


def _need_mlir() -> None:
    try:
        import mlir  # noqa: F401
    except ImportError:
        raise CompileError("no cached kernel for this attention and the MLIR bindings are not installed "
                           "to compile one; build bundles with ae_mlir.backends.triton.compile_bundle "
                           "on a machine that has them") from None


# The cache keys of the modules this process ran: the key hashes the module without its
# locations, which took longer than a short kernel runs (a training step of linear attention
# launches four modules; a decoding step one).
_KEYS: dict = {}


def _remembered_key(l0_text: str, target: str, config: dict | None, input_precision: str) -> str:
    memo = (l0_text, target, None if not config else tuple(sorted(config.items())), input_precision)
    return kept(_KEYS, memo, lambda: _key(l0_text, target, config, input_precision), 4096)


def get_bundle(l0_text: str, target: str, input_precision: str = "ieee", config: dict | None = None) -> runtime.Bundle:
    """The bundle of an L0 module for `target` (with `config`'s overrides of the preset's options):
    from the cache, or compiled and cached."""
    key = _remembered_key(l0_text, target, config or None, input_precision)
    bundle = runtime.CACHE.get(key)
    if bundle is None:
        _need_mlir()
        bundle = build_bundle(l0_text, target, config or None, input_precision)
        runtime.CACHE.put(key, bundle)
    return bundle


def get_backward_bundle(l0_text: str, target: str, input_precision: str = "ieee",
                        closure_grads: bool = True, tiles: dict | None = None) -> runtime.Bundle:
    """The backward bundle of an L0 module for `target` (with the closure tensors' gradients, or
    without; `tiles` overrides the preset's backward config): from the cache, or compiled and
    cached."""
    config = dict(tiles or {}, **({} if closure_grads else {"closure_grads": False})) or None
    key = _remembered_key(l0_text, target, dict(config or {}, backward=True), input_precision)
    bundle = runtime.CACHE.get(key)
    if bundle is None:
        _need_mlir()
        bundle = build_backward_bundle(l0_text, target, config, input_precision)
        bundle.key = key
        runtime.CACHE.put(key, bundle)
    return bundle


def backward_call_config(module_text: str, target: str, tensors: dict) -> dict | None:
    """A call's overrides of the backward preset: the tiles its call-time tables ask for, and,
    where torch.use_deterministic_algorithms is on, the form whose dQ is the same bits every run
    (reduce_dq off: launch_defaults.reduced_dq)."""
    import torch

    tiles = backward_call_time_tiles(module_text, target, tensors)
    if torch.are_deterministic_algorithms_enabled():
        return dict(tiles or {}, reduce_dq=False)
    return tiles


def alert_atomic_closure_grads() -> None:
    """torch.use_deterministic_algorithms's contract for the closure tensors' gradients, which GPU
    kernels sum by atomic adds (attn.scatter_add) in an order that varies between runs: a
    RuntimeError where it is on, a warning with warn_only. No deterministic form exists for them
    (a tile's scores add into the same elements, a relative-position table's along diagonals)."""
    import warnings

    import torch

    if not torch.are_deterministic_algorithms_enabled():
        return
    message = ("ae-mlir's GPU backward sums the gradients of the closure tensors its mods read (a learnable "
               "bias table, ALiBi slopes) with atomic adds, which have no deterministic form, but "
               "torch.use_deterministic_algorithms(True) is on. Pass warn_only=True to it to allow them, or "
               "detach those tensors (their gradients are then not computed); q, k and v's gradients are "
               "deterministic.")
    if torch.is_deterministic_algorithms_warn_only_enabled():
        warnings.warn(message, stacklevel=3)
        return
    raise RuntimeError(message)


def run_backward(module_text: str, tensors: dict, closure_grads: bool = True, autotune: bool = False) -> dict:
    """dq, dk and dv (by role) of an L0 module from its backward kernels, on CUDA/ROCm tensors
    given by role (q, k, v, c<i>, do, and for softmax out, lse, dlse), and with `closure_grads`
    the closure tensors' gradients dc<i>; with `autotune`, the bundle of the fastest candidate
    configuration (`triton_tuning.tuned_backward_bundle`)."""
    if closure_grads:
        alert_atomic_closure_grads()
    target = runtime.current_target(tensors["q"].device)
    tiles = backward_call_config(module_text, target, tensors)
    if autotune:
        from .triton_tuning import tuned_backward_bundle

        bundle = tuned_backward_bundle(module_text, target, tensors, closure_grads, tiles)
    else:
        bundle = get_backward_bundle(module_text, target, closure_grads=closure_grads, tiles=tiles)
    return runtime.launch_roles(bundle, tensors)


def run(module_text: str, inputs: list, out_dtype, autotune: bool = False) -> list:
    """Compile (or fetch) and launch an L0 module on CUDA/ROCm tensors [q, k, v, *captures]; with
    `autotune`, the bundle of the fastest candidate configuration (`triton_tuning.tuned_bundle`)."""
    target = runtime.current_target(inputs[0].device)
    if autotune:
        from .triton_tuning import tuned_bundle

        bundle = tuned_bundle(module_text, target, inputs)
    else:
        bundle = _default_bundle(module_text, target, inputs)
    return runtime.launch(bundle, *inputs)


def _default_bundle(l0_text: str, target: str, inputs: list) -> runtime.Bundle:
    """The preset's bundle for this call, at the tiles `call_time_tiles` chose for its mask."""
    return get_bundle(l0_text, target, config=call_time_tiles(l0_text, target, inputs) or None)


# --- ae-opt --emit=ttir|ptx|amdgcn --------------------------------------------------------------


# Triton's own defaults, for a module that no preset lowered (its launch options are unknown).
_TRITON_WARPS = 4
_TRITON_STAGES = {"cuda": 3, "hip": 2}


def emit(kind: str, module, target: str | None, launch=None) -> str:
    """The lowered module's kernels as Triton IR, each a module of its own as the bundle holds
    them (between `// -----` lines, in launch order), or compiled to PTX (cuda) / AMDGCN (hip)
    for `target` with `launch(kernel name, chunk stage)` = (num_warps, num_stages): the preset's, as the
    runtime launches them, else Triton's defaults."""
    kernels = kernel_ops(module)
    variants = [kernel_variant(module, kernel, True) for kernel in kernels]
    if kind == "ttir":
        return "// -----\n".join(variant.ttir for variant in variants)
    default = {"ptx": "cuda:90", "amdgcn": "hip:gfx942"}[kind]
    target = target or default
    family = default.split(":")[0]
    if target.split(":")[0] != family:
        raise CompileError(f"--emit={kind} needs a {family} target, got --target={target}")
    assembly = []
    for kernel, variant in zip(kernels, variants):
        name = kernel.attributes["sym_name"].value
        warps, stages = launch(name, abi.chunk_stage(kernel)) if launch else (_TRITON_WARPS, _TRITON_STAGES[family])
        try:
            compiled = runtime.compile_variant(variant, target, warps, stages)
        except Exception as err:
            raise CompileError(f"triton.compile for {target} failed: {str(err).strip().splitlines()[-1]}") from None
        assembly.append(compiled.asm[kind])
    return "\n".join(assembly)
