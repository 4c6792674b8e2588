"""Load and launch ae-mlir's Triton kernels: bundles, the bundle cache, the launcher.

A bundle is what `ae_mlir.backends.triton` compiles from an L0 module: the Triton IR of the kernel
(an aligned variant specialized for the usual layouts and a general one for any strides), the
launch grid, what each kernel argument is, the block tables' contents and the compile options;
for a mask that reads closure tensors, the mask itself as a JSON scalar program, which the launcher
evaluates with torch to classify the tiles per call (`ae_mlir.block_mask`); plus, for a split
chunked recurrence, the kernels launched before it (`stages`) and the scratch
tensors they hand on (`workspace`).
This module needs only torch and triton (both imported on first use) and never the MLIR bindings,
so a machine without them runs kernels built elsewhere:

    bundle = Bundle.load("attn.bundle")          # built on any machine by compile_bundle(...)
    out, lse = launch(bundle, q, k, v)           # CUDA/ROCm tensors, any strides

Bundles are cached in memory and on disk under $AE_MLIR_CACHE_DIR (default ~/.cache/ae-mlir),
keyed by the L0 IR, target, options and a hash of the compiler's sources; files are written
atomically and checksummed, so a crashed writer or a truncated file is detected and rebuilt
rather than loaded.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .core import abi
from .disk_cache import atomic_write, cache_dir, compiler_fingerprint
from .kernel_args import KernelLaunch, aligned_ok, argument_values, kernels, launch_plan, pick_variant  # noqa: F401  (part of the runtime's API)
from .kernel_args import HostDescriptor, mirrored_inputs, mirrored_roles  # noqa: F401  (part of the runtime's API)
from .triton_kernels import compile_ttir, compile_variant, current_target, launch_one, parse_target  # noqa: F401  (part of the runtime's API)

# 2: a mask that reads closure tensors travels as `meta["mask_program"]` and `bind` classifies its
# tiles; launch takes no tile tables. 3: where that mask reads b or h, its tables have a batch and
# a head axis (core.block_tables.table_lead), which a runtime of format 2 would not give. 4: a
# packed batch's tensors take any rows (-1 in their specs, "<role>.size2" kernel arguments, a
# workspace's `rows` rule), which a runtime of format 3 would allocate wrongly. 5: a variant may
# be Triton GPU IR with its own grid and register cap (KernelVariant.ir), which format 4 would
# compile as Triton IR. 6: kernels after the bundle's own (`finish`) and kernels of the aligned
# variants only (Stage.only), which format 5 would not launch or would launch with the others.
FORMAT_VERSION = 6
# Bundle.meta's key for the JSON mask program of a kernel that takes call-time tile tables, and
# for the (batch, query, key) grid it classifies where q's shape does not give it (abi.CALL_TIME_GRID).
MASK_PROGRAM = "mask_program"
CALL_TIME_GRID = "call_time_grid"
_TORCH_DTYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16", "f64": "float64", "i64": "int64",
                 "i32": "int32", "i16": "int16", "i8": "int8", "i1": "bool"}


class BundleError(Exception):
    """A bundle file is missing, truncated, corrupt or of another format version."""


@dataclass
class TensorSpec:
    role: str  # q, k, v, c<i> (closure tensor i), out, lse
    shape: list[int]  # -1: any size (a packed batch's rows, abi.PACKED_ROWS_DIM)
    dtype: str  # torch dtype name, e.g. "bfloat16"
    rows: list[int] | None = None  # a workspace of any rows: [divisor, addend] (abi.sized_shape)


@dataclass
class KernelVariant:
    ttir: str  # the kernel's Triton IR, or its Triton GPU IR where `ir` is "ttgir"
    args: list[str]  # kernel argument labels: "q", "q.stride0", ..., "table0"
    aligned: bool
    ir: str = "ttir"  # "ttgir": a kernel of attn-lower-to-gluon, past Triton's layout passes
    grid: list[int] | None = None  # programs along x, y, z where they differ from the kernel's
    max_registers: int = 0  # Triton's maxnreg where the kernel needs it (0: Triton's choice)


@dataclass
class Stage:
    """A kernel a bundle launches before its own (the chunk states of a split recurrence)."""

    name: str
    grid: list[int]
    variants: dict[str, KernelVariant]
    num_warps: int
    num_stages: int
    tables: list[dict] = field(default_factory=list)  # its own block tables, as Bundle.tables
    # "aligned": launched only when a call takes the aligned variants (a kernel of a form that
    # only they have, as the backward's dQ conversion after TMA reduce-adds); "": always.
    only: str = ""

    @classmethod
    def from_dict(cls, d: dict) -> Stage:
        return cls(name=d["name"], grid=list(d["grid"]),
                   variants={k: KernelVariant(**v) for k, v in d["variants"].items()},
                   num_warps=int(d["num_warps"]), num_stages=int(d["num_stages"]), tables=list(d.get("tables", [])),
                   only=d.get("only", ""))


@dataclass
class Bundle:
    name: str
    grid: list[int]  # programs along x, y, z
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    variants: dict[str, KernelVariant]
    tables: list[dict]  # {"shape": [...], "data": [...]} int32, row-major
    num_warps: int
    num_stages: int
    block_m: int
    block_n: int
    target: str | None = None  # the GPU the block sizes were chosen for: "cuda:90", "hip:gfx942"
    key: str = ""
    meta: dict = field(default_factory=dict)
    # Kernels launched first, in order, and the scratch tensors (roles "w<i>") they pass on; the
    # launcher allocates those, contiguous, on every call.
    stages: list[Stage] = field(default_factory=list)
    workspace: list[TensorSpec] = field(default_factory=list)
    # Kernels launched after its own, in order.
    finish: list[Stage] = field(default_factory=list)

    # --- (de)serialization -------------------------------------------------------------------
    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Bundle:
        try:
            return cls(
                name=d["name"], grid=list(d["grid"]),
                inputs=[TensorSpec(**t) for t in d["inputs"]], outputs=[TensorSpec(**t) for t in d["outputs"]],
                variants={k: KernelVariant(**v) for k, v in d["variants"].items()},
                tables=list(d["tables"]), num_warps=int(d["num_warps"]), num_stages=int(d["num_stages"]),
                block_m=int(d["block_m"]), block_n=int(d["block_n"]), target=d.get("target"),
                key=d.get("key", ""), meta=dict(d.get("meta", {})),
                stages=[Stage.from_dict(x) for x in d.get("stages", [])],
                workspace=[TensorSpec(**t) for t in d.get("workspace", [])],
                finish=[Stage.from_dict(x) for x in d.get("finish", [])])
        except (KeyError, TypeError, ValueError) as err:
            raise BundleError(f"malformed bundle: {type(err).__name__}: {err}") from None

    def to_json(self) -> str:
        payload = self.to_dict()
        return json.dumps({"format": FORMAT_VERSION, "checksum": _checksum(payload), "bundle": payload})

    @classmethod
    def from_json(cls, text: str) -> Bundle:
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as err:
            raise BundleError(f"not a bundle (bad JSON: {err})") from None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT_VERSION or "bundle" not in doc:
            raise BundleError(f"not a format-{FORMAT_VERSION} bundle")
        if doc.get("checksum") != _checksum(doc["bundle"]):
            raise BundleError("bundle checksum mismatch (corrupt or edited file)")
        return cls.from_dict(doc["bundle"])

    def save(self, path) -> Path:
        """Write to `path`: one JSON file if it ends in .json, else a directory holding bundle.json
        and each variant's Triton IR as <variant>.ttir or .ttgir (for reading; bundle.json is complete)."""
        path = Path(path)
        if path.suffix == ".json":
            atomic_write(path, self.to_json())
            return path
        path.mkdir(parents=True, exist_ok=True)
        for name, variant in self.variants.items():
            atomic_write(path / f"{name}.{variant.ir}", variant.ttir)
        atomic_write(path / "bundle.json", self.to_json())
        return path

    @classmethod
    def load(cls, path) -> Bundle:
        path = Path(path)
        target = path / "bundle.json" if path.is_dir() else path
        try:
            text = target.read_text()
        except (OSError, UnicodeDecodeError) as err:
            raise BundleError(f"cannot read bundle {target}: {err}") from None
        return cls.from_json(text)


