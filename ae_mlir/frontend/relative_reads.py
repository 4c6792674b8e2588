"""Closure reads indexed by a function of the relative position alone, composed once per call.

T5's bias reads table[h, bucket(kv_idx - q_idx)]: a log and a few selects per score, then a
gather that depends on them, for a value that depends on the pair only through its distance
d = kv_idx - q_idx. A call with Lq queries and Lk keys has Lq + Lk - 1 distances; `compose`
evaluates the index once for each (in int64/float64, as the reference executor evaluates a mod),
gathers the table along that dimension into a tensor with Lq + Lk - 1 entries there, and the
score_mod reads it at d + Lq - 1, the form a relative-position bias has. The gather is a torch op,
so a table that requires grad gets its gradient through torch's autograd from the composed
tensor's, which the backward kernels compute as for any closure tensor.

This happens on the traced expression rather than as an IR pass because the composed tensor is a
new closure input computed from the user's tensors on every call, which only the frontend
holds; the kernels see an ordinary relative-position read. (Tabulating only the bucket at compile
time, an i32 table read before the bias, ran slower on an NVIDIA H200: two dependent gathers.)

The mods' positions run over 0..Lq-1 and 0..Lk-1 with per-entry key lengths and paged caches
too (Lk the logical cache's length), and over the longest sequences' bounds in a packed batch, so
those calls are composed alike (the index is evaluated once per index expression and shapes:
a call adds one gather). Any such index is composed but kv_idx - q_idx plus a constant, the
composed form itself: a relative-position table read at q_idx - kv_idx + c is composed too,
reversed (`_ascending`). A read at a position the distance alone does not give (a query's
position in a cache, q_idx + offset[b] - kv_idx) stays as written; the kernels read it from a
mirrored copy where it steps back along a tile's rows (passes/mirror_reads.py).
Under torch.compile the custom op takes the tensors the mods read: `kernel_closures` composes
them there and `written_gradients` adds a composed tensor's gradient back into its table.
"""
from __future__ import annotations

from collections import OrderedDict

from .module_text import signature
from .trace import F32, I1, INDEX, Capture, Expr, TraceState

# The score_mod's arguments (s, b, h, q_idx, kv_idx): positions of the two indices.
Q_IDX, KV_IDX = 3, 4
_AFFINE = {"add", "sub", "neg", "const", "cast"}


def compose(expr: Expr, state: TraceState, lq: int, lk: int) -> Expr:
    """`expr` with every composable closure read replaced by a read of its composed tensor (a new
    capture of `state`, whose captures are renumbered in first-use order)."""
    replaced: dict[int, Expr] = {}

    def rewrite(e: Expr) -> Expr:
        if id(e) in replaced:
            return replaced[id(e)]
        args = tuple(rewrite(a) for a in e.args)
        new = _composed_read(e, lq, lk) if e.op == "extract" else None
        if new is None:
            new = e if all(a is b for a, b in zip(args, e.args)) else Expr(e.op, e.type, args, e.value, e.loc)
        replaced[id(e)] = new
        return new

    out = rewrite(expr)
    if out is not expr:
        _renumber(out, state)
    return out


def _distance(e: Expr) -> int | None:
    """+1 if `e` is kv_idx - q_idx, -1 if q_idx - kv_idx, else None."""
    if e.op != "sub" or e.type != INDEX or any(a.op != "arg" for a in e.args):
        return None
    return {(KV_IDX, Q_IDX): 1, (Q_IDX, KV_IDX): -1}.get(tuple(a.value for a in e.args))


def _of_distance(e: Expr, ops: set, seen: dict | None = None) -> bool:
    """Whether `e` reads the positions only through a distance (and nothing else of the pair: no
    score, batch, head or closure tensor); collects its ops into `ops`."""
    seen = {} if seen is None else seen
    if id(e) not in seen:
        if _distance(e) is not None:
            ops.add("distance")
            seen[id(e)] = True
        elif e.op in ("arg", "extract"):
            seen[id(e)] = False
        else:
            ops.add(e.op)
            seen[id(e)] = all(_of_distance(a, ops, seen) for a in e.args)
    return seen[id(e)]


def _composed_read(e: Expr, lq: int, lk: int) -> Expr | None:
    """A read of the composed tensor replacing the closure read `e`, or None when `e` does not
    qualify (exactly one index a function of the distance, other than kv_idx - q_idx plus a
    constant, the composed form itself)."""
    cap = e.value
    found = []
    for dim, index in enumerate(e.args):
        ops: set = set()
        if _of_distance(index, ops) and "distance" in ops:
            found.append((dim, index, ops))
    if len(found) != 1:
        return None
    dim, index, ops = found[0]
    if ops <= _AFFINE | {"distance"} and _ascending(index):
        return None
    positions = _positions(index, lq, lk, cap.tensor.shape[dim], cap.tensor.device)
    if positions is None:
        return None
    gathered = cap.tensor.index_select(dim, positions)
    composed = Capture(gathered, -1, gathered, origin=(cap, dim, positions))
    distance = Expr("sub", INDEX, (Expr("arg", INDEX, value=KV_IDX), Expr("arg", INDEX, value=Q_IDX)), loc=index.loc)
    shifted = Expr("add", INDEX, (distance, Expr("const", INDEX, value=lq - 1)), loc=index.loc)
    indices = tuple(shifted if i == dim else a for i, a in enumerate(e.args))
    return Expr("extract", e.type, indices, composed, e.loc)


