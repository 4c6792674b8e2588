"""`attn-tabulate-index-terms`: an integer term of a tile's element-wise body that depends on one
integer value alone, and costs more than a load, is computed at compile time for every value
that one can take and read from a constant table.

T5's bucket of kv_idx - q_idx is the case in point: a log, two divisions and two conversions per
score, all a function of the distance, which a kernel at L = 8192 takes in 2^14 values. The
interval comes from `index_bounds` (the grid, loop ranges, tile lanes with Triton's padding lanes,
constants), so the table covers every lane that computes the term. Only integer terms are
tabulated: the Triton lowering passes a constant table as an `!tt.ptr<i32>` argument, and an
integer term's table is exact. The values come from the shared scalar evaluator, the reference
executor's numerics (int64 and float64), as compile-time mask classification does.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from . import ModulePass, option
from ..core.regions import scalar_op
from ..core.scalar_eval import ScalarEvalError, eval_op
from .cpu_support import walk
from .index_bounds import IndexBounds
from .triton.values import padded_size

# A table of 2^16 i32 (256 KiB) still sits in the L2 cache beside the tiles.
MAX_ENTRIES = 1 << 16
# The ops worth a table: a transcendental or a division costs a gather at least.
_COSTLY = ("arith.divf", "arith.remf", "arith.divsi", "arith.divui", "arith.remsi", "arith.remui",
           "arith.floordivsi", "arith.ceildivsi")
_CHEAP_MATH = ("math.absi", "math.absf", "math.copysign")
_I32 = (-(2 ** 31), 2 ** 31 - 1)


@dataclass(frozen=True)
class TabulateIndexTerms(ModulePass):
    name: ClassVar[str] = "attn-tabulate-index-terms"
    summary: ClassVar[str] = ("read integer terms of one bounded index (T5's buckets of q - k) from "
                              "compile-time constant tables instead of computing them per element")

    padded_tiles: bool = option(True, "bound tile indices by the power-of-two lane counts of Triton's "
                                      "lowering (its padding lanes compute too), not by the tile sizes")

    def apply(self, module_op) -> None:
        lanes = padded_size if self.padded_tiles else None
        for func in walk(module_op, "func.func"):
            for generic in walk(func, "linalg.generic"):
                body = generic.regions[0].blocks[0]
                # Bounds are memoized per value; a rewrite erases values, so each round starts afresh.
                while _tabulate_one(func, body, IndexBounds(lanes)):
                    pass


def _is_int(t) -> bool:
    from mlir import ir

    return isinstance(t, ir.IndexType) or (isinstance(t, ir.IntegerType) and t.width > 1)


def _pure(op) -> bool:
    return op.name.startswith(("arith.", "math.")) and not len(op.regions)


def _constant_owner(value):
    owner = getattr(value.owner, "operation", None)
    return owner if owner is not None and owner.name == "arith.constant" else None


def _tabulate_one(func, body, bounds: IndexBounds) -> bool:
    """Tabulate the first costly term of one value in `body`; whether one was."""
    ops = [op.operation for op in body.operations]
    for i, op in enumerate(ops):
        if op.name == "arith.constant" or not _pure(op):
            continue
        for index in op.results:
            if not _is_int(index.type):
                continue
            lo, hi = bounds.bounds(index)
            if not (isinstance(lo, int) and isinstance(hi, int)) or hi - lo + 1 > MAX_ENTRIES:
                continue
            members = _functions_of(index, ops[i + 1:])
            for root in _roots(members):
                chain = _slice(root, members)
                if not any(_costly(m) for m in chain):
                    continue
                values = _evaluate(index, lo, hi, chain, root)
                if values is None:
                    continue
                _replace(func, root, index, lo, values)
                _erase_dead(members)
                return True
    return False


def _functions_of(index, later: list) -> list:
    """The ops after `index`'s definition whose results are functions of `index` alone (their
    other operands constants), in order."""
    known = {index}
    members = []
    for op in later:
        if not _pure(op) or op.name == "arith.constant" or not op.results:
            continue
        operands = list(op.operands)
        if any(v in known for v in operands) and all(v in known or _constant_owner(v) for v in operands):
            members.append(op)
            known.update(op.results)
    return members


def _roots(members: list) -> list:
    """The integer results of `members` read by an op that is not one of them."""
    inside = set(members)
    roots = []
    for op in members:
        for r in op.results:
            if _is_int(r.type) and any(getattr(use.owner, "operation", use.owner) not in inside for use in r.uses):
                roots.append(r)
    return roots


def _slice(root, members: list) -> list:
    """The members `root` depends on, in order."""
    needed = {root}
    chain = []
    for op in reversed(members):
        if any(r in needed for r in op.results):
            chain.append(op)
            needed.update(op.operands)
    return chain[::-1]


def _costly(op) -> bool:
    return op.name in _COSTLY or (op.name.startswith("math.") and op.name not in _CHEAP_MATH)


def _evaluate(index, lo: int, hi: int, chain: list, root):
    """The root's values at index = lo..hi as int64 numpy, or None where the evaluator cannot run
    the chain or a value leaves i32."""
    import torch

    env = {index: torch.arange(lo, hi + 1, dtype=torch.int64)}

    def read(v):
        if v in env:
            return env[v]
        const = _constant_owner(v)
        return eval_op(scalar_op(const, ()), [])

    try:
        for op in chain:
            env[op.results[0]] = eval_op(scalar_op(op, ()), [read(v) for v in op.operands])
    except ScalarEvalError:
        return None
    values = env[root].to(torch.int64).expand(hi - lo + 1).numpy()
    if values.min() < _I32[0] or values.max() > _I32[1]:
        return None
    return values


def _replace(func, root, index, lo: int, values) -> None:
    """root := table[index - lo], the table a constant at the top of the function."""
    import numpy as np
    from mlir import ir
    from mlir.dialects import arith, tensor

    entry = func.regions[0].blocks[0]
    root_op = root.owner
    with root_op.context, root_op.location:
        i32 = ir.IntegerType.get_signless(32)
        index_type = ir.IndexType.get()
        table_type = ir.RankedTensorType.get([len(values)], i32)
        table = arith.ConstantOp(table_type, ir.DenseElementsAttr.get(np.ascontiguousarray(values, np.int32),
                                                                      type=table_type),
                                 ip=ir.InsertionPoint.at_block_begin(entry)).result
        with ir.InsertionPoint(root_op):
            position = index if isinstance(index.type, ir.IndexType) else arith.index_cast(index_type, index)
            if lo:
                position = arith.addi(position, arith.constant(index_type, -lo))
            value = tensor.extract(table, [position])
            rtype = root.type
            if isinstance(rtype, ir.IndexType):
                value = arith.index_cast(rtype, value)
            elif rtype.width > 32:
                value = arith.extsi(rtype, value)
            elif rtype.width < 32:
                value = arith.trunci(rtype, value)
    root.replace_all_uses_with(value)


def _erase_dead(members: list) -> None:
    for op in reversed(members):
        if all(not list(r.uses) for r in op.results):
            op.erase()
