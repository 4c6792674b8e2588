"""The Gluon backward kernels with a score_mod (passes/gluon/score_mod.py): bundles built with
`warp_specialize` take the Gluon kernels for their aligned variants, and run as the runtime binds
them (the emulator for the Gluon kernels) they give float64 autograd's gradients, in both forms,
with and without the causal mask, GQA and ragged lengths; every entry of the tracer's table goes
through them; their sm90 PTX; a mod they cannot lower is a located error; the default keeps mods
on the Triton IR kernels."""
from __future__ import annotations

import inspect

import pytest
import torch

import ae_mlir as ae
from ae_mlir import presets, runtime
from ae_mlir.backends import triton as tb
from ae_mlir.core.context import CompileError, new_context, parse_module

import test_torch_functions as table
from bundle_interp import interpret_roles
from ptxas_report import ptxas_spill_bytes


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


MODS = {
    "softcap": lambda s, b, h, q_idx, kv_idx: 30.0 * torch.tanh(s / 30.0),
    "position bias": lambda s, b, h, q_idx, kv_idx: s + (kv_idx - q_idx) * 0.05,
    "buckets": lambda s, b, h, q_idx, kv_idx: s - 0.5 * torch.abs((q_idx - kv_idx) // 32),
    "per head and batch": lambda s, b, h, q_idx, kv_idx: s * (1.0 + 0.25 * h) - 0.5 * b,
    "leaky": lambda s, b, h, q_idx, kv_idx: torch.where(s > 0, s, 0.25 * s),
    "smooth": lambda s, b, h, q_idx, kv_idx: s + torch.log1p(torch.exp(-s.abs())),
}


def reference(q, k, v, do, dlse, mod, mask):
    """dQ, dK, dV of sum(out * dO) + sum(lse * dlse) in float64, and the forward's out and lse."""
    group = q.shape[1] // k.shape[1]
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    s = torch.einsum("bhqd,bhkd->bhqk", q64, k64.repeat_interleave(group, 1)) * q.shape[-1] ** -0.5
    b, h, i, j = (torch.arange(n).view([-1 if d == a else 1 for a in range(4)]) for d, n in enumerate(s.shape))
    s = mod(s, b, h, i, j)
    if mask is not None:
        s = s.masked_fill(~mask(b, h, i, j), float("-inf"))
    lse = torch.logsumexp(s, -1)
    out = torch.einsum("bhqk,bhkd->bhqd", torch.softmax(s, -1), v64.repeat_interleave(group, 1))
    ((out * do.double()).sum() + (lse * dlse.double()).sum()).backward()
    return (q64.grad, k64.grad, v64.grad), out.detach().to(q.dtype), lse.detach().float()


def check_gluon_backward(mod, mask, b, h, hkv, lq, lk, dim, dtype, reduce_dq, variants=(None, )):
    """The bundle built with warp_specialize (the Gluon kernels for its aligned variants) against
    float64 autograd: every gradient's largest error within 2% of its largest value."""
    q, do = (torch.randn(b, h, lq, dim).mul(2).to(dtype) for _ in range(2))
    k, v = (torch.randn(b, hkv, lk, dim).mul(2).to(dtype) for _ in range(2))
    dlse = torch.randn(b, h, lq)
    attn = ae.attention(score_mod=mod, mask_mod=mask)
    bundle = tb.build_backward_bundle(attn.mlir(q, k, v), "cuda:90", {"warp_specialize": True,
                                                                       "reduce_dq": reduce_dq, "closure_grads": False})
    assert {k.variants["aligned"].ir for k in runtime.kernels(bundle, True)} == {"ttgir"}
    want, out, lse = reference(q, k, v, do, dlse, mod, mask)
    given = {"q": q, "k": k, "v": v, "out": out, "lse": lse, "do": do, "dlse": dlse}
    given.update((f"c{i}", t) for i, t in enumerate(attn._build(q, k, v)[1]))
    for variant in variants:
        got = interpret_roles(bundle, given, variant)
        for role, w in zip(("dq", "dk", "dv"), want):
            error = (got[role].double() - w).abs().max().item()
            assert error <= 2e-2 * w.abs().max().item() + 1e-3, (variant, role, error)


@pytest.mark.parametrize("reduce_dq", [False, True], ids=["two_kernels", "reduce_dq"])
@pytest.mark.parametrize("name, mask, b, h, hkv, lq, lk, dim, dtype", [
    ("softcap", causal, 1, 2, 1, 150, 150, 128, torch.bfloat16),
    ("position bias", causal, 1, 2, 2, 130, 130, 64, torch.float16),
    ("buckets", None, 1, 2, 1, 100, 230, 128, torch.bfloat16),
    ("per head and batch", causal, 2, 2, 1, 96, 96, 64, torch.bfloat16),
    ("leaky", None, 1, 1, 1, 200, 70, 64, torch.bfloat16),
    ("smooth", causal, 1, 1, 1, 140, 140, 128, torch.float16),
])
def test_emulated_backward_with_a_score_mod_matches_float64(name, mask, b, h, hkv, lq, lk, dim, dtype, reduce_dq):
    torch.manual_seed(lq + lk + dim)
    check_gluon_backward(MODS[name], mask, b, h, hkv, lq, lk, dim, dtype, reduce_dq)


def test_the_general_variant_of_a_modded_bundle_agrees():
    """The same bundle's general variants (the Triton IR kernels, for layouts the aligned ones do
    not take) give the same gradients."""
    torch.manual_seed(3)
    check_gluon_backward(MODS["softcap"], causal, 1, 2, 1, 100, 100, 64, torch.bfloat16, True, ("generic", ))


def test_every_table_entry_through_the_gluon_backward():
    """One attention holding every entry of the tracer's table (entry e on head e, as
    test_torch_functions builds it), its backward in the Gluon kernels, against float64
    autograd of eager torch: each entry's head's gradients."""
    names = table.NAMES
    torch.manual_seed(0)
    q, k, v, do = (torch.randn(1, len(names), 64, 64).to(torch.bfloat16) for _ in range(4))
    dlse = torch.zeros(1, len(names), 64)

    def mod(s, b, h, q_idx, kv_idx):
        return torch.stack([table.EXAMPLES[name](s[:, e], q_idx[..., 0, :, :], kv_idx[..., 0, :, :])
                            for e, name in enumerate(names)], dim=1).to(s.dtype)

    want, out, lse = reference(q, k, v, do, dlse, mod, None)
    bundle = tb.build_backward_bundle(table._attention(names).mlir(q, k, v), "cuda:90",
                                      {"warp_specialize": True})
    assert {k.variants["aligned"].ir for k in runtime.kernels(bundle, True)} == {"ttgir"}
    got = interpret_roles(bundle, {"q": q, "k": k, "v": v, "out": out, "lse": lse, "do": do, "dlse": dlse})
    for e, name in enumerate(names):
        for role, w in zip(("dq", "dk", "dv"), want):
            error = (got[role][:, e].double() - w[:, e]).abs().max().item()
            assert error <= 2e-2 * w[:, e].abs().max().item() + 1e-3, (name, role, error)


@pytest.mark.parametrize("fast_tanh", [True, False])
def test_modded_kernels_compile_for_sm90(fast_tanh):
    """What the runtime compiles on the GPU, compiled here: soft-capping's five-product kernel
    takes tanh from the hardware where the preset's fast_tanh asks (tanh.approx, in S's
    recomputation and its derivative, once: the derivative's factor is taken beside it) and the
    exact formula otherwise; its consumers spill more than the unmodded kernel's (484 against 128
    bytes causal at B 8, H 16, L 2048: the factor stays live across dP^T's product), within the
    H100's shared memory."""
    meta = [torch.empty(8, 16, 2048, 128, dtype=torch.bfloat16, device="meta") for _ in range(3)]
    bundle = tb.build_backward_bundle(ae.attention(score_mod=MODS["softcap"], mask_mod=causal).mlir(*meta),
                                      "cuda:90", {"warp_specialize": True, "reduce_dq": True, "fast_tanh": fast_tanh})
    compiled = [runtime.compile_variant(k.variants["aligned"], "cuda:90", k.num_warps, k.num_stages)
                for k in runtime.kernels(bundle, True)]
    fused = compiled[1].asm["ptx"]
    assert fused.count("wgmma.mma_async") >= 10 and "cp.reduce.async.bulk.tensor" in fused
    # The consumers' two loops (masked and not) of two warpgroups, 32 elements a thread each.
    assert fused.count("tanh.approx.f32") == (128 if fast_tanh else 0) and "ex2.approx" in fused
    assert compiled[1].metadata.shared <= 227 * 1024 and ptxas_spill_bytes(fused) <= 768


def test_an_additive_bias_holds_no_second_factor_of_p():
    """A mod whose derivative hands the gradient back as it is (a bias added to the score) takes P
    itself as dS's factor: the two-kernel dK/dV kernel's consumers spill at most 64 bytes (28 at
    B 8, H 16, L 2048 with the shortcut; 272 holding a second factor across dP^T's product), and
    soft-capping, whose derivative is not 1, keeps its factor (more spills)."""
    meta = [torch.empty(8, 16, 2048, 128, dtype=torch.bfloat16, device="meta") for _ in range(3)]
    spills = {}
    for name in ("position bias", "softcap"):
        bundle = tb.build_backward_bundle(ae.attention(score_mod=MODS[name], mask_mod=causal).mlir(*meta),
                                          "cuda:90", {"warp_specialize": True, "reduce_dq": False})
        dkdv = [k for k in runtime.kernels(bundle, True) if k.name.endswith("dkdv")][0]
        ptx = runtime.compile_variant(dkdv.variants["aligned"], "cuda:90", dkdv.num_warps, dkdv.num_stages).asm["ptx"]
        spills[name] = ptxas_spill_bytes(ptx)
    assert spills["position bias"] <= 64 < spills["softcap"], spills


@pytest.mark.parametrize("reduce_dq", [False, True], ids=["two_kernels", "reduce_dq"])
@pytest.mark.parametrize("name, mask, hkv, lq, lk, dim", [
    ("alibi", causal, 1, 150, 150, 128),
    ("bias table", None, 2, 100, 170, 64),
    ("ids", causal, 2, 130, 130, 64),
])
def test_emulated_backward_reading_closure_tensors_matches_float64(name, mask, hkv, lq, lk, dim, reduce_dq):
    """Score mods that read closure tensors (a slope per head, a [H, Lq + Lk - 1] bias table read
    by position, int64 ids per key) in the Gluon kernels, which take them as pointers (c0, c1),
    against float64 autograd."""
    torch.manual_seed(lk + dim)
    slopes, table = torch.rand(2) - 0.5, torch.randn(2, lq + lk - 1)
    ids = torch.randint(0, 3, (lk, ))
    mods = {
        "alibi": lambda s, b, h, q_idx, kv_idx: s + slopes[h] * (kv_idx - q_idx),
        "bias table": lambda s, b, h, q_idx, kv_idx: s + table[h, q_idx - kv_idx + lk - 1],
        "ids": lambda s, b, h, q_idx, kv_idx: s + torch.where(ids[q_idx] == ids[kv_idx], 0.5, -0.5) * slopes[h],
    }
    check_gluon_backward(mods[name], mask, 1, 2, hkv, lq, lk, dim, torch.bfloat16, reduce_dq)


def test_an_unclamped_closure_read_is_zero_out_of_bounds():
    """An index the IR does not clamp (the tracer always does; hand-written IR may not) reads 0
    outside the tensor, as the Triton IR kernels' reads do: c0 of 4 elements read at every key of
    100, through the Gluon kernels, against float64 autograd of that zero-padded read."""
    torch.manual_seed(5)
    c = torch.randn(4)
    q, k, v, do = (torch.randn(1, 2, 100, 64).to(torch.bfloat16) for _ in range(4))
    dlse = torch.randn(1, 2, 100)
    text = ae.attention(score_mod=lambda s, b, h, q_idx, kv_idx: s + c[kv_idx]).mlir(q, k, v)
    assert text.count("tensor.extract %c0[%s4]") == 1
    text = text.replace("tensor.extract %c0[%s4]", "tensor.extract %c0[%kv_idx]")
    bundle = tb.build_backward_bundle(text, "cuda:90", {"warp_specialize": True, "closure_grads": False})
    padded = torch.cat([c, torch.zeros(96)])
    want, out, lse = reference(q, k, v, do, dlse, lambda s, b, h, q_idx, kv_idx: s + padded[kv_idx], None)
    got = interpret_roles(bundle, {"q": q, "k": k, "v": v, "out": out, "lse": lse, "do": do, "dlse": dlse, "c0": c})
    for role, w in zip(("dq", "dk", "dv"), want):
        assert (got[role].double() - w).abs().max().item() <= 2e-2 * w.abs().max().item() + 1e-3, role


def test_a_closure_tensor_past_32_bit_offsets_is_a_located_error():
    """The kernels offset a closure tensor's pointer in 32 bits: one of 2^31 elements fails at the
    read (the module's type alone: no such tensor is made)."""
    slopes = torch.tensor([0.5, 0.25])
    meta = [torch.empty(1, 2, 256, 64, dtype=torch.bfloat16, device="meta") for _ in range(3)]
    text = ae.attention(score_mod=lambda s, b, h, q_idx, kv_idx: s + slopes[h]).mlir(*meta)
    assert text.count("tensor<2xf32>") == 2
    text = text.replace("tensor<2xf32>", "tensor<2147483648xf32>").replace("arith.constant 1 : index",
                                                                             "arith.constant 2147483647 : index")
    with pytest.raises(CompileError, match="2\\^31 elements or more"):
        tb.build_backward_bundle(text, "cuda:90", {"warp_specialize": True, "closure_grads": False})


def test_closure_gradients_keep_the_triton_ir_backward():
    """The Gluon kernels compute no closure tensor's gradient: with closure gradients asked for
    (a tensor that requires grad), warp_specialize is an error naming the option, and the default
    takes the Triton IR kernels; without, the Gluon kernels take the slopes as their c0."""
    slopes = torch.tensor([0.5, 0.25])

    def alibi(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx)

    meta = [torch.empty(1, 2, 256, 128, dtype=torch.bfloat16, device="meta") for _ in range(3)]
    text = ae.attention(score_mod=alibi, mask_mod=causal).mlir(*meta)
    with pytest.raises(CompileError, match="warp-specialize.*closure tensor's gradient"):
        tb.build_backward_bundle(text, "cuda:90", {"warp_specialize": True})
    assert {k.variants["aligned"].ir for k in runtime.kernels(tb.build_backward_bundle(text, "cuda:90"), True)} \
        == {"ttir"}
    kernels = runtime.kernels(tb.build_backward_bundle(text, "cuda:90", {"warp_specialize": True,
                                                                        "closure_grads": False}), True)
    assert [k.variants["aligned"].args[-1] for k in kernels] == ["c0", "c0"]
    assert {k.variants["aligned"].ir for k in kernels} == {"ttgir"}


def test_index_arithmetic_past_32_bits_is_a_located_error():
    """The Gluon kernels compute positions in 32 bits: a mod whose index arithmetic can leave i32
    at the module's shapes (q_idx * kv_idx from L = 46342 on) fails at its line when they are
    asked for, and the default takes the Triton IR kernels, which compute it in 64 bits. The same
    mod one key shorter, where 46340^2 fits, takes the Gluon kernels."""
    def product_bands(score, b, h, q_idx, kv_idx):
        return score + ((q_idx * kv_idx) % 7).float()

    line = inspect.getsourcelines(product_bands)[1] + 1
    texts = {}
    for length, fits in ((46341, True), (46342, False)):
        meta = [torch.empty(1, 1, length, 128, dtype=torch.bfloat16, device="meta") for _ in range(3)]
        texts[length] = ae.attention(score_mod=product_bands, mask_mod=causal).mlir(*meta, debug_info=True)
        problem = presets.read_problem(parse_module(texts[length], new_context(), "l0.mlir"))
        assert (problem.gluon_backward == "causal") is fits
    with pytest.raises(CompileError) as raised:
        tb.build_backward_bundle(texts[46342], "cuda:90", {"warp_specialize": True})
    diagnostic = raised.value.diagnostics[0]
    assert "[0, 2147488281]" in diagnostic.message and "64 bits" in diagnostic.message
    assert diagnostic.line == line and diagnostic.filename.endswith("test_gluon_score_mods.py")


def test_the_default_keeps_score_mods_on_the_triton_ir_kernels():
    """A score_mod's backward takes the Triton IR kernels by default, which ran ahead of the Gluon
    ones on soft-capping (launch_defaults.warp_specialized); asked for, the Gluon ones in their
    two-kernel form, which ran ahead of the five-product one with the mod (launch_defaults.
    reduced_dq). The forward's Gluon kernel takes no score_mod."""
    meta = [torch.empty(8, 16, 2048, 128, dtype=torch.bfloat16, device="meta") for _ in range(3)]
    text = ae.attention(score_mod=MODS["softcap"], mask_mod=causal).mlir(*meta)
    problem = presets.read_problem(parse_module(text, new_context(), "l0.mlir"))
    assert problem.score_mod and problem.gluon_backward == "causal" and problem.simple_mask is None
    assert not presets.options_for("triton", problem, "cuda:90", backward=True).warp_specialize
    asked = presets.options_for("triton", problem, "cuda:90", backward=True, warp_specialize=True)
    assert asked.warp_specialize and not asked.reduce_dq
    assert not presets.options_for("triton", problem, "cuda:90").warp_specialize


def test_a_bias_mods_default_backward_is_the_gluon_kernels_and_a_tanh_mods_takes_narrow_tiles():
    """The presets read what a score_mod does (core.mod_traits): one that adds a bias (ALiBi) takes
    the Gluon backward by default, in two kernels, where its closure tensors' gradients are not
    wanted, and the Triton IR kernels where they are; soft-capping (a tanh) keeps the Triton IR
    kernels, its dK/dV kernel on 32x64 tiles and 4 warps (launch_defaults.backward_config)."""
    from ae_mlir.variants import Shape, build

    meta = [torch.empty(8, 16, 2048, 128, dtype=torch.bfloat16, device="meta") for _ in range(3)]
    options = {}
    for name in ("alibi", "softcap"):
        attn, _ = build(name, Shape(8, 16, 2048, 2048, 128, 128), device="cpu", seed=0)
        problem = presets.read_problem(parse_module(attn.mlir(*meta), new_context(), "l0.mlir"))
        options[name] = [presets.options_for("triton", problem, "cuda:90", backward=True, closure_grads=grads)
                         for grads in (True, False)]
    (alibi_grads, alibi), (softcap, _) = options["alibi"], options["softcap"]
    assert not alibi_grads.warp_specialize and alibi.warp_specialize and not alibi.reduce_dq
    assert not softcap.warp_specialize
    assert (softcap.dkdv_block_m, softcap.dkdv_block_n, softcap.dkdv_num_warps,
            softcap.dkdv_num_stages) == (32, 64, 4, 3)
    assert (alibi_grads.dkdv_block_m, alibi_grads.dkdv_block_n, alibi_grads.dkdv_num_warps) == (64, 128, 8)


def test_a_tanh_that_decides_keeps_the_exact_formula_in_both_functions():
    """With fast_tanh, a tanh whose value reaches a comparison keeps the exact formula (the
    approximation could flip it); the chain rule adds such a comparison for max's winner to the
    derivative alone, so the decision is taken for the mod and its derivative together: P and
    its gradient see the same tanh, and no kernel holds the approximation."""
    def capped(score, b, h, q_idx, kv_idx):
        return torch.maximum(30.0 * torch.tanh(score / 30.0), 0.5 * score)

    meta = [torch.empty(1, 2, 256, 64, dtype=torch.bfloat16, device="meta") for _ in range(3)]
    for mod, approximated in ((MODS["softcap"], True), (capped, False)):
        bundle = tb.build_backward_bundle(ae.attention(score_mod=mod).mlir(*meta), "cuda:90",
                                          {"warp_specialize": True, "fast_tanh": True})
        texts = [k.variants["aligned"].ttir for k in runtime.kernels(bundle, True)]
        assert all(("tanh.approx.f32" in text) is approximated for text in texts)
