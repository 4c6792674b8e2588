"""The Gluon backward kernels (passes/gluon/attention_backward.py: dQ, which writes delta, then
dK/dV), run by the emulator on CPU tensors against float64 autograd (with a logsumexp gradient):
plain and causal, GQA (dK and dV summed over the group), ragged lengths, Lq != Lk, D 64 and 128,
transposed layouts; and their Triton GPU IR compiled for sm90."""
from __future__ import annotations

import pytest
import torch

import ae_mlir as ae
from ae_mlir import presets, runtime
from ae_mlir.backends import triton as tb
from ae_mlir.core.context import CompileError, new_context, parse_module
from ae_mlir.kernel_args import host_descriptor
from ae_mlir.passes.gluon import attention_backward as ab, attention_backward_fused as af

from bundle_interp import interpret_roles
from ptxas_report import ptxas_spill_bytes
from gluon_emu import launch


def reference(q, k, v, do, dlse, causal, scale):
    """dQ, dK, dV of sum(out * dO) + sum(lse * dlse) in float64, and the forward's out and lse as
    the kernels read them."""
    group = q.shape[1] // k.shape[1]
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    s = torch.einsum("bhqd,bhkd->bhqk", q64, k64.repeat_interleave(group, 1)) * scale
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).tril().logical_not(), float("-inf"))
    lse = torch.logsumexp(s, -1)
    out = torch.einsum("bhqk,bhkd->bhqd", torch.softmax(s, -1), v64.repeat_interleave(group, 1))
    ((out * do.double()).sum() + (lse * dlse.double()).sum()).backward()
    return q64.grad, k64.grad, v64.grad, out.detach().to(q.dtype), lse.detach().float()


def run_kernels(q, k, v, do, out, lse, dlse, causal, scale):
    """The dQ kernel (which writes delta), then the dK/dV kernel, as the backward bundle runs them."""
    b, h, lq, d = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    tensors = {"q": q, "k": k, "v": v, "do": do, "out": out, "lse": lse, "dlse": dlse,
               "dq": torch.full(q.shape, float("nan"), dtype=q.dtype),
               "dk": torch.full(k.shape, float("nan"), dtype=k.dtype),
               "dv": torch.full(v.shape, float("nan"), dtype=v.dtype),
               "delta": torch.full(lse.shape, float("nan"))}
    for kernel in ab.KERNELS:
        args = [host_descriptor(tensors[role]) for role in ab.DESCRIPTORS]
        for role, strides in ab.pointer_args(kernel):
            args += [tensors[role]] + [tensors[role].stride(i) for i in range(strides)]
        args.append(())  # no score mod, no closure tensors
        launch(ab.kernel_function(kernel), ab.grid(kernel, b, h, hkv, lq, lk), args, ab.descriptor_blocks(kernel, d),
               ab.kernel_constants(kernel, h, hkv, lq, lk, scale, causal))
    return tensors["dq"], tensors["dk"], tensors["dv"]


SHAPES = [
    (1, 2, 2, 256, 256, 128, True, torch.bfloat16, False),
    (1, 2, 2, 200, 200, 128, False, torch.bfloat16, False),
    (2, 4, 2, 190, 190, 64, True, torch.float16, True),
    (1, 2, 1, 100, 300, 128, False, torch.bfloat16, False),
    (1, 1, 1, 64, 64, 64, True, torch.bfloat16, False),
    (1, 2, 2, 300, 90, 64, False, torch.float16, False),
    # Causal GQA walks sections of 8 KV heads (attention_backward.GQA_SECTION): 9 here, the last alone.
    (3, 6, 3, 200, 200, 64, True, torch.bfloat16, False),
]


