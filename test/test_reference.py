"""Numerics of the float64 reference executor against independent plain-PyTorch formulas (softmax
attention and its normalizers here, linear attention in test_reference_linear.py).

Expected values are computed here, in float64, from materialized scores, broadcast index grids
and torch.softmax / closed-form sums; nothing from ae_mlir is used to build them, so a shared bug
in the tracer, the emitter and the reference cannot hide.
"""
from __future__ import annotations

import math

import pytest
import torch
from torch.nn.attention.flex_attention import and_masks, noop_mask, or_masks

import ae_mlir as ae
from inputs import rand

# Shapes are deliberately not multiples of 16 and B*H > 1.
B, H, LQ, LK, D = 2, 3, 17, 17, 16

TOL = {
    torch.float32: dict(atol=1e-5, rtol=1e-5),
    # Low-precision results are the float64 answer rounded once to the input dtype.
    torch.bfloat16: dict(atol=1e-2, rtol=1e-2),
    torch.float16: dict(atol=2e-3, rtol=2e-3),
}


def qkv(b=B, h=H, hkv=None, lq=LQ, lk=LK, dk=D, dv=D, dtype=torch.float32, seed=0):
    hkv = h if hkv is None else hkv
    return (rand(b, h, lq, dk, seed=seed, dtype=dtype), rand(b, hkv, lk, dk, seed=seed + 1, dtype=dtype),
            rand(b, hkv, lk, dv, seed=seed + 2, dtype=dtype))


def grids(b, h, lq, lk):
    """Index tensors b, h, q_idx, kv_idx shaped to broadcast over [B, H, Lq, Lk]."""
    return (torch.arange(b).view(-1, 1, 1, 1), torch.arange(h).view(1, -1, 1, 1),
            torch.arange(lq).view(1, 1, -1, 1), torch.arange(lk).view(1, 1, 1, -1))


def expected_attention(q, k, v, score_fn=None, keep_fn=None, scale=None, normalize="softmax"):
    """Plain float64 attention; score_fn(s, b, h, qi, ki) and keep_fn(b, h, qi, ki) act on grids."""
    q, k, v = q.double(), k.double(), v.double()
    b, h, lq, dk = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    kv_head = torch.arange(h) // (h // hkv)
    k, v = k[:, kv_head], v[:, kv_head]
    scale = 1.0 / math.sqrt(dk) if scale is None else scale
    s = scale * (q @ k.transpose(-1, -2))
    ib, ih, iq, ik = grids(b, h, lq, lk)
    if score_fn is not None:
        s = score_fn(s, ib, ih, iq, ik)
    keep = torch.ones(b, h, lq, lk, dtype=torch.bool)
    if keep_fn is not None:
        keep = keep & keep_fn(ib, ih, iq, ik)
    if normalize == "softmax":
        masked = s.masked_fill(~keep, -math.inf)
        p = torch.softmax(masked, dim=-1).nan_to_num(0.0)  # all-masked rows: 0, not NaN
        lse = torch.logsumexp(masked, dim=-1)
        return p @ v, lse
    act = {"sigmoid": torch.sigmoid, "relu": torch.relu, "none": lambda x: x}[normalize]
    return act(s).masked_fill(~keep, 0.0) @ v, None


def check(out, want, dtype=torch.float32):
    assert out.dtype == dtype
    assert not torch.isnan(out).any()
    torch.testing.assert_close(out.double(), want, check_dtype=False, **TOL[dtype])


def run(attn, q, k, v, **kw):
    return attn(q, k, v, backend="reference", **kw)


# --------------------------------------------------------------------------------------------
# masks


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


WINDOW = 5


def sliding(b, h, q_idx, kv_idx):
    return (q_idx - kv_idx <= WINDOW) & (kv_idx - q_idx <= WINDOW)


def causal_sliding(b, h, q_idx, kv_idx):
    return (q_idx >= kv_idx) & (q_idx - kv_idx <= WINDOW)


PREFIX = 6


def prefix_lm(b, h, q_idx, kv_idx):
    return (kv_idx < PREFIX) | (q_idx >= kv_idx)


