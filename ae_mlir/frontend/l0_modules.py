"""The L0 module texts of the two attention families' calls (DESIGN.md section 3), written from
the traced mods and the call's tensors with the pieces in `module_text`."""
from __future__ import annotations

from .emit import emit_region, float_literal, mlir_elt, tensor_type
from .module_text import KEEP_ALL, Captures, defined_at, func_text, region_text, types_text
from .varlen import any_rows

# The linear recurrence's feature mods, in its regions' order.
FEATURE_ROLES = ("q_mod", "k_mod", "v_mod")


def attention_module(attn, q, k, v, mods: list, clamp: bool, kv_len, block_table, sequences, b: int, lq: int,
                     lk: int, scale: float, call: str) -> tuple[str, Captures]:
    """The L0 module's text of `attn` (an `api.attention`) from its traced mods, and the closure
    tensors in its order."""
    h, dk = q.shape[1], q.shape[3]
    hkv, dv = v.shape[1], v.shape[3]
    elt = mlir_elt(q.dtype)
    tq = tensor_type((b, h, lq, dk), elt)
    tk, tv = tensor_type((b, hkv, lk, dk), elt), tensor_type((b, hkv, lk, dv), elt)
    ts = tensor_type((b, h, lq, lk), "f32")
    tm = tensor_type((b, h, lq, lk), "i1")
    to = tensor_type((b, h, lq, dv), elt)
    tl = tensor_type((b, h, lq), "f32")
    traced = {role: (expr, state) for role, expr, state in mods}
    caps = Captures()
    body = []
    scores = "%scores"
    queries, keys, values = ("%q", "%k", "%v") if block_table is None and sequences is None else (
        "%q" if sequences is None else "%q_logical", "%k_logical", "%v_logical")
    body.append(f'%scores = "attn.score"({queries}, {keys}) {{scale = {float_literal(scale)} : f32}} : ({tq}, {tk}) -> {ts}'
                + call)
    if "score_mod" in traced:
        args = [("%s", "f32"), ("%b", "index"), ("%h", "index"), ("%q_idx", "index"), ("%kv_idx", "index")]
        region = region_text(*traced["score_mod"], args, caps, "s", clamp)
        body.append(f'%modded = "attn.score_mod"({scores}) ({region}) : ({ts}) -> {ts}'
                    + defined_at(attn.score_mod, call))
        scores = "%modded"
    keep = None
    if attn.mask_mod is not None or kv_len is not None:
        mask_loc, region = call, KEEP_ALL
        if "mask_mod" in traced:
            args = [("%b", "index"), ("%h", "index"), ("%q_idx", "index"), ("%kv_idx", "index")]
            region = region_text(*traced["mask_mod"], args, caps, "m", clamp)
            mask_loc = defined_at(attn.mask_mod, call)
        operands, operand_types = "", ""
        if kv_len is not None:
            operands, operand_types = caps.add_call_tensor(kv_len), tensor_type(kv_len.shape, "i32")
        body.append(f'%keep = "attn.mask"({operands}) ({region}) : ({operand_types}) -> {tm}' + mask_loc)
        keep = "%keep"
    with_lse = attn.normalize == "softmax"
    results = "%probs, %lse" if with_lse else "%probs"
    operands = [scores] + ([keep] if keep else [])
    in_types = [ts] + ([tm] if keep else [])
    out_types = [ts] + ([tl] if with_lse else [])
    kind, regions, norm_loc = attn.normalize, "{}, {}, {}", call
    if not isinstance(kind, str):
        norm_loc = defined_at(attn.normalize.prob, call)
        from ..normalizers import region_texts

        texts = region_texts(attn.normalize)
        kind, regions = "online", ", ".join(texts.get(r, "{}") for r in ("prob", "rescale", "finalize"))
    body.append(
        f'{results} = "attn.normalize"({", ".join(operands)}) ({regions}) '
        f'{{kind = "{kind}", operandSegmentSizes = array<i32: 1, {1 if keep else 0}>, '
        f'resultSegmentSizes = array<i32: 1, {1 if with_lse else 0}>}} : {types_text(in_types)} -> {types_text(out_types)}'
        + norm_loc
    )
    body.append(f'%out = "attn.aggregate"(%probs, {values}) : ({ts}, {tv}) -> {to}' + call)
    if block_table is not None:
        table = caps.add_call_tensor(block_table)
        body[:0] = [f'%{name}_logical = "attn.gather_pages"(%{name}, {table}) : '
                    f'({tensor_type(t.shape, elt)}, {tensor_type(block_table.shape, "i32")}) -> {logical}' + call
                    for name, t, logical in (("k", k, tk), ("v", v, tv))]
    ret_vals = ["%out"] + (["%lse"] if with_lse else [])
    ret_types = [to] + ([tl] if with_lse else [])
    if sequences is not None:
        from .varlen import packed_module_lines, packed_type

        ret_vals, ret_types = packed_module_lines(body, caps, sequences, q, k, v, ret_vals, ret_types, call)

    body.append(f"return {', '.join(ret_vals)} : {', '.join(ret_types)}" + call)
    params = [f"%{name}: {tensor_type(t.shape, elt) if sequences is None else packed_type(t, elt)}"
              for name, t in (("q", q), ("k", k), ("v", v))] + [
        f"%c{i}: {t}" for i, t in enumerate(caps.types())]
    text = func_text("attention", params, ret_types, body, call)
    return text, caps


