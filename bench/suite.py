"""The benchmark suite's cases, problems, inputs, float32 references and FLOP counts.

Shared by build_suite.py (here, with MLIR: bundles for every case) and run_suite.py (on the GPU
machine, without MLIR: it rebuilds the same attention objects from ae_mlir.variants, whose closure
tensors come from seeded generators, so the kernels' closure-tensor arguments line up with the
bundles). Importing this module loads nothing heavy; torch is imported where it is used, so the
spawned warm-up workers of run_suite.py start light.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

TOKENS = 16384  # B * L for the catalogue and linear parts (DESIGN.md section 8)
HEADS = 16
CHUNK = 64  # ae.linear_attention's and fla's default chunk size
SEED = 0

VERIFY_LENGTHS = (128, 1000, 4096)
VERIFY_DIMS = (64, 128)
VERIFY_DTYPES = ("bfloat16", "float16")
CATALOGUE_LENGTHS = (2048, 8192)
# The catalogue's head dim, and the entries also run at D = 64 (issue 13 compares plain and causal
# attention with cuDNN at both head dims).
CATALOGUE_DIM = 128
CATALOGUE_D64 = ("full", "causal")
LINEAR_LENGTHS = (2048, 8192)
LINEAR_DIMS = (64, 128)
# ae.linear_attention's decay kind for each fla peer op.
LINEAR_DECAYS = {"retention": "head", "simple_gla": "token", "gla": "token_dim"}
# The catalogue entries torch SDPA computes too, as (is_causal); the rest have no SDPA form.
SDPA_EQUIVALENT = {"full": False, "causal": True, "gqa": True, "mla_dims": True}
PARTS = ("verify", "catalogue", "linear")


@dataclass(frozen=True)
class Case:
    part: str  # verify | catalogue | linear
    variant: str  # a CATALOGUE name, or a LINEAR_DECAYS key
    batch: int
    heads: int
    seq: int
    dim: int
    dtype: str

    @property
    def name(self) -> str:
        return f"{self.part}-{self.variant}-B{self.batch}-H{self.heads}-L{self.seq}-D{self.dim}-{self.dtype}"

    @property
    def bundle_file(self) -> str:
        return self.name + ".json"

    def as_dict(self) -> dict:
        return asdict(self)


def cases(parts=PARTS) -> list[Case]:
    from ae_mlir.variants import CATALOGUE

    out = []
    if "verify" in parts:
        for dtype in VERIFY_DTYPES:
            for length in VERIFY_LENGTHS:
                for dim in VERIFY_DIMS:
                    for variant in ("full", "causal"):
                        out.append(Case("verify", variant, 2, 4, length, dim, dtype))
    if "catalogue" in parts:
        for variant in CATALOGUE:
            dims = (CATALOGUE_DIM, 64) if variant in CATALOGUE_D64 else (CATALOGUE_DIM,)
            for dim in dims:
                for length in CATALOGUE_LENGTHS:
                    out.append(Case("catalogue", variant, TOKENS // length, HEADS, length, dim, "bfloat16"))
    if "linear" in parts:
        for variant in LINEAR_DECAYS:
            for length in LINEAR_LENGTHS:
                for dim in LINEAR_DIMS:
                    out.append(Case("linear", variant, TOKENS // length, HEADS, length, dim, "bfloat16"))
    return out


# --- softmax family (verify, catalogue) -----------------------------------------------------------


def softmax_problem(case: Case, device):
    """The case's `ae.attention` and its shape (the catalogue's adjust() may change heads or dims)."""
    from ae_mlir.variants import Shape, build

    base = Shape(case.batch, case.heads, case.seq, case.seq, case.dim, case.dim)
    return build(case.variant, base, device=device, seed=SEED)


def softmax_inputs(shape, dtype: str, device, empty: bool = False):
    import torch

    dt = getattr(torch, dtype)
    sizes = ((shape.batch, shape.heads, shape.seq_q, shape.dim_qk),
             (shape.batch, shape.kv_heads, shape.seq_k, shape.dim_qk),
             (shape.batch, shape.kv_heads, shape.seq_k, shape.dim_v))
    if empty:
        return tuple(torch.empty(s, dtype=dt, device=device) for s in sizes)
    gen = torch.Generator(device=device).manual_seed(SEED + 1)
    return tuple(torch.randn(s, dtype=dt, device=device, generator=gen) for s in sizes)


def meta_like(shape, dtype: str):
    """q, k, v on the meta device: what compile_bundle needs to build a bundle without data."""
    return softmax_inputs(shape, dtype, "meta", empty=True)


def cache_training_step(case: Case, target: str = "cuda:90") -> dict:
    """Compile what a training step of the softmax `case` needs into the kernel cache
    (AE_MLIR_CACHE_DIR), for a GPU machine without the MLIR bindings: the forward bundle at the
    tiles a call takes, the backward bundle at its call-time tiles, the variant's derivative and
    the problem the module poses. Returns the backward's call-time tiles."""
    import torch

    from ae_mlir.backends import call_time_tiles as ctt
    from ae_mlir.backends import triton as tb
    from ae_mlir.frontend.backward import Derivative

    attn, shape = softmax_problem(case, "cpu")
    q, k, v = (torch.zeros(t.shape, dtype=getattr(torch, case.dtype)) for t in meta_like(shape, case.dtype))
    text, captures = attn._prepare(q, k, v)
    grads = bool(Derivative.of(text).closure_grads)
    tb._default_bundle(text, target, [q, k, v, *captures])
    roles = dict(zip(("q", "k", "v"), (q, k, v)), **{f"c{i}": t for i, t in enumerate(captures)})
    tiles = ctt.backward_call_time_tiles(text, target, roles)
    tb.get_backward_bundle(text, target, closure_grads=grads, tiles=tiles)
    return tiles


