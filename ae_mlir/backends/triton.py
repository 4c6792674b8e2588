"""The Triton backend, compile side: an L0 module becomes a runtime `Bundle`.

    L0 --attn-verify, attn-fuse-online-softmax, attn-chunk-recurrence, attn-tile{block-m,block-n},
         canonicalize, cse--> L1 --attn-lower-to-triton{assume-aligned=true|false}--> Triton IR

Both Triton IR variants go into the bundle with the launch grid, argument labels, block tables and
the compile options (`default_config`). `run` is what `ae.attention(...)(q, k, v)` calls on GPU
tensors: the bundle comes from the cache (memory, then disk) when it can, so MLIR is imported only
to build a missing one. `compile_bundle` builds a bundle ahead of time from shapes or "meta"
tensors, on a machine without a GPU.
"""
from __future__ import annotations

from .. import runtime
from ..core.context import CompileError

_ELT_DTYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16", "f64": "float64", "i64": "int64",
               "i32": "int32", "i16": "int16", "i8": "int8", "i1": "bool"}

# (block_m, block_n, num_warps, num_stages) by head dim (padded to a power of two); 16-bit inputs
# run tt.dot on wgmma. Measured on an H200 (bf16, B*L = 16k, H = 16, 2026-11-30): at D = 128,
# 128x64 with 8 warps and 3 stages beat 128x128 (out of shared memory), 2 stages and 64x64; at
# D = 64, 128x128 with 4 warps (FlexAttention's choice) spills with a score_mod (63 TFLOP/s on
# softcap) where 128x64 runs 168 and causal 349 instead of 237.
_CUDA_16BIT = {64: (128, 64, 4, 3), 128: (128, 64, 8, 3), 256: (64, 32, 4, 3)}
_CUDA_FP32 = {64: (128, 32, 4, 3), 128: (32, 64, 4, 3), 256: (32, 32, 4, 3)}
# MI300 (gfx942): mfma 32x32 tiles; one LDS buffer per operand leaves room for 128x64 at D=128.
_HIP_16BIT = {64: (128, 64, 4, 2), 128: (128, 64, 4, 2), 256: (64, 32, 4, 2)}
_HIP_FP32 = {64: (64, 32, 4, 2), 128: (64, 32, 4, 2), 256: (32, 32, 4, 2)}


def _pow2(n: int) -> int:
    return max(16, 1 << (max(n, 1) - 1).bit_length())


def default_config(lq: int, lk: int, dk: int, dv: int, dtype: str, target: str) -> dict:
    """Block sizes and launch options for one problem shape on `target` ("cuda:90", "hip:gfx942")."""
    d = max(_pow2(dk), _pow2(dv), 64)
    wide = dtype in ("bfloat16", "float16", "bf16", "f16")
    if target.startswith("hip"):
        table = _HIP_16BIT if wide else _HIP_FP32
    else:
        table = _CUDA_16BIT if wide else _CUDA_FP32
    block_m, block_n, warps, stages = table.get(d, (32, 32, 4, 2))
    block_m = min(block_m, _pow2(lq))
    block_n = min(block_n, _pow2(lk))
    if block_m * block_n <= 64 * 64:
        warps = 4
    return {"block_m": block_m, "block_n": block_n, "num_warps": warps, "num_stages": stages}


# Linear attention (the split chunked recurrence, passes/chunk_recurrence.py): V and state-row
# blocks of 64 columns, as flash-linear-attention's chunk kernels use, 4 warps. Measured on an
# H200 (bench/results/h200-linear-configs-2026-11-30.json): 8 warps make the output kernels
# 30-50% slower; 2 and 3 pipeline stages are within a few percent of each other (an earlier
# sweep of the chunk-state loop found 1 stage 5-30% slower).
_LINEAR = {"block_v": 64, "block_k": 64, "num_warps": 4, "num_stages": 3}


