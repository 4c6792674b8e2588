"""Autotuning on the Triton backend: the search over a module's candidate launch configurations
(`ae_mlir.autotune`) for its forward kernels (`tuned_bundle`) and its backward kernels
(`tuned_backward_bundle`: the dQ kernel's candidates, then the dK/dV kernel's), and the ahead-of-time
compile of the candidates for a GPU machine without the MLIR bindings (`prepare_tuning`,
`prepare_backward_tuning`). The bundles come from `backends.triton` (its cache, or compiled).
"""
from __future__ import annotations

from .. import runtime
from ..core.context import CompileError
from ..core.regions import strip_locations
from .triton import _need_mlir, _parse_l0, _remembered_key, get_backward_bundle, get_bundle


def tuning_key(l0_text: str, target: str, input_precision: str = "ieee") -> str:
    """The key of a module's autotuning record (`ae_mlir.autotune.load`)."""
    return _remembered_key(l0_text, target, {"autotune": True}, input_precision)


def bucket_key(l0_text: str, target: str, input_precision: str = "ieee") -> str:
    """The key of the autotuning record of a module's shape bucket (`ae_mlir.autotune.shape_bucket`)."""
    from .. import autotune

    return _remembered_key(autotune.shape_bucket(strip_locations(l0_text)), target, {"autotune": "bucket"},
                           input_precision)


def _candidates(l0_text: str, target: str) -> list[dict]:
    from .. import autotune, presets

    problem = presets.read_problem(_parse_l0(l0_text))
    if problem is None:
        raise CompileError("autotuning needs an attention module (q, k, v tensors) at L0")
    return autotune.candidates(problem, target)


def prepare_tuning(l0_text: str, target: str, input_precision: str = "ieee") -> dict:
    """Compile every autotuning candidate of an L0 module for `target` and record them, unchosen
    (`ae_mlir.autotune`): what a machine with the MLIR bindings and no GPU does ahead of time.
    A candidate other than the default that fails to compile is left out."""
    from .. import autotune

    _need_mlir()
    name = get_bundle(l0_text, target, input_precision).name
    kept, _ = autotune.compiled(name, _candidates(l0_text, target),
                                lambda config: get_bundle(l0_text, target, input_precision, config))
    record = {"target": target, "candidates": kept}
    autotune.save(tuning_key(l0_text, target, input_precision), record)
    return record


def tuned_bundle(l0_text: str, target: str, inputs: list, input_precision: str = "ieee") -> runtime.Bundle:
    """The bundle of the fastest autotuning candidate of an L0 module on this GPU, searched on
    `inputs` (the call's q, k, v, ...) the first time and remembered on disk afterwards. Without
    the MLIR bindings, the candidates must come from `prepare_tuning`'s record; lacking one, the
    default is launched (and that said once)."""
    import functools

    from .. import autotune

    key = tuning_key(l0_text, target, input_precision)
    record = autotune.load(key)
    if record is not None and record.get("chosen") is not None:
        return get_bundle(l0_text, target, input_precision, record["chosen"])
    bucket = bucket_key(l0_text, target, input_precision)
    if record is None:
        shared = _bucket_bundle(l0_text, target, input_precision, key, bucket)
        if shared is not None:
            return shared
        if not autotune.can_compile(key):
            return get_bundle(l0_text, target, input_precision)
        configs = _candidates(l0_text, target)
    else:
        configs = record["candidates"]
    default = get_bundle(l0_text, target, input_precision)

    def launcher(config):
        return functools.partial(runtime.launch, get_bundle(l0_text, target, input_precision, config), *inputs)

    chosen = autotune.choose(key, default.name, target, configs, launcher, bucket=bucket)
    return get_bundle(l0_text, target, input_precision, chosen)


def _bucket_bundle(l0_text: str, target: str, input_precision: str, key: str, bucket: str) -> runtime.Bundle | None:
    """The bundle of the choice searched for another module of this one's shape bucket, adopted
    as this module's; None if there is none, or it does not compile here (no MLIR bindings and
    not cached, or not for this shape), which leaves the module to its own search."""
    from .. import autotune

    chosen = autotune.bucket_choice(bucket)
    if chosen is None:
        return None
    try:
        bundle = get_bundle(l0_text, target, input_precision, chosen)
    except Exception:  # noqa: BLE001 -- a choice that does not build for this shape is searched anew
        return None
    autotune.adopt(key, bundle.name, bucket)
    return bundle


