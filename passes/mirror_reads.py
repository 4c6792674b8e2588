"""Closure reads that step backwards along a tile's rows, read forwards from a mirrored copy.

Triton's axis analysis finds runs of consecutive addresses only where an index ascends, and the
CPU's vectorizer (upstream's, through `attn-cpu-vectorize`) loads a row contiguously only then. A
table read at kv_idx - q_idx + c (the relative-position reads `frontend.relative_reads` composes,
which ascend along the forward's rows of keys) descends along the rows of the dK/dV kernel's
transposed tiles, whose last axis runs over queries: Triton then stages it one 4-byte copy per
score, ordered along the other axis, and the CPU gathers it lane by lane. The same values read from the tensor mirrored along its last dimension,
m[..., n - 1 - x], come from (n - 1 - c) + q_idx - kv_idx, which ascends. A mod region's read
qualifies when its last index is an affine function of the region's arguments (sums, differences,
products by constants), or such a function clamped into [0, n - 1] as the frontend clamps every
closure index (the clamp mirrors onto itself), stepping by -1 with the argument along the tile's
last axis. `attn-tile-backward{mirror-reads}` uses this in both backward kernels and
`attn-tile{mirror-reads}` in the forward ones: the forward's and dQ kernel's rows run over keys,
where a table read at q_idx - kv_idx + c descends (one the frontend leaves as written: a read at
a query's position in a cache, q_idx + offset[b] - kv_idx, or a module built with compose=False). Each such kernel takes the mirrored copy of each such
closure tensor c<i> as one more input (abi.mirrored), which the runtime makes and keeps while its
source is unchanged (`kernel_args.mirrored_inputs`, through `runtime.bind` and
`runtime.backward_inputs_made`; the CPU backend's `CompiledKernel.with_mirrors`).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mirror:
    """A read's last index x = sum(coefficient * leaf) + constant, optionally clamped into
    [0, size - 1], which `emit` writes mirrored: size - 1 - x."""

    terms: tuple  # (leaf value, coefficient)
    constant: int
    size: int
    clamped: bool


def _constant(value) -> int | None:
    from mlir import ir

    owner = getattr(value.owner, "operation", None)
    if owner is None or owner.name != "arith.constant":
        return None
    attr = owner.attributes["value"]
    return ir.IntegerAttr(attr).value if isinstance(attr, ir.IntegerAttr) else None


def _affine(value, terms: dict, coefficient: int) -> int:
    """Adds coefficient * value's terms into `terms` (leaf -> coefficient); returns its constant."""
    c = _constant(value)
    if c is not None:
        return coefficient * c
    owner = getattr(value.owner, "operation", None)
    name = owner.name if owner is not None else None
    if name in ("arith.addi", "arith.subi"):
        sign = 1 if name == "arith.addi" else -1
        return (_affine(owner.operands[0], terms, coefficient)
                + _affine(owner.operands[1], terms, sign * coefficient))
    if name == "arith.muli":
        for this, other in ((0, 1), (1, 0)):
            factor = _constant(owner.operands[this])
            if factor is not None:
                return _affine(owner.operands[other], terms, coefficient * factor)
    terms[value] = terms.get(value, 0) + coefficient
    return 0


def _unclamped(value, size: int):
    """The x of min(max(x, 0), size - 1) or max(min(x, size - 1), 0); None for anything else."""
    bounds = {"arith.maxsi": 0, "arith.minsi": size - 1}
    inner = value
    seen = []
    for _ in range(2):
        owner = getattr(inner.owner, "operation", None)
        if owner is None or owner.name not in bounds or owner.name in seen:
            return None
        limits = [_constant(v) for v in owner.operands]
        if limits[1] == bounds[owner.name]:
            inner = owner.operands[0]
        elif limits[0] == bounds[owner.name]:
            inner = owner.operands[1]
        else:
            return None
        seen.append(owner.name)
    return inner


def mirror_of(extract, along) -> Mirror | None:
    """The mirrored form of `extract` (a tensor.extract in a mod region) when its last index steps
    by -1 with the block argument `along`; None otherwise."""
    size = extract.operands[0].type.shape[-1]
    index = extract.operands[-1]
    inner = _unclamped(index, size)
    x = index if inner is None else inner
    terms: dict = {}
    constant = _affine(x, terms, 1)
    if terms.get(along) != -1:
        return None
    return Mirror(tuple((leaf, c) for leaf, c in terms.items() if c), constant, size, inner is not None)


def mirrored_positions(regions, axis: int, position) -> list[int]:
    """The closure positions i (c<i>) that some of the mod `regions` (None skipped) read stepping
    back along `axis`, a mod region's argument counted from the end (-2: the queries, -1: the
    keys); `position(source)` is the c<i> position of a read's source block argument, or None."""
    from mlir import ir

    found = set()
    for region in regions:
        if region is None:
            continue
        block = region.blocks[0]
        for op in block.operations:
            operation = op.operation
            source = operation.operands[0] if operation.name == "tensor.extract" else None
            if source is None or not isinstance(source.owner, ir.Block):
                continue
            if mirror_of(operation, block.arguments[len(block.arguments) + axis]) is not None:
                found.add(position(ir.BlockArgument(source)))
    return sorted(found - {None})


def emit(mirror: Mirror, image):
    """size - 1 - x at the insertion point, with the leaves' images `image(leaf)`: the terms of
    positive coefficient summed first, those of negative coefficient subtracted from that sum,
    then the constant added, so that Triton sees an ascending index plus values the row holds
    constant; clamped into [0, size - 1] if the read was."""
    from mlir import ir
    from mlir.dialects import arith

    index_type = ir.IndexType.get()

    def constant(n: int):
        return arith.constant(index_type, n)

    total = None
    for sign in (1, -1):
        for leaf, coefficient in mirror.terms:
            c = -coefficient  # mirrored
            if (c > 0) != (sign > 0):
                continue
            term = image(leaf)
            if abs(c) != 1:
                term = arith.muli(term, constant(abs(c)))
            if total is None:
                total = term if sign > 0 else arith.subi(constant(0), term)
            else:
                total = (arith.addi if sign > 0 else arith.subi)(total, term)
    offset = mirror.size - 1 - mirror.constant
    if total is None:
        total = constant(offset)
    elif offset:
        total = arith.addi(total, constant(offset))
    if mirror.clamped:
        total = arith.minsi(arith.maxsi(total, constant(0)), constant(mirror.size - 1))
    return total
