"""Shape and region-signature rules of the `attn` dialect that IRDL cannot express.

`verify_module` walks a module and returns one located error per violated rule; callers raise
`CompileError` (Python) or print the diagnostics and exit 1 (`ae-opt`).
"""
from __future__ import annotations

from .context import CompileError, Diagnostic, location_parts

FLOAT_TYPES = ("f16", "bf16", "f32")
# q, k, v and the output of the softmax family, and q, k, v, g, initial_state and the output of
# the linear recurrence, may also be f64, which only the reference executor runs (the float64
# oracle that torch.autograd.gradcheck checks the backward against).
ATTENTION_TYPES = FLOAT_TYPES + ("f64",)
NORMALIZE_KINDS = ("softmax", "sigmoid", "relu", "none", "online")
DECAY_KINDS = ("none", "head", "token", "token_dim", "token_value_dim")


class _Fail(Exception):
    pass


def _tensor(value_type, what: str, rank: int | None = None, elts=None, dynamic_dim: int | None = None):
    from mlir import ir

    t = value_type
    if not isinstance(t, ir.RankedTensorType):
        raise _Fail(f"{what} must be a ranked tensor, got {value_type}")
    shape = list(t.shape)
    if rank is not None and len(shape) != rank:
        raise _Fail(f"{what} must have rank {rank}, got {value_type}")
    if any(ir.ShapedType.is_dynamic_size(n) for i, n in enumerate(shape) if i != dynamic_dim):
        but = "" if dynamic_dim is None else f" but for its rows (dimension {dynamic_dim})"
        raise _Fail(f"{what} must have a static shape{but}, got {value_type}")
    elt = str(t.element_type)
    if elts is not None and elt not in elts:
        raise _Fail(f"{what} must have element type {' or '.join(elts)}, got {value_type}")
    return shape, elt


def _expect(cond: bool, msg: str):
    if not cond:
        raise _Fail(msg)


def _segments(op, attr: str, n: int) -> list[list]:
    """Split operands (or results) by a segment-size attribute of n entries."""
    values = list(op.operands) if attr == "operandSegmentSizes" else list(op.results)
    if attr not in op.attributes:
        return [[v] for v in values] if len(values) == n else [values]
    sizes = [int(x) for x in op.attributes[attr]]
    out, pos = [], 0
    for size in sizes:
        out.append(values[pos : pos + size])
        pos += size
    return out


def _yielded_types(region, what: str, arg_types: list[str], optional: bool = False) -> list[str] | None:
    """The types a one-block region taking `arg_types` yields; None for an allowed empty region."""
    blocks = list(region.blocks)
    if not blocks:
        _expect(optional, f"{what} region must not be empty")
        return None
    _expect(len(blocks) == 1, f"{what} region must have exactly one block")
    block = blocks[0]
    got = [str(a.type) for a in block.arguments]
    _expect(
        got == arg_types,
        f"{what} region must take ({', '.join(arg_types)}), got ({', '.join(got)})",
    )
    ops = list(block.operations)
    _expect(bool(ops) and ops[-1].name == "gpu.yield", f"{what} region must end with gpu.yield")
    return [str(v.type) for v in ops[-1].operands]


def _check_region(region, what: str, arg_types: list[str], result_type: str, optional: bool = False):
    yielded = _yielded_types(region, what, arg_types, optional)
    if yielded is not None:
        _expect(yielded == [result_type], f"{what} region must yield one {result_type}, got ({', '.join(yielded)})")


def _check_gqa(h: int, hkv: int, what: str):
    _expect(hkv > 0 and h % hkv == 0, f"query heads ({h}) must be a multiple of {what} heads ({hkv})")


def _verify_score(op):
    (bq, h, lq, dq), _ = _tensor(op.operands[0].type, "q", 4, ATTENTION_TYPES)
    (bk, hkv, lk, dk), _ = _tensor(op.operands[1].type, "k", 4, ATTENTION_TYPES)
    _expect(bq == bk, f"q and k batch sizes differ ({bq} vs {bk})")
    _expect(dq == dk, f"q and k head dims differ ({dq} vs {dk})")
    _check_gqa(h, hkv, "k")
    shape, _ = _tensor(op.results[0].type, "scores", 4, ("f32",))
    _expect(shape == [bq, h, lq, lk], f"scores must have shape [{bq}, {h}, {lq}, {lk}], got {shape}")


