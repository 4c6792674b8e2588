"""Interval evaluation of a mask `ScalarProgram` over tiles.

Classifying a mask's tiles element by element evaluates it on every (query, key) pair: B x L^2
evaluations for a mask that reads document ids per batch row. Here the program runs once per
tile on intervals instead: each value is a [lo, hi] box per (b, h, query block, KV block), each
op maps boxes to a box that holds every value the op can give inside the tile (adds, products,
clamps, comparisons, three-valued and/or/not, gathers from closure tensors as the range of the
gathered elements), and a mask whose box is [true, true] keeps every pair of the tile, [false,
false] none. The classifier (`core.block_tables.classify`) then evaluates element by element only
the tiles the boxes leave open: for document ids those on a document's edge.

Boxes over-approximate, never under-: a tile said full or empty is, and any tile may stay open.
An op the intervals do not model (a remainder of a varying divisor, sin, a float that may be NaN)
makes `tile_bounds` return None and the classifier evaluates every tile, as before. Needs only
torch, like `scalar_eval`, whose numerics (int64, float64, bool) it follows.
"""
from __future__ import annotations

from dataclasses import dataclass

from .regions import ScalarOp, ScalarProgram
from .scalar_eval import _CMPF, _CMPI, _predicate, constant_value

# The most elements of a closure tensor's range-minimum tables (a level per power of two): a
# larger tensor read by an interval is bounded by its smallest and largest element instead.
RANGE_TABLE_BUDGET = 1 << 26

_MONOTONE = ("math.exp", "math.exp2", "math.log", "math.log2", "math.sqrt", "math.tanh", "math.erf",
             "math.log1p", "math.expm1", "math.floor", "math.ceil", "math.roundeven")
_CASTS = ("arith.index_cast", "arith.index_castui", "arith.extsi", "arith.extui", "arith.sitofp",
          "arith.uitofp", "arith.extf", "arith.truncf")


class _Unsupported(Exception):
    pass


@dataclass(frozen=True)
class _Box:
    lo: object  # torch tensors broadcastable to the tile grid; bool boxes: lo = always, hi = maybe
    hi: object

    @property
    def exact(self):
        return self.lo == self.hi


