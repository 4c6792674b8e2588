"""The backward of attention as torch evaluating the derivative regions that `attn-differentiate`
compiles from the forward L0 module: what autograd runs when the backward kernels do not apply
(user normalizers, the reference backend; frontend/autograd.py).

`Derivative.of(text)` runs the pass on the forward module and reads its `<name>_grad` function
into scalar programs (the score_mod and mask, the normalizer's derivative, the chain rule through
the score_mod and the closure-tensor gradients). `attention_backward` evaluates them with
`core.scalar_eval` one block of query rows at a time: a block holds every key of its rows, so
the row sums the normalizers need are at hand, and no tensor of the full [B, H, Lq, Lk] size
exists at once when Lq is large. The algebra around the regions is FlashAttention's: P from the
saved logsumexp, dP = dO V^T, dV = P^T dO, dQ = scale dS K, dK = scale dS^T Q, with dK and dV
summed over each GQA group. Softmax's dS = P (dP - rowsum(P dP)) takes the row sum from the
recomputed P in float32 rather than as rowsum(dO O) (FlashAttention's way, for kernels that never
hold a whole row): O rounded to bfloat16 leaves each row of dS summing to that rounding error,
which the gradient of a position-dependent closure tensor (ALiBi slopes) adds up over the row,
about 4% off in a bfloat16 test against 0.2% this way.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from ..core import scalar_eval
from ..core.regions import ScalarProgram

# Elements of one [B, H, rows, Lk] block; a dozen such tensors are alive while a block is worked
# on (scores, probabilities, their gradients, the regions' temporaries).
BLOCK_ELEMENTS = 1 << 20
# The frontend's forward function takes q, k, v, then the closure tensors.
_FIRST_CLOSURE_ARG = 3


@dataclass(frozen=True)
class Derivative:
    """The programs of one attention's `<name>_grad` function."""

    kind: str
    stat: str
    score_mod: ScalarProgram | None
    mask: ScalarProgram | None
    normalizer: tuple  # prob, finalize, prob_grad, finalize_grad (None for built-in kinds)
    score_mod_grad: ScalarProgram | None
    closure_grads: tuple[tuple[int, ScalarProgram], ...]  # (closure tensor position, program)
    closures: tuple[int, ...]  # per closure parameter of the grad function, its closure position

    @staticmethod
    @functools.lru_cache(maxsize=64)
    def of(text: str) -> "Derivative":
        """The derivative of the forward module `text`; `CompileError` when attn-differentiate
        cannot build it. Building it parses the module, so a machine with the MLIR bindings also
        records it in the cache (`<cache_dir>/derivatives/`), beside the kernels it compiles; a
        machine without them, which runs kernels compiled elsewhere, reads that record."""
        try:
            import mlir  # noqa: F401
        except ImportError:
            return _recorded(text)
        derivative = Derivative._differentiate(text)
        _record(text, derivative)
        return derivative

    @staticmethod
    def _differentiate(text: str) -> "Derivative":
        from ..core.context import new_context, parse_module
        from ..core.regions import from_region
        from ..passes import create_pass
        from ..passes.differentiate import CLOSURE_ARGS

        ctx = new_context()
        module = parse_module(text, ctx)
        with ctx:
            create_pass("attn-differentiate").apply(module.operation)
            grad = next(op for op in module.body.operations if CLOSURE_ARGS in op.attributes)
            closures = tuple(int(a) - _FIRST_CLOSURE_ARG for a in grad.attributes[CLOSURE_ARGS])
            found = {"closure_grads": []}
            for op in grad.regions[0].blocks[0].operations:
                name = op.operation.name
                if name in ("attn.score_mod", "attn.mask", "attn.score_mod_grad"):
                    found[name] = from_region(op.regions[0])
                elif name == "attn.closure_grad":
                    position = closures[op.operands[2].arg_number - 2]
                    found["closure_grads"].append((position, from_region(op.regions[0])))
                elif name == "attn.normalize_grad":
                    found["kind"] = op.attributes["kind"].value
                    found["stat"] = op.attributes["stat"].value
                    found["normalizer"] = tuple(from_region(r) for r in op.regions)
        return Derivative(found["kind"], found["stat"], found.get("attn.score_mod"), found.get("attn.mask"),
                          found["normalizer"], found.get("attn.score_mod_grad"), tuple(found["closure_grads"]),
                          closures)

    def externals(self, program: ScalarProgram, captures: list, device) -> list:
        """The closure tensors and constants `program` reads (its sources name grad-function
        arguments: d_scores and d_probs first, then the closure parameters)."""
        operands = [None, None] + [captures[p] for p in self.closures]
        return scalar_eval.bind_externals(program, operands, device)


