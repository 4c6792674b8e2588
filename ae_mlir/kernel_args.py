"""The arguments of a bundle's kernels, from the tensors bound by role: whether the aligned
variant's assumptions hold for them, and the argument list (pointers, strides, tile tables) in
the order the Triton IR's tt.func takes it. Part of the runtime (torch only, no MLIR); both
answers are cached, since a decoding step launches the same layout over and over."""
from __future__ import annotations

from typing import NamedTuple

from .core import abi


def unit_last_stride(t) -> bool:
    """Whether consecutive elements along `t`'s last dimension are adjacent in memory (a 0-d
    tensor, or a last dimension of one element, counts as such): what the kernels' unit-stride
    variants take."""
    return t.dim() == 0 or t.shape[-1] <= 1 or t.stride(-1) == 1


class ReversedRows:
    """A GPU tensor read (or written) with its sequence dimension (2, of [B, H, L, D]) in reverse
    order, as a kernel argument: the pointer at its last row and that dimension's stride negated.

    torch has no negative strides, so this stands in for the view where only the kernels touch it:
    it has what binding and argument lists read (shape, dtype, device, strides, the data pointer),
    nothing else. The Triton kernels take any strides; tile origins and row offsets are signed."""

    def __init__(self, t, dim: int = 2):
        self.base, self.dim_reversed = t, dim
        self.shape, self.dtype, self.device = t.shape, t.dtype, t.device

    def dim(self) -> int:
        return self.base.dim()

    def stride(self, d: int | None = None):
        strides = tuple(-s if i == self.dim_reversed else s for i, s in enumerate(self.base.stride()))
        return strides if d is None else strides[d]

    def data_ptr(self) -> int:
        t = self.base
        return t.data_ptr() + (t.shape[self.dim_reversed] - 1) * t.stride(self.dim_reversed) * t.element_size()


_MIRRORED: dict = {}


def mirrored_roles(bundle) -> list[str]:
    """The bundle's mirrored inputs (abi.mirrored: closure tensors its kernels read reversed along
    the last dimension, passes/mirror_reads.py), in input order; found once per bundle."""
    found = bundle.__dict__.get("_mirrored_roles")
    if found is None:
        found = bundle.__dict__["_mirrored_roles"] = [s.role for s in bundle.inputs if abi.mirrored_capture(s.role)]
    return found


def mirrored_inputs(bundle, tensors: dict) -> dict:
    """The bundle's mirrored inputs by role, made from the closure tensors in `tensors` (by role)
    where not given there (`mirrored_copy`)."""
    made = {}
    for role in mirrored_roles(bundle):
        source = tensors.get(abi.mirrored_capture(role))
        if role in tensors or source is None:
            continue
        made[role] = mirrored_copy(source)
    return made


def mirrored_copy(source):
    """`source` reversed along its last dimension (a contiguous copy), kept while its memory and
    version are unchanged, so a call repeated on the same table (a decoding step, a layer's next
    call) copies nothing; the entry holds its source, whose memory no other tensor can take
    meanwhile."""
    from .core.memo import kept

    t = source.detach()
    key = (str(t.device), t.data_ptr(), tuple(t.shape), t.stride(), t.dtype, t._version)
    return kept(_MIRRORED, key, lambda: (t, t.flip(-1)), 16)[1]


def _padded(n: int) -> int:
    return max(16, 1 << (n - 1).bit_length())


def aligned_ok(bundle, tensors: dict) -> bool:
    """Whether the tensors meet the aligned variant's assumptions (`abi.aligned_assumption`):
    unit last-dim strides, and for the ALIGNED ones 16-byte aligned base pointers, strides
    divisible by 16 (but the row statistics' row strides), every stride an i32, and 32-bit
    offsets inside a tile that cannot overflow. The launch path asks once per layout
    (`launch_plan`)."""
    assumed = {role: abi.aligned_assumption(role, t.shape) for role, t in tensors.items() if t is not None}
    config = bundle.meta.get("config", {})
    blocks = [bundle.block_m, bundle.block_n, config.get("dkdv_block_m", 0), config.get("dkdv_block_n", 0)]
    reach = max(blocks + [_padded(t.shape[-1]) for t in bundle.inputs[:3]])
    # A packed GQA tile spans the group's heads: offsets inside it reach (group - 1) head strides.
    group = bundle.inputs[0].shape[1] // bundle.inputs[1].shape[1] if config.get("pack_gqa") else 1
    for role, t in tensors.items():
        if assumed.get(role) == abi.UNIT_LAST and t.dim() and t.shape[-1] > 1 and t.stride(-1) != 1:
            return False
        if assumed.get(role) != abi.ALIGNED:
            continue
        if group > 1 and t.dim() >= 3 and t.stride(1) * group >= 2**31:
            return False
        if t.data_ptr() % 16:
            return False
        for d, (size, stride) in enumerate(zip(t.shape, t.stride())):
            if size == 1:
                continue
            if d == t.dim() - 1:
                if stride != 1:
                    return False
                continue
            if role not in abi.ROW_STATS and stride % 16:
                return False
            # A broadcast dimension (an expanded K or V): TMA descriptors' strides are not
            # specified at 0, so such tensors take the general variant's pointers.
            if stride == 0:
                return False
            # Strides travel as i32; tile origins are computed in i64, so only offsets inside a
            # tile (rows along the sequence dimension) must stay below 2^31.
            limit = abs(stride) * reach if d == t.dim() - 2 else abs(stride)
            if limit >= 2**31:
                return False
    return True


