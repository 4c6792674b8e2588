"""Differential fuzzing: random attention programs through every backend available here (the
CPU backend's LLVM JIT and the Triton IR in the NumPy interpreter), each compared with the float64
reference executor.

The Triton IR is compiled at the configs users get: the default config `ae.attention` picks for
each target (cuda:90 and hip:gfx942, block sizes from the shape and dtype), with lengths up to 200
so the last tiles are ragged and often shorter than a block, and at small explicit blocks, which
give many tiles per program. test_linear_differential.py does the same for linear attention.

CI runs a fixed budget (AE_FUZZ_EXAMPLES programs per test and config, 100 by default, seeded).
A longer run is one command:

    AE_FUZZ_EXAMPLES=5000 AE_FUZZ_SEED=7 python -m pytest -q test/fuzz

campaign.py runs the default configs alone and writes a record to bench/results/.

Every failure found is minimized by hypothesis; keep it as a regression case in
test_regressions.py.
"""
from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, given, seed, settings

import ae_mlir as ae
from ae_mlir import variants
from programs import Program, gluon_programs, programs

EXAMPLES = int(os.environ.get("AE_FUZZ_EXAMPLES", "100"))
SEED = int(os.environ.get("AE_FUZZ_SEED", "20261130"))
SMALL = {"block_m": 32, "block_n": 16, "num_warps": 4, "num_stages": 2}
TARGETS = ("cuda:90", "hip:gfx942")
# name -> (target, config); a config of None is the target's default, as ae.attention picks it.
CONFIGS = {"small": ("cuda:90", SMALL), **{target: (target, None) for target in TARGETS}}
# The default blocks reach 128 x 64: longer sequences than the small blocks need.
MAX_SEQ = {"small": 80, "cuda:90": 200, "hip:gfx942": 200}

# Outputs are in the input dtype; unnormalized normalizers (relu, none) also see P rounded to the
# input dtype before P @ V, as every backend does, so their bound scales with the row sum.
TOL = {torch.float32: 3e-5, torch.bfloat16: 3e-2, torch.float16: 5e-3}


def _exp_difference(a, b):
    return torch.exp(a - b)


# Users' online normalizers: RetNet's division by max(|row sum|, 1), no running max; and one with a
# running max whose output depends on the max (acc / (l + 1) over exp(x - m)), so that the max's
# own gradient counts.
USER_NORMALIZERS = {
    "retnet": variants.retnet_normalizer(),
    "plus_one": ae.OnlineNormalizer(prob=_exp_difference, finalize=lambda acc, l: acc / (l + 1.0),
                                    rescale=_exp_difference, name="plus_one"),
}


def _attention(p: Program):
    normalize = USER_NORMALIZERS.get(p.normalize, p.normalize)
    return ae.attention(score_mod=p.score_mod(), mask_mod=p.mask_mod(), normalize=normalize)


def _assert_close(p: Program, got, want, what: str):
    got, want = got.double(), want.double()
    scale = 1.0
    if p.normalize in ("relu", "none", "retnet") and p.dtype != torch.float32:
        scale *= p.seq_k ** 0.5
    tol = TOL[p.dtype] * scale
    both_nan = torch.isnan(got) & torch.isnan(want)
    diff = (got - want).abs().masked_fill(both_nan, 0.0)
    assert not torch.isnan(diff).any(), f"{what}: NaN where the reference has a number\n{p}"
    if diff.numel() == 0:
        return
    finite = want[torch.isfinite(want)]
    bound = tol + tol * (float(finite.abs().max()) if finite.numel() else 0.0)
    assert float(diff.max()) <= bound, f"{what}: max error {float(diff.max()):.3g} > {bound:.3g}\n{p}"


def _reference(p: Program, attn, q, k, v):
    return attn(q, k, v, backend="reference")