class _Block:
    """One block of query rows [i0, i1): its index grid and the programs' evaluation on it."""

    def __init__(self, derivative: Derivative, captures: list, shape: tuple, i0: int, i1: int, device):
        import torch

        b, h, _, lk = shape
        self.derivative, self.captures, self.device = derivative, captures, device
        self.grid = [torch.arange(b, device=device).view(b, 1, 1, 1), torch.arange(h, device=device).view(1, h, 1, 1),
                     torch.arange(i0, i1, device=device).view(1, 1, i1 - i0, 1),
                     torch.arange(lk, device=device).view(1, 1, 1, lk)]

    def run(self, program: ScalarProgram, args: list, like) -> list:
        """Every value `program` yields, broadcast to the block (`like`'s shape) in its dtype;
        index values stay integers."""
        import torch

        values = scalar_eval.evaluate_all(program, args, self.derivative.externals(program, self.captures, self.device),
                                          self.device)
        return [torch.broadcast_to(v.to(like.dtype) if v.dtype.is_floating_point else v, like.shape)
                for v in values]


def attention_backward(derivative: Derivative, scale: float, q, k, v, captures: list, lse, d_out, d_lse=None,
                       closures_wanted=None):
    """dq, dk, dv (in q's, k's and v's dtypes) and one gradient per closure tensor (its dtype;
    None where no gradient reaches it or `closures_wanted[i]` is false), computed in float32
    (float64 for float64 inputs).

    `lse` is the forward's logsumexp (softmax; None otherwise), `d_out` and `d_lse` (None: zero)
    the gradients with respect to the output and the logsumexp.
    """
    import torch

    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    b, h, lq, dk_dim = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    group = h // hkv
    keys = k.to(work).repeat_interleave(group, dim=1)
    values = v.to(work).repeat_interleave(group, dim=1)
    dq = torch.empty(b, h, lq, dk_dim, dtype=work, device=q.device)
    dk = torch.zeros(b, h, lk, dk_dim, dtype=work, device=q.device)
    dv = torch.zeros(b, h, lk, v.shape[3], dtype=work, device=q.device)
    # Closure gradients accumulate in float64 with index_put_(accumulate=True), block after block:
    # on the CPU that kernel adds float64 values serially in index order, on CUDA it sorts the
    # indices first, so every run adds in the same order and gives the same bits.
    # A constant table (a buffer, fixed ALiBi slopes) costs a full-grid scatter per block for
    # nothing: only the closure tensors autograd asks about are accumulated.
    closure_grads = {p: torch.zeros(captures[p].shape, dtype=torch.float64, device=q.device)
                     for p, _ in derivative.closure_grads if closures_wanted is None or closures_wanted[p]}
    rows = max(1, BLOCK_ELEMENTS // max(1, b * h * lk))
    for i0 in range(0, lq, rows):
        i1 = min(lq, i0 + rows)
        block = _Block(derivative, captures, (b, h, lq, lk), i0, i1, q.device)
        q_rows, d_out_rows = q[:, :, i0:i1].to(work), d_out[:, :, i0:i1].to(work)
        scores = (q_rows * scale) @ keys.transpose(-1, -2)
        modded = scores
        if derivative.score_mod is not None:
            (modded,) = block.run(derivative.score_mod, [scores, *block.grid], scores)
        keep = None
        if derivative.mask is not None:
            (keep,) = block.run(derivative.mask, block.grid, scores)
        d_probs = d_out_rows @ values.transpose(-1, -2)
        rows_of = (lambda t: None if t is None else t[:, :, i0:i1].to(work))
        probs, d_modded = _normalize_backward(block, modded, keep, d_probs, rows_of(lse), rows_of(d_lse))
        dv += probs.transpose(-1, -2) @ d_out_rows
        d_scores = d_modded
        if derivative.score_mod_grad is not None:
            (d_scores,) = block.run(derivative.score_mod_grad, [scores, d_modded, *block.grid], scores)
            if keep is not None:
                # A masked pair's local derivative may be inf or NaN (sqrt(i - j) above the causal
                # diagonal), and 0 * inf is NaN: select, do not multiply.
                d_scores = torch.where(keep, d_scores, 0.0)
        dq[:, :, i0:i1] = scale * (d_scores @ keys)
        dk += scale * (d_scores.transpose(-1, -2) @ q_rows)
        for position, program in derivative.closure_grads:
            if position not in closure_grads:
                continue
            _accumulate(closure_grads[position], block.run(program, [scores, d_modded, *block.grid], scores), keep)
    dk = dk.view(b, hkv, group, lk, dk_dim).sum(2)
    dv = dv.view(b, hkv, group, lk, v.shape[3]).sum(2)
    d_captures = [closure_grads[p].to(t.dtype) if p in closure_grads else None for p, t in enumerate(captures)]
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), d_captures