MASK_CASES = {
    "full": (None, None),
    "causal": (causal, lambda b, h, qi, ki: qi >= ki),
    "sliding": (sliding, lambda b, h, qi, ki: (qi - ki).abs() <= WINDOW),
    "causal_sliding": (causal_sliding, lambda b, h, qi, ki: (qi >= ki) & (qi - ki <= WINDOW)),
    "prefix_lm": (prefix_lm, lambda b, h, qi, ki: (ki < PREFIX) | (qi >= ki)),
}


@pytest.mark.parametrize("case", list(MASK_CASES))
def test_mask_variants(case):
    mask_mod, keep_fn = MASK_CASES[case]
    q, k, v = qkv(seed=10)
    o, lse = run(ae.attention(mask_mod=mask_mod), q, k, v, return_lse=True)
    want_o, want_lse = expected_attention(q, k, v, keep_fn=keep_fn)
    check(o, want_o)
    check(lse, want_lse)


def test_causal_with_lq_neq_lk_uses_absolute_positions():
    # Lq < Lk: row i keeps keys 0..i (absolute positions, not bottom-right aligned).
    q, k, v = qkv(lq=9, lk=33, seed=11)
    o = run(ae.attention(mask_mod=causal), q, k, v)
    check(o, expected_attention(q, k, v, keep_fn=lambda b, h, qi, ki: qi >= ki)[0])


# --------------------------------------------------------------------------------------------
# score mods with captured tensors


def test_alibi_captured_slopes():
    slopes = torch.tensor([2.0 ** (-8 * (i + 1) / H) for i in range(H)])

    def alibi(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx)

    q, k, v = qkv(seed=20)
    o = run(ae.attention(score_mod=alibi, mask_mod=causal), q, k, v)
    want = expected_attention(
        q, k, v, score_fn=lambda s, b, h, qi, ki: s + slopes.double()[h] * (ki - qi),
        keep_fn=lambda b, h, qi, ki: qi >= ki)[0]
    check(o, want)


@pytest.mark.parametrize("id_dtype", [torch.int64, torch.int32])
def test_document_mask_captured_ids(id_dtype):
    doc = torch.tensor([0] * 5 + [1] * 7 + [2] * 5, dtype=id_dtype)

    def document(b, h, q_idx, kv_idx):
        return doc[q_idx] == doc[kv_idx]

    q, k, v = qkv(seed=21)
    o, lse = run(ae.attention(mask_mod=document), q, k, v, return_lse=True)
    same = doc.view(-1, 1) == doc.view(1, -1)
    want_o, want_lse = expected_attention(q, k, v, keep_fn=lambda b, h, qi, ki: same)
    check(o, want_o)
    check(lse, want_lse)


@pytest.mark.parametrize("lq,lk", [(17, 17), (9, 21)])
def test_relative_position_bias_table(lq, lk):
    bias = rand(H, lq + lk - 1, seed=22)

    def relpos(score, b, h, q_idx, kv_idx):
        return score + bias[h, q_idx - kv_idx + lk - 1]

    q, k, v = qkv(lq=lq, lk=lk, seed=23)
    o = run(ae.attention(score_mod=relpos), q, k, v)
    rel = torch.arange(lq).view(-1, 1) - torch.arange(lk).view(1, -1) + lk - 1
    table = bias.double()[:, rel]  # [H, Lq, Lk]
    check(o, expected_attention(q, k, v, score_fn=lambda s, *_: s + table)[0])


def test_tanh_softcap():
    cap = 2.5

    def softcap(score, b, h, q_idx, kv_idx):
        return cap * torch.tanh(score / cap)

    q, k, v = qkv(seed=24)
    q = q * 3  # push scores into tanh's saturating range
    o = run(ae.attention(score_mod=softcap, mask_mod=causal), q, k, v)
    want = expected_attention(q, k, v, score_fn=lambda s, *_: cap * torch.tanh(s / cap),
                              keep_fn=lambda b, h, qi, ki: qi >= ki)[0]
    check(o, want)


NB = 12  # buckets of a T5-style bias