def tile_bounds(program: ScalarProgram, externals: list, lead: tuple[int, int], seq_q: int, seq_k: int,
                block_m: int, block_n: int, device=None):
    """(always, never): bool [Bt, Ht, NM, NN] tensors, the tiles whose pairs the mask keeps all
    of and none of (`lead` = (Bt, Ht): the entries and heads told apart, 1 where the mask reads
    no b or h); None where the program holds an op the intervals do not model."""
    import torch

    nm, nn = -(-seq_q // block_m), -(-seq_k // block_n)
    if nm == 0 or nn == 0 or program.result_type != "i1":
        return None

    def blocks(count: int, size: int, extent: int, axis: int) -> _Box:
        shape = [1, 1, 1, 1]
        shape[axis] = count
        lo = torch.arange(count, device=device) * size
        return _Box(lo.view(shape), torch.clamp(lo + size, max=extent).sub(1).view(shape))

    b = torch.arange(lead[0], device=device).view(-1, 1, 1, 1)
    h = torch.arange(lead[1], device=device).view(1, -1, 1, 1)
    env = {"arg0": _Box(b, b), "arg1": _Box(h, h), "arg2": blocks(nm, block_m, seq_q, 2),
           "arg3": blocks(nn, block_n, seq_k, 3)}
    # An outer constant is a value; a closure tensor is read through tensor.extract (`_gather`).
    env.update({f"ext{i}": _Box(e, e) if source[0] == "constant" else e
                for i, (e, source) in enumerate(zip(externals, program.sources))})
    try:
        for i, op in enumerate(program.ops):
            env[f"v{i}_0"] = _op(op, [env[k] for k in op.operands], device)
        box = env[program.result]
    except _Unsupported:
        return None
    grid = (lead[0], lead[1], nm, nn)
    return box.lo.expand(grid).contiguous(), (~box.hi).expand(grid).contiguous()


def gathers_in_bounds(program: ScalarProgram, shapes: list, lead: tuple[int, int], seq_q: int,
                      seq_k: int) -> frozenset:
    """The positions (in `program.ops`) of the closure reads whose indices stay inside their tensor
    for every b < lead[0], h < lead[1], q_idx < seq_q and kv_idx < seq_k, from the indices'
    intervals over that whole grid (a value read from a tensor is unbounded): those need no bounds
    check when the mask is evaluated. `shapes`: each source's shape (None for a constant).

    On a GPU each check is a synchronization: the host waits for every kernel queued before the
    classification (a training step's previous backward) before it can go on. Runs on the host on
    scalars, reading no tensor."""
    import torch

    if min(lead) < 1 or seq_q < 1 or seq_k < 1:
        return frozenset()

    def span(hi: int) -> _Box:
        return _Box(torch.tensor(0), torch.tensor(hi - 1))

    env = {"arg0": span(lead[0]), "arg1": span(lead[1]), "arg2": span(seq_q), "arg3": span(seq_k)}
    for i, source in enumerate(program.sources):
        if source[0] == "constant":
            value = constant_value(source[1], source[2], "cpu")
            env[f"ext{i}"] = _Box(value, value)
        else:
            env[f"ext{i}"] = tuple(shapes[i])
    proven = set()
    for i, op in enumerate(program.ops):
        args = [env[k] for k in op.operands]
        result = None
        if op.name == "tensor.extract":
            tensor, indices = args[0], args[1:]
            if isinstance(tensor, tuple) and all(isinstance(x, _Box) for x in indices) and all(
                    0 <= int(x.lo) <= int(x.hi) < size for x, size in zip(indices, tensor)):
                proven.add(i)
        elif all(isinstance(a, _Box) for a in args):
            # Proving is a speed-up only: a value no box models leaves the reads of it checked.
            try:
                result = _op(op, args, "cpu")
            except Exception:  # noqa: BLE001
                result = None
        env[f"v{i}_0"] = result
    return frozenset(proven)


def _op(op: ScalarOp, args: list, device) -> _Box:
    import torch

    name = op.name
    if name == "arith.constant":
        value = constant_value(op.attr("value"), op.result_types[0], device)
        return _Box(value, value)
    if name == "tensor.extract":
        return _gather(args[0], args[1:])
    if any(not isinstance(a, _Box) for a in args):
        raise _Unsupported(name)
    if name in ("arith.addi", "arith.subi", "arith.muli"):
        _small(args, name == "arith.muli")
    if name in ("arith.addi", "arith.addf"):
        return _checked(args[0].lo + args[1].lo, args[0].hi + args[1].hi)
    if name in ("arith.subi", "arith.subf"):
        return _checked(args[0].lo - args[1].hi, args[0].hi - args[1].lo)
    if name in ("arith.muli", "arith.mulf"):
        a, c = args
        products = torch.stack(torch.broadcast_tensors(a.lo * c.lo, a.lo * c.hi, a.hi * c.lo, a.hi * c.hi))
        return _checked(products.amin(0), products.amax(0))
    if name in ("arith.maxsi", "arith.maximumf"):
        return _Box(torch.maximum(args[0].lo, args[1].lo), torch.maximum(args[0].hi, args[1].hi))
    if name in ("arith.minsi", "arith.minimumf"):
        return _Box(torch.minimum(args[0].lo, args[1].lo), torch.minimum(args[0].hi, args[1].hi))
    if name in ("arith.floordivsi", "arith.divsi"):
        return _divide(args[0], args[1], "floor" if name == "arith.floordivsi" else "trunc")
    if name == "arith.remsi":
        return _remainder(args[0], args[1])
    if name in _CASTS:
        # A bool widens to 0 / 1, as scalar_eval evaluates it.
        return _Box(*(x.to(torch.float64) if op.result_types[0].startswith(("f", "bf")) else
                      x.to(torch.int64) if x.dtype == torch.bool else x for x in (args[0].lo, args[0].hi)))
    if name == "arith.fptosi":
        if bool((args[0].lo.abs() > 2.0 ** 62).any() | (args[0].hi.abs() > 2.0 ** 62).any()):
            raise _Unsupported("a float to integer conversion that may overflow")
        return _Box(torch.trunc(args[0].lo).to(torch.int64), torch.trunc(args[0].hi).to(torch.int64))
    if name == "arith.negf":
        return _Box(-args[0].hi, -args[0].lo)
    if name in ("math.absf", "math.absi"):
        lo, hi = args[0].lo, args[0].hi
        zero = torch.zeros_like(lo)
        return _Box(torch.where(lo >= 0, lo, torch.where(hi <= 0, -hi, zero)), torch.maximum(-lo, hi))
    if name in _MONOTONE:
        from .scalar_eval import _tables

        f = _tables()[1][name]
        return _checked(f(args[0].lo), f(args[0].hi))
    if name == "arith.cmpi":
        return _compare(_CMPI[_predicate(op)], *args)
    if name == "arith.cmpf":
        return _compare_floats(_predicate(op), *args)
    if name in ("arith.andi", "arith.ori", "arith.xori") and op.result_types[0] == "i1":
        return _logic(name, *args)
    if name == "arith.select":
        c, a, e = args
        both = _Box(_lower(a.lo, e.lo), _upper(a.hi, e.hi))
        always, never = c.lo, ~c.hi
        return _Box(torch.where(always, a.lo, torch.where(never, e.lo, both.lo)),
                    torch.where(always, a.hi, torch.where(never, e.hi, both.hi)))
    raise _Unsupported(name)


def _lower(x, y):
    import torch

    return x & y if x.dtype == torch.bool else torch.minimum(x, y)


def _upper(x, y):
    import torch

    return x | y if x.dtype == torch.bool else torch.maximum(x, y)


def _small(args: list, product: bool) -> None:
    """Bounds of integer adds and products stay exact only while they cannot wrap: int64 bounds
    past 2^30 (for a product) or 2^61 have no interval here."""
    limit = 1 << (30 if product else 61)
    if any(bool((a.lo.abs() > limit).any() | (a.hi.abs() > limit).any()) for a in args):
        raise _Unsupported("integer bounds that may wrap")


def _checked(lo, hi) -> _Box:
    """A box of floats or ints; a NaN bound (inf - inf, 0 * inf, log of a negative) is no bound."""
    if lo.dtype.is_floating_point and bool(lo.isnan().any() | hi.isnan().any()):
        raise _Unsupported("NaN bound")
    return _Box(lo, hi)


def _divide(a: _Box, d: _Box, rounding: str) -> _Box:
    import torch

    if not bool((d.exact & (d.lo > 0)).all()):
        raise _Unsupported("a division by a varying or non-positive divisor")
    return _Box(torch.div(a.lo, d.lo, rounding_mode=rounding), torch.div(a.hi, d.lo, rounding_mode=rounding))


def _remainder(a: _Box, d: _Box) -> _Box:
    """x mod d of x in [lo, hi] >= 0 by a fixed d > 0: [lo mod d, hi mod d] where the interval
    wraps no multiple of d, else [0, d - 1]."""
    import torch

    if not bool((d.exact & (d.lo > 0)).all() and (a.lo >= 0).all()):
        raise _Unsupported("a remainder of a possibly negative value or by a varying divisor")
    lo, hi = torch.fmod(a.lo, d.lo), torch.fmod(a.hi, d.lo)
    plain = (a.hi - a.lo < d.lo) & (lo <= hi)
    return _Box(torch.where(plain, lo, torch.zeros_like(lo)), torch.where(plain, hi, d.lo - 1))


def _compare(name: str, a: _Box, c: _Box) -> _Box:
    if name in ("gt", "ge"):
        name, a, c = {"gt": "lt", "ge": "le"}[name], c, a
    if name == "lt":
        return _Box(a.hi < c.lo, a.lo < c.hi)
    if name == "le":
        return _Box(a.hi <= c.lo, a.lo <= c.hi)
    equal_always = a.exact & c.exact & (a.lo == c.lo)
    equal_maybe = (a.lo <= c.hi) & (c.lo <= a.hi)
    return _Box(equal_always, equal_maybe) if name == "eq" else _Box(~equal_maybe, ~equal_always)


def _compare_floats(predicate: int, a: _Box, c: _Box) -> _Box:
    import torch

    if predicate in (0, 14, 15, 7):  # false, uno, true, ord: no bound is NaN (_checked)
        value = torch.tensor(predicate in (15, 7), device=a.lo.device)
        return _Box(value, value)
    return _compare(_CMPF[predicate][0], a, c)


def _logic(name: str, a: _Box, c: _Box) -> _Box:
    if name == "arith.andi":
        return _Box(a.lo & c.lo, a.hi & c.hi)
    if name == "arith.ori":
        return _Box(a.lo | c.lo, a.hi | c.hi)
    # xor: exact where both are; flipped where one is exactly true; open otherwise.
    lo = (a.lo & ~c.hi) | (~a.hi & c.lo)
    hi = ~((a.lo & c.lo) | (~a.hi & ~c.hi))
    return _Box(lo, hi)


def _gather(tensor, indices: list) -> _Box:
    """The range of `tensor`'s elements over the index boxes: the elements themselves where every
    index is exact, a range-minimum lookup along the one axis that varies, else the whole
    tensor's range."""
    import torch

    if isinstance(tensor, _Box) or any(not isinstance(i, _Box) for i in indices):
        raise _Unsupported("a gather from a value that is not a closure tensor")
    if tensor.dtype.is_floating_point and bool(tensor.isnan().any()):
        raise _Unsupported("a closure tensor holding NaN")
    if not indices:
        value = _numeric(tensor)
        return _Box(value, value)
    for i, size in zip(indices, tensor.shape):
        if bool((i.lo < 0).any() | (i.hi >= size).any()):
            raise _Unsupported("an index past a closure tensor's bounds (the exact evaluation reports it)")
    varying = [axis for axis, i in enumerate(indices) if not bool(i.exact.all())]
    values = _numeric(tensor)
    if not varying:
        grid = torch.broadcast_tensors(*[i.lo for i in indices])
        value = values[tuple(grid)]
        return _Box(value, value)
    levels = max(1, tensor.shape[varying[-1]].bit_length())
    if len(varying) > 1 or values.numel() * levels > RANGE_TABLE_BUDGET:
        lo, hi = values.min(), values.max()
        return _Box(lo, hi)
    return _range_lookup(values, indices, varying[0])


def _numeric(tensor):
    import torch

    if tensor.dtype == torch.bool:
        return tensor
    return tensor.to(torch.float64) if tensor.dtype.is_floating_point else tensor.to(torch.int64)


def _range_lookup(values, indices: list, axis: int) -> _Box:
    """min and max of values[.., lo:hi + 1 along `axis`, ..] per tile, from sparse tables (the
    minima and maxima of every run of 2^k elements): two lookups per tile."""
    import torch

    moved = values.movedim(axis, -1)
    if moved.dtype == torch.bool:
        moved = moved.to(torch.int8)
    others = [i.lo for a, i in enumerate(indices) if a != axis]
    lo, hi = indices[axis].lo, indices[axis].hi
    length = hi - lo + 1
    level = torch.floor(torch.log2(length.to(torch.float64))).to(torch.int64)
    mins, maxs = moved, moved
    out_lo = out_hi = None
    for k in range(int(level.max()) + 1):
        if k:
            step = 1 << (k - 1)
            mins = torch.minimum(mins[..., :-step], mins[..., step:])
            maxs = torch.maximum(maxs[..., :-step], maxs[..., step:])
        at = level == k
        if not bool(at.any()):
            continue
        # Tiles of other levels look up element 0, inside every level's table.
        left, right = torch.where(at, lo, 0), torch.where(at, hi - (1 << k) + 1, 0)
        grid_left = torch.broadcast_tensors(*others, left)
        grid_right = torch.broadcast_tensors(*others, right)
        low = torch.minimum(mins[tuple(grid_left)], mins[tuple(grid_right)])
        high = torch.maximum(maxs[tuple(grid_left)], maxs[tuple(grid_right)])
        out_lo = low if out_lo is None else torch.where(at, low, out_lo)
        out_hi = high if out_hi is None else torch.where(at, high, out_hi)
    if values.dtype == torch.bool:
        out_lo, out_hi = out_lo.to(torch.bool), out_hi.to(torch.bool)
    return _Box(out_lo, out_hi)