_STRIDE, _TABLE, _TENSOR, _DESCRIPTOR, _DESCRIPTOR_SIZE, _DESCRIPTOR_STRIDE, _SIZE = range(7)
_PLANS: dict = {}
_LAUNCHER: dict = {}


class HostDescriptor(NamedTuple):
    """A kernel argument for a TMA descriptor over a whole tensor, made on the host at launch
    (`abi.descriptor_label`): what Triton's launcher reads to encode one (`base.data_ptr()`,
    `shape`, `strides`, `padding`), and the interpreter too."""

    base: object
    shape: tuple
    strides: tuple
    padding: str = "zero"


def descriptor_strides(t) -> tuple:
    """t's strides as a descriptor takes them. A dimension of size 1, whose stride no offset
    moves along (the aligned variant does not check it), gets the extent of the dimensions inside
    it, as a contiguous tensor has: TMA wants every stride but the last a multiple of 16 bytes,
    which the aligned variant's other strides are (in 16 elements)."""
    strides = list(t.stride())
    for d in range(t.dim() - 2, -1, -1):
        if t.shape[d] == 1:
            strides[d] = max(strides[i] * t.shape[i] for i in range(d + 1, t.dim()))
    return tuple(strides)


def host_descriptor(t) -> HostDescriptor:
    return HostDescriptor(t, tuple(t.shape), descriptor_strides(t))


def _argument_plan(variant) -> list[tuple]:
    """The variant's argument labels parsed once: (kind, role or table index, dimension). A
    decoding call's kernel runs for microseconds, so the launch path does not parse per call."""
    entry = _PLANS.get(id(variant))
    if entry is None or entry[0] is not variant:
        plan = []
        for label in variant.args:
            name, _, rest = label.partition(".")
            if rest.startswith(abi.DESCRIPTOR):
                kind = rest[len(abi.DESCRIPTOR) + 1:]
                if not kind:
                    plan.append((_DESCRIPTOR, name, 0))
                elif kind.startswith("size"):
                    plan.append((_DESCRIPTOR_SIZE, name, int(kind[len("size"):])))
                else:
                    plan.append((_DESCRIPTOR_STRIDE, name, int(kind[len("stride"):])))
            elif rest.startswith("stride"):
                plan.append((_STRIDE, name, int(rest[len("stride"):])))
            elif rest.startswith("size"):
                plan.append((_SIZE, name, int(rest[len("size"):])))
            elif name.startswith("table"):
                plan.append((_TABLE, int(name[len("table"):]), 0))
            else:
                plan.append((_TENSOR, name, 0))
        entry = _PLANS[id(variant)] = (variant, plan)
    return entry[1]


def argument_values(variant, tensors: dict, tables: list) -> list:
    """The kernel's arguments in order: tensors for pointers, ints for strides (0 for dimensions
    of size 1, whose stride never moves a pointer), table tensors for tables."""
    values = []
    for kind, key, d in _argument_plan(variant):
        if kind == _STRIDE:
            t = tensors[key]
            values.append(0 if t.shape[d] == 1 else t.stride(d))
        elif kind == _TABLE:
            values.append(tables[key])
        elif kind == _DESCRIPTOR:
            values.append(host_descriptor(tensors[key]))
        elif kind in (_DESCRIPTOR_SIZE, _SIZE):
            values.append(tensors[key].shape[d])
        elif kind == _DESCRIPTOR_STRIDE:
            values.append(descriptor_strides(tensors[key])[d])
        else:
            values.append(tensors[key])
    return values