def linear_config(chunk: int, decay: str, target: str = "cuda:90") -> dict:
    """Launch options of a linear-attention bundle. block_m/block_n are the chunk's rows (what
    the runtime's 32-bit tile-offset check reads). Narrower chunk-state V blocks (more programs)
    were slower on an H200 at every measured shape, 16 columns 2-3x (its loop is bound by each
    step's latency, not by the programs in flight). With the "token_dim" decay the output kernel
    takes all of V (up to 128 columns) in one program: its scores, most of its work, do not
    depend on V."""
    config = dict(_LINEAR, block_m=chunk, block_n=chunk)
    if target.startswith("hip"):
        # MI300's 64 KiB of LDS: three stages of the GLA chunk-state loop need 80 KiB.
        config["num_stages"] = 2
    if decay == "token_dim":
        config["block_v"] = 128
    return config


def config_for(l0_text: str, target: str) -> dict:
    """The default compile options of an L0 module on `target`."""
    import re

    linear = re.search(r'"attn\.linear_recurrence".*?decay = "(\w+)".*?chunk_size = (\d+)', l0_text, re.S)
    if linear:
        return linear_config(int(linear.group(2)), linear.group(1), target)
    return default_config(*_shapes(l0_text), target=target)


def _pipeline(config: dict) -> str:
    from ..passes import PIPELINES

    steps = []
    for name in PIPELINES["triton"]:
        if name == "attn-tile":
            steps.append(f"attn-tile{{block-m={config['block_m']} block-n={config['block_n']} "
                         "call-time-tables=true}")
        elif name.startswith("attn-chunk-recurrence") and "block_v" in config:
            steps.append(f"attn-chunk-recurrence{{split=true block-v={config['block_v']} "
                         f"block-k={config['block_k']}}}")
        elif name == "attn-lower-to-triton":
            steps += ["canonicalize", "cse"]
        else:
            steps.append(name)
    return "builtin.module(" + ",".join(steps) + ")"


def _specs(types: list, roles: list[str]) -> list[runtime.TensorSpec]:
    specs = []
    for role, ty in zip(roles, types):
        elt = str(ty.element_type)
        specs.append(runtime.TensorSpec(role, [int(n) for n in ty.shape], _ELT_DTYPES.get(elt, elt)))
    return specs


def lower(l0_text: str, config: dict):
    """L0 text -> (L1 module text, input, output and workspace specs)."""
    from mlir import ir

    from ..core.context import new_context, parse_module
    from ..passes import build_pass_manager
    from ..core.verifier import check_module

    ctx = new_context()
    module = parse_module(l0_text, ctx, "<l0>")
    check_module(module)
    funcs = [op.operation for op in module.body.operations if op.operation.name == "func.func"]
    if len(funcs) != 1:
        raise CompileError(f"the Triton backend compiles a module with one function, found {len(funcs)}")
    fty = funcs[0].attributes["function_type"].value
    n_cap = len(fty.inputs) - 3
    inputs = _specs(list(fty.inputs), ["q", "k", "v"] + [f"c{i}" for i in range(n_cap)])
    linear = any(op.operation.name == "attn.linear_recurrence" for op in funcs[0].regions[0].blocks[0].operations)
    outputs = _specs(list(fty.results), ["out", "state"] if linear else ["out", "lse"])
    pm = build_pass_manager(_pipeline(config), ctx)
    try:
        pm.run(module.operation)
    except ir.MLIRError as err:
        from ..core.context import diagnostic_from_mlir

        raise CompileError("the Triton pipeline failed",
                           [diagnostic_from_mlir(d) for d in err.error_diagnostics]) from None
    kernels = [op.operation for op in module.body.operations if op.operation.name == "func.func"]
    kernel = kernels[-1]
    if "attn.call_time_tables" in kernel.attributes:
        # The tile tables of a mask that reads closure tensors follow the inputs; the caller
        # computes them with ae_mlir.block_mask when it launches the kernel.
        types = list(kernel.attributes["function_type"].value.inputs)[len(inputs):len(inputs) + 4]
        inputs += _specs(types, [f"c{n_cap + i}" for i in range(4)])
    workspace = {}
    for func in kernels:
        if "attn.arg_roles" not in func.attributes:
            continue
        roles = [ir.StringAttr(r).value for r in func.attributes["attn.arg_roles"]]
        for role, ty in zip(roles, func.attributes["function_type"].value.inputs):
            if role.startswith("w"):
                workspace.setdefault(role, ty)
    return str(module), inputs, outputs, _specs(list(workspace.values()), list(workspace))