def linear_module(attn, q, k, v, g, initial_state, clamp: bool, sequences, out_dtype, scale: float,
                  exprs: dict, caps: Captures, call: str) -> str:
    """The L0 module's text of `attn` (a `linear_api.linear_attention`) from its traced mods
    (`linear_attention._trace_mods`)."""
    dk = q.shape[3]
    dv = v.shape[3]
    elt = mlir_elt(q.dtype)

    def typed(t, t_elt):
        # A packed batch's tensors take any total rows (`?`): one module serves every total.
        return tensor_type(t.shape if sequences is None or t.dim() < 3 else any_rows(t.shape), t_elt)

    tq, tk, tv = (typed(t, elt) for t in (q, k, v))
    params = [f"%q: {tq}", f"%k: {tk}", f"%v: {tv}"]
    operands = ["%q", "%k", "%v"]
    types = [tq, tk, tv]
    body = []
    if g is not None:
        tg = typed(g, mlir_elt(g.dtype))
        params.append(f"%g: {tg}")
        operands.append("%g")
        types.append(tg)
    if initial_state is not None:
        ts0 = tensor_type(initial_state.shape, mlir_elt(initial_state.dtype))
        params.append(f"%s0: {ts0}")
        operands.append("%s0")
        types.append(ts0)
    if sequences is not None:
        tensors = [t for t in (q, k, v, g, initial_state) if t is not None]
        operands, types = _unpacked_operands(sequences, operands, types, tensors, params, body, call)
    cap_types = caps.types()
    cap_names = [f"%c{i}" for i in range(len(cap_types))]
    regions = []
    args = [("%x", "f32"), ("%b", "index"), ("%h", "index"), ("%t", "index"), ("%d", "index")]
    for role in FEATURE_ROLES:
        if role in exprs:
            regions.append(emit_region(exprs[role], args, cap_names, cap_types, role[0], clamp=clamp))
        else:
            regions.append("{}")
    params += [f"%c{i}: {t}" for i, t in enumerate(cap_types)]
    b, h, l = (q.shape[0], q.shape[1], q.shape[2]) if sequences is None else \
        (sequences.kv_len.shape[0], q.shape[1], sequences.longest_q)
    elt = mlir_elt(out_dtype or q.dtype)
    to = tensor_type((b, h, l, dv), elt)
    tst = tensor_type((b, h, dk, dv), "f32")
    seg = f"1, 1, 1, {int(g is not None)}, {int(initial_state is not None)}, {int(sequences is not None)}"
    body.append(
        f'%out, %state = "attn.linear_recurrence"({", ".join(operands)}) ({", ".join(regions)}) '
        f'{{decay = "{attn.decay or "none"}", scale = {float_literal(scale)} : f32, '
        f'normalize = {str(attn.normalize).lower()}, chunk_size = {attn.chunk_size} : i64, '
        f'operandSegmentSizes = array<i32: {seg}>}} : {types_text(types)} -> ({to}, {tst}){call}')
    out = "%out"
    if sequences is not None:
        to = tensor_type((1, h, None, dv), elt)
        body.append(f'%out_packed = "attn.pack_sequences"(%out, %cu) : ({tensor_type((b, h, l, dv), elt)}, '
                    f'{tensor_type(sequences.cu_q.shape, "i32")}) -> {to}{call}')
        out = "%out_packed"
    body.append(f"return {out}, %state : {to}, {tst}{call}")
    return func_text("linear_attention", params, [to, tst], body, call)


def _unpacked_operands(sequences, operands: list, types: list, tensors: list, params: list, body: list,
                       call: str):
    """The recurrence's operands for a packed batch: views of q, k, v (and a per-token g; the
    operands' `tensors`) through attn.unpack_sequences, the initial state as it is, then the
    sequences' lengths; the lengths and offsets become parameters after the others."""
    count = sequences.kv_len.shape[0]
    t_cu = tensor_type(sequences.cu_q.shape, "i32")
    t_len = tensor_type((count,), "i32")
    params += [f"%len: {t_len}", f"%cu: {t_cu}"]
    viewed, view_types = [], []
    for name, ty, t in zip(operands, types, tensors):
        if name == "%s0" or t.dim() == 1:  # the state and a per-head g are not per token
            viewed.append(name)
            view_types.append(ty)
            continue
        view = tensor_type((count, t.shape[1], sequences.longest_q, *t.shape[3:]), mlir_elt(t.dtype))
        body.append(f'{name}_seq = "attn.unpack_sequences"({name}, %cu) : ({ty}, {t_cu}) -> {view}{call}')
        viewed.append(f"{name}_seq")
        view_types.append(view)
    return viewed + ["%len"], view_types + [t_len]
