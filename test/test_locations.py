"""Source locations: the ops a traced mod produces point at the user's lines, at L0 and after the
passes, so a diagnostic about them names the user's file and line."""
from __future__ import annotations

import inspect

import torch
from torch.nn.attention.flex_attention import and_masks

import ae_mlir as ae
from ae_mlir.core.context import location_parts, new_context, parse_module

SLOPES = torch.randn(2)


def alibi(score, b, h, q_idx, kv_idx):
    return score + SLOPES[h] * (kv_idx - q_idx)


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


ALIBI_BODY = alibi.__code__.co_firstlineno + 1
CAUSAL_BODY = causal.__code__.co_firstlineno + 1


def _qkv():
    q = torch.randn(1, 2, 8, 16)
    return q, q, q


def _module(text: str):
    """The parsed module; keep it referenced while its ops are in use."""
    return parse_module(text, new_context())


def _ops(module) -> list:
    found = []

    def collect(op):
        found.append(op)
        from mlir import ir

        return ir.WalkResult.ADVANCE

    module.operation.walk(collect)
    return found


def _named(module, name: str) -> list:
    return [op for op in _ops(module) if op.name == name]


def _region_ops(op) -> list:
    return [o.operation for o in op.regions[0].blocks[0].operations]


def test_mod_ops_point_at_the_mod_body_and_l0_ops_at_definition_and_call():
    attn = ae.attention(score_mod=alibi, mask_mod=causal)
    text, call_line = attn.mlir(*_qkv(), debug_info=True), inspect.currentframe().f_lineno
    module = _module(text)
    (score_mod,) = _named(module, "attn.score_mod")
    assert location_parts(score_mod.location) == (__file__, alibi.__code__.co_firstlineno, 0)
    body = _region_ops(score_mod)
    assert {location_parts(op.location)[:2] for op in body} == {(__file__, ALIBI_BODY)}
    # `SLOPES[h]` starts at column 20 of `    return score + SLOPES[h] * ...` (1-based).
    extract = next(op for op in body if op.name == "tensor.extract")
    assert location_parts(extract.location)[2] == 20
    (mask,) = _named(module, "attn.mask")
    assert {location_parts(op.location)[:2] for op in _region_ops(mask)} == {(__file__, CAUSAL_BODY)}
    for name in ("attn.score", "attn.normalize", "attn.aggregate"):
        (op,) = _named(module, name)
        assert location_parts(op.location)[:2] == (__file__, call_line), name


def test_default_text_has_no_locations():
    text = ae.attention(score_mod=alibi, mask_mod=causal).mlir(*_qkv())
    assert "loc(" not in text


def test_mods_combined_by_torch_helpers_keep_the_user_lines():
    # and_masks is defined in torch: the mask op falls back to the call, its body to causal's line.
    attn = ae.attention(mask_mod=and_masks(causal, causal))
    text, call_line = attn.mlir(*_qkv(), debug_info=True), inspect.currentframe().f_lineno
    module = _module(text)
    (mask,) = _named(module, "attn.mask")
    assert location_parts(mask.location)[:2] == (__file__, call_line)
    lines = {location_parts(op.location)[:2] for op in _region_ops(mask) if op.name == "arith.cmpi"}
    assert lines == {(__file__, CAUSAL_BODY)}


def test_user_normalizer_regions_point_at_its_functions():
    def prob(s, m):
        return torch.relu(s)

    def finalize(acc, l):
        return acc / torch.clamp(l, 1.0)

    attn = ae.attention(normalize=ae.OnlineNormalizer(prob=prob, finalize=finalize))
    module = _module(attn.mlir(*_qkv(), debug_info=True))
    (norm,) = _named(module, "attn.normalize")
    assert location_parts(norm.location)[:2] == (__file__, prob.__code__.co_firstlineno)
    finalize_ops = [o.operation for o in norm.regions[2].blocks[0].operations]
    assert {location_parts(op.location)[:2] for op in finalize_ops} == {(__file__, finalize.__code__.co_firstlineno + 1)}


def test_linear_mod_ops_point_at_the_mod_body():
    def elu1(x, b, h, t, d):
        return torch.where(x > 0, x + 1, torch.exp(x))

    q = torch.randn(1, 2, 8, 16)
    text = ae.linear_attention(q_mod=elu1).mlir(q, q, q, debug_info=True)
    module = _module(text)
    (rec,) = _named(module, "attn.linear_recurrence")
    assert {location_parts(op.location)[:2] for op in _region_ops(rec)} == {(__file__, elu1.__code__.co_firstlineno + 1)}


def test_the_compile_path_keeps_the_locations(monkeypatch):
    # Calling the attention hands the backends the located text (they parse it), while
    # attn.mlir() without debug_info prints none.
    import ae_mlir.backends

    seen = []

    def capture(text, inputs, backend, out_dtype, *args, **kwargs):
        seen.append(text)
        return [torch.zeros(1, 2, 8, 16), torch.zeros(1, 2, 8)]

    monkeypatch.setattr(ae_mlir.backends, "run", capture)
    ae.attention(score_mod=alibi, mask_mod=causal)(*_qkv())
    module = _module(seen[0])
    (score_mod,) = _named(module, "attn.score_mod")
    assert {location_parts(op.location)[:2] for op in _region_ops(score_mod)} == {(__file__, ALIBI_BODY)}
