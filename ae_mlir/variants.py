"""The variant catalogue: attention variants as a user writes them, a few lines each.

Tests, benchmarks and the README draw from here. `build(name, shape, device)` returns the
`ae.attention` object and the head counts / head dims it wants, with closure tensors (slopes,
document ids, bias tables) created for that shape on that device. FlexAttention users will
recognize the mods: they have its signatures and use only torch operations.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable

WINDOW = 256
SOFTCAP = 30.0
T5_BUCKETS = 32
T5_MAX_DISTANCE = 128
RETNET_GAMMA = 1 - 2.0 ** -5
# The tempered softmax entry: softmax(s / TEMPERATURE) through a user normalizer.
TEMPERATURE = 0.5


@dataclass(frozen=True)
class Shape:
    batch: int
    heads: int
    seq_q: int
    seq_k: int
    dim_qk: int
    dim_v: int
    heads_kv: int | None = None

    @property
    def kv_heads(self) -> int:
        return self.heads if self.heads_kv is None else self.heads_kv


@dataclass(frozen=True)
class Variant:
    name: str
    summary: str
    make: Callable  # (shape, device, generator) -> ae.attention
    adjust: Callable[[Shape], Shape] = lambda s: s
    causal_like: bool = False  # about half the tiles visible (for FLOP counts)
    per_entry: bool = False  # the mask reads b: each batch entry has its own (a closure tensor per row)


def _causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def _full(shape, device, gen):
    import ae_mlir as ae

    return ae.attention()


def _causal_attention(shape, device, gen):
    import ae_mlir as ae

    return ae.attention(mask_mod=_causal)


def _sliding(shape, device, gen):
    import ae_mlir as ae

    def sliding_window(b, h, q_idx, kv_idx):
        return (q_idx - kv_idx).abs() <= WINDOW

    return ae.attention(mask_mod=sliding_window)


def _causal_sliding(shape, device, gen):
    import ae_mlir as ae

    def causal_window(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx <= WINDOW)

    return ae.attention(mask_mod=causal_window)


def _prefix_lm(shape, device, gen):
    import ae_mlir as ae

    prefix = shape.seq_k // 4

    def prefix_lm(b, h, q_idx, kv_idx):
        return (kv_idx < prefix) | (q_idx >= kv_idx)

    return ae.attention(mask_mod=prefix_lm)


def _document(shape, device, gen):
    import torch

    import ae_mlir as ae

    lengths = torch.randint(shape.seq_k // 8, shape.seq_k // 2 + 1, (shape.seq_k,), generator=gen)
    doc = torch.repeat_interleave(torch.arange(len(lengths)), lengths)[: shape.seq_k].to(device)

    def document(b, h, q_idx, kv_idx):
        return (doc[q_idx] == doc[kv_idx]) & (q_idx >= kv_idx)

    return ae.attention(mask_mod=document)


def _document_rows(shape, device, gen):
    """Each batch row packs its own documents (ids [B, L]), as a training batch of packed rows does."""
    import torch

    import ae_mlir as ae

    rows = []
    for _ in range(shape.batch):
        lengths = torch.randint(shape.seq_k // 16, shape.seq_k // 4 + 1, (shape.seq_k,), generator=gen)
        rows.append(torch.repeat_interleave(torch.arange(len(lengths)), lengths)[: shape.seq_k])
    doc = torch.stack(rows).to(device)

    def document_rows(b, h, q_idx, kv_idx):
        return (doc[b, q_idx] == doc[b, kv_idx]) & (q_idx >= kv_idx)

    return ae.attention(mask_mod=document_rows)


def _alibi(shape, device, gen):
    import torch

    import ae_mlir as ae

    slopes = torch.tensor([2.0 ** (-8.0 * (i + 1) / shape.heads) for i in range(shape.heads)], device=device)

    def alibi(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx)

    return ae.attention(score_mod=alibi, mask_mod=_causal)


def _relative_bias(shape, device, gen):
    import torch

    import ae_mlir as ae

    table = torch.randn(shape.heads, shape.seq_q + shape.seq_k - 1, generator=gen).to(device)
    offset = shape.seq_k - 1

    def relative_bias(score, b, h, q_idx, kv_idx):
        return score + table[h, q_idx - kv_idx + offset]

    return ae.attention(score_mod=relative_bias)


def _softcap(shape, device, gen):
    import torch

    import ae_mlir as ae

    def softcap(score, b, h, q_idx, kv_idx):
        return SOFTCAP * torch.tanh(score / SOFTCAP)

    return ae.attention(score_mod=softcap, mask_mod=_causal)


def _t5_bias(shape, device, gen):
    import torch

    import ae_mlir as ae

    bias = torch.randn(shape.heads, T5_BUCKETS, generator=gen).to(device)
    half = T5_BUCKETS // 2
    exact = half // 2
    log_ratio = math.log(T5_MAX_DISTANCE / exact)

    def t5_bias(score, b, h, q_idx, kv_idx):
        distance = kv_idx - q_idx
        side = torch.where(distance > 0, half, 0)
        n = distance.abs()
        # Bucket edges fall on exact powers of two, where f32 and f64 round the log ratio to
        # either side of an integer; the small offset puts both on the same bucket.
        far = exact + (torch.log(torch.clamp(n, min=1) / exact) / log_ratio * (half - exact) + 1e-4).long()
        bucket = side + torch.where(n < exact, n, torch.clamp(far, max=half - 1))
        return score + bias[h, bucket]

    return ae.attention(score_mod=t5_bias)


def _sigmoid(shape, device, gen):
    import ae_mlir as ae

    shift = -math.log(shape.seq_k)

    def sigmoid_bias(score, b, h, q_idx, kv_idx):
        return score + shift

    return ae.attention(score_mod=sigmoid_bias, normalize="sigmoid")


def _relu(shape, device, gen):
    import ae_mlir as ae

    inverse_length = 1.0 / shape.seq_k

    def relu_scaled(score, b, h, q_idx, kv_idx):
        return score * inverse_length

    return ae.attention(score_mod=relu_scaled, mask_mod=_causal, normalize="relu")


def retnet_normalizer():
    """RetNet's parallel form divides each row by max(|row sum|, 1); no running max."""
    import torch

    import ae_mlir as ae

    def prob(s, m):
        return s

    def finalize(acc, l):
        return acc / torch.clamp(torch.abs(l), min=1.0)

    return ae.OnlineNormalizer(prob=prob, finalize=finalize, name="retnet")