def _lower_l1(l1_text: str, aligned: bool, precision: str) -> list[tuple[runtime.KernelVariant, dict]]:
    """One Triton IR variant of each kernel of an L1 module, in launch order, with the launch
    facts its tt.func records."""
    from mlir import ir

    from ..core.context import new_context, parse_module
    from ..passes import build_pass_manager
    from ..passes.lower_to_triton import triton_text

    ctx = new_context()
    module = parse_module(l1_text, ctx, "<l1>")
    pipeline = (f"builtin.module(attn-lower-to-triton{{assume-aligned={str(aligned).lower()} "
                f"input-precision={precision}}})")
    try:
        build_pass_manager(pipeline, ctx).run(module.operation)
    except ir.MLIRError as err:
        from ..core.context import diagnostic_from_mlir

        raise CompileError("attn-lower-to-triton failed",
                           [diagnostic_from_mlir(d) for d in err.error_diagnostics]) from None
    lowered = []
    for kernel in kernel_ops(module):
        args = [ir.StringAttr(a).value for a in kernel.attributes["attn.kernel_args"]]
        facts = {"name": ir.StringAttr(kernel.attributes["sym_name"]).value,
                 "grid": [int(x) for x in kernel.attributes["attn.grid"]], "tables": _tables(kernel)}
        lowered.append((runtime.KernelVariant(triton_text(module, kernel), args, aligned), facts))
    return lowered


def kernel_ops(module) -> list:
    """The tt.func kernels of a lowered module, in launch order."""
    kernels = [op.operation for op in module.body.operations if op.operation.name == "tt.func"]
    if not kernels:
        raise CompileError("the module holds no tt.func kernel; run attn-lower-to-triton first")
    return kernels


def _tables(kernel) -> list[dict]:
    import numpy as np

    tables = []
    for attr in kernel.attributes["attn.tables"]:
        data = np.array(attr).astype(np.int64)
        if attr.is_splat:
            data = np.full(tuple(attr.type.shape), int(attr.get_splat_value().value), np.int64)
        tables.append({"shape": list(data.shape), "data": data.reshape(-1).tolist()})
    return tables


def build_bundle(l0_text: str, target: str, config: dict | None = None,
                 input_precision: str = "ieee") -> runtime.Bundle:
    """Compile an L0 module into a bundle (needs the MLIR bindings, no GPU)."""
    config = dict(config or config_for(l0_text, target))
    l1_text, inputs, outputs, workspace = lower(l0_text, config)
    kernels = [(aligned, generic, facts) for (aligned, facts), (generic, _) in
               zip(_lower_l1(l1_text, True, input_precision), _lower_l1(l1_text, False, input_precision))]
    meta = {"input_precision": input_precision, "config": config}
    if "attn.call_time_tables" in l1_text:
        meta["call_time_tables"] = True
    stages = []
    for aligned, generic, facts in kernels[:-1]:
        if facts["tables"]:
            raise CompileError(f"kernel '{facts['name']}' reads block tables; only a module's last kernel may")
        stages.append(runtime.Stage(facts["name"], facts["grid"], {"aligned": aligned, "generic": generic},
                                    config["num_warps"], config["num_stages"]))
    aligned, generic, facts = kernels[-1]
    return runtime.Bundle(
        name=facts["name"], grid=facts["grid"], inputs=inputs, outputs=outputs,
        variants={"aligned": aligned, "generic": generic}, tables=facts["tables"],
        num_warps=config["num_warps"], num_stages=config["num_stages"], block_m=config["block_m"],
        block_n=config["block_n"], target=target, meta=meta, stages=stages, workspace=workspace)


def _shapes(l0_text: str) -> tuple:
    """(Lq, Lk, Dk, Dv, dtype) read from the L0 function signature without MLIR."""
    import re

    header = re.search(r"func\.func @\w+\((.*?)\)\s*->", l0_text, re.S)
    types = re.findall(r"tensor<([0-9x]+)x(\w+)>", header.group(1) if header else "")
    if len(types) < 3:
        raise CompileError("the Triton backend needs an attention module (q, k, v tensors) at L0")
    dims = [[int(n) for n in t[0].split("x")] for t in types[:3]]
    return dims[0][2], dims[1][2], dims[0][3], dims[2][3], types[0][1]


