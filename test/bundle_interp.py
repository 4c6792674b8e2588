"""Run a Triton bundle in the NumPy TTIR interpreter exactly as `ae_mlir.runtime.launch` would
run it on a GPU (same argument binding, same kernel variant choice); a Triton GPU IR variant
(attn-lower-to-gluon's) runs in the Gluon emulator."""
from __future__ import annotations

import numpy as np
import torch

from ae_mlir import presets, runtime
from ae_mlir.core import abi
from tt_interp import run_ttir


def _storage(t: torch.Tensor) -> np.ndarray:
    """The tensor's storage from its first element on, flat, as the interpreter's pointer argument
    (bf16 travels as float32, bool as int8)."""
    n = t.untyped_storage().nbytes() // t.element_size() - t.storage_offset()
    flat = torch.empty(0, dtype=t.dtype).set_(t.untyped_storage(), t.storage_offset(), (n,), (1,))
    if t.dtype == torch.bfloat16:
        return flat.float().numpy()
    array = flat.numpy()
    return array.view(np.int8) if array.dtype == np.uint8 else array


def interpret(bundle: runtime.Bundle, q, k, v, *captures, variant: str | None = None):
    """Run a bundle's kernels (its stages, then its own) in the TTIR interpreter the way
    `runtime.launch` runs them on a GPU."""
    tensors = runtime.bind(bundle, q, k, v, *captures)
    # Outputs and workspaces start as NaN: a position no kernel writes shows.
    for role in ["out", "lse", "state"] + [w.role for w in bundle.workspace]:
        if role in tensors:
            tensors[role].fill_(float("nan"))
    launches = _launches(bundle, tensors, variant)
    arrays = _run_kernels(launches, tensors, bundle)
    chosen = launches[-1][1]
    results = []
    for spec in bundle.outputs:
        t = tensors[spec.role]
        results.append(torch.from_numpy(np.array(arrays[spec.role][: t.numel()]).reshape(t.shape)).float())
    return results, chosen


def interpret_roles(bundle: runtime.Bundle, given: dict, variant: str | None = None) -> dict:
    """Run a bundle whose kernels name their arguments' roles (the backward's) in the TTIR
    interpreter the way `runtime.launch_roles` runs it; returns its outputs by role (float32)."""
    tensors = dict(given)
    tensors.update(runtime.backward_inputs_made(bundle, given, "cpu"))

    def sized(spec):
        return abi.sized_shape(spec.role, spec.shape, given["q"].shape[2], given["k"].shape[2], spec.rows)

    for spec in bundle.outputs:
        # NaN where the kernels must write every element; the closure gradients start at zero,
        # as the runtime allocates them, since the kernels add into them.
        fill = 0.0 if abi.is_closure_grad(spec.role) else float("nan")
        tensors[spec.role] = torch.full(sized(spec), fill, dtype=runtime.torch_dtype(spec.dtype))
    workspace = tuple((spec.role, sized(spec), runtime.torch_dtype(spec.dtype)) for spec in bundle.workspace)

    def nan(shape, dtype):
        return torch.full(shape, float("nan"), dtype=dtype)

    if variant is None:
        # The workspace as the runtime allocates it: only what the launched kernels read.
        plan = runtime.plan_with_workspace(bundle, tensors, "interpreter", _tables_of, workspace, nan)
        launches = [(launch.kernel, launch.variant, launch.arguments(tensors)) for launch in plan]
    else:
        tensors.update((role, nan(shape, dtype)) for role, shape, dtype in workspace)
        launches = _launches(bundle, tensors, variant)
    arrays = _run_kernels(launches, tensors, bundle)
    results = {}
    for spec in bundle.outputs:
        t = tensors[spec.role]
        results[spec.role] = torch.from_numpy(np.array(arrays[spec.role][: t.numel()]).reshape(t.shape)).float()
    return results


def _tables_of(kernel) -> list:
    return [np.array(t["data"], np.int32).reshape(t["shape"]) for t in kernel.tables]