def _verify_score_mod(op):
    shape, _ = _tensor(op.operands[0].type, "scores", 4, ("f32",))
    out, _ = _tensor(op.results[0].type, "result", 4, ("f32",))
    _expect(out == shape, f"result shape {out} must equal the scores shape {shape}")
    _check_region(op.regions[0], "score_mod", ["f32"] + ["index"] * 4, "f32")


def _verify_mask(op):
    shape, _ = _tensor(op.results[0].type, "mask result", 4, ("i1",))
    _check_region(op.regions[0], "mask", ["index"] * 4, "i1")
    if len(op.operands):
        _check_kv_len(op.operands[0], shape[0])


def _check_kv_len(value, batch: int):
    shape, _ = _tensor(value.type, "kv_len", 1, ("i32",))
    _expect(shape == [batch], f"kv_len must have shape [{batch}] (one length per batch entry), got {shape}")


def _verify_normalize(op):
    kind = str(op.attributes["kind"]).strip('"')
    _expect(kind in NORMALIZE_KINDS, f"unknown normalize kind '{kind}' (expected one of {', '.join(NORMALIZE_KINDS)})")
    (scores,), keep = _segments(op, "operandSegmentSizes", 2)
    shape, _ = _tensor(scores.type, "scores", 4, ("f32",))
    if keep:
        kshape, _ = _tensor(keep[0].type, "mask", 4, ("i1",))
        _expect(kshape == shape, f"mask shape {kshape} must equal the scores shape {shape}")
    (probs,), lse = _segments(op, "resultSegmentSizes", 2)
    pshape, _ = _tensor(probs.type, "probs", 4, ("f32",))
    _expect(pshape == shape, f"probs shape {pshape} must equal the scores shape {shape}")
    if lse:
        _expect(kind == "softmax", f"only softmax has a logsumexp result, not '{kind}'")
        lshape, _ = _tensor(lse[0].type, "lse", 3, ("f32",))
        _expect(lshape == shape[:3], f"lse must have shape {shape[:3]}, got {lshape}")
    filled = [bool(list(r.blocks)) for r in op.regions]
    if kind != "online":
        _expect(not any(filled), f"built-in normalize kind '{kind}' takes no regions")
        return
    for region, name, optional in zip(op.regions, ("prob", "rescale", "finalize"), (False, True, False)):
        _check_region(region, name, ["f32", "f32"], "f32", optional=optional)


def _verify_aggregate(op):
    (b, h, lq, lk), _ = _tensor(op.operands[0].type, "probs", 4, ("f32",))
    (bv, hkv, lv, dv), _ = _tensor(op.operands[1].type, "v", 4, ATTENTION_TYPES)
    _expect(b == bv, f"probs and v batch sizes differ ({b} vs {bv})")
    _expect(lk == lv, f"probs has {lk} keys but v has {lv} rows")
    _check_gqa(h, hkv, "v")
    out, _ = _tensor(op.results[0].type, "result", 4, ATTENTION_TYPES)
    _expect(out == [b, h, lq, dv], f"result must have shape [{b}, {h}, {lq}, {dv}], got {out}")


def _verify_gather_pages(op):
    (_, hkv, size, d), elt = _tensor(op.operands[0].type, "pages", 4, ATTENTION_TYPES)
    (b, m), _ = _tensor(op.operands[1].type, "block table", 2, ("i32",))
    out, out_elt = _tensor(op.results[0].type, "result", 4, ATTENTION_TYPES)
    _expect(out == [b, hkv, m * size, d], f"result must have shape [{b}, {hkv}, {m * size}, {d}] (batch, heads, "
                                          f"table width x page size, head dim), got {out}")
    _expect(out_elt == elt, f"result element type {out_elt} must be the pages' ({elt})")


def _sequence_count(value) -> int:
    (n,), _ = _tensor(value.type, "cu_seqlens", 1, ("i32",))
    _expect(n >= 2, f"cu_seqlens must hold at least two offsets (one sequence), got {n}")
    return n - 1


