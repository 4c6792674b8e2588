"""Per-entry key lengths (`kv_len`, attn.mask's optional operand): keys j >= kv_len[b] are dropped.

Two ways the passes honour it:

* `fold_into_mask` rewrites an attn.mask with kv_len into one without, whose region also asks
  kv_idx < kv_len[b]. The result means the same; attn-differentiate writes the derivative's mask
  so, for evaluators that do not specialize the lengths (torch evaluating the derivative).
* `attn-tile` and `attn-tile-backward` specialize them (`entry_length`, `trip_count`): a program
  reads its entry's length once, visits only the KV tiles (query blocks) in reach of it and loads
  K and V rows up to it, so a cache allocated for Lk keys costs what its filled part does.
"""
from __future__ import annotations

from .l1_builders import index


def fold_into_mask(mask_op):
    """Replace `mask_op` (an attn.mask with a kv_len operand) by an equivalent one without it;
    returns the new op."""
    from mlir import ir
    from mlir.dialects import arith, tensor

    kv_len = mask_op.operands[0]
    new = ir.Operation.create("attn.mask", results=[mask_op.results[0].type], regions=1,
                              loc=mask_op.location, ip=ir.InsertionPoint(mask_op))
    for block in list(mask_op.regions[0].blocks):
        block.append_to(new.regions[0])
    block = new.regions[0].blocks[0]
    b, _, _, kv_idx = block.arguments
    terminator = list(block.operations)[-1].operation
    with ir.InsertionPoint(terminator), mask_op.location:
        length = arith.index_cast(ir.IndexType.get(), tensor.extract(kv_len, [b]))
        inside = arith.cmpi(arith.CmpIPredicate.slt, kv_idx, length)
        terminator.operands[0] = arith.andi(terminator.operands[0], inside)
    mask_op.results[0].replace_all_uses_with(new.results[0])
    mask_op.erase()
    return new


def entry_length(kernel_arg, batch, keys: int):
    """The batch entry's number of keys, read from the kernel argument kv_len and clamped into
    [0, keys] so no load or closure read leaves the tensors."""
    from mlir import ir
    from mlir.dialects import arith, tensor

    length = arith.index_cast(ir.IndexType.get(), tensor.extract(kernel_arg, [batch]))
    return arith.minsi(arith.maxsi(length, index(0)), index(keys))


def constant_table(rows: list[list[int]]):
    """An i32 constant tensor of equal-length rows."""
    from mlir import ir
    from mlir.dialects import arith

    body = ", ".join("[" + ", ".join(map(str, row)) + "]" for row in rows)
    value = ir.Attribute.parse(f"dense<[{body}]> : tensor<{len(rows)}x{len(rows[0])}xi32>")
    return arith.constant(value.type, value)


def consecutive(lists: list[list[int]]) -> bool:
    """Whether every list is a run of consecutive block numbers."""
    return all(row == list(range(row[0], row[0] + len(row))) for row in lists if row)


def bound_table(lists: list[list[int]], nn: int) -> list[list[int]]:
    """Per list, for t in [0, nn]: how many of its (increasing) block numbers are below t."""
    return [[sum(1 for n in row if n < t) for t in range(nn + 1)] for row in lists]


def trip_count(count, index_table, bounds, table_row, blocks_in_reach):
    """How many of the row's first `count` listed KV blocks (increasing) lie below
    `blocks_in_reach`: from the bound table when there is one, else (consecutive lists) from the
    row's first block."""
    from mlir import ir
    from mlir.dialects import arith, tensor

    if bounds is not None:
        return arith.index_cast(ir.IndexType.get(), tensor.extract(bounds, [table_row, blocks_in_reach]))
    first = arith.index_cast(ir.IndexType.get(), tensor.extract(index_table, [table_row, index(0)]))
    reach = arith.maxsi(arith.subi(blocks_in_reach, first), index(0))
    return arith.minsi(count, reach)
