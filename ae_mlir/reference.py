"""The reference executor: evaluates an L0 `attn` module on torch tensors in float64.

It materializes every intermediate (scores are [B, H, Lq, Lk]), so it is the semantic oracle of
the dialect, not a fast path. Mod regions are evaluated once, vectorized over the whole index
grid, by `core.scalar_eval`, the evaluator the compiler and the runtime classify masks with.
"""
from __future__ import annotations

import math

from .core.context import CompileError, Diagnostic, location_parts
from .core.regions import from_region
from .core import abi, scalar_eval


def _error(op, message: str) -> CompileError:
    filename, line, col = location_parts(op.location)
    return CompileError(message, [Diagnostic("error", f"'{op.operation.name}' op {message}", filename, line, col)])


def _attr_float(op, name: str) -> float:
    return float(op.attributes[name].value)


def _attr_str(op, name: str) -> str:
    return op.attributes[name].value


def eval_region(region, args: list, outer: dict):
    """Evaluate a one-block mod region with `core.scalar_eval`; `args` bind its block arguments
    in order and `outer` holds the enclosing function's values (the closure tensors the region
    reads)."""
    ops = list(region.blocks[0].operations)
    try:
        program = from_region(region)
    except ValueError as err:
        raise _error(region.owner, str(err)) from None
    try:
        return scalar_eval.evaluate(program, args, [outer[v] for v in program.externals])
    except scalar_eval.ScalarEvalError as err:
        raise _error(ops[err.index], str(err)) from None


def _grid(*sizes):
    """Index tensors for a 4-D grid, each shaped to broadcast along its own axis."""
    import torch

    out = []
    for axis, n in enumerate(sizes):
        shape = [1] * len(sizes)
        shape[axis] = n
        out.append(torch.arange(n, dtype=torch.int64).view(shape))
    return out


def _as_f64(t):
    import torch

    return t.to(torch.float64) if t.dtype.is_floating_point else t