def test_t5_bucketed_bias():
    table = rand(H, NB, seed=25)

    def t5(score, b, h, q_idx, kv_idx):
        rel = kv_idx - q_idx
        dist = torch.where(rel < 0, -rel, rel)
        # exact buckets for small distances, coarse `//` buckets beyond, clamped; sign splits halves
        half = torch.where(dist < 3, dist, 3 + torch.clamp((dist - 3) // 4, 0, NB // 2 - 4))
        bucket = half + torch.where(rel > 0, NB // 2, 0)
        return score + table[h, bucket]

    q, k, v = qkv(lq=33, lk=33, seed=26)
    o = run(ae.attention(score_mod=t5), q, k, v)
    qi, ki = torch.arange(33).view(-1, 1), torch.arange(33).view(1, -1)
    rel = ki - qi
    dist = rel.abs()
    coarse = 3 + torch.div(dist - 3, 4, rounding_mode="floor").clamp(0, NB // 2 - 4)
    bucket = torch.where(dist < 3, dist, coarse) + (rel > 0).long() * (NB // 2)
    assert 0 <= int(bucket.min()) and int(bucket.max()) < NB
    bias = table.double()[:, bucket]
    check(o, expected_attention(q, k, v, score_fn=lambda s, *_: s + bias)[0])


def test_nested_indexing_one_tensor():
    # perm[perm[i]]: the inner extract's result is the outer extract's index
    perm = torch.randperm(LK, generator=torch.Generator().manual_seed(27))

    def shuffled_causal(b, h, q_idx, kv_idx):
        return perm[perm[kv_idx]] <= q_idx

    q, k, v = qkv(seed=28)
    o = run(ae.attention(mask_mod=shuffled_causal), q, k, v)
    pp = perm[perm].view(1, -1)
    # row q keeps keys whose twice-permuted position is <= q; rows without any are all-zero
    check(o, expected_attention(q, k, v, keep_fn=lambda b, h, qi, ki: pp <= qi)[0])


def test_nested_indexing():
    # two captures of different shapes and dtypes in each op, and one shared by both ops
    doc = torch.tensor([0] * 4 + [1] * 8 + [2] * 5)
    starts = torch.tensor([0, 4, 12])

    def doc_causal(b, h, q_idx, kv_idx):
        return (kv_idx >= starts[doc[q_idx]]) & (kv_idx <= q_idx)

    offsets = rand(3, seed=27)

    def doc_bias(score, b, h, q_idx, kv_idx):
        return score + offsets[doc[kv_idx]]

    q, k, v = qkv(seed=28)
    o = run(ae.attention(score_mod=doc_bias, mask_mod=doc_causal), q, k, v)
    qi, ki = torch.arange(LQ).view(-1, 1), torch.arange(LK).view(1, -1)
    keep = (ki >= starts[doc].view(-1, 1)) & (ki <= qi)
    bias = offsets.double()[doc].view(1, -1)
    check(o, expected_attention(q, k, v, score_fn=lambda s, *_: s + bias, keep_fn=lambda *_: keep)[0])


def test_score_mod_uses_batch_and_head_indices():
    per_bh = rand(B, H, seed=29)

    def bh_bias(score, b, h, q_idx, kv_idx):
        return score * (1 + b) + per_bh[b, h] * kv_idx

    q, k, v = qkv(seed=30)
    o = run(ae.attention(score_mod=bh_bias), q, k, v)
    pb = per_bh.double().view(B, H, 1, 1)
    check(o, expected_attention(q, k, v, score_fn=lambda s, b, h, qi, ki: s * (1 + b) + pb * ki)[0])


def test_python_modulo_on_negative_differences():
    def every_third(b, h, q_idx, kv_idx):
        return (q_idx - kv_idx) % 3 == 0

    q, k, v = qkv(lq=13, lk=20, seed=31)
    o = run(ae.attention(mask_mod=every_third), q, k, v)
    keep = lambda b, h, qi, ki: torch.remainder(qi - ki, 3) == 0
    check(o, expected_attention(q, k, v, keep_fn=keep)[0])


@pytest.mark.parametrize("op,torch_op", [
    ("arith.remsi", lambda x, y: torch.fmod(x, y)),
    ("arith.divsi", lambda x, y: torch.div(x, y, rounding_mode="trunc")),
    ("arith.floordivsi", lambda x, y: torch.div(x, y, rounding_mode="floor")),
])
def test_reference_integer_division_ops_keep_mlir_semantics(op, torch_op):
    # The frontend never emits divsi and wraps remsi in a sign fix-up, so hand-edit a traced module:
    # remsi/divsi truncate toward zero (C), floordivsi floors; the oracle must not blur them.
    from ae_mlir.reference import run_module_text

    q, k, v = qkv(lq=7, lk=11, seed=32)
    attn = ae.attention(mask_mod=lambda b, h, q_idx, kv_idx: (q_idx - kv_idx) // 3 == -1, normalize="none")
    text = attn.mlir(q, k, v)
    assert text.count("arith.floordivsi") == 1
    (o,) = run_module_text(text.replace("arith.floordivsi", op), [q, k, v], torch.float32)
    keep = lambda b, h, qi, ki: torch_op(qi - ki, 3) == -1
    check(o, expected_attention(q, k, v, keep_fn=keep, normalize="none")[0])


# --------------------------------------------------------------------------------------------
# shapes, GQA, dtypes, layout


@pytest.mark.parametrize("hkv", [2, 1])
def test_gqa(hkv):
    q, k, v = qkv(h=4, hkv=hkv, seed=40)
    # a head-dependent bias makes a wrong kv-head mapping visible even with shared k/v
    slopes = rand(4, seed=41)
    o = run(ae.attention(score_mod=lambda s, b, h, qi, ki: s + slopes[h] * ki, mask_mod=causal), q, k, v)
    want = expected_attention(q, k, v, score_fn=lambda s, b, h, qi, ki: s + slopes.double()[h] * ki,
                              keep_fn=lambda b, h, qi, ki: qi >= ki)[0]
    check(o, want)


def test_gqa_head_mapping_is_blocked_not_interleaved():
    # head h reads kv head h // (H // Hkv): heads 0,1 -> kv 0 and heads 2,3 -> kv 1
    q, k, v = qkv(h=4, hkv=2, seed=42)
    o = run(ae.attention(), q, k, v)
    for h in range(4):
        want = expected_attention(q[:, h:h + 1], k[:, h // 2:h // 2 + 1], v[:, h // 2:h // 2 + 1])[0]
        check(o[:, h:h + 1], want)


def test_lq_neq_lk_and_dk_neq_dv():
    q, k, v = qkv(lq=9, lk=33, dk=24, dv=40, seed=43)
    o, lse = run(ae.attention(), q, k, v, return_lse=True)
    assert o.shape == (B, H, 9, 40) and lse.shape == (B, H, 9)
    want_o, want_lse = expected_attention(q, k, v)
    check(o, want_o)
    check(lse, want_lse)


@pytest.mark.parametrize("dk,dv", [(80, 96), (192, 40), (256, 256)])
def test_large_and_odd_head_dims(dk, dv):
    q, k, v = qkv(lq=9, lk=11, dk=dk, dv=dv, seed=39)
    o, lse = run(ae.attention(mask_mod=causal), q, k, v, return_lse=True)
    want_o, want_lse = expected_attention(q, k, v, keep_fn=lambda b, h, qi, ki: qi >= ki)
    check(o, want_o)
    check(lse, want_lse)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_dtypes(dtype):
    q, k, v = qkv(dtype=dtype, seed=44)
    slopes = rand(H, seed=45)  # f32 closure with low-precision q/k/v
    o, lse = run(ae.attention(score_mod=lambda s, b, h, qi, ki: s - slopes[h].abs() * (qi - ki).abs(),
                              mask_mod=sliding), q, k, v, return_lse=True)
    want_o, want_lse = expected_attention(
        q, k, v, score_fn=lambda s, b, h, qi, ki: s - slopes.double()[h].abs() * (qi - ki).abs(),
        keep_fn=lambda b, h, qi, ki: (qi - ki).abs() <= WINDOW)
    check(o, want_o, dtype)
    assert lse.dtype == torch.float32
    check(lse, want_lse)


@pytest.mark.parametrize("scale", [0.3, 2, 1e-3, 1e-5])  # 1e-5 prints in exponent form
def test_custom_scale(scale):
    q, k, v = qkv(seed=46)
    # score_mod sees the already scaled score
    o = run(ae.attention(score_mod=lambda s, b, h, qi, ki: s * s, scale=scale), q, k, v)
    check(o, expected_attention(q, k, v, score_fn=lambda s, *_: s * s, scale=scale)[0])


def test_non_contiguous_blhd_input():
    gen = [rand(B, LK, H, D, seed=s).transpose(1, 2) for s in (47, 48, 49)]
    q, k, v = gen
    assert not q.is_contiguous()
    o = run(ae.attention(mask_mod=causal), q, k, v)
    check(o, expected_attention(q.contiguous(), k.contiguous(), v.contiguous(),
                                keep_fn=lambda b, h, qi, ki: qi >= ki)[0])


# --------------------------------------------------------------------------------------------
# normalizers, lse, fully masked rows


@pytest.mark.parametrize("normalize", ["sigmoid", "relu", "none"])
def test_non_softmax_normalizers_with_mask(normalize):
    q, k, v = qkv(seed=50)
    o = run(ae.attention(mask_mod=causal_sliding, normalize=normalize), q, k, v)
    keep = lambda b, h, qi, ki: (qi >= ki) & (qi - ki <= WINDOW)
    check(o, expected_attention(q, k, v, keep_fn=keep, normalize=normalize)[0])


def test_sigmoid_with_score_mod_bias():
    # sigmoid attention typically adds a -log(L) bias; the bias goes inside the sigmoid
    q, k, v = qkv(seed=51)
    o = run(ae.attention(score_mod=lambda s, b, h, qi, ki: s - math.log(LK), normalize="sigmoid"), q, k, v)
    check(o, expected_attention(q, k, v, score_fn=lambda s, *_: s - math.log(LK), normalize="sigmoid")[0])


def test_return_lse_matches_logsumexp():
    q, k, v = qkv(lq=21, lk=13, seed=52)
    o, lse = run(ae.attention(), q, k, v, return_lse=True)
    s = (q.double() @ k.double().transpose(-1, -2)) / math.sqrt(D)
    check(lse, torch.logsumexp(s, dim=-1))
    # and o is consistent with lse: o = exp(s - lse) v
    check(o, torch.exp(s - lse.double().unsqueeze(-1)) @ v.double())


@pytest.mark.parametrize("normalize", ["softmax", "sigmoid", "relu", "none"])
def test_fully_masked_rows(normalize):
    def late_start(b, h, q_idx, kv_idx):
        return (q_idx >= 3) & (kv_idx <= q_idx)

    q, k, v = qkv(seed=53)
    attn = ae.attention(mask_mod=late_start, normalize=normalize)
    if normalize == "softmax":
        o, lse = run(attn, q, k, v, return_lse=True)
        assert not torch.isnan(lse).any()
        assert torch.isneginf(lse[:, :, :3]).all()
        assert torch.isfinite(lse[:, :, 3:]).all()
    else:
        o = run(attn, q, k, v)
    assert not torch.isnan(o).any()
    assert (o[:, :, :3] == 0).all()
    want = expected_attention(q, k, v, keep_fn=lambda b, h, qi, ki: (qi >= 3) & (ki <= qi), normalize=normalize)
    check(o, want[0])


# --------------------------------------------------------------------------------------------
# FlexAttention helpers used verbatim


def test_flex_attention_mask_combinators():
    def window(b, h, q_idx, kv_idx):
        return q_idx - kv_idx <= WINDOW

    def sink(b, h, q_idx, kv_idx):
        return kv_idx < 2

    mask_mod = and_masks(causal, or_masks(window, sink), noop_mask)
    q, k, v = qkv(seed=60)
    o = run(ae.attention(mask_mod=mask_mod), q, k, v)
    keep = lambda b, h, qi, ki: (qi >= ki) & ((qi - ki <= WINDOW) | (ki < 2))
    check(o, expected_attention(q, k, v, keep_fn=keep)[0])


def test_noop_mask_and_empty_combinators_keep_everything():
    q, k, v = qkv(seed=61)
    want = expected_attention(q, k, v)[0]
    for mask_mod in (noop_mask, and_masks()):
        check(run(ae.attention(mask_mod=mask_mod), q, k, v), want)
    # or_masks() of nothing keeps nothing: every row is fully masked
    assert (run(ae.attention(mask_mod=or_masks()), q, k, v) == 0).all()


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_matches_flex_attention_eager():
    # The same mods run by FlexAttention itself (eager CPU) give the same answer.
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    slopes = rand(H, seed=62)

    def alibi(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx)

    q, k, v = qkv(seed=63)
    mine = run(ae.attention(score_mod=alibi, mask_mod=prefix_lm), q, k, v)
    bm = create_block_mask(prefix_lm, B, H, LQ, LK, device="cpu")
    theirs = flex_attention(q, k, v, score_mod=alibi, block_mask=bm)
    torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=1e-5)