def _launches(bundle: runtime.Bundle, tensors: dict, variant: str | None) -> list[tuple]:
    """(kernel, variant, arguments) of each kernel in launch order: from the launch plan the
    runtime keeps per layout, or with `variant` ("aligned" or "generic") forced."""
    if variant is None:
        return [(launch.kernel, launch.variant, launch.arguments(tensors))
                for launch in runtime.launch_plan(bundle, tensors, "interpreter", _tables_of)]
    launches = []
    for kernel in runtime.kernels(bundle, variant == "aligned"):
        picked = runtime.pick_variant(kernel, variant == "aligned")
        launches.append((kernel, picked, runtime.argument_values(picked, tensors, _tables_of(kernel))))
    return launches


def _run_kernels(launches: list[tuple], tensors: dict, bundle: runtime.Bundle) -> dict:
    """Run the kernels in the interpreter on the tensors bound by role; returns each tensor's
    storage array by label (the kernels' results are written there)."""
    arrays = {}
    gluon_launches = 0
    for kernel, picked, values in launches:
        if picked.ir == "ttgir":
            _emulate_gluon(bundle, gluon_launches, picked, values)
            gluon_launches += 1
            arrays.update((label, _storage(value)) for label, value in zip(picked.args, values)
                          if isinstance(value, torch.Tensor))
            continue
        args = []
        for label, value in zip(picked.args, values):
            if isinstance(value, runtime.HostDescriptor):
                role = label.partition(".")[0]
                if role not in arrays:
                    arrays[role] = _storage(value.base)
                value = value._replace(base=arrays[role])
            elif isinstance(value, torch.Tensor):
                if label not in arrays:
                    arrays[label] = _storage(value)
                value = arrays[label]
            args.append(value)
        run_ttir(picked.ttir, kernel.name, args, kernel.grid)
    return arrays


def _emulate_gluon(bundle: runtime.Bundle, index: int, variant, values: list) -> None:
    """attn-lower-to-gluon's kernel `index` in launch order (the forward's, or one of the
    backward's), instantiated again from the bundle's L0 module and config as the pass did, run
    by the Gluon emulator with the arguments Triton's launcher gets; it writes into the tensors
    themselves."""
    from gluon_emu import launch

    from ae_mlir.core.context import new_context, parse_module
    from ae_mlir.kernel_args import launcher_positions
    from ae_mlir.passes import create_pass
    from ae_mlir.passes.gluon import attention_backward, attention_backward_fused, attention_forward
    from ae_mlir.passes.lower_to_gluon import backward_instances, instance

    module = parse_module(bundle.meta["l0"], new_context(), "l0.mlir")
    func = abi.functions(module)[0]
    if bundle.meta.get("backward"):
        # As the preset's stages run it: a score_mod's derivative from attn-differentiate.
        create_pass("attn-differentiate").apply(module.operation)
        func, grad = abi.functions(module)
        # (The emulator's tanh is exact whether the kernel's is approximate or not.)
        reduce_dq = bool(bundle.meta["config"].get("reduce_dq"))
        part, kernel = backward_instances(func, reduce_dq, grad)[index]
        form = attention_backward_fused if reduce_dq else attention_backward
        fn, blocks = form.kernel_function(part, kernel.score_mod), form.descriptor_blocks(part, kernel.dim)
    else:
        options = presets.options_for("triton", presets.read_problem(module), "cuda:90", **bundle.meta["config"])
        kernel = instance(func, options.pingpong, options.gluon_programs, options.wave_programs,
                              options.warpgroups)
        fn, blocks = attention_forward.attention_forward, attention_forward.descriptor_blocks(kernel.dim)
    if list(kernel.grid) != list(variant.grid):
        raise AssertionError(f"the bundle's grid {variant.grid} is not the pass's {list(kernel.grid)}")
    positions = launcher_positions(variant)
    args = values if positions is None else [values[i] for i in positions]
    if "closures" in fn.arg_names:
        # The score mod's closure tensors, the launcher's last arguments, are the kernel's tuple.
        n = len(kernel.score_mod.closures) if kernel.score_mod is not None else 0
        args = args[:len(args) - n] + [tuple(args[len(args) - n:])]
    launch(fn, variant.grid, args, blocks, kernel.constants)