def _expand_heads(t, heads: int):
    return t.repeat_interleave(heads // t.shape[1], dim=1)


def _softmax_family(kind: str, scores, keep):
    import torch

    if keep is None:
        keep = torch.ones_like(scores, dtype=torch.bool)
    if kind == "softmax":
        masked = scores.masked_fill(~keep, -math.inf)
        row_max = masked.amax(dim=-1, keepdim=True)
        safe_max = torch.where(torch.isinf(row_max) & (row_max < 0), torch.zeros_like(row_max), row_max)
        e = torch.exp(masked - safe_max)
        total = e.sum(dim=-1, keepdim=True)
        # A row with no visible key has total 0 and gives 0; NaN scores give NaN, as in torch.
        probs = torch.where(total == 0, torch.zeros_like(e), e / torch.where(total == 0, torch.ones_like(total), total))
        lse = (safe_max + torch.log(total)).squeeze(-1)
        return probs, lse
    zero = torch.zeros_like(scores)
    if kind == "sigmoid":
        return torch.where(keep, torch.sigmoid(scores), zero), None
    if kind == "relu":
        return torch.where(keep, torch.relu(scores), zero), None
    return torch.where(keep, scores, zero), None


def _online(op, scores, keep, outer):
    """A user normalizer on a materialized row: probs = finalize(prob(s, m), l)."""
    import torch

    prob, rescale, finalize = op.regions
    if keep is None:
        keep = torch.ones_like(scores, dtype=torch.bool)
    m = torch.zeros_like(scores[..., :1])
    if list(rescale.blocks):
        m = scores.masked_fill(~keep, -math.inf).amax(dim=-1, keepdim=True)
        m = torch.where(torch.isinf(m) & (m < 0), torch.zeros_like(m), m)
    p = eval_region(prob, [scores, m], outer).to(torch.float64).expand(scores.shape)
    p = torch.where(keep, p, torch.zeros_like(p))
    total = p.sum(dim=-1, keepdim=True)
    return eval_region(finalize, [p, total], outer).to(torch.float64).expand(scores.shape).clone()


def _linear(op, env_vals, seg, outer):
    import torch

    q, k, v = (_as_f64(env_vals[i]) for i in range(3))
    pos = 3
    g = s0 = None
    if seg[3]:
        g = _as_f64(env_vals[pos])
        pos += 1
    if seg[4]:
        s0 = _as_f64(env_vals[pos])
        pos += 1
    b, h, l, dk = q.shape
    # Entry b's tokens from lengths[b] on leave the state alone and output zero.
    lengths = env_vals[pos].to(torch.int64).clamp(0, l) if len(seg) > 5 and seg[5] else None
    dv = v.shape[3]
    for region, name in zip(op.regions, ("q", "k", "v")):
        if not list(region.blocks):
            continue
        x = {"q": q, "k": k, "v": v}[name]
        ib, ih, it, idd = _grid(*x.shape)
        y = eval_region(region, [x, ib, ih, it, idd], outer).to(torch.float64)
        y = y.expand(x.shape).clone()
        if name == "q":
            q = y
        elif name == "k":
            k = y
        else:
            v = y
    decay = _attr_str(op, "decay")
    scale = _attr_float(op, "scale")
    normalize = bool(op.attributes["normalize"].value)
    state = s0.clone() if s0 is not None else torch.zeros(b, h, dk, dv, dtype=torch.float64)
    z = torch.zeros(b, h, dk, dtype=torch.float64)
    out = torch.empty(b, h, l, dv, dtype=torch.float64)
    for t in range(l):
        if decay == "head":
            factor = torch.exp(g).view(1, h, 1).expand(b, h, dk)
        elif decay == "token":
            factor = torch.exp(g[:, :, t]).unsqueeze(-1).expand(b, h, dk)
        elif decay in ("token_dim", "token_value_dim"):
            factor = torch.exp(g[:, :, t, :])
        else:
            factor = None
        before = (state, z)
        if decay == "token_value_dim":
            state = state * factor.unsqueeze(-2)
        elif factor is not None:
            state = state * factor.unsqueeze(-1)
            z = z * factor
        kt, vt, qt = k[:, :, t, :], v[:, :, t, :], q[:, :, t, :]
        state = state + kt.unsqueeze(-1) * vt.unsqueeze(-2)
        z = z + kt
        o = torch.einsum("bhd,bhde->bhe", qt, state)
        if normalize:
            o = o / torch.einsum("bhd,bhd->bh", qt, z).unsqueeze(-1)
        else:
            o = o * scale
        if lengths is not None:
            live = (t < lengths).view(b, 1, 1)
            state = torch.where(live.unsqueeze(-1), state, before[0])
            z = torch.where(live, z, before[1])
            o = torch.where(live, o, torch.zeros((), dtype=o.dtype))
        out[:, :, t, :] = o
    return out, state


def _spans(cu, rows: int, longest: int) -> list[tuple[int, int]]:
    """Each sequence's packed rows [lo, hi): clamped into the packed tensor's `rows` and cut at the
    view's `longest` rows, as the kernels clamp them."""
    offsets = [min(max(int(x), 0), rows) for x in cu.tolist()]
    return [(lo, max(lo, min(hi, lo + longest))) for lo, hi in zip(offsets, offsets[1:])]


def evaluate(module, inputs: list) -> list:
    """Run the module's single function on `inputs`; return its results as float64 tensors."""
    import torch

    funcs = [op for op in module.body.operations if op.operation.name == "func.func"]
    if len(funcs) != 1:
        raise CompileError(f"the reference executor needs exactly one func.func, found {len(funcs)}")
    func = funcs[0]
    block = func.regions[0].blocks[0]
    if len(block.arguments) != len(inputs):
        raise ValueError(f"the module takes {len(block.arguments)} tensors, got {len(inputs)}")
    env = {arg: _as_f64(t.detach().cpu()) for arg, t in zip(block.arguments, inputs)}
    packed_rows = {}  # offsets -> the rows of the packed tensor they unpacked
    for op in block.operations:
        vals = [env[v] for v in op.operands]
        name = op.operation.name
        if name == "func.return":
            return vals
        if name == "attn.score":
            q, k = vals
            kk = _expand_heads(k, q.shape[1])
            env[op.results[0]] = _attr_float(op, "scale") * torch.matmul(q, kk.transpose(-1, -2))
        elif name == "attn.score_mod":
            scores = vals[0]
            ib, ih, iq, ik = _grid(*scores.shape)
            out = eval_region(op.regions[0], [scores, ib, ih, iq, ik], env)
            env[op.results[0]] = out.to(torch.float64).expand(scores.shape).clone()
        elif name == "attn.mask":
            shape = list(op.results[0].type.shape)
            ib, ih, iq, ik = _grid(*shape)
            out = eval_region(op.regions[0], [ib, ih, iq, ik], env).to(torch.bool)
            if len(op.operands):
                out = out & (ik < vals[0].to(torch.int64)[ib])
            env[op.results[0]] = out.expand(shape).clone()
        elif name == "attn.normalize":
            seg = [int(x) for x in op.attributes["operandSegmentSizes"]]
            keep = vals[1] if seg[1] else None
            kind = _attr_str(op, "kind")
            if kind == "online":
                probs, lse = _online(op, vals[0], keep, env), None
            else:
                probs, lse = _softmax_family(kind, vals[0], keep)
            env[op.results[0]] = probs
            if len(op.results) > 1:
                env[op.results[1]] = lse
        elif name == "attn.gather_pages":
            pages, table = vals
            n_pages, heads, size, d = pages.shape
            picked = pages[table.to(torch.int64).clamp(0, n_pages - 1)]  # [B, M, Hkv, S, D]
            b, m = table.shape
            env[op.results[0]] = picked.permute(0, 2, 1, 3, 4).reshape(b, heads, m * size, d)
        elif name == "attn.unpack_sequences":
            packed, cu = vals
            view = torch.zeros(list(op.results[0].type.shape), dtype=packed.dtype)
            for s, (lo, hi) in enumerate(_spans(cu, packed.shape[2], view.shape[2])):
                view[s, :, :hi - lo] = packed[0, :, lo:hi]
            env[op.results[0]] = view
            packed_rows[op.operands[1]] = packed.shape[2]
        elif name == "attn.pack_sequences":
            view, cu = vals
            # A module of any row count (`?`) packs into as many rows as it unpacked with these offsets.
            shape = list(op.results[0].type.shape)
            shape[abi.PACKED_ROWS_DIM] = packed_rows.get(op.operands[1], shape[abi.PACKED_ROWS_DIM])
            packed = torch.zeros(shape, dtype=view.dtype)
            for s, (lo, hi) in enumerate(_spans(cu, packed.shape[2], view.shape[2])):
                packed[0, :, lo:hi] = view[s, :, :hi - lo]
            env[op.results[0]] = packed
        elif name == "attn.aggregate":
            probs, v = vals
            v = _expand_heads(v, probs.shape[1])
            # Keys no query row sees contribute nothing, even where V holds NaN there (the unfilled
            # part of a KV cache past kv_len).
            unused = ~(probs != 0).any(dim=-2).unsqueeze(-1)
            env[op.results[0]] = torch.matmul(probs, v.masked_fill(unused, 0.0))
        elif name == "attn.linear_recurrence":
            seg = [int(x) for x in op.attributes["operandSegmentSizes"]]
            out, state = _linear(op, vals, seg, env)
            env[op.results[0]] = out
            env[op.results[1]] = state
        else:
            raise _error(op, "is not supported by the reference executor (it runs L0 modules only)")
    raise CompileError("function has no func.return")


def run_module_text(text: str, inputs: list, out_dtype) -> list:
    """Parse, verify and evaluate `text`; the first result takes `out_dtype`, the rest are f32
    (f64 for a float64 `out_dtype`, so a float64 call keeps the oracle's precision throughout)."""
    import torch

    from .core.context import new_context, parse_module
    from .core.verifier import check_module

    ctx = new_context()
    module = parse_module(text, ctx)
    check_module(module)
    with ctx:
        results = evaluate(module, inputs)
    device = inputs[0].device
    first = results[0].to(dtype=out_dtype, device=device)
    rest = torch.float64 if out_dtype == torch.float64 else torch.float32
    return [first] + [r.to(dtype=rest, device=device) for r in results[1:]]
