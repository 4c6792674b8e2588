"""A call whose mods trace to the same expressions as an earlier call's takes that call's L0
module text instead of writing it again; anything the text depends on (a Python constant a mod
reads, a closure tensor's shape, the call's line, the shapes) makes it written anew."""
from __future__ import annotations

import inspect

import torch

import ae_mlir as ae
from ae_mlir.core.regions import strip_locations
from ae_mlir.frontend.api import attention

CAP = 30.0
DOC = torch.arange(64) // 16


def softcap(score, b, h, q_idx, kv_idx):
    return CAP * torch.tanh(score / CAP)


def document(b, h, q_idx, kv_idx):
    return (DOC[q_idx] == DOC[kv_idx]) & (q_idx >= kv_idx)


def _qkv(seq=64):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(1, 2, seq, 16, generator=g) for _ in range(3)]


def _written(attn, q, k, v) -> str:
    """The module (with its locations) as a call with an empty text cache writes it."""
    attn.__dict__.pop("_texts", None)
    return attn._prepare(q, k, v)[0]


def _prepare(attn, q, k, v):
    # One line for every call: the calls have the same location.
    return attn._prepare(q, k, v)


def test_a_repeated_call_takes_the_written_text():
    attn = ae.attention(score_mod=softcap, mask_mod=document)
    q, k, v = _qkv()
    (first, caps1), (second, caps2) = _prepare(attn, q, k, v), _prepare(attn, q, k, v)
    assert second is first
    assert [t is DOC for t in caps2] == [True]
    assert strip_locations(second) == strip_locations(_written(attn, q, k, v))


def test_a_changed_constant_is_traced_into_a_new_text():
    global CAP
    attn = ae.attention(score_mod=softcap)
    q, k, v = _qkv()
    before = attn(q, k, v, backend="cpu")
    text = attn._prepare(q, k, v)[0]
    try:
        CAP = 5.0
        changed = attn._prepare(q, k, v)[0]
        after = attn(q, k, v, backend="cpu")
    finally:
        CAP = 30.0
    assert changed != text and "5.0" in changed
    want = torch.softmax(5.0 * torch.tanh(q @ k.transpose(-1, -2) / 4.0 / 5.0), -1) @ v
    torch.testing.assert_close(after, want, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(before, after)


def test_a_rebound_closure_tensor_of_another_shape_writes_a_new_text():
    global DOC
    attn = ae.attention(mask_mod=document)
    q, k, v = _qkv()
    text = attn._prepare(q, k, v)[0]
    saved = DOC
    try:
        DOC = torch.arange(128) // 32
        changed, caps = attn._prepare(q, k, v)
    finally:
        DOC = saved
    assert "tensor<128xi64>" in changed and "tensor<128xi64>" not in text
    assert caps[0].shape == (128,)


def test_the_same_mask_rebound_to_new_ids_keeps_the_text_and_takes_the_new_tensor():
    global DOC
    attn = ae.attention(mask_mod=document)
    q, k, v = _qkv()
    text, _ = _prepare(attn, q, k, v)
    saved = DOC
    try:
        DOC = torch.arange(64) // 8
        again, caps = _prepare(attn, q, k, v)
        out = attn(q, k, v, backend="cpu")
    finally:
        DOC = saved
    assert again is text and caps[0] is not saved
    ids = torch.arange(64) // 8
    keep = (ids[:, None] == ids[None, :]) & torch.ones(64, 64, dtype=torch.bool).tril()
    scores = (q @ k.transpose(-1, -2) / 4.0).masked_fill(~keep, float("-inf"))
    torch.testing.assert_close(out, torch.softmax(scores, -1) @ v, atol=1e-5, rtol=1e-5)


def test_shapes_and_the_calls_line_are_part_of_the_text():
    attn = ae.attention(mask_mod=document)
    q, k, v = _qkv()
    here, line = attn.mlir(q, k, v, debug_info=True), inspect.currentframe().f_lineno
    there = attn.mlir(q, k, v, debug_info=True)
    assert f'test_module_texts.py":{line}:' in here and f'test_module_texts.py":{line + 1}:' in there
    assert f'test_module_texts.py":{line + 1}:' not in here
    assert strip_locations(here) == strip_locations(there)
    shorter = attn._prepare(*(t[:, :, :32] for t in (q, k, v)))[0]
    assert "1x2x32x16" in shorter


def test_every_attention_keeps_its_own_texts():
    first, second = attention(mask_mod=document), attention(mask_mod=lambda b, h, q, kv: q >= kv)
    q, k, v = _qkv()
    assert first._prepare(q, k, v)[0] != second._prepare(q, k, v)[0]


def test_a_differentiable_call_reuses_its_compiled_call_and_a_used_attention_pickles():
    import pickle

    from ae_mlir.frontend.autograd import compiled_call

    attn = ae.attention(score_mod=softcap, mask_mod=document)
    q, k, v = (t.requires_grad_() for t in _qkv())
    out = attn(q, k, v, backend="cpu")
    out.sum().backward()
    text = attn._prepare(q, k, v)[0]
    assert compiled_call(attn, text, q, k, v, "cpu") is compiled_call(attn, text, q, k, v, "cpu")
    copy = pickle.loads(pickle.dumps(attn))
    assert "_texts" not in copy.__dict__ and "_calls" not in copy.__dict__
    torch.testing.assert_close(copy(q, k, v, backend="cpu"), out)


GAMMA = 0.9


def test_a_user_normalizers_regions_are_written_once_per_traced_form():
    from ae_mlir.normalizers import region_texts

    global GAMMA
    normalizer = ae.OnlineNormalizer(prob=lambda s, m: torch.exp(s) * GAMMA, finalize=lambda acc, l: acc / l,
                                     name="scaled")
    first, again = region_texts(normalizer), region_texts(normalizer)
    assert again is first
    try:
        GAMMA = 0.5
        changed = region_texts(normalizer)
    finally:
        GAMMA = 0.9
    assert changed is not first and "constant 0.5" in changed["prob"] and "constant 0.9" in first["prob"]
    attn = ae.attention(mask_mod=causal_mask, normalize=normalizer)
    q, k, v = _qkv()
    text = _prepare(attn, q, k, v)[0]
    assert _prepare(attn, q, k, v)[0] is text


def causal_mask(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


QSCALE = 2.0


def _linear_prepare(layer, q, k, v, g):
    # One line for every call: the calls have the same location.
    return layer._build(q, k, v, g, None)[0]


def test_linear_attention_reuses_its_text_until_a_mod_traces_differently():
    global QSCALE
    layer = ae.linear_attention(decay="head", q_mod=lambda x: x * QSCALE)
    q, k, v = _qkv()
    g = torch.full((2,), -0.1)
    first = _linear_prepare(layer, q, k, v, g)
    assert _linear_prepare(layer, q, k, v, g) is first
    out = layer(q, k, v, g, backend="cpu")
    try:
        QSCALE = 3.0
        changed = _linear_prepare(layer, q, k, v, g)
        scaled = layer(q, k, v, g, backend="cpu")
    finally:
        QSCALE = 2.0
    assert changed != first and "constant 3.0" in changed and "constant 2.0" in first
    # The recurrence is linear in q: q * 3 gives 1.5x the output of q * 2.
    torch.testing.assert_close(scaled, out * 1.5, atol=1e-4, rtol=1e-4)