def sample_rows(length: int, edge: int = 128, spread: int = 256):
    """Query rows the catalogue reference checks: both ends (first rows see few keys under causal
    masks, last rows see the most) and an even spread in between."""
    import torch

    rows = torch.cat([torch.arange(min(edge, length)), torch.linspace(0, length - 1, spread).long(),
                      torch.arange(max(0, length - edge), length)])
    return torch.unique(rows)


def _index_grids(batch: int, heads: int, rows, seq_k: int, device):
    import torch

    b = torch.arange(batch, device=device).view(batch, 1, 1, 1)
    h = torch.arange(heads, device=device).view(1, heads, 1, 1)
    q_idx = rows.to(device).view(1, 1, -1, 1)
    kv_idx = torch.arange(seq_k, device=device).view(1, 1, 1, seq_k)
    return b, h, q_idx, kv_idx


def attention_reference(attn, q, k, v, rows, block: int = 256):
    """float32 output rows of `attn` (an ae.attention) for the query rows `rows`, materialized:
    the entry's own score_mod and mask_mod evaluated eagerly with torch on index grids, then its
    normalizer as DESIGN.md section 3 defines it."""
    import torch

    batch, heads, _, dk = q.shape
    group = heads // k.shape[1]
    kf = k.float().repeat_interleave(group, dim=1)
    vf = v.float().repeat_interleave(group, dim=1)
    scale = attn.scale if attn.scale is not None else 1.0 / math.sqrt(dk)
    pieces = []
    for part in rows.split(block):
        b, h, q_idx, kv_idx = _index_grids(batch, heads, part, k.shape[2], q.device)
        s = torch.einsum("bhqd,bhkd->bhqk", q[:, :, part.to(q.device)].float(), kf) * scale
        if attn.score_mod is not None:
            s = attn.score_mod(s, b, h, q_idx, kv_idx)
        keep = None
        if attn.mask_mod is not None:
            keep = torch.as_tensor(attn.mask_mod(b, h, q_idx, kv_idx), device=q.device).expand_as(s)
        pieces.append(_normalized(attn.normalize, s, keep, vf))
    return torch.cat(pieces, dim=2)


def _normalized(normalize, s, keep, v):
    import torch

    v = v.to(s.dtype)
    if normalize == "softmax":
        if keep is not None:
            s = s.masked_fill(~keep, -math.inf)
        # A row with every key masked is all NaN after softmax; the contract gives 0 there.
        return torch.softmax(s, dim=-1).nan_to_num(0.0) @ v
    elementwise = {"sigmoid": torch.sigmoid, "relu": torch.relu, "none": lambda x: x}
    if isinstance(normalize, str):
        p = elementwise[normalize](s)
        return (p if keep is None else torch.where(keep, p, 0.0)) @ v
    if normalize.log2_domain:
        s = s * math.log2(math.e)
    m = torch.zeros_like(s[..., :1])
    if normalize.stat == "max":
        m = (s if keep is None else s.masked_fill(~keep, -math.inf)).amax(dim=-1, keepdim=True)
        m = torch.where(torch.isinf(m), 0.0, m)
    # where, not a product: masked scores may be inf (RetNet's decay grows past the diagonal).
    p = normalize.prob(s, m)
    if keep is not None:
        p = torch.where(keep, p, 0.0)
    return normalize.finalize(p @ v, p.sum(dim=-1, keepdim=True))