def _verify_unpack_sequences(op):
    packed, elt = _tensor(op.operands[0].type, "packed", None, ATTENTION_TYPES, dynamic_dim=2)
    _expect(len(packed) in (3, 4), f"packed must have rank 3 or 4, got {len(packed)}")
    _expect(packed[0] == 1, f"packed must have batch size 1, got {packed[0]}")
    s = _sequence_count(op.operands[1])
    view, velt = _tensor(op.results[0].type, "view", len(packed), ATTENTION_TYPES)
    tail = "".join(f", {x}" for x in packed[3:])
    _expect([view[0], view[1]] + view[3:] == [s, packed[1]] + packed[3:] and velt == elt,
            f"view must be [{s}, {packed[1]}, L{tail}] of {elt} (sequences, heads, longest sequence"
            f"{', head dim' if tail else ''})")


def _verify_pack_sequences(op):
    view, elt = _tensor(op.operands[0].type, "view", None, ATTENTION_TYPES)
    s = _sequence_count(op.operands[1])
    packed, pelt = _tensor(op.results[0].type, "packed", len(view), ATTENTION_TYPES, dynamic_dim=2)
    _expect(len(view) in (3, 4), f"view must have rank 3 or 4, got {len(view)}")
    _expect(view[0] == s, f"view must hold {s} sequences, got {view[0]}")
    _expect(packed[0] == 1 and packed[1] == view[1] and packed[3:] == view[3:] and pelt == elt,
            f"packed must be [1, {view[1]}, T{''.join(f', {x}' for x in view[3:])}] of {elt}, got {packed} of {pelt}")


_GRAD_ARGS = ["f32", "f32"] + ["index"] * 4


def _same_scores(op, names: list[str]) -> list[int]:
    """The shape shared by the op's first operands (f32 [B, H, Lq, Lk]) and its result."""
    shape, _ = _tensor(op.operands[0].type, names[0], 4, ("f32",))
    for value, name in zip(list(op.operands)[1 : len(names)], names[1:]):
        other, _ = _tensor(value.type, name, 4, ("f32",))
        _expect(other == shape, f"{name} shape {other} must equal the {names[0]} shape {shape}")
    return shape


def _verify_score_mod_grad(op):
    shape = _same_scores(op, ["scores", "grad"])
    out, _ = _tensor(op.results[0].type, "result", 4, ("f32",))
    _expect(out == shape, f"result shape {out} must equal the scores shape {shape}")
    _check_region(op.regions[0], "score_mod_grad", _GRAD_ARGS, "f32")


