"""Checked closure indices: `check_indices=True`, or `AE_MLIR_CHECK=1` in the environment.

By default the frontend clamps every closure-tensor index into the tensor (memory-safe, every
backend agrees; compiled FlexAttention leaves such a read undefined). In checked mode the mods'
regions, emitted without the clamp, are evaluated on the whole index grid with
`core.scalar_eval` before running, a slice of query rows (or tokens) at a time so memory stays
bounded, and the first index out of range is an IndexError naming the mod, the tensor, the
dimension and a grid point, as FlexAttention's eager reference would raise.
"""
from __future__ import annotations

import os

_POINTS = 1 << 22  # grid points evaluated at once
_ATTENTION_AXES = ("b", "h", "q_idx", "kv_idx")
_LINEAR_AXES = ("b", "h", "t", "d")


def enabled(flag: bool | None) -> bool:
    if flag is not None:
        return flag
    return os.environ.get("AE_MLIR_CHECK", "").strip() not in ("", "0")


def describe(fn, role: str) -> str:
    """`score_mod 'bias' (defined at file.py:12)`, for messages."""
    from .locations import definition_location

    name = f"{role} '{getattr(fn, '__name__', type(fn).__name__)}'"
    loc = definition_location(fn)
    return f"{name} (defined at {loc.file}:{loc.line})" if loc is not None else name


def check_module(text: str, inputs: list, n_fixed: int, mods: dict, grid: tuple | None = None,
                 linear_views: dict | None = None):
    """Raise IndexError if a region of the unclamped L0 module `text` reads a closure tensor out
    of range on `inputs` (the function's operands; closure tensors start at `n_fixed`). `mods`
    maps (op name, region number) to the description of the mod that region came from. `grid`
    (q, k, query lengths, key lengths) gives the [B, H, L, D] q and k the mods see where the
    operands are not those (paged caches, packed sequences), and per batch entry how many query
    rows and keys exist (None: all); points past them are not checked. For linear attention on
    packed sequences, `linear_views` maps a mod's region number to the [S, H, L, D] view its mod
    sees, and the grid's query lengths are the sequences' lengths."""
    import torch

    from ..core.context import new_context, parse_module
    from ..core.regions import from_region

    ctx = new_context()
    module = parse_module(text, ctx)
    with ctx:
        func = next(iter(module.body.operations))
        scale = None
        for op in func.regions[0].blocks[0].operations:
            name = op.operation.name
            if name == "attn.score":
                scale = float(op.attributes["scale"].value)
            for number, region in enumerate(op.regions):
                if (name, number) not in mods:
                    continue
                program = from_region(region)
                if program is None or not any(o.name == "tensor.extract" for o in program.ops):
                    continue
                check = _Check(program, inputs, n_fixed, mods[(name, number)], grid)
                with torch.no_grad():
                    if name == "attn.linear_recurrence":
                        check.linear(inputs[number] if linear_views is None else linear_views[number])
                    else:
                        check.attention(name == "attn.score_mod", scale)


class _Check:
    def __init__(self, program, inputs: list, n_fixed: int, mod: str, grid: tuple | None = None):
        from ..core import scalar_eval

        self.program = program
        self.n_fixed = n_fixed
        self.mod = mod
        self.externals = scalar_eval.bind_externals(program, inputs)
        self.q, self.k, self.lengths = inputs[0], inputs[1], (None, None)
        if grid is not None:
            self.q, self.k, *self.lengths = grid

    def attention(self, with_score: bool, scale: float | None):
        import torch

        b, h, lq = self.q.shape[:3]
        lk = self.k.shape[2]
        k = None
        if with_score and self._index_reads_score():
            k = self.k.to(torch.float64).repeat_interleave(h // self.k.shape[1], dim=1)
        rows = max(1, _POINTS // max(1, b * h * lk))
        for start in range(0, lq, rows):
            stop = min(lq, start + rows)
            grid = _grid((b, h, stop - start, lk), start, self.q.device)
            args = grid
            if with_score:
                score = (torch.zeros((), dtype=torch.float64, device=self.q.device) if k is None else
                         scale * self.q[:, :, start:stop].to(torch.float64) @ k.transpose(2, 3))
                args = [score] + grid
            self._run(args, grid, start, _ATTENTION_AXES)

    def linear(self, x):
        import torch

        b, h, l, d = x.shape
        rows = max(1, _POINTS // max(1, b * h * d))
        for start in range(0, l, rows):
            stop = min(l, start + rows)
            grid = _grid((b, h, stop - start, d), start, x.device)
            self._run([x[:, :, start:stop].to(torch.float64)] + grid, grid, start, _LINEAR_AXES)

    def _index_reads_score(self) -> bool:
        """Whether an index into a closure tensor depends on the score (block argument 0)."""
        tainted = {"arg0"}
        for i, op in enumerate(self.program.ops):
            if op.name == "tensor.extract" and tainted.intersection(op.operands[1:]):
                return True
            if tainted.intersection(op.operands):
                tainted.add(f"v{i}_0")
        return False

    def _run(self, args: list, grid: list, start: int, axes: tuple):
        from ..core import scalar_eval

        env = {f"arg{i}": a for i, a in enumerate(args)}
        env.update({f"ext{i}": e for i, e in enumerate(self.externals)})
        shape = tuple(max(g.shape[a] for g in grid) for a in range(4))
        for i, op in enumerate(self.program.ops):
            values = [env[key] for key in op.operands]
            if op.name == "tensor.extract":
                self._bounds(op, values, shape, start, axes, grid)
                # Points past a sequence's or entry's end were not checked: their reads are clamped.
                values = values[:1] + [index.clamp(0, size - 1) for index, size in zip(values[1:], values[0].shape)]
            env[f"v{i}_0"] = scalar_eval.eval_op(op, values, i, args[0].device)

    def _bounds(self, op, values: list, shape: tuple, start: int, axes: tuple, grid: list):
        tensor = values[0]
        source = self.program.sources[int(op.operands[0].removeprefix("ext"))]
        position = source[1] - self.n_fixed
        exists = None
        for lengths, axis in zip(self.lengths, (2, 3)):
            if lengths is not None and (axes is _ATTENTION_AXES or axis == 2):
                inside = grid[axis] < lengths.to(grid[0].device).long()[grid[0]]
                exists = inside if exists is None else exists & inside
        for axis, (index, size) in enumerate(zip(values[1:], tensor.shape)):
            bad = (index < 0) | (index >= size)
            if exists is not None:
                bad = bad & exists
            if not bool(bad.any()):
                continue
            point = bad.expand(shape).nonzero()[0].tolist()
            value = int(index.expand(shape)[tuple(point)])
            point[2] += start
            where = ", ".join(f"{n}={p}" for n, p in zip(axes, point))
            raise IndexError(
                f"{self.mod}: index {value} is out of range for dimension {axis} (size {size}) of closure "
                f"tensor {position} of shape {tuple(tensor.shape)}, e.g. at ({where}); unchecked, the index "
                f"would be clamped into [0, {size - 1}]")


def _grid(shape: tuple, start: int, device) -> list:
    """Index tensors of a 4-D grid whose third axis starts at `start`, each broadcastable."""
    import torch

    out = []
    for axis, n in enumerate(shape):
        view = [1] * 4
        view[axis] = n
        first = start if axis == 2 else 0
        out.append(torch.arange(first, first + n, dtype=torch.int64, device=device).view(view))
    return out