def _checksum(payload: dict) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def cache_key(l0_text: str, target: str, options: dict) -> str:
    blob = json.dumps({"ir": l0_text, "target": target, "options": options, "format": FORMAT_VERSION,
                       "compiler": compiler_fingerprint()}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


class BundleCache:
    """Bundles by key: in memory, then on disk (`<cache_dir>/bundles/<key>.json`)."""

    def __init__(self):
        self._memory: dict[str, Bundle] = {}
        self._lock = threading.Lock()

    def path(self, key: str) -> Path:
        return cache_dir() / "bundles" / f"{key}.json"

    def get(self, key: str) -> Bundle | None:
        with self._lock:
            if key in self._memory:
                return self._memory[key]
        path = self.path(key)
        if not path.exists():
            return None
        try:
            bundle = Bundle.load(path)
        except BundleError:
            # A torn or corrupt entry is a miss: the caller rebuilds and overwrites it.
            with contextlib.suppress(OSError):
                path.unlink()
            return None
        if bundle.key != key:
            return None
        with self._lock:
            self._memory[key] = bundle
        return bundle

    def put(self, key: str, bundle: Bundle) -> None:
        bundle.key = key
        with self._lock:
            self._memory[key] = bundle
        try:
            bundle.save(self.path(key))
        except OSError:
            # A read-only or full cache directory costs a recompile next process, nothing more.
            pass

    def clear_memory(self) -> None:
        with self._lock:
            self._memory.clear()


CACHE = BundleCache()


# --- binding tensors and launching (compiling the Triton IR: triton_kernels) -------------------


def torch_dtype(name: str):
    import torch

    return getattr(torch, _TORCH_DTYPES.get(name, name))


def choose_variant(bundle: Bundle, tensors: dict) -> KernelVariant:
    return pick_variant(bundle, aligned_ok(bundle, tensors))


_TABLES: dict = {}


def device_tables(bundle: Bundle, device, kernel: Bundle | Stage | None = None) -> list:
    """The block tables of `kernel` (the bundle's own by default) as int32 tensors on `device`."""
    import torch

    kernel = kernel or bundle
    key = (bundle.key or id(bundle), kernel.name, str(device))
    if key not in _TABLES:
        _TABLES[key] = [torch.tensor(t["data"], dtype=torch.int32, device=device).reshape(t["shape"])
                        for t in kernel.tables]
    return _TABLES[key]


def bind(bundle: Bundle, q, k, v, *captures, out=None, lse=None) -> dict:
    """Check the inputs against the bundle and return every kernel tensor by role, allocating
    the outputs that were not given and the workspace."""
    import torch

    given = [q, k, v] + list(captures)
    # The runtime makes the call-time tables and the mirrored closure tensors, the last inputs.
    n_made = (4 if MASK_PROGRAM in bundle.meta else 0) + len(mirrored_roles(bundle))
    if len(given) != len(bundle.inputs) - n_made:
        raise ValueError(f"kernel '{bundle.name}' takes {len(bundle.inputs) - n_made} tensors (q, k, v and "
                         f"{len(bundle.inputs) - n_made - 3} closure tensors), got {len(given)}")
    given += call_time_tables(bundle, q, k, v, *captures)
    if mirrored_roles(bundle):  # most bundles have none: no per-call dict for them
        given += mirrored_inputs(bundle, {abi.capture(i): c for i, c in enumerate(captures)}).values()
    device = q.device
    tensors = {}
    inputs, outputs, workspace = _binding(bundle)
    for (role, shape, dtype, spec), t in zip(inputs, given):
        if not _fits(t, shape) or t.dtype != dtype:
            raise ValueError(f"{role} must be {spec.dtype}{list(spec.shape)}, got {t.dtype}{list(t.shape)} "
                             "(this bundle was compiled for other shapes)")
        if t.device != device:
            if role in ("q", "k", "v"):
                raise ValueError(f"{role} is on {t.device} but q is on {device}")
            t = t.to(device)
        if dtype == torch.bool:
            t = t.view(torch.uint8)
        tensors[role] = t
    for (role, shape, dtype, spec), t in zip(outputs, (out, lse)):
        shape = _sized(role, shape, q, k)
        if t is None:
            t = torch.empty(shape, dtype=dtype, device=device)
        elif t.shape != shape or t.dtype != dtype or t.device != device:
            raise ValueError(f"{role} must be {spec.dtype}{list(spec.shape)} on {device}")
        tensors[role] = t
    for role, shape, dtype, spec in workspace:
        tensors[role] = torch.empty(_sized(role, shape, q, k, spec.rows), dtype=dtype, device=device)
    return tensors


def _fits(t, shape) -> bool:
    """Whether tensor `t` has a spec's `shape` (-1: any size, a packed batch's rows)."""
    return t.shape == shape if -1 not in shape else abi.fits_shape(shape, t.shape)


def _sized(role: str, shape, q, k, rule=None):
    """A spec's shape with a packed batch's rows (-1) from q's or k's (abi.sized_shape)."""
    return shape if -1 not in shape else abi.sized_shape(role, shape, q.shape[2], k.shape[2], rule)


def _binding(bundle: Bundle) -> tuple:
    """The bundle's input, output and workspace specs as (role, shape, torch dtype, spec), built
    once per bundle: a call compares against them without converting a spec per tensor."""
    import torch

    found = bundle.__dict__.get("_binding")
    if found is None:
        found = bundle.__dict__["_binding"] = tuple(
            [(s.role, torch.Size(s.shape), torch_dtype(s.dtype), s) for s in specs]
            for specs in (bundle.inputs, bundle.outputs, bundle.workspace))
    return found


def call_time_tables(bundle: Bundle, q, k, v, *captures) -> list:
    """The tile tables of a bundle whose mask reads closure tensors, classified from the mask
    program it carries on q's device (cached while the closure tensors are unchanged); [] for
    any other bundle."""
    program = bundle.meta.get(MASK_PROGRAM)
    if program is None:
        return []
    from .block_mask import call_time_tables as classify

    batch, seq_q, seq_k = abi.classification_grid(bundle.meta.get(CALL_TIME_GRID), q.shape[2], k.shape[2])
    return classify(program, [q, k, v, *captures], seq_q, seq_k, bundle.block_m, bundle.block_n, q.device,
                    batch=batch)


def backward_call_time_tables(bundle: Bundle, given: dict, device) -> dict:
    """The call-time tile tables of a backward bundle's kernels by role (abi.backward_table_roles),
    classified from its mask program on the given q, k, v and closure tensors (by role) with each
    kernel's blocks; {} for a bundle without them."""
    program = bundle.meta.get(MASK_PROGRAM)
    if program is None:
        return {}
    from .block_mask import call_time_tables as classify

    roles = [spec.role for spec in bundle.inputs]
    operands = [given[role] for role in roles if role in abi.INPUTS or abi.is_capture(role)]
    config = bundle.meta["config"]
    batch, seq_q, seq_k = abi.classification_grid(bundle.meta.get(CALL_TIME_GRID), given["q"].shape[2],
                                                     given["k"].shape[2])
    tables = {}
    for part in ("dq", "dkdv"):
        names = abi.backward_table_roles(part)
        if names[0] in roles:
            bm, bn = abi.backward_blocks(part, config)
            found = classify(program, operands, seq_q, seq_k, bm, bn, device, part, batch=batch)
            tables.update(zip(names, found))
    return tables


def backward_inputs_made(bundle: Bundle, given: dict, device) -> dict:
    """The inputs of a backward bundle the runtime makes from the given ones, by role: the
    call-time tile tables and the mirrored closure tensors (abi.mirrored)."""
    return {**backward_call_time_tables(bundle, given, device), **mirrored_inputs(bundle, given)}


def launch(bundle: Bundle, q, k, v, *captures, out=None, lse=None) -> list:
    """Run the bundle's kernels (its stages, then its own) on GPU tensors (any strides) and
    return [out] or [out, lse] (for linear attention, [out, state]).

    The Triton IR is target-neutral: a bundle tuned for one GPU (`bundle.target`) compiles for
    whichever device `q` is on."""
    tensors = bind(bundle, q, k, v, *captures, out=out, lse=lse)
    _launch_all(bundle, tensors, q.device)
    return [tensors[spec.role] for spec in bundle.outputs]


def plan_with_workspace(bundle: Bundle, tensors: dict, device, tables_of, workspace: tuple = (),
                        allocate=None) -> list:
    """The launch plan of a call on `tensors` (by role), with the `workspace` specs ((role, shape,
    torch dtype), shapes sized) put into `tensors`: `allocate(shape, dtype)` makes those the
    launched kernels read, the others are None. A five-product backward's float32 dQ sums (4
    bytes per element of q) serve its aligned kernels alone, so a call whose layout takes the
    general ones allocates none."""
    import torch

    # The plan reads a workspace's layout only (a fresh, contiguous tensor), never its storage.
    tensors.update({role: torch.empty(shape, dtype=dtype, device="meta") for role, shape, dtype in workspace})
    plan = launch_plan(bundle, tensors, device, tables_of)
    if workspace:
        read = {role for launch in plan for _, role in launch.slots + launch.descriptors}
        for role, shape, dtype in workspace:
            tensors[role] = allocate(shape, dtype) if role in read else None
    return plan


def _launch_all(bundle: Bundle, tensors: dict, device, workspace: tuple = ()) -> None:
    """Launch the bundle's stages, then its own kernel, on the tensors bound by role, the
    `workspace` allocated as plan_with_workspace says."""
    import torch

    plan = plan_with_workspace(bundle, tensors, device, lambda kernel: device_tables(bundle, device, kernel),
                               workspace, lambda shape, dtype: torch.empty(shape, dtype=dtype, device=device))
    target = current_target(device)
    # Triton launches on the current device's stream; entering a device context costs more than
    # a short kernel's launch, so only a call on another device enters one.
    here = device.index is None or device.index == torch.cuda.current_device()
    with contextlib.nullcontext() if here else torch.cuda.device(device):
        for launch in plan:
            launch_one(launch.kernel, launch.variant, target, launch.arguments(tensors))


def launch_roles(bundle: Bundle, given: dict) -> dict:
    """Run a bundle whose kernels name their arguments' roles (the backward's: q, k, v, c<i>, out,
    do, lse, dlse in; dq, dk, dv and the closure gradients dc<i> out) on GPU tensors given by role; returns its outputs by role."""
    import torch

    device = given["q"].device
    tensors = {}
    inputs, outputs, workspace = _binding(bundle)
    made = backward_inputs_made(bundle, given, device)
    for role, shape, dtype, spec in inputs:
        t = given.get(role, made.get(role))
        if t is None or not _fits(t, shape) or t.dtype != dtype:
            got = "nothing" if t is None else f"{t.dtype}{list(t.shape)}"
            raise ValueError(f"{role} must be {spec.dtype}{list(spec.shape)}, got {got}")
        if t.device != device:
            t = t.to(device)
        tensors[role] = t.view(torch.uint8) if dtype == torch.bool else t
    for role, shape, dtype, spec in outputs:
        # The closure tensors' gradients are sums the kernel adds into.
        allocate = torch.zeros if abi.is_closure_grad(role) else torch.empty
        tensors[role] = allocate(_sized(role, shape, given["q"], given["k"], spec.rows), dtype=dtype, device=device)
    _launch_all(bundle, tensors, device,
                tuple((role, _sized(role, shape, given["q"], given["k"], spec.rows), dtype)
                      for role, shape, dtype, spec in workspace))
    return {spec.role: tensors[spec.role] for spec in bundle.outputs}