def mask_batch(variant: str, shape) -> int | None:
    """The batch entries a catalogue entry's mask differs over: B where it reads b (per-row
    document ids), else None (one mask for every entry; no catalogue mask reads h)."""
    from ae_mlir.variants import CATALOGUE

    return shape.batch if variant in CATALOGUE and CATALOGUE[variant].per_entry else None


def kept_fraction(mask_mod, seq_q: int, seq_k: int, device, block: int = 1024, batch: int | None = None) -> float:
    """The exact fraction of (query, key) pairs the mask keeps, over `batch` entries where it
    reads b (`mask_batch`)."""
    import torch

    if mask_mod is None:
        return 1.0
    entries = batch or 1
    kept = 0
    for start in range(0, seq_q, block):
        rows = torch.arange(start, min(start + block, seq_q))
        b, h, q_idx, kv_idx = _index_grids(entries, 1, rows, seq_k, device)
        keep = torch.as_tensor(mask_mod(b, h, q_idx, kv_idx), device=device)
        kept += int(keep.expand(entries, 1, len(rows), seq_k).sum())
    return kept / (entries * seq_q * seq_k)


def softmax_flops(shape, kept: float) -> float:
    """4 * B * H * Lq * Lk * D (QK^T and PV) times the kept fraction; D is the mean of Dk and Dv,
    which is D for every case but mla_dims."""
    d = (shape.dim_qk + shape.dim_v) / 2
    return 4.0 * shape.batch * shape.heads * shape.seq_q * shape.seq_k * d * kept


# --- linear attention -------------------------------------------------------------------------------


def linear_attention(case: Case):
    import ae_mlir as ae

    return ae.linear_attention(decay=LINEAR_DECAYS[case.variant], chunk_size=CHUNK)


def retention_log_decay(heads: int, device):
    """RetNet's per-head decay gamma_h = 1 - 2^(-5-h), as a log-decay (fla's chunk_retention uses
    the same)."""
    import torch

    return torch.log(1 - 2.0 ** (-5.0 - torch.arange(heads, dtype=torch.float32, device=device)))


def ae_decay(g):
    """g as ae.linear_attention hands it to the kernels (and so as the benches time it): a g whose
    last dimension is not unit-strided (fla's per-token [B, T, H] read as [B, H, T]) is copied, or
    every kernel of the bundle would take its general variant."""
    return g if g is None or g.stride(-1) == 1 else g.contiguous()


def linear_inputs(case: Case, device, empty: bool = False) -> dict:
    """q, k, v and the log-decay g, stored in fla's [B, T, H, D] layout (fla reads them without a
    copy), with ae-mlir's [B, H, T, D] views of the same memory; g is float32 for both."""
    import torch
    import torch.nn.functional as F

    b, h, t, d = case.batch, case.heads, case.seq, case.dim
    dt = getattr(torch, case.dtype)
    gen = None if empty else torch.Generator(device=device).manual_seed(SEED + 2)

    def tensor(*size, dtype=dt):
        if empty:
            return torch.empty(size, dtype=dtype, device=device)
        return torch.randn(size, dtype=dtype, device=device, generator=gen)

    q, k, v = (tensor(b, t, h, d) for _ in range(3))
    decay = LINEAR_DECAYS[case.variant]
    if decay == "head":
        g_fla = None
        g_ae = retention_log_decay(h, device)
    else:
        size = (b, t, h) if decay == "token" else (b, t, h, d)
        # logsigmoid of a standard normal, over 16: decays of about 0.95 per token, as gated
        # models learn them.
        g_fla = F.logsigmoid(tensor(*size, dtype=torch.float32)) / 16
        g_ae = g_fla.transpose(1, 2)
    return {"fla": (q, k, v, g_fla), "ae": (q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), g_ae)}