def run_fused_kernel(q, k, v, do, out, lse, dlse, causal, scale):
    """The five-product kernel (attention_backward_fused.py) with the delta it reads and the dQ it
    leaves in its float32 buffer computed around it, as bench/fused_backward_probe.py runs it."""
    b, h, lq, d = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    tensors = {"q": q, "k": k, "v": v, "do": do, "lse": lse,
               "delta": ((do.float() * out.float()).sum(-1) - dlse).contiguous(),
               "acc": torch.zeros(q.shape, dtype=torch.float32),
               "dk": torch.full(k.shape, float("nan"), dtype=k.dtype),
               "dv": torch.full(v.shape, float("nan"), dtype=v.dtype)}
    args = [host_descriptor(tensors[role]) for role in ab.DESCRIPTORS + ("acc", )]
    for role, strides in (("lse", 2), ("delta", 2), ("dk", 3), ("dv", 3)):
        args += [tensors[role]] + [tensors[role].stride(i) for i in range(strides)]
    args.append(())
    launch(af.attention_backward_fused, ab.grid("dkdv", b, h, hkv, lq, lk), args,
           ab.descriptor_blocks("dkdv", d) + [[1, 1, 64, d // 2]],
           ab.kernel_constants("dkdv", h, hkv, lq, lk, scale, causal))
    return (tensors["acc"] * scale).to(q.dtype), tensors["dk"], tensors["dv"]


@pytest.mark.parametrize("fused", [False, True], ids=["two_kernels", "fused"])
@pytest.mark.parametrize("b, h, hkv, lq, lk, d, causal, dtype, transposed", SHAPES)
def test_emulated_backward_matches_float64(b, h, hkv, lq, lk, d, causal, dtype, transposed, fused):
    torch.manual_seed(lq + lk + d)

    def make(heads, length):
        if transposed:
            return torch.randn(b, length, heads, d, dtype=dtype).transpose(1, 2)
        return torch.randn(b, heads, length, d, dtype=dtype)

    q, k, v, do = make(h, lq), make(hkv, lk), make(hkv, lk), make(h, lq)
    dlse = torch.randn(b, h, lq)
    scale = d ** -0.5
    want_dq, want_dk, want_dv, out, lse = reference(q, k, v, do, dlse, causal, scale)
    got = (run_fused_kernel if fused else run_kernels)(q, k, v, do, out, lse, dlse, causal, scale)
    # 16-bit P and dS enter the products, as in every flash backward.
    for name, g, want in zip(("dq", "dk", "dv"), got, (want_dq, want_dk, want_dv)):
        error = (g.double() - want).abs().max().item()
        assert error <= 2e-2 * (1 + want.abs().max().item()), (name, error)


def causal(b, h, i, j):
    return i >= j


@pytest.mark.parametrize("fused", [False, True], ids=["two_kernels", "fused"])
@pytest.mark.parametrize("causal", [False, True])
def test_rows_of_far_negative_scores_stay_finite(causal, fused):
    """A row whose scores are all far below zero has exp(-lse) past float32's range: the keys
    TMA reads as zeros past a ragged end must be masked, not only multiplied by their zero K."""
    torch.manual_seed(5)
    q = torch.randn(1, 1, 100, 64).abs().neg().mul(12).to(torch.bfloat16)
    k = (torch.randn(1, 1, 100, 64).abs() + 1).to(torch.bfloat16)
    v, do = torch.randn(1, 1, 100, 64, dtype=torch.bfloat16), torch.randn(1, 1, 100, 64, dtype=torch.bfloat16)
    dlse = torch.zeros(1, 1, 100)
    want_dq, want_dk, want_dv, out, lse = reference(q, k, v, do, dlse, causal, 64 ** -0.5)
    assert lse[0, 0, -1] < -100
    got = (run_fused_kernel if fused else run_kernels)(q, k, v, do, out, lse, dlse, causal, 64 ** -0.5)
    for g, want in zip(got, (want_dq, want_dk, want_dv)):
        assert torch.isfinite(g).all()
        assert (g.double() - want).abs().max().item() <= 2e-2 * (1 + want.abs().max().item())


@pytest.mark.parametrize("reduce_dq", [False, True], ids=["two_kernels", "reduce_dq"])
@pytest.mark.parametrize("mask, b, h, hkv, length, dtype", [
    (causal, 2, 4, 2, 150, torch.bfloat16),
    (None, 1, 2, 2, 140, torch.float16),
])
def test_backward_bundle_runs_the_gluon_kernels_where_asked(mask, b, h, hkv, length, dtype, reduce_dq):
    """build_backward_bundle with warp_specialize: both aligned variants are the Gluon kernels
    (the general ones stay Triton IR; with reduce_dq the delta and five-product kernels in their
    places and the conversion after them, launched with the aligned variants only), and run as
    the runtime binds them (the emulator for the Gluon ones) they give float64 autograd's
    gradients, a logsumexp gradient included."""
    torch.manual_seed(length)
    q, do = (torch.randn(b, length, h, 128, dtype=dtype).transpose(1, 2) for _ in range(2))
    k, v = (torch.randn(b, hkv, length, 128, dtype=dtype) for _ in range(2))
    dlse = torch.randn(b, h, length)
    attn = ae.attention(mask_mod=mask)
    bundle = tb.build_backward_bundle(attn.mlir(q, k, v), "cuda:90", {"warp_specialize": True,
                                                                       "reduce_dq": reduce_dq})
    kernels = bundle.stages + [bundle]
    assert [k.variants["aligned"].ir for k in kernels] == ["ttgir", "ttgir"]
    assert [k.variants["generic"].ir for k in kernels] == ["ttir", "ttir"]
    assert [(s.only, list(s.variants)) for s in bundle.finish] == ([("aligned", ["aligned"])] if reduce_dq else [])
    assert ("dq_sums" in [w.role for w in bundle.workspace]) == reduce_dq
    assert bundle.meta["config"]["reduce_dq"] is reduce_dq
    assert runtime.Bundle.from_json(bundle.to_json()) == bundle
    want_dq, want_dk, want_dv, out, lse = reference(q, k, v, do, dlse, mask is not None, 128 ** -0.5)
    given = {"q": q, "k": k, "v": v, "out": out, "lse": lse, "do": do, "dlse": dlse}
    # The call's layout takes the aligned variants; the general ones (the conversion not
    # launched) must give the same gradients.
    for variant in (None, "generic"):
        got = interpret_roles(bundle, given, variant)
        for role, want in (("dq", want_dq), ("dk", want_dk), ("dv", want_dv)):
            error = (got[role].double() - want).abs().max().item()
            assert error <= 2e-2 * (1 + want.abs().max().item()), (variant, role, error)


def test_the_runtime_allocates_the_dq_sums_only_for_the_aligned_kernels(monkeypatch):
    """runtime.launch_roles on a five-product bundle (launch_one recorded, not run): a call that
    takes the aligned variants launches three kernels and hands the fused one float32 dQ sums of
    q's shape; a call whose q has a non-unit last stride takes the two general kernels, and no
    float32 buffer of q's size is allocated for it."""
    launched, allocated = [], []
    monkeypatch.setattr(runtime, "launch_one", lambda kernel, variant, target, args: launched.append((variant, args)))
    monkeypatch.setattr(runtime, "current_target", lambda device=None: "cuda:90")
    empty = torch.empty

    def recorded(*shape, **kwargs):
        t = empty(*shape, **kwargs)
        if t.device.type != "meta":
            allocated.append(t)
        return t

    meta = [torch.empty(1, 2, 200, 128, dtype=torch.bfloat16, device="meta") for _ in range(3)]
    bundle = tb.build_backward_bundle(ae.attention().mlir(*meta), "cuda:90",
                                      {"warp_specialize": True, "reduce_dq": True})
    wide = torch.randn(1, 2, 200, 256).to(torch.bfloat16)
    aligned = {role: torch.randn(1, 2, 200, 128).to(torch.bfloat16) for role in ("q", "k", "v", "out", "do")}
    aligned.update(lse=torch.randn(1, 2, 200), dlse=torch.zeros(1, 2, 200))
    generic = dict(aligned, q=wide[..., ::2])
    sums = []
    for given, kernels in ((aligned, ["ttgir"] * 3), (generic, ["ttir"] * 2)):
        launched.clear()
        allocated.clear()
        monkeypatch.setattr(torch, "empty", recorded)
        runtime.launch_roles(bundle, given)
        monkeypatch.setattr(torch, "empty", empty)
        assert [variant.ir for variant, _ in launched] == kernels
        arguments = [a.base if hasattr(a, "base") else a for _, args in launched for a in args]
        sums.append([t for t in allocated if t.dtype == torch.float32 and t.shape == given["q"].shape])
        assert all(any(t is a for a in arguments) for t in sums[-1])
    assert len(sums[0]) == 1 and not sums[1]


@pytest.mark.parametrize("dim, mask, expected", [(128, None, True), (128, causal, True), (64, None, False),
                                                  (64, causal, False)])
def test_the_backward_takes_it_at_head_dim_128(dim, mask, expected):
    """The Gluon backward is the default where it ran ahead of the Triton IR kernels on an H100
    (launch_defaults.warp_specialized), in its five-product form (launch_defaults.reduced_dq);
    ping-pong and the persistent grid are the forward's."""
    text = ae.attention(mask_mod=mask).mlir(*(torch.empty(8, 16, 2048, dim, dtype=torch.bfloat16, device="meta")
                                              for _ in range(3)))
    problem = presets.read_problem(parse_module(text, new_context(), "l0.mlir"))
    options = presets.options_for("triton", problem, "cuda:90", backward=True)
    assert options.warp_specialize is expected and options.reduce_dq is expected
    assert not options.persistent and not options.pingpong
    assert not presets.options_for("triton", problem, "cuda:90", warp_specialize=expected).reduce_dq
    off = presets.options_for("triton", problem, "cuda:90", backward=True, warp_specialize=False)
    assert off.warp_specialize is False and off.reduce_dq is False
    two = presets.options_for("triton", problem, "cuda:90", backward=True, reduce_dq=False)
    assert two.warp_specialize is expected and two.reduce_dq is False
    # Asked for at D = 64, the Gluon backward takes its five-product form there too.
    asked = presets.options_for("triton", problem, "cuda:90", backward=True, warp_specialize=True)
    assert asked.warp_specialize and asked.reduce_dq
    with pytest.raises(CompileError, match="'pingpong' is an option of the forward kernel"):
        presets.options_for("triton", problem, "cuda:90", backward=True, warp_specialize=True, pingpong=True)


@pytest.mark.parametrize("mask", [None, causal])
def test_runtime_compiles_the_bundles_kernels_for_sm90(mask):
    """What the runtime compiles on the GPU, compiled here: both kernels of a GQA backward bundle
    at D 128, their four descriptors' TMA boxes read back for Triton's launcher, tensor-core
    products, and ptxas's spills: none in the dQ kernel; the dK/dV kernel's consumers hold four
    tile accumulators and reload a few scalars per query block (0-160 bytes across shapes)."""
    meta = [torch.empty(2, h, 1000, 128, dtype=torch.bfloat16, device="meta") for h in (8, 2, 2)]
    bundle = tb.build_backward_bundle(ae.attention(mask_mod=mask).mlir(*meta), "cuda:90",
                                      {"warp_specialize": True, "reduce_dq": False})
    for kernel in bundle.stages + [bundle]:
        compiled = runtime.compile_variant(kernel.variants["aligned"], "cuda:90", kernel.num_warps, kernel.num_stages)
        ptx = compiled.asm["ptx"]
        # 64-row boxes of 128-byte rows (the swizzle's span) for q, k, v and do.
        assert [m["block_size"] for m in compiled.metadata.tensordesc_meta] == [[1, 1, 64, 64]] * 4
        assert ptx.count("wgmma.mma_async") >= 6 and "cp.async.bulk.tensor" in ptx and ".maxnreg 168" in ptx
        assert ptxas_spill_bytes(ptx) <= (256 if kernel is bundle else 0), kernel.name


@pytest.mark.parametrize("mask", [None, causal])
def test_runtime_compiles_the_reduced_dq_kernels_for_sm90(mask):
    """With reduce_dq, what the runtime compiles on the GPU, compiled here: the delta kernel,
    the five-product kernel (its dQ added by TMA reduce-adds, no per-element atomics; five
    descriptors, the dQ sums' in 64 x 32 float32 boxes; within the H100's 227 KiB of shared
    memory; ptxas spills 40-400 bytes across shapes, a few scalars reloaded per query block as in
    the dK/dV kernel; 396 for this causal GQA one, whose grid walks sections of KV heads) and the
    conversion."""
    meta = [torch.empty(2, h, 1000, 128, dtype=torch.bfloat16, device="meta") for h in (8, 2, 2)]
    bundle = tb.build_backward_bundle(ae.attention(mask_mod=mask).mlir(*meta), "cuda:90",
                                      {"warp_specialize": True, "reduce_dq": True})
    compiled = [runtime.compile_variant(k.variants["aligned"], "cuda:90", k.num_warps, k.num_stages)
                for k in runtime.kernels(bundle, True)]
    delta, fused, convert = (c.asm["ptx"] for c in compiled)
    assert "cp.reduce.async.bulk.tensor.4d.global.shared::cta.add" in fused
    assert not any(op in fused for op in ("atom.global", "red.global"))
    assert [m["block_size"] for m in compiled[1].metadata.tensordesc_meta] == [[1, 1, 64, 64]] * 4 + [[1, 1, 64, 32]]
    assert compiled[1].metadata.shared <= 227 * 1024 and ptxas_spill_bytes(fused) <= 416
    assert "wgmma" not in delta + convert and "st.global" in delta and "st.global" in convert


def test_deterministic_algorithms_take_the_two_kernel_backward():
    """Under torch.use_deterministic_algorithms a call's backward asks for the form whose dQ has
    the same bits every run (no reduce-adds); otherwise the preset's default stands."""
    q, k, v = (torch.randn(1, 2, 128, 128, dtype=torch.bfloat16) for _ in range(3))
    text = ae.attention(mask_mod=causal).mlir(q, k, v)
    assert "reduce_dq" not in (tb.backward_call_config(text, "cuda:90", {"q": q, "k": k, "v": v}) or {})
    torch.use_deterministic_algorithms(True)
    try:
        assert tb.backward_call_config(text, "cuda:90", {"q": q, "k": k, "v": v}) == {"reduce_dq": False}
    finally:
        torch.use_deterministic_algorithms(False)