def _backward_tuning_keys(l0_text: str, target: str, closure_grads: bool, tiles: dict,
                          input_precision: str) -> tuple[str, str]:
    """The keys of the backward's tuning record of a module and of its shape bucket's."""
    from .. import autotune

    options = {"autotune": "backward", "closure_grads": closure_grads, **(tiles or {})}
    return (_remembered_key(l0_text, target, options, input_precision),
            _remembered_key(autotune.shape_bucket(strip_locations(l0_text)), target, dict(options, bucket=True),
                            input_precision))


def _backward_candidates(l0_text: str, target: str, tiles: dict, closure_grads: bool) -> list[list[dict]]:
    from .. import autotune, presets

    problem = presets.read_problem(_parse_l0(l0_text))
    if problem is None:
        raise CompileError("autotuning needs an attention module (q, k, v tensors) at L0")
    default = presets.backward_defaults(problem, target)
    return autotune.backward_candidates(problem, target, dict(default, **(tiles or {})), closure_grads)


def prepare_backward_tuning(l0_text: str, target: str, closure_grads: bool = True, tiles: dict | None = None,
                            input_precision: str = "ieee") -> dict:
    """`prepare_tuning` for the backward kernels: compile every combination of the dQ kernel's
    and the dK/dV kernel's candidates (the search takes them in turn, so the second group meets
    whichever the first chose) and record them, unchosen; `tiles` as the call's
    (`backward_call_time_tiles`)."""
    import itertools

    from .. import autotune

    _need_mlir()
    tiles = dict(tiles or {})
    groups = _backward_candidates(l0_text, target, tiles, closure_grads)
    configs = autotune._unique([{k: v for c in combo for k, v in c.items()} for combo in itertools.product(*groups)])
    name = get_backward_bundle(l0_text, target, input_precision, closure_grads, tiles).name
    kept, _ = autotune.compiled(name, configs, lambda config: get_backward_bundle(
        l0_text, target, input_precision, closure_grads, dict(tiles, **config)))
    record = {"target": target, "candidates": kept, "groups": groups}
    autotune.save(_backward_tuning_keys(l0_text, target, closure_grads, tiles, input_precision)[0], record)
    return record


def tuned_backward_bundle(l0_text: str, target: str, tensors: dict, closure_grads: bool = True,
                          tiles: dict | None = None, input_precision: str = "ieee") -> runtime.Bundle:
    """`tuned_bundle` for the backward kernels: the bundle of the fastest candidates of the dQ
    and dK/dV kernels (searched in turn, `autotune.backward_candidates`) on this GPU, timed on
    the call's tensors (by role) the first time and remembered on disk, the shape bucket's
    choice taken without a search where it builds."""
    import functools

    from .. import autotune

    tiles = dict(tiles or {})
    key, bucket = _backward_tuning_keys(l0_text, target, closure_grads, tiles, input_precision)

    def bundle(config):
        return get_backward_bundle(l0_text, target, input_precision, closure_grads, dict(tiles, **config))

    record = autotune.load(key)
    if record is not None and record.get("chosen") is not None:
        return bundle(record["chosen"])
    if record is None:
        chosen = autotune.bucket_choice(bucket)
        if chosen is not None:
            try:
                found = bundle(chosen)
            except Exception:  # noqa: BLE001 -- a choice that does not build for this shape is searched anew
                found = None
            if found is not None:
                autotune.adopt(key, found.name, bucket)
                return found
        if not autotune.can_compile(key):
            return bundle({})
        groups = _backward_candidates(l0_text, target, tiles, closure_grads)
    else:
        groups = record["groups"]
    default = bundle({})

    def launcher(config):
        return functools.partial(runtime.launch_roles, bundle(config), tensors)

    return bundle(autotune.choose_in_turn(key, default.name, target, groups, launcher, bucket=bucket))