def triton_interpreted(attn, q, k, v, target: str = "cuda:90", config: dict | None = SMALL, expect_ir: str | None = None):
    """The attention compiled to Triton IR exactly as for a GPU (`config` None: the target's
    default), run in the NumPy interpreter; `expect_ir` checks the kind of kernel the call ran."""
    from bundle_interp import interpret

    from ae_mlir.backends import triton as tb

    bundle = tb.compile_bundle(attn, q, k, v, target=target, config=config)
    _, captures = attn._build(q, k, v)
    # attn-lower-to-gluon's aligned variant (cuda:90's default for plain and causal 16-bit
    # attention at D = 128) runs in the Gluon emulator.
    (out, *_), variant = interpret(bundle, q, k, v, *captures)
    assert expect_ir in (None, variant.ir), f"the call ran a {variant.ir} kernel, not {expect_ir}"
    return out


FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=False, database=None,
                suppress_health_check=list(HealthCheck), print_blob=True)


def check_triton(p: Program, target: str, config: dict | None, expect_ir: str | None = None):
    attn = _attention(p)
    q, k, v = p.inputs()
    got = triton_interpreted(attn, q, k, v, target, config, expect_ir)
    _assert_close(p, got, _reference(p, attn, q, k, v), f"Triton IR for {target} (interpreted)")


@pytest.mark.parametrize("name", list(CONFIGS))
def test_triton_ir_matches_reference(name):
    target, config = CONFIGS[name]

    @seed(SEED)
    @FUZZ
    @given(programs(max_seq=MAX_SEQ[name]))
    def run(p: Program):
        check_triton(p, target, config)

    run()