def _retnet(shape, device, gen):
    import ae_mlir as ae

    log_gamma = math.log(RETNET_GAMMA)

    def decay(score, b, h, q_idx, kv_idx):
        import torch

        return score * torch.exp((q_idx - kv_idx) * log_gamma)

    return ae.attention(score_mod=decay, mask_mod=_causal, normalize=retnet_normalizer())


def tempered_normalizer(temperature: float = TEMPERATURE):
    """softmax(s / temperature) as a user's normalizer with a running max (the max of s; the
    built-in softmax's exp2 and log2(e) folding stay out of it)."""
    import torch

    import ae_mlir as ae

    inverse = 1.0 / temperature

    def prob(s, m):
        return torch.exp((s - m) * inverse)

    def rescale(m_old, m_new):
        return torch.exp((m_old - m_new) * inverse)

    def finalize(acc, l):
        return torch.where(l == 0.0, 0.0, acc / l)

    return ae.OnlineNormalizer(prob=prob, finalize=finalize, rescale=rescale, name="tempered")


def _tempered(shape, device, gen):
    import ae_mlir as ae

    return ae.attention(mask_mod=_causal, normalize=tempered_normalizer())


def _dilated(shape, device, gen):
    import ae_mlir as ae

    def dilated(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & ((q_idx - kv_idx) % 2 == 0)

    return ae.attention(mask_mod=dilated)


CATALOGUE: dict[str, Variant] = {v.name: v for v in (
    Variant("full", "no mask", _full),
    Variant("causal", "q_idx >= kv_idx", _causal_attention, causal_like=True),
    Variant("sliding_window", f"|q_idx - kv_idx| <= {WINDOW}", _sliding),
    Variant("causal_sliding", f"causal and q_idx - kv_idx <= {WINDOW}", _causal_sliding),
    Variant("prefix_lm", "the first quarter visible to all, causal after", _prefix_lm),
    Variant("document", "causal within documents (closure tensor of ids)", _document, causal_like=True),
    Variant("document_rows", "causal within documents, ids per batch row ([B, L] closure tensor)",
            _document_rows, causal_like=True, per_entry=True),
    Variant("alibi", "causal + ALiBi slopes (closure tensor)", _alibi, causal_like=True),
    Variant("relative_bias", "learned bias table [H, Lq + Lk - 1]", _relative_bias),
    Variant("softcap", "causal + tanh soft-capping at 30", _softcap, causal_like=True),
    Variant("t5_bias", "T5 bucketed relative bias", _t5_bias),
    Variant("sigmoid", "sigmoid attention with a -log(L) bias", _sigmoid),
    Variant("relu", "causal ReLU attention scaled by 1/L", _relu, causal_like=True),
    Variant("retnet", "RetNet parallel form: decay mask, abs-sum normalizer", _retnet, causal_like=True),
    Variant("tempered", f"causal softmax at temperature {TEMPERATURE}, a user normalizer with a running max",
            _tempered, causal_like=True),
    Variant("gqa", "causal, 4 query heads per KV head", _causal_attention,
            adjust=lambda s: replace(s, heads_kv=max(1, s.heads // 4)), causal_like=True),
    Variant("mla_dims", "causal, Dk = 192 and Dv = 128 (MLA-like)", _causal_attention,
            adjust=lambda s: replace(s, dim_qk=192, dim_v=128), causal_like=True),
    Variant("dilated", "causal, every other key", _dilated, causal_like=True),
)}


def build(name: str, shape: Shape, device="cpu", seed: int = 0):
    """The variant's attention object and the shape it runs at (head counts and dims adjusted)."""
    import torch

    if name not in CATALOGUE:
        raise ValueError(f"unknown variant {name!r} (known: {', '.join(CATALOGUE)})")
    variant = CATALOGUE[name]
    shape = variant.adjust(shape)
    gen = torch.Generator().manual_seed(seed)
    return variant.make(shape, device, gen), shape


def inputs(shape: Shape, dtype=None, device="cpu", seed: int = 0):
    """Fresh random q, k, v for `shape` (never zeros)."""
    import torch

    dtype = dtype or torch.float32
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(shape.batch, shape.heads, shape.seq_q, shape.dim_qk, generator=gen)
    k = torch.randn(shape.batch, shape.kv_heads, shape.seq_k, shape.dim_qk, generator=gen)
    v = torch.randn(shape.batch, shape.kv_heads, shape.seq_k, shape.dim_v, generator=gen)
    return tuple(t.to(dtype=dtype, device=device) for t in (q, k, v))


# --- linear attention ------------------------------------------------------------------------


@dataclass(frozen=True)
class LinearVariant:
    name: str
    summary: str
    make: Callable  # (shape, device, generator) -> (ae.linear_attention, g or None)


def _elu_plus_one(x, b, h, t, d):
    import torch

    return torch.where(x > 0, x + 1.0, torch.exp(x))


def _linear_transformer(shape, device, gen):
    import ae_mlir as ae

    return ae.linear_attention(q_mod=_elu_plus_one, k_mod=_elu_plus_one, normalize=True), None


def _retnet_recurrent(shape, device, gen):
    import torch

    import ae_mlir as ae

    g = torch.log(1 - 2.0 ** (-5.0 - torch.arange(shape.heads, dtype=torch.float64))).float().to(device)
    return ae.linear_attention(decay="head"), g


def _mamba2_ssd(shape, device, gen):
    """q = C, k = B, v = x * dt, g = A * dt (per head A < 0, per token dt > 0)."""
    import torch

    import ae_mlir as ae

    dt = torch.nn.functional.softplus(torch.randn(shape.batch, shape.heads, shape.seq_q, generator=gen) - 1.0)
    a = -torch.exp(torch.randn(shape.heads, generator=gen) * 0.5)
    dt = dt.to(device)

    def v_times_dt(x, b, h, t, d):
        return x * dt[b, h, t]

    g = (a.view(1, -1, 1).to(device) * dt).float()
    return ae.linear_attention(v_mod=v_times_dt, decay="token", scale=1.0), g


def _gated_retention(shape, device, gen):
    import torch

    import ae_mlir as ae

    g = torch.nn.functional.logsigmoid(torch.randn(shape.batch, shape.heads, shape.seq_q, generator=gen)) / 16
    return ae.linear_attention(decay="token"), g.to(device)


def _gla(shape, device, gen):
    import torch

    import ae_mlir as ae

    g = torch.nn.functional.logsigmoid(torch.randn(shape.batch, shape.heads, shape.seq_q, shape.dim_qk,
                                                   generator=gen)) / 16
    return ae.linear_attention(decay="token_dim"), g.to(device)


LINEAR_CATALOGUE: dict[str, LinearVariant] = {v.name: v for v in (
    LinearVariant("linear_transformer", "elu + 1 feature maps, normalized", _linear_transformer),
    LinearVariant("retnet", "per-head decay 1 - 2^(-5 - h)", _retnet_recurrent),
    LinearVariant("mamba2_ssd", "q = C, k = B, v = x * dt, g = A * dt", _mamba2_ssd),
    LinearVariant("gated_retention", "scalar data-dependent decay per token (simple GLA)", _gated_retention),
    LinearVariant("gla", "decay per token and key dimension", _gla),
)}


def build_linear(name: str, shape: Shape, device="cpu", seed: int = 0):
    """A linear-attention variant's object and its log-decay g (None without decay)."""
    import torch

    if name not in LINEAR_CATALOGUE:
        raise ValueError(f"unknown linear variant {name!r} (known: {', '.join(LINEAR_CATALOGUE)})")
    gen = torch.Generator().manual_seed(seed)
    return LINEAR_CATALOGUE[name].make(shape, device, gen)
