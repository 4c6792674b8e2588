"""Packed variable-length batches for `attn-tile`: q, k and v given as `attn.unpack_sequences` of
packed [1, H, T, D] tensors and cu_seqlens offsets, and the results consumed by
`attn.pack_sequences`. The grid's batch axis runs over sequences; a program reads its sequence's
packed rows in place (rows past the sequence's end load as zeros), visits no KV tile for query
blocks past the sequence's end, and writes its rows straight into the packed results. The mods
see the sequence as b and positions within it as q_idx and kv_idx.
"""
from __future__ import annotations

from ..core import abi
from .l1_builders import index
from .l1_ops import shape


def sequences_source(value):
    """(packed, cu_seqlens) when `value` is an attn.unpack_sequences result, else None."""
    owner = getattr(value.owner, "operation", None)
    if owner is None or owner.name != "attn.unpack_sequences":
        return None
    return owner.operands[0], owner.operands[1]


def packing_ops(op) -> list | None:
    """The attn.pack_sequences ops that take `op`'s results, in result order; None when the
    results are not packed."""
    found = []
    for result in op.results:
        users = [use.owner for use in result.uses]
        packs = [u for u in users if getattr(u, "name", None) == "attn.pack_sequences"]
        if not packs:
            return None
        found.append(packs[0])
    return found


def span(kernel, source, batch, longest: int):
    """The packed rows [lo, hi) of sequence `batch` of an unpack_sequences `source`: offsets
    clamped into the packed tensor and cut at the view's longest sequence, as the reference does."""
    from mlir import ir
    from mlir.dialects import arith, tensor

    packed, cu = source
    rows = packed_rows(kernel, packed)
    cu_arg = kernel.kernel_arg(cu, "cu_seqlens")

    def offset(i):
        return arith.index_cast(ir.IndexType.get(), tensor.extract(cu_arg, [i]))

    lo = arith.minsi(arith.maxsi(offset(batch), index(0)), rows)
    hi = arith.minsi(arith.maxsi(offset(arith.addi(batch, index(1))), lo), rows)
    return lo, arith.minsi(hi, arith.addi(lo, index(longest)))


def packed_rows(kernel, packed):
    """The row count T of a packed [1, H, T(, D)] argument: a constant, or read from the tensor
    where the module takes any T (one compiled kernel serves every total of a packed batch)."""
    from mlir import ir
    from mlir.dialects import tensor

    rows = shape(packed)[abi.PACKED_ROWS_DIM]
    if not ir.ShapedType.is_dynamic_size(rows):
        return index(rows)
    return tensor.dim(kernel.kernel_arg(packed, "the packed q, k and v"), index(abi.PACKED_ROWS_DIM))