def launcher_positions(variant) -> tuple | None:
    """The positions of the arguments Triton's launcher takes for a Triton IR source with host
    descriptors: it takes one HostDescriptor for a descriptor and its sizes and strides (it
    passes them on itself); None where the variant has no host descriptor."""
    entry = _LAUNCHER.get(id(variant))
    if entry is None or entry[0] is not variant:
        plan = _argument_plan(variant)
        positions = None
        if any(kind == _DESCRIPTOR for kind, _, _ in plan):
            positions = tuple(i for i, (kind, _, _) in enumerate(plan)
                              if kind not in (_DESCRIPTOR_SIZE, _DESCRIPTOR_STRIDE))
        entry = _LAUNCHER[id(variant)] = (variant, positions)
    return entry[1]


def kernels(bundle, aligned: bool | None = None) -> list:
    """The bundle's kernels in launch order (its stages, its own, its finish), those a call
    launches where `aligned` says which variants it takes (a Stage with `only` "aligned" is
    launched with them alone)."""
    found = bundle.stages + [bundle] + bundle.finish
    if aligned is None:
        return found
    return [k for k in found if not getattr(k, "only", "") or (k.only == "aligned") == aligned]


def pick_variant(kernel, aligned: bool):
    """The kernel's (a Bundle's or a Stage's) aligned variant where the call allows it (and it
    has one), else the general."""
    return kernel.variants["aligned"] if aligned and "aligned" in kernel.variants else kernel.variants["generic"]


def _layout_roles(bundle) -> tuple:
    """Every role a kernel of the bundle reads a pointer or a stride of, once, in a fixed order."""
    roles = bundle.__dict__.get("_layout_roles")
    if roles is None:
        found = {}
        for kernel in kernels(bundle):
            for variant in kernel.variants.values():
                for kind, key, _ in _argument_plan(variant):
                    if kind in (_STRIDE, _TENSOR):
                        found.setdefault(key)
        roles = bundle.__dict__["_layout_roles"] = tuple(found)
    return roles


class KernelLaunch(NamedTuple):
    """One kernel of a launch plan: the kernel (a Bundle or a Stage), its variant for the layout,
    and its argument list with the strides and tables in place and None where a tensor goes."""

    kernel: object
    variant: object
    template: list
    slots: tuple  # (position, role) of each tensor argument
    descriptors: tuple = ()  # (position, role) of each host descriptor (its base filled per call)

    def arguments(self, tensors: dict) -> list:
        """The argument list of a call on `tensors` (by role)."""
        args = self.template.copy()
        for i, role in self.slots:
            args[i] = tensors[role]
        for i, role in self.descriptors:
            args[i] = args[i]._replace(base=tensors[role])
        return args


def launch_plan(bundle, tensors: dict, device, tables_of) -> list[KernelLaunch]:
    """Each kernel of the bundle, in launch order, as launched on tensors of this layout.

    What it holds depends only on the tensors' layout (shapes, strides, pointer alignment) and
    device, so it is built once per layout and kept on the bundle: a call then fills in only its
    tensors, instead of reading every stride again (a linear-attention training step launches
    ten kernels; a decoding step runs for microseconds). `tables_of(kernel)` gives a kernel's
    block tables on `device`."""
    layout = (device,) + tuple((t.data_ptr() % 16, t.shape, t.stride()) for t in map(tensors.get, _layout_roles(bundle)))
    # Kept on the bundle (not a serialized field), so a plan is never another bundle's.
    plans = bundle.__dict__.setdefault("_launch_plans", {})
    plan = plans.get(layout)
    if plan is None:
        if len(plans) > 1024:
            plans.clear()
        aligned = aligned_ok(bundle, tensors)
        plan = []
        for kernel in kernels(bundle, aligned):
            variant = pick_variant(kernel, aligned)
            values = argument_values(variant, tensors, tables_of(kernel))
            slots = tuple((i, key) for i, (kind, key, _) in enumerate(_argument_plan(variant)) if kind == _TENSOR)
            descriptors = tuple((i, key) for i, (kind, key, _) in enumerate(_argument_plan(variant))
                                if kind == _DESCRIPTOR)
            # Not this call's tensors: the plan outlives them (a descriptor keeps the layout's
            # shape and strides and takes its base per call).
            for i, _ in slots:
                values[i] = None
            for i, _ in descriptors:
                values[i] = values[i]._replace(base=None)
            plan.append(KernelLaunch(kernel, variant, values, slots, descriptors))
        plans[layout] = plan
    return plan