def linear_meta(case: Case):
    """q, k, v, g on the meta device in ae-mlir's layout, for building the bundle."""
    return linear_inputs(case, "meta", empty=True)["ae"]


def linear_reference(q, k, v, g, decay: str, scale: float | None = None, chunk: int = CHUNK):
    """float32 o of the linear recurrence S_t = diag(exp(g_t)) S_{t-1} + k_t^T v_t, o_t = scale q_t S_t
    (DESIGN.md section 3), evaluated chunk by chunk so that every exponent is a decay (<= 0).

    q, k [B, h, T, Dk], v [B, h, T, Dv]; g [h] ("head"), [B, h, T] ("token"), [B, h, T, Dk]."""
    import torch

    q, k, v = q.float(), k.float(), v.float()
    batch, heads, length, dk = q.shape
    scale = 1.0 / math.sqrt(dk) if scale is None else scale
    g = g.float()
    if decay == "head":
        g = g.view(1, heads, 1, 1).expand(batch, heads, length, dk)
    elif decay == "token":
        g = g.unsqueeze(-1).expand(batch, heads, length, dk)
    state = q.new_zeros(batch, heads, dk, v.shape[-1])
    out = torch.empty(batch, heads, length, v.shape[-1], device=q.device)
    for start in range(0, length, chunk):
        end = min(start + chunk, length)
        qc, kc, vc = q[:, :, start:end], k[:, :, start:end], v[:, :, start:end]
        cum = g[:, :, start:end].cumsum(dim=2)  # G_i, inclusive
        n = end - start
        causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        diff = (cum[:, :, :, None, :] - cum[:, :, None, :, :]).masked_fill(~causal[:, :, None], -math.inf)
        scores = (qc[:, :, :, None, :] * kc[:, :, None, :, :] * diff.exp()).sum(dim=-1)
        out[:, :, start:end] = scale * (scores @ vc + (qc * cum.exp()) @ state)
        last = cum[:, :, -1:]
        state = last.transpose(-1, -2).exp() * state + (kc * (last - cum).exp()).transpose(-1, -2) @ vc
    return out


def linear_flops(case: Case) -> float:
    """Chunked form with chunk C: per token 2*C*Dk (QK^T) + 2*C*Dv (AV) + 2*Dk*Dv (q S) +
    2*Dk*Dv (the state update), full C x C blocks counted; the same count for every peer."""
    d = case.dim
    return case.batch * case.heads * case.seq * (2.0 * CHUNK * (d + d) + 4.0 * d * d)


def reference_heads(heads: int) -> list[int]:
    """The heads the linear reference checks: the first, the last (RetNet's slowest decay) and two
    between."""
    return sorted({0, heads // 3, 2 * heads // 3, heads - 1})


# --- peers ------------------------------------------------------------------------------------------


def flex_callable(attn, shape, device, batch: int | None = None):
    """torch.compile'd FlexAttention computing what `attn` computes (softmax entries only), with a
    BlockMask from the entry's mask_mod (per batch entry with `batch`: `mask_batch`); the warm-up
    workers and the measurement both build it here, so the workers' compiles are the cache
    entries the measurement then hits."""
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    # A fresh compile per case: dynamo's recompile limit would otherwise fall back to eager
    # FlexAttention after a few cases.
    torch._dynamo.reset()
    compiled = torch.compile(flex_attention, dynamic=False)
    block_mask = None
    if attn.mask_mod is not None:
        block_mask = create_block_mask(attn.mask_mod, batch, None, shape.seq_q, shape.seq_k, device=device)
    gqa = shape.kv_heads != shape.heads

    def run(q, k, v):
        return compiled(q, k, v, score_mod=attn.score_mod, block_mask=block_mask, scale=attn.scale, enable_gqa=gqa)

    return run


def fla_op(variant: str):
    """fla's chunked kernel for the variant, as (q, k, v, g) -> o in fla's [B, T, H, D] layout."""
    if variant == "retention":
        from fla.ops.retention import chunk_retention

        return lambda q, k, v, g: chunk_retention(q, k, v)[0]
    if variant == "simple_gla":
        from fla.ops.simple_gla import chunk_simple_gla

        return lambda q, k, v, g: chunk_simple_gla(q, k, v, g=g)[0]
    from fla.ops.gla import chunk_gla

    return lambda q, k, v, g: chunk_gla(q, k, v, g=g)[0]
