"""`Tables`: the block tables of an L1 kernel (`arith.constant` tensors indexed by the query block).
A lookup is folded into arithmetic where the table is affine in the block id (causal masks,
unmasked attention); otherwise the table becomes an extra `!tt.ptr<i32>` argument read with scalar
loads, its contents recorded in `attn.tables` on the tt.func."""
from __future__ import annotations

import math

from .scatter import ClosureAdds
from .values import Arg, Table, Value, constant_int


class Tables(ClosureAdds):
    """Needs `tables` (the tables that became arguments, in argument order) from the kernel."""

    def table_param(self, table: Table) -> Value:
        if table.param is None:
            j = len(self.tables)
            table.param = self.add_param(f"table{j}", "!tt.ptr<i32>", f"table{j}")
            self.tables.append(table)
        return table.param

    def table_arg(self, table: Table) -> Arg:
        ptr = self.table_param(table)
        shape = tuple(table.values.shape)
        strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
        return Arg("table", shape, "i32", ptr, [s if s == 1 else self.const(s, "i64") for s in strides])

    def table_lookup(self, table: Table, index_values: list, op) -> Value:
        import numpy as np

        vals = table.values
        idx = [self.scalar(v, op) for v in index_values]
        consts = [constant_int(v) for v in index_values]
        if vals.ndim == 1:
            fit = _affine(vals, np.ones(len(vals), bool))
            if fit is not None:
                return self.affine(idx[0], *fit)
        elif vals.ndim == 2 and consts[1] is not None:
            fit = _affine(vals[:, consts[1]], np.ones(vals.shape[0], bool))
            if fit is not None:
                return self.affine(idx[0], *fit)
        elif vals.ndim == 2:
            counts = _loop_counts(index_values[1], index_values[0], vals.shape[0])
            if counts is not None and counts.shape[0] == vals.shape[0]:
                width = vals.shape[1]
                live = counts > 0
                starts = vals[:, 0]
                steps_ok = all(
                    (vals[m, : min(counts[m], width)] == starts[m] + np.arange(min(counts[m], width))).all()
                    for m in range(vals.shape[0]) if live[m])
                fit = _affine(starts, live) if steps_ok else None
                if fit is not None:
                    start = self.affine(idx[0], *fit)
                    return idx[1] if fit == (0, 0) else self.op("arith.addi", start, idx[1])
        ptr = self.table_param(table)
        linear, stride = None, 1
        for d in reversed(range(vals.ndim)):
            term = idx[d] if stride == 1 else self.op("arith.muli", idx[d], self.const(stride, "i32"))
            linear = term if linear is None else self.op("arith.addi", linear, term)
            stride *= vals.shape[d]
        return self.load(self.addptr(ptr, linear), None, "i32")

    def affine(self, x: Value, a: int, b: int) -> Value:
        if a == 0:
            return self.const(b, "i32")
        v = x if a == 1 else self.op("arith.muli", x, self.const(a, "i32"))
        return v if b == 0 else self.op("arith.addi", v, self.const(b, "i32"))


def _affine(values, rows) -> tuple[int, int] | None:
    """(a, b) with values[m] == a * m + b for every selected row m, or None."""
    import numpy as np

    ms = np.nonzero(rows)[0]
    if len(ms) == 0:
        return 0, 0
    b0 = int(values[ms[0]])
    if len(ms) == 1:
        return 0, b0
    a = (int(values[ms[1]]) - b0) // int(ms[1] - ms[0])
    b = b0 - a * int(ms[0])
    if (values[ms] == a * ms + b).all():
        return a, b
    return None


def _loop_counts(iv, row, rows: int):
    """The per-row trip counts when `iv` is the induction variable of an scf.for from 0 whose upper
    bound is a constant or `counts[row]` read from a constant table; None otherwise."""
    import numpy as np
    from mlir import ir

    iv = iv.maybe_downcast()
    if not isinstance(iv, ir.BlockArgument) or iv.arg_number != 0:
        return None
    loop = iv.owner.owner
    loop = getattr(loop, "operation", loop)
    if loop is None or loop.name != "scf.for":
        return None
    if constant_int(loop.operands[0]) != 0 or constant_int(loop.operands[2]) != 1:
        return None
    ub = loop.operands[1]
    if constant_int(ub) is not None:
        return np.full(rows, constant_int(ub), np.int64)
    cast = getattr(ub.owner, "operation", None)
    if cast is None or cast.name != "arith.index_cast":
        return None
    extract = getattr(cast.operands[0].owner, "operation", None)
    if extract is None or extract.name != "tensor.extract" or len(extract.operands) != 2:
        return None
    if extract.operands[1] != row:
        return None
    table = getattr(extract.operands[0].owner, "operation", None)
    if table is None or table.name != "arith.constant":
        return None
    attr = table.attributes["value"]
    if not isinstance(attr, ir.DenseIntElementsAttr):
        return None
    counts = np.array(attr).astype(np.int64)
    if attr.is_splat:
        counts = np.full(tuple(table.results[0].type.shape), int(attr.get_splat_value().value), np.int64)
    return counts if counts.ndim == 1 else None