def _verify_closure_grad(op):
    _same_scores(op, ["scores", "grad"])
    shape, _ = _tensor(op.operands[2].type, "closure", None, ATTENTION_TYPES)
    out, _ = _tensor(op.results[0].type, "result", len(shape), ("f32",))
    _expect(out == shape, f"result shape {out} must equal the closure's shape {shape}")
    group = ["f32"] + ["index"] * len(shape)
    yielded = _yielded_types(op.regions[0], "closure_grad", _GRAD_ARGS)
    _expect(bool(yielded) and len(yielded) % len(group) == 0 and yielded == group * (len(yielded) // len(group)),
            f"closure_grad region must yield groups ({', '.join(group)}), one per read, got ({', '.join(yielded)})")


def _verify_normalize_grad(op):
    kind = str(op.attributes["kind"]).strip('"')
    _expect(kind in NORMALIZE_KINDS, f"unknown normalize kind '{kind}' (expected one of {', '.join(NORMALIZE_KINDS)})")
    stat = str(op.attributes["stat"]).strip('"')
    _expect(stat in ("max", "none"), f"stat must be 'max' or 'none', got '{stat}'")
    (scores,), keep, (d_probs,) = _segments(op, "operandSegmentSizes", 3)
    shape, _ = _tensor(scores.type, "scores", 4, ("f32",))
    for value, name, elts in ((keep[0] if keep else None, "mask", ("i1",)), (d_probs, "d_probs", ("f32",))):
        if value is not None:
            other, _ = _tensor(value.type, name, 4, elts)
            _expect(other == shape, f"{name} shape {other} must equal the scores shape {shape}")
    out, _ = _tensor(op.results[0].type, "result", 4, ("f32",))
    _expect(out == shape, f"result shape {out} must equal the scores shape {shape}")
    if kind != "online":
        _expect(not any(list(r.blocks) for r in op.regions), f"built-in normalize kind '{kind}' takes no regions")
        return
    for region, name in zip(op.regions[:2], ("prob", "finalize")):
        _check_region(region, name, ["f32", "f32"], "f32")
    for region, name in zip(op.regions[2:], ("prob_grad", "finalize_grad")):
        yielded = _yielded_types(region, name, ["f32"] * 3)
        _expect(yielded == ["f32", "f32"], f"{name} region must yield (f32, f32), got ({', '.join(yielded)})")


def _verify_linear(op):
    decay = str(op.attributes["decay"]).strip('"')
    _expect(decay in DECAY_KINDS, f"unknown decay kind '{decay}' (expected one of {', '.join(DECAY_KINDS)})")
    chunk = int(str(op.attributes["chunk_size"]).split(":")[0])
    _expect(chunk >= 1, f"chunk_size must be positive, got {chunk}")
    (q,), (k,), (v,), g, s0, lengths = _segments(op, "operandSegmentSizes", 6)
    (b, h, l, dk), _ = _tensor(q.type, "q", 4, ATTENTION_TYPES)
    kshape, _ = _tensor(k.type, "k", 4, ATTENTION_TYPES)
    _expect(kshape == [b, h, l, dk], f"k must have shape {[b, h, l, dk]}, got {kshape}")
    (bv, hv, lv, dv), _ = _tensor(v.type, "v", 4, ATTENTION_TYPES)
    _expect([bv, hv, lv] == [b, h, l], f"v must have shape [{b}, {h}, {l}, Dv], got {[bv, hv, lv, dv]}")
    expected_g = {"head": [h], "token": [b, h, l], "token_dim": [b, h, l, dk],
                  "token_value_dim": [b, h, l, dv]}.get(decay)
    if expected_g is None:
        _expect(not g, "decay 'none' takes no g operand")
    else:
        _expect(bool(g), f"decay '{decay}' needs a g operand of shape {expected_g}")
        gshape, _ = _tensor(g[0].type, "g", None, ATTENTION_TYPES)
        _expect(gshape == expected_g, f"g for decay '{decay}' must have shape {expected_g}, got {gshape}")
    # The normalizer's key sum z has no value columns for such a decay to act on.
    _expect(not (decay == "token_value_dim" and bool(op.attributes["normalize"].value)),
            "decay 'token_value_dim' does not take normalize = true")
    if s0:
        sshape, _ = _tensor(s0[0].type, "initial_state", 4, ATTENTION_TYPES)
        _expect(sshape == [b, h, dk, dv], f"initial_state must have shape {[b, h, dk, dv]}, got {sshape}")
    if lengths:
        shape, _ = _tensor(lengths[0].type, "lengths", 1, ("i32",))
        _expect(shape == [b], f"lengths must have shape [{b}] (one length per batch entry), got {shape}")
    out, _ = _tensor(op.results[0].type, "out", 4, ATTENTION_TYPES)
    _expect(out == [b, h, l, dv], f"out must have shape {[b, h, l, dv]}, got {out}")
    st, _ = _tensor(op.results[1].type, "final_state", 4, ("f32",))
    _expect(st == [b, h, dk, dv], f"final_state must have shape {[b, h, dk, dv]}, got {st}")
    sig = ["f32"] + ["index"] * 4
    for region, name in zip(op.regions, ("q_mod", "k_mod", "v_mod")):
        _check_region(region, name, sig, "f32", optional=True)


_RULES = {
    "attn.score": _verify_score,
    "attn.score_mod": _verify_score_mod,
    "attn.mask": _verify_mask,
    "attn.normalize": _verify_normalize,
    "attn.aggregate": _verify_aggregate,
    "attn.gather_pages": _verify_gather_pages,
    "attn.unpack_sequences": _verify_unpack_sequences,
    "attn.pack_sequences": _verify_pack_sequences,
    "attn.linear_recurrence": _verify_linear,
    "attn.score_mod_grad": _verify_score_mod_grad,
    "attn.closure_grad": _verify_closure_grad,
    "attn.normalize_grad": _verify_normalize_grad,
}


def verify_module(module) -> list[Diagnostic]:
    """Check every attn op in `module`; return the errors (empty when the module is valid)."""
    errors: list[Diagnostic] = []

    def visit(op):
        from mlir import ir

        rule = _RULES.get(op.name)
        if rule is not None:
            try:
                rule(op)
            except _Fail as fail:
                filename, line, col = location_parts(op.location)
                errors.append(Diagnostic("error", f"'{op.name}' op {fail}", filename, line, col))
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return errors


def check_module(module, source_name: str = "-") -> None:
    """Raise `CompileError` if `module` breaks a dialect rule."""
    errors = verify_module(module)
    if errors:
        raise CompileError(f"invalid attn IR in {source_name}", errors)