def _accumulate(total, values: list, keep) -> None:
    """Add each (value, index_0, ..., index_{r-1}) group of a closure_grad region into `total`,
    leaving out the pairs the mask drops (`keep` False; None keeps all): their values may be NaN
    from a non-finite local derivative, and their indices may point anywhere."""
    import torch

    width = 1 + total.dim()
    for start in range(0, len(values), width):
        group = values[start : start + width]
        if keep is not None:
            group = [t[keep] for t in group]
        value = group[0].to(torch.float64).reshape(-1)
        indices = tuple(i.reshape(-1) for i in group[1:])
        total.index_put_(indices, value, accumulate=True)


def _normalize_backward(block: _Block, modded, keep, d_probs, lse, d_lse):
    """The probabilities of a block and the gradient of the modified scores (attn.normalize_grad's
    meaning); softmax takes P from the saved logsumexp."""
    import torch

    derivative = block.derivative
    kind = derivative.kind
    visible = torch.ones_like(modded, dtype=torch.bool) if keep is None else keep
    zero = torch.zeros((), dtype=modded.dtype, device=modded.device)
    if kind == "softmax":
        lse = lse.unsqueeze(-1)
        probs = torch.where(visible & torch.isfinite(lse), torch.exp(modded - lse), zero)
        shift = (probs * d_probs).sum(-1, keepdim=True)
        if d_lse is not None:
            shift = shift - d_lse.unsqueeze(-1)
        return probs, probs * (d_probs - shift)
    if kind == "sigmoid":
        probs = torch.where(visible, torch.sigmoid(modded), zero)
        return probs, d_probs * probs * (1 - probs)
    if kind == "relu":
        probs = torch.where(visible, torch.relu(modded), zero)
        return probs, torch.where(visible & (modded > 0), d_probs, zero)
    if kind == "none":
        return torch.where(visible, modded, zero), torch.where(visible, d_probs, zero)
    return _online_backward(block, modded, visible, d_probs, zero)