def _ascending(index: Expr) -> bool:
    """Whether the affine `index` of the distance steps by +1 with kv_idx: its reads along a row of
    keys are consecutive. A relative-position table read at q_idx - kv_idx + c steps by -1, which
    Triton's contiguity analysis does not see (it loads one element at a time): composing it
    reverses the table once per call."""
    import torch

    try:
        at = _evaluate(index, torch.tensor([0, 1]))
    except (_NotEvaluable, RuntimeError):
        return False
    return int(at[1] - at[0]) == 1


_POSITIONS: OrderedDict = OrderedDict()


def _positions(index: Expr, lq: int, lk: int, size: int, device):
    """The table positions `index` reads at each distance, clamped into [0, size) as the kernels
    clamp every closure index (emit.RegionEmitter._clamp), on `device`; None when the index cannot
    be evaluated. Kept per index expression, shapes and device, so that a call repeated at the
    same shapes (a CUDA graph's capture included) copies nothing to the device."""
    import torch

    # No closure read is inside an index of the distance (`_of_distance`): no positions to map.
    key = (signature(index, []), lq, lk, size, str(device))
    if key in _POSITIONS:
        _POSITIONS.move_to_end(key)
        return _POSITIONS[key]
    distances = torch.arange(-(lq - 1), lk, dtype=torch.int64)
    try:
        positions = _evaluate(index, distances).to(torch.int64).clamp(0, size - 1).to(device)
    except (_NotEvaluable, RuntimeError):  # an op it does not know, an integer division by zero
        positions = None
    _POSITIONS[key] = positions
    if len(_POSITIONS) > 256:
        _POSITIONS.popitem(last=False)
    return positions


def _renumber(root: Expr, state: TraceState) -> None:
    """Keep in `state` the captures `root` reads, numbered in first-use order (as tracing did)."""
    seen: dict[int, Capture] = {}
    visited: set[int] = set()

    def walk(e: Expr) -> None:
        if id(e) in visited:
            return
        visited.add(id(e))
        for a in e.args:
            walk(a)
        if e.op == "extract" and id(e.value) not in seen:
            seen[id(e.value)] = e.value

    walk(root)
    state.captures = list(seen.values())
    for i, cap in enumerate(state.captures):
        cap.position = i


def kernel_closures(plan: list, given: list) -> list:
    """The closure tensors of a composed module from the tensors its mods read (`given`, in the
    order of the module as written): `plan` holds, per closure tensor of the composed module,
    (its index in `given`, the dimension gathered, the positions gathered), dimension None for
    a tensor taken as it is."""
    out = []
    for j, dim, positions in plan:
        t = given[j]
        out.append(t if dim is None else t.index_select(dim, positions.to(t.device)))
    return out


def written_gradients(plan: list, given: list, grads: list) -> list:
    """The gradients of `given` (None where none reaches) from those of the composed module's
    closure tensors: a composed tensor's are added back at the positions it gathered."""
    import torch

    out = [None] * len(given)
    for (j, dim, positions), g in zip(plan, grads):
        if g is None:
            continue
        if dim is not None:
            g = torch.zeros(given[j].shape, dtype=g.dtype, device=g.device).index_add_(dim, positions.to(g.device), g)
        out[j] = g if out[j] is None else out[j] + g
    return out


class _NotEvaluable(Exception):
    pass


def _evaluate(e: Expr, distances):
    """The index expression `e` at each of `distances` (kv_idx - q_idx), int64 and float64."""
    import torch

    memo: dict[int, object] = {}
    unary = {"exp": torch.exp, "exp2": torch.exp2, "log": torch.log, "log2": torch.log2, "sqrt": torch.sqrt,
             "rsqrt": torch.rsqrt, "tanh": torch.tanh, "sin": torch.sin, "cos": torch.cos, "floor": torch.floor,
             "ceil": torch.ceil, "round": torch.round, "erf": torch.erf, "log1p": torch.log1p,
             "expm1": torch.expm1, "sigmoid": torch.sigmoid, "neg": torch.neg, "abs": torch.abs,
             "not": torch.logical_not}
    binary = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "pow": torch.pow,
              "max": torch.maximum, "min": torch.minimum, "and": torch.bitwise_and, "or": torch.bitwise_or,
              "xor": torch.bitwise_xor, "mod": torch.remainder}
    compare = {"lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge, "eq": torch.eq, "ne": torch.ne}
    dtypes = {F32: torch.float64, INDEX: torch.int64, I1: torch.bool}

    def value(x: Expr):
        if id(x) in memo:
            return memo[id(x)]
        sign = _distance(x)
        if sign is not None:
            out = distances * sign
        elif x.op == "const":
            out = torch.tensor(x.value, dtype=dtypes[x.type])
        else:
            a = [value(y) for y in x.args]
            if x.op == "cast" or x.op == "trunc":
                src = x.args[0].type
                out = (a[0] != 0) if x.type == I1 else (torch.trunc(a[0]) if src == F32 else a[0]).to(dtypes[x.type])
            elif x.op == "floordiv":
                out = torch.floor(a[0] / a[1]) if x.type == F32 else torch.div(a[0], a[1], rounding_mode="floor")
            elif x.op == "select":
                out = torch.where(a[0], a[1], a[2])
            elif x.op == "cmp":
                out = compare[x.value](a[0], a[1])
            elif x.op in unary:
                out = unary[x.op](a[0])
            elif x.op in binary:
                out = binary[x.op](a[0], a[1])
            else:
                raise _NotEvaluable(x.op)
            out = out.to(dtypes[x.type])
        memo[id(x)] = out
        return out

    return torch.broadcast_to(value(e), distances.shape)
