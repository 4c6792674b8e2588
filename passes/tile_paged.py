"""Paged KV caches for `attn-tile`: K and V given as `attn.gather_pages` of page pools
[P, Hkv, S, D] and a block table [B, M] are read through the table, tile by tile, in place.

* Pages of at least a KV tile (S a multiple of block_n): a tile lies in one page, so it is one
  slice of that page, found by one table read per tile -- the same contiguous load as an unpaged
  cache.
* Smaller pages (vLLM's 16 slots under 64-key tiles, down to one slot): each row of the tile reads
  its own page's row, a gather (one table read per row).

Page numbers are clamped into [0, P), rows past the entry's last key read as zeros, and no table
entry past the entry's last key is read, so unused table slots may hold anything.
"""
from __future__ import annotations

from .l1_builders import element_type, index, index_value, tensor_type
from .l1_ops import shape


def paged_source(value):
    """(pages, table) when `value` is an attn.gather_pages result, else None."""
    owner = getattr(value.owner, "operation", None)
    if owner is None or owner.name != "attn.gather_pages":
        return None
    return owner.operands[0], owner.operands[1]


def _page(kernel, table_arg, batch, page_index, n_pages: int):
    from mlir import ir
    from mlir.dialects import arith, tensor

    number = arith.index_cast(ir.IndexType.get(), tensor.extract(table_arg, [batch, page_index]))
    return arith.minsi(arith.maxsi(number, index(0)), index(n_pages - 1))


def load_paged(kernel, source, hk, n0, rows: int, width: int):
    """Keys n0 .. n0 + rows - 1 of the program's batch entry and KV head `hk` as a [rows, width]
    tile, zero from the entry's length (kernel.keys) on."""
    from mlir import ir
    from mlir.dialects import arith, linalg, tensor

    pages, table = source
    n_pages, _, size, _ = shape(pages)
    pages_arg = kernel.kernel_arg(pages, "the pages of attn.gather_pages")
    table_arg = kernel.kernel_arg(table, "the block table of attn.gather_pages")
    keys = index_value(kernel.keys)
    if size % rows == 0:
        page_index = arith.divui(n0, index(size))
        slot = arith.subi(n0, arith.muli(page_index, index(size)))
        page = _page(kernel, table_arg, kernel.pb, page_index, n_pages)
        return kernel.load_tile(pages_arg, [page, hk], slot, arith.addi(slot, arith.subi(keys, n0)), rows, width)
    elt = element_type(pages_arg)
    i32 = ir.IntegerType.get_signless(32)
    last = arith.subi(keys, index(1))

    def clamped_key():
        return arith.minsi(arith.addi(n0, linalg.IndexOp(0).result), last)

    def page_of_row(_):
        page = _page(kernel, table_arg, kernel.pb, arith.divui(clamped_key(), index(size)), n_pages)
        return arith.index_cast(i32, page)

    # One table read per row, not per element: the row's page, then its D elements.
    pages_of_rows = kernel.generic([], tensor_type([rows], i32), page_of_row, rank=1)

    def element(a):
        key = arith.addi(n0, linalg.IndexOp(0).result)
        clamped = clamped_key()
        slot = arith.subi(clamped, arith.muli(arith.divui(clamped, index(size)), index(size)))
        page = arith.index_cast(ir.IndexType.get(), a[0])
        x = tensor.extract(pages_arg, [page, hk, slot, linalg.IndexOp(1).result])
        inside = arith.cmpi(arith.CmpIPredicate.slt, key, keys)
        return arith.select(inside, x, arith.constant(elt, 0.0))

    return kernel.generic([(pages_of_rows, (0,))], tensor_type([rows, width], elt), element)