def compile_bundle(attn, q, k, v, *, target: str = "cuda:90", config: dict | None = None,
                   input_precision: str = "ieee") -> runtime.Bundle:
    """Build the bundle of `attn` (an `ae.attention`) for these q/k/v ahead of time.

    q, k and v may be tensors on any device (including "meta") or (shape, dtype) pairs; closure
    tensors the mods capture are read from `attn` itself. No GPU is needed.
    """
    q, k, v = (_as_tensor(x) for x in (q, k, v))
    text = attn.mlir(q, k, v)
    config = dict(config or config_for(text, target))
    bundle = build_bundle(text, target, config, input_precision)
    bundle.key = runtime.cache_key(text, target, _options(config, input_precision))
    bundle.meta["l0"] = text
    return bundle


def _as_tensor(x):
    import torch

    if isinstance(x, torch.Tensor):
        return x
    shape, dtype = x
    return torch.empty(tuple(shape), dtype=dtype, device="meta")


def _options(config: dict, input_precision: str) -> dict:
    return dict(config, input_precision=input_precision)


def get_bundle(l0_text: str, target: str, input_precision: str = "ieee") -> runtime.Bundle:
    """The bundle of an L0 module for `target`: from the cache, or compiled and cached."""
    config = config_for(l0_text, target)
    key = runtime.cache_key(l0_text, target, _options(config, input_precision))
    bundle = runtime.CACHE.get(key)
    if bundle is None:
        try:
            import mlir  # noqa: F401
        except ImportError:
            raise CompileError("no cached kernel for this attention and the MLIR bindings are not installed "
                               "to compile one; build bundles with ae_mlir.backends.triton.compile_bundle "
                               "on a machine that has them") from None
        bundle = build_bundle(l0_text, target, config, input_precision)
        runtime.CACHE.put(key, bundle)
    return bundle


def run(module_text: str, inputs: list, out_dtype, mask_mod=None) -> list:
    """Compile (or fetch) and launch an L0 module on CUDA/ROCm tensors [q, k, v, *captures];
    `mask_mod` classifies the tiles at call time when the kernel asks for tables."""
    bundle = get_bundle(module_text, runtime.current_target())
    return runtime.launch(bundle, *inputs, *call_time_tables(bundle, mask_mod, inputs[0], inputs[1]))


def call_time_tables(bundle: runtime.Bundle, mask_mod, q, k) -> list:
    """The four tile tables a bundle compiled for a closure-reading mask takes after its inputs."""
    if not bundle.meta.get("call_time_tables"):
        return []
    if mask_mod is None:
        raise CompileError(f"kernel '{bundle.name}' classifies its mask at call time; pass the mask_mod")
    from ..block_mask import classify_cached

    return classify_cached(mask_mod, q.shape[2], k.shape[2], bundle.block_m, bundle.block_n, q.device)


# --- ae-opt --emit=ttir|ptx|amdgcn --------------------------------------------------------------


def emit(kind: str, module, target: str | None) -> str:
    """The lowered module as Triton IR, or compiled to PTX (cuda) / AMDGCN (hip) for `target`
    (each kernel of a multi-kernel module compiled on its own, in launch order)."""
    from mlir import ir

    from ..passes.lower_to_triton import triton_text

    text = triton_text(module)
    if kind == "ttir":
        return text
    default = {"ptx": "cuda:90", "amdgcn": "hip:gfx942"}[kind]
    target = target or default
    if target.split(":")[0] != default.split(":")[0]:
        raise CompileError(f"--emit={kind} needs a {default.split(':')[0]} target, got --target={target}")
    assembly = []
    for kernel in kernel_ops(module):
        block_m = ir.IntegerAttr(kernel.attributes["attn.block_m"]).value if "attn.block_m" in kernel.attributes else 64
        block_n = ir.IntegerAttr(kernel.attributes["attn.block_n"]).value if "attn.block_n" in kernel.attributes else 64
        warps = 8 if block_m * block_n >= 128 * 64 and kind == "ptx" else 4
        stages = 3 if kind == "ptx" else 2
        try:
            compiled = runtime.compile_ttir(triton_text(module, kernel), target, warps, stages)
        except Exception as err:
            raise CompileError(f"triton.compile for {target} failed: {str(err).strip().splitlines()[-1]}") from None
        assembly.append(compiled.asm[kind])
    return "\n".join(assembly)