def _online_backward(block: _Block, modded, visible, d_probs, zero):
    """A user normalizer: probs = finalize(p, l) with p = prob(s, m) on visible entries (0 on the
    others), l = rowsum(p) and m the visible row max (0 for a row with none) or 0."""
    import torch

    derivative = block.derivative
    prob, finalize, prob_grad, finalize_grad = derivative.normalizer
    m = torch.zeros_like(modded[..., :1])
    if derivative.stat == "max":
        masked = modded.masked_fill(~visible, -torch.inf)
        m = masked.amax(dim=-1, keepdim=True)
        unseen = torch.isinf(m) & (m < 0)
        m = torch.where(unseen, zero, m)
    m_full = torch.broadcast_to(m, modded.shape)
    (p,) = block.run(prob, [modded, m_full], modded)
    p = torch.where(visible, p, zero)
    total = p.sum(dim=-1, keepdim=True)
    total_full = torch.broadcast_to(total, modded.shape)
    (probs,) = block.run(finalize, [p, total_full], modded)
    d_p, d_total = block.run(finalize_grad, [p, total_full, d_probs], modded)
    d_p = torch.where(visible, d_p + d_total.sum(dim=-1, keepdim=True), zero)
    d_modded, d_m = block.run(prob_grad, [modded, m_full, d_p], modded)
    d_modded = torch.where(visible, d_modded, zero)
    if derivative.stat == "max":
        # d(row max)/ds goes to the first visible entry equal to the max, as torch.max's gradient
        # does and the backward kernels do (tile_backward_running_max); a row with no visible
        # entry has the constant m = 0.
        d_m = torch.where(visible & ~unseen, d_m, zero).sum(dim=-1, keepdim=True)
        d_modded = d_modded.scatter_add(-1, masked.argmax(dim=-1, keepdim=True), d_m)
    return probs, d_modded


def _derivative_path(text: str):
    from .. import runtime
    from ..core.regions import strip_locations
    from ..disk_cache import cache_dir

    return cache_dir() / "derivatives" / f"{runtime.cache_key(strip_locations(text), 'derivative', {})}.json"


def _program_json(program: ScalarProgram | None):
    return None if program is None else program.to_json()


def _program(data: str | None) -> ScalarProgram | None:
    return None if data is None else ScalarProgram.from_json(data)


def _record(text: str, derivative: Derivative) -> None:
    """Write the derivative's record, where its programs serialize (each reads only closure
    tensors and constants) and the cache is writable; otherwise a machine without the MLIR
    bindings cannot train this attention, and says so (`_recorded`)."""
    import json

    from ..disk_cache import atomic_write

    path = _derivative_path(text)
    if path.exists():  # recorded by an earlier process: the same sources give the same record
        return
    d = derivative
    try:
        data = {"kind": d.kind, "stat": d.stat, "score_mod": _program_json(d.score_mod), "mask": _program_json(d.mask),
                "normalizer": [_program_json(p) for p in d.normalizer],
                "score_mod_grad": _program_json(d.score_mod_grad),
                "closure_grads": [[position, p.to_json()] for position, p in d.closure_grads],
                "closures": list(d.closures)}
        atomic_write(path, json.dumps(data))
    except (ValueError, OSError):
        pass


def _recorded(text: str) -> Derivative:
    import json

    from ..core.context import CompileError

    try:
        data = json.loads(_derivative_path(text).read_text())
    except (OSError, ValueError):
        raise CompileError("the MLIR bindings are not installed to differentiate this attention and no machine "
                           "that compiled its kernels recorded its derivative in this cache; run the backward "
                           "once where ae-mlir compiles (it records it beside the kernels) and ship the cache")
    return Derivative(data["kind"], data["stat"], _program(data["score_mod"]), _program(data["mask"]),
                      tuple(_program(p) for p in data["normalizer"]), _program(data["score_mod_grad"]),
                      tuple((int(position), _program(p)) for position, p in data["closure_grads"]),
                      tuple(int(c) for c in data["closures"]))