@pytest.mark.parametrize("target", TARGETS)
def test_decoding_programs_at_default_configs(target):
    # A few query tokens against 600-3000 keys with 1-4 query heads a KV head: at the default
    # config the kernels split the KV tiles (from 16 tiles of 64 keys on) and pack GQA heads
    # (passes/tile_split_kv.py, tile_pack_gqa.py) whenever the shape asks for it.
    @seed(SEED + 2)
    @settings(FUZZ, max_examples=max(5, EXAMPLES // 5))
    @given(programs(max_seq=16, seq_k_range=(600, 3000), groups=(1, 2, 4)))
    def run(p: Program):
        check_triton(p, target, None)

    run()


def test_gluon_programs_on_sm90():
    # What attn-lower-to-gluon takes (plain or causal, 16-bit, D 64/128, GQA, ragged, transposed),
    # its kernel run in the Gluon emulator (test/gluon_emu.py).
    @seed(SEED + 5)
    @settings(FUZZ, max_examples=max(5, EXAMPLES // 5))
    @given(gluon_programs())
    def run(p: Program):
        check_triton(p, "cuda:90", {"warp_specialize": True}, expect_ir="ttgir")

    run()


def test_gluon_backward_programs_on_sm90():
    # The same programs' backward through attn-lower-to-gluon{backward=true}, half of them with a
    # score_mod (which its kernels take asked for, closure tensors read included, whose gradients
    # they leave to the Triton IR kernels).
    @seed(SEED + 6)
    @settings(FUZZ, max_examples=max(5, EXAMPLES // 10))
    @given(gluon_programs(score_mods=True))
    def run(p: Program):
        check_backward(p, "cuda:90", {"warp_specialize": True, "closure_grads": False})

    run()


def _paged(k, v, page: int, gen):
    """k, v [B, Hkv, L, D] as shuffled page pools (L padded to whole pages with NaN) and the table."""
    b, hkv, length, _ = k.shape
    per = -(-length // page)
    order = torch.randperm(b * per + 2, generator=gen)
    table = order[:b * per].view(b, per).to(torch.int32)
    pools = []
    for t in (k, v):
        pool = torch.full((b * per + 2, hkv, page, t.shape[3]), float("nan"), dtype=t.dtype)
        padded = torch.full((b, hkv, per * page, t.shape[3]), float("nan"), dtype=t.dtype)
        padded[:, :, :length] = t
        pool[table.view(-1).long()] = padded.view(b, hkv, per, page, -1).transpose(1, 2).reshape(b * per, hkv, page, -1)
        pools.append(pool)
    return pools[0], pools[1], table


@pytest.mark.parametrize("target", TARGETS)
def test_cache_programs_at_default_configs(target):
    # Per-entry key lengths (0 to Lk) on a cache whose unfilled keys are NaN, in place or paged
    # (pages of 1 to 256 slots, shuffled): random mods at each target's default config.
    from bundle_interp import interpret
    from hypothesis import strategies as st

    from ae_mlir.backends import triton as tb

    @seed(SEED + 3)
    @settings(FUZZ, max_examples=max(5, EXAMPLES // 5))
    @given(programs(max_seq=16, seq_k_range=(1, 700), groups=(1, 2, 4)), st.data())
    def run(p: Program, data):
        attn = _attention(p)
        q, k, v = p.inputs()
        lengths = torch.tensor(data.draw(st.lists(st.integers(0, p.seq_k), min_size=p.batch, max_size=p.batch)),
                               dtype=torch.int32)
        want = attn(q, k, v, kv_len=lengths, backend="reference")
        gen = torch.Generator().manual_seed(p.seed)
        k_nan, v_nan = k.clone(), v.clone()
        for b, n in enumerate(lengths.tolist()):
            k_nan[b, :, n:], v_nan[b, :, n:] = float("nan"), float("nan")
        page = data.draw(st.sampled_from([None, 1, 16, 64, 256]))
        if page is None:
            keys, values, extra = k_nan, v_nan, {}
        else:
            keys, values, table = _paged(k_nan, v_nan, page, gen)
            extra = {"block_table": table}
        bundle = tb.compile_bundle(attn, q, keys, values, target=target, kv_len=lengths, **extra)
        _, captures = attn._build(q, keys, values, kv_len=lengths, **extra)
        (out, *_), _ = interpret(bundle, q, keys, values, *captures)
        _assert_close(p, out, want, f"Triton IR for {target} with kv_len, pages of {page}")

    run()


def _packed(p: Program, q, k, v, count: int, gen):
    """q, k, v of `p` as a packed batch of `count` sequences, sequence s cut from batch entry
    s % B to random lengths (0 to the full length; the first keeps a query): the packed q, k, v
    ([H, T, D]) and the call's offsets, bounded by p's lengths."""
    lens_q, lens_k = (torch.randint(0, n + 1, (count,), generator=gen) for n in (p.seq_q, p.seq_k))
    lens_q[0] = max(int(lens_q[0]), 1)

    def pack(t, lens):
        return torch.cat([t[s % p.batch, :, :n] for s, n in enumerate(lens.tolist())], dim=1)

    def offsets(lens):
        return torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)]).to(torch.int32)

    call = {"cu_seqlens_q": offsets(lens_q), "cu_seqlens_k": offsets(lens_k), "max_seqlen_q": p.seq_q,
            "max_seqlen_k": p.seq_k}
    return (pack(q, lens_q), pack(k, lens_k), pack(v, lens_k)), call


def check_packed(p: Program, target: str):
    """`p` on two packed batches of 1 to 5 sequences of other lengths and totals: one kernel (the Triton bundle at the
    target's default config, interpreted, or the CPU backend's), compiled for p's longest
    sequences, runs both; each against the reference backend on the same batch."""
    from bundle_interp import interpret

    from ae_mlir.backends import triton as tb
    from ae_mlir.frontend import varlen

    attn = _attention(p)
    q, k, v = p.inputs()
    gen = torch.Generator().manual_seed(p.seed + 7)
    count = int(torch.randint(1, 6, (), generator=gen))
    bundle = None
    for _ in range(2):
        packed, call = _packed(p, q, k, v, count, gen)
        want = attn(*packed, backend="reference", **call)
        if target == "cpu":
            got = attn(*packed, backend="cpu", **call)
        else:
            views = varlen.packed_views(*packed, attn.layout)
            bundle = bundle or tb.compile_bundle(attn, *packed, target=target, **call)
            sequences = varlen.prepare(*views[:2], call["cu_seqlens_q"], call["cu_seqlens_k"], p.seq_q, p.seq_k, False)
            _, captures = attn._prepare(*views, sequences=sequences)
            (out, *_), _ = interpret(bundle, *views, *captures)
            got = out[0]
        _assert_close(p, got, want, f"packed {call['cu_seqlens_q'].tolist()} / {call['cu_seqlens_k'].tolist()} "
                                    f"on {target}")


@pytest.mark.parametrize("target", TARGETS + ("cpu",))
def test_packed_programs_at_default_configs(target):
    @seed(SEED + 6)
    @settings(FUZZ, max_examples=max(5, EXAMPLES // 5))
    @given(programs(max_seq=MAX_SEQ.get(target, 200)))
    def run(p: Program):
        check_packed(p, target)

    run()


@seed(SEED + 1)
@FUZZ
# Past 128 keys: the CPU preset's KV tiles are 128 keys wide where no mask cuts them.
@given(programs(max_seq=300))
def test_cpu_backend_matches_reference(p: Program):
    attn = _attention(p)
    q, k, v = p.inputs()
    _assert_close(p, attn(q, k, v, backend="cpu"), _reference(p, attn, q, k, v), "CPU backend")


def test_generator_covers_the_space():
    # A budget spent on one corner finds nothing: check the strategy reaches the main axes.
    from hypothesis import find

    find(programs(), lambda p: p.mask_tree is not None and p.score_tree is not None and p.heads != p.heads_kv)
    find(programs(), lambda p: p.transposed and p.dtype == torch.bfloat16 and p.seq_q != p.seq_k)
    find(programs(), lambda p: p.normalize == "none" and p.dim_qk != p.dim_v)


pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _backward_case(p: Program, target: str, config: dict | None = None):
    """(got, want, names): the backward bundle's gradients at the target's default config, in the
    interpreter (on "cpu": the CPU backend's through autograd), and float64 autograd's on the
    reference backend, of q, k, v and the float closure tensors the score_mod reads (bias [H],
    table [H, 7]), all learnable."""
    from bundle_interp import interpret_roles

    from ae_mlir.backends import triton as tb
    from ae_mlir.core import abi

    attn = _attention(p)
    q, k, v = p.inputs()
    gen = torch.Generator().manual_seed(p.seed + 1)
    # dO as the kernels get it, in the inputs' dtype, for the reference too.
    d_out = torch.randn(*q.shape[:3], v.shape[3], generator=gen, dtype=torch.float64).to(q.dtype).double()
    learnable = [c for c in p.captures if c.dtype.is_floating_point]
    for c in learnable:
        c.requires_grad_()
    try:
        leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
        out = attn(*leaves, backend="reference", return_lse=p.normalize == "softmax")
        out, lse = out if isinstance(out, tuple) else (out, None)
        want = torch.autograd.grad(out, leaves + learnable, d_out, allow_unused=True)
        if target == "cpu":
            inputs = [t.detach().clone().requires_grad_() for t in (q, k, v)]
            got = torch.autograd.grad(attn(*inputs, backend="cpu"), inputs + learnable, d_out.to(q.dtype),
                                      allow_unused=True)
            names = ["dq", "dk", "dv"] + [f"d{i}" if p.dtype == torch.float32 else None
                                          for i in range(len(learnable))]
            return list(got), want, names
    finally:
        for c in learnable:
            c.requires_grad_(False)
    # The module as written: the kernels' own gradients of the tables (a table read by a function
    # of the distance is otherwise composed per call, its gradient then torch's).
    text, captures = attn._build(q, k, v, compose=False)
    # dO and the saved output in the inputs' dtype, as autograd hands them to the kernels.
    tensors = {"q": q, "k": k, "v": v, "do": d_out.to(q.dtype)}
    if lse is not None:
        tensors.update(out=out.detach().to(q.dtype), lse=lse.detach().float(),
                       dlse=torch.zeros_like(lse, dtype=torch.float32))
    tensors.update({abi.capture(i): c for i, c in enumerate(captures)})
    got = interpret_roles(tb.build_backward_bundle(text, target, config), tensors)
    positions = {id(c): i for i, c in enumerate(captures)}
    # A tensor the score_mod does not read, or reads only through a 0-d element taken in Python
    # (the closure tensor is then that element), is no closure tensor of the module: unchecked.
    # Where the module also has such an element, its share of the gradient reaches the tensor
    # through torch's autograd (test_regressions checks that path), not through the tensor's dc<i>:
    # then no closure gradient is compared either.
    derived = any(all(c is not own for own in p.captures) for c in captures)
    # A build without closure gradients (the Gluon backward's) leaves them to none: not compared.
    unbuilt = not (config or {}).get("closure_grads", True)
    names = ["dq", "dk", "dv"] + [abi.closure_grad(positions[id(c)])
                                  if id(c) in positions and not derived and not unbuilt else None
                                  for c in learnable]
    return [got.get(n) if n else None for n in names], list(want), names


@pytest.mark.parametrize("target", TARGETS + ("cpu",))
def test_backward_with_learnable_closures_at_default_configs(target):
    # The backward kernels (softmax, the element-wise normalizers and the users'), with the gradients
    # of the closure tensors the random score_mods read scattered by the dQ kernel, in float32
    # against float64 autograd.
    @seed(SEED + 5)
    @settings(FUZZ, max_examples=max(5, EXAMPLES // 5))
    @given(programs(max_seq=MAX_SEQ.get(target, 200), dtypes=(torch.float32,)))
    def run(p: Program):
        check_backward(p, target)

    run()


def _rows_at_kinks(p: Program, q, k, kv_len=None):
    """Rows whose gradient the check leaves out, (query rows [B, H, Lq], key rows [B, Hkv, Lk]):
    those holding a kept score within rounding of a kink of the score_mod (Node.kink_distance;
    the 16-bit kernels' tanh.approx is within 2^-11), where the derivative the kernels take and
    float64's may differ by O(1). A closure tensor's gradient sums over every score: it is left
    out where any row is."""
    q, k = q.double(), k.double()
    rows_q = torch.zeros(q.shape[:3], dtype=torch.bool)
    rows_k = torch.zeros(k.shape[:3], dtype=torch.bool)
    if p.score_tree is None:
        return rows_q, rows_k
    group = q.shape[1] // k.shape[1]
    score = q @ k.repeat_interleave(group, dim=1).transpose(-1, -2) / q.shape[-1] ** 0.5
    b, h, i, j = (torch.arange(n).view([-1 if d == axis else 1 for d in range(4)])
                  for axis, n in enumerate(score.shape))
    env = {"score": score, "b": b, "h": h, "q_idx": i, "kv_idx": j}
    near = torch.broadcast_to(p.score_tree.kink_distance(env) < (1e-5 if p.dtype == torch.float32 else 1e-3),
                              score.shape)
    if p.mask_tree is not None:
        near = near & p.mask_tree.eval(env, clamped=True)
    if kv_len is not None:
        near = near & (j < kv_len.view(-1, 1, 1, 1))
    rows_q |= near.any(-1)
    rows_k |= near.any(-2).view(k.shape[0], k.shape[1], group, -1).any(2)
    return rows_q, rows_k


def _compare_gradients(p: Program, got, want, names, kinks, what: str):
    """dq, dk, dv and (float32 programs) the closure tensors' gradients, past the rows at kinks."""
    rows_q, rows_k = kinks
    for g, w, name in zip(got, want, names):
        if name is None or (name not in ("dq", "dk", "dv") and p.dtype != torch.float32):
            continue
        if w is None:  # the score_mod does not read this tensor
            assert g is None or not g.any(), f"{name}: a gradient where none reaches\n{p}"
            continue
        assert g is not None, f"{name}: missing\n{p}"
        if name in ("dq", "dk", "dv"):
            rows = (rows_q if name == "dq" else rows_k).unsqueeze(-1)
            g, w = g.double().masked_fill(rows, 0.0), w.double().masked_fill(rows, 0.0)
        elif rows_q.any():
            continue
        _assert_close(p, g, w, f"{name} of the backward for {what}")


def check_backward(p: Program, target: str, config: dict | None = None):
    """The backward kernels at the target's default config (interpreted) against float64 autograd:
    dq, dk, dv and, for float32 programs, the gradients of the float closure tensors the score_mod
    reads. A closure tensor's gradient sums dS over many scores whose row sums cancel (softmax's
    rows of dS sum to zero), so the 16-bit output the kernels read (delta = rowsum(dO * O)) leaves
    it an error that no bound relative to the small result can hold; its 16-bit checks are
    test_backward_closures'."""
    got, want, names = _backward_case(p, target, config)
    q, k, _ = p.inputs()
    _compare_gradients(p, got, want, names, _rows_at_kinks(p, q, k),
                       "cpu" if target == "cpu" else f"{target} (interpreted)")


def _packed_backward_case(p: Program, target: str):
    """(got, want, names, rows at kinks) for `p` on a packed batch of 1 to 5 sequences: the
    backward kernels' dq, dk, dv and closure gradients (the target's default-config bundle
    interpreted, or the CPU backend's through autograd) against float64 autograd on the reference
    backend over the same sequences unpacked, each a batch entry of its own length (kv_len): b is
    the sequence and the positions are the sequence's in both."""
    from bundle_interp import interpret_roles
    from packed_oracle import packed_gradients, repacked, unpacked

    from ae_mlir.backends import triton as tb
    from ae_mlir.core import abi
    from ae_mlir.frontend import varlen

    attn = _attention(p)
    q, k, v = p.inputs()
    gen = torch.Generator().manual_seed(p.seed + 11)
    (qp, kp, vp), call = _packed(p, q, k, v, int(torch.randint(1, 6, (), generator=gen)), gen)
    d_out = torch.randn(*qp.shape[:2], vp.shape[2], generator=gen, dtype=torch.float64).to(q.dtype)
    cu_q, cu_k = (call[name].tolist() for name in ("cu_seqlens_q", "cu_seqlens_k"))
    kv_len = torch.tensor([b - a for a, b in zip(cu_k, cu_k[1:])])
    rows_q, rows_k = _rows_at_kinks(p, unpacked(qp, cu_q, p.seq_q), unpacked(kp, cu_k, p.seq_k), kv_len)
    kinks = (repacked(rows_q, cu_q), repacked(rows_k, cu_k))
    learnable = [c for c in p.captures if c.dtype.is_floating_point]
    names = ["dq", "dk", "dv"]
    for c in learnable:
        c.requires_grad_()
    try:
        want = packed_gradients(attn, qp, kp, vp, d_out, cu_q, cu_k, p.seq_q, p.seq_k, learnable)
        if target == "cpu":
            packed = [t.detach().clone().requires_grad_() for t in (qp, kp, vp)]
            got = torch.autograd.grad(attn(*packed, backend="cpu", **call), packed + learnable, d_out,
                                      allow_unused=True)
            names += [None if p.dtype != torch.float32 else f"d{i}" for i in range(len(learnable))]
            return list(got), want, names, kinks
    finally:
        for c in learnable:
            c.requires_grad_(False)
    views = varlen.packed_views(qp, kp, vp, attn.layout)
    sequences = varlen.prepare(*views[:2], call["cu_seqlens_q"], call["cu_seqlens_k"], p.seq_q, p.seq_k, False)
    text, captures = attn._prepare(*views, sequences=sequences, compose=False)
    tensors = {"q": views[0], "k": views[1], "v": views[2], "do": varlen.packed_views(d_out, d_out, d_out,
                                                                                        attn.layout)[0]}
    if p.normalize == "softmax":
        out, lse = attn(qp, kp, vp, backend="reference", return_lse=True, **call)
        tensors.update(out=varlen.packed_views(out, out, out, attn.layout)[0].to(q.dtype),
                       lse=lse.float().unsqueeze(0), dlse=torch.zeros(1, *lse.shape))
    tensors.update({abi.capture(i): c for i, c in enumerate(captures)})
    got = interpret_roles(tb.build_backward_bundle(text, target), tensors)
    positions = {id(c): i for i, c in enumerate(captures)}
    derived = any(all(c is not own for own in p.captures) for c in captures)
    names += [abi.closure_grad(positions[id(c)]) if id(c) in positions and not derived else None for c in learnable]
    return [got["dq"][0], got["dk"][0], got["dv"][0]] + [got.get(n) if n else None for n in names[3:]], want, names, kinks


def check_packed_backward(p: Program, target: str):
    """The backward kernels of `p` on a packed batch (`_packed_backward_case`): dq, dk, dv and, for
    float32 programs, the gradients of the float closure tensors the score_mod reads."""
    *case, kinks = _packed_backward_case(p, target)
    _compare_gradients(p, *case, kinks, f"{target} (packed)")


@pytest.mark.parametrize("target", TARGETS + ("cpu",))
def test_packed_backward_at_default_configs(target):
    @seed(SEED + 7)
    @settings(FUZZ, max_examples=max(5, EXAMPLES // 10))
    @given(programs(max_seq=MAX_SEQ.get(target, 200), dtypes=(torch.float32,)))
    def run(p: Program):
        check_packed_backward(p, target)

    run()
