"""Packed GQA for `attn-tile` (pack-gqa): with H query heads sharing each of Hkv KV heads, a
program takes one KV head and block_m / group rows of each of its group's query heads as the rows
of one tile, so each K and V tile is read once per KV head instead of once per query head. When a
few query tokens meet a long KV cache (decoding) those reads are the whole cost.

Tile row r stands for head hk * group + r / rows and query row m0 + r % rows, where rows =
block_m / group: the Q tile is the 3-D slice q[b, hk*group : +group, m0 : +rows, :] collapsed to
[block_m, D], and the output and statistics go back through the inverse expand into the same
slice of their destinations. The mods see each row's own head and query index.
"""
from __future__ import annotations

from .l1_builders import element_type, index, tensor_type


def packable(kernel, block_m: int) -> bool:
    """Whether the group's heads fit in a tile's rows: a group of more than one head, a power of
    two, with at least two rows of each in block_m (a one-row [group, 1, D] slice has no layout
    the Triton lowering pads to, and head dims below 16 none either)."""
    group = kernel.group
    return (group > 1 and group & (group - 1) == 0 and block_m % group == 0 and block_m // group >= 2
            and min(kernel.dk, kernel.dv) >= 16)


def pack(kernel) -> None:
    """Switch `kernel` (tile._Kernel) to the packed form."""
    kernel.packed = True
    kernel.rows = kernel.bm // kernel.group


def load_head_rows(kernel, src, lead: list, width: int | None):
    """src[lead..., hk*group : +group, m0 : +rows(, :width)], zero past Lq, as [block_m(, width)]."""
    from mlir import ir
    from mlir.dialects import arith, tensor

    from .l1_builders import _block, extract_slice

    group, rows = kernel.group, kernel.rows
    elt = element_type(src)
    dynamic = ir.ShapedType.get_dynamic_size()
    valid = kernel.rows_left(kernel.m0, kernel.lq, rows)
    pad = arith.subi(index(rows), valid)
    head0 = arith.muli(kernel.hk, index(group))
    trailing = [] if width is None else [width]
    ones = [1] * len(lead)
    piece = extract_slice(src, lead + [head0, kernel.m0] + [0] * len(trailing), ones + [group, valid] + trailing,
                          2 + len(trailing))
    padded = tensor.PadOp(tensor_type([group, rows] + trailing, elt), piece, [], [pad],
                          [0] * (2 + len(trailing)), [0, dynamic] + [0] * len(trailing))
    block = _block(padded.regions[0], [ir.IndexType.get()] * (2 + len(trailing)))
    with ir.InsertionPoint(block):
        tensor.YieldOp(arith.constant(elt, 0.0))
    reassociation = [[0, 1]] + ([[2]] if trailing else [])
    return tensor.CollapseShapeOp(tensor_type([group * rows] + trailing, elt), padded.result, reassociation).result


def store_head_rows(kernel, tile, dest, lead: list, valid_rows):
    """The first `valid_rows` query rows of each head of a packed [block_m(, width)] tile written
    into dest[lead..., hk*group : +group, m0:(, :)]."""
    from mlir import ir
    from mlir.dialects import arith, tensor

    group, rows = kernel.group, kernel.rows
    dynamic = ir.ShapedType.get_dynamic_size()
    trailing = list(tile.type.shape[1:])
    elt = tile.type.element_type
    reassociation = [[0, 1]] + ([[2]] if trailing else [])
    per_head = tensor.ExpandShapeOp(tensor_type([group, rows] + trailing, elt), tile, reassociation, [], [group, rows]
                                    + trailing).result
    rank = 2 + len(trailing)
    valid = tensor.ExtractSliceOp(tensor_type([group, dynamic] + trailing, elt), per_head, [], [valid_rows], [],
                                  [0] * rank, [group, dynamic] + trailing, [1] * rank).result
    coords = lead + [arith.muli(kernel.hk, index(group)), kernel.m0]
    return tensor.InsertSliceOp(valid, dest, coords, [valid_rows], [], [dynamic] * len(coords) + [0] * len(trailing),
                                [1] * len(lead) + [group, dynamic] + trailing,
                                [1] * (len(coords) + len(trailing))).result
