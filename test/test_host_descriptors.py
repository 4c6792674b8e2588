"""TMA tile loads through descriptors made on the host (attn-lower-to-triton{host-descriptors}):
the cuda:90 defaults that take them, their numerics in the Triton IR interpreter against float64
(ragged lengths, the transposed layout, GQA, a batch of one), the kernel
arguments the runtime makes for them, and the launcher signature Triton needs."""
from __future__ import annotations

import pytest
import torch

import ae_mlir as ae
from ae_mlir import kernel_args, presets, runtime
from ae_mlir.backends import triton as tb
from bundle_interp import interpret

TOL = {"atol": 2e-2, "rtol": 2e-2}


def causal(b, h, i, j):
    return i >= j


def _bundle(attn, q, k, v):
    # The Triton IR kernel: at D = 128 plain and causal attention default to attn-lower-to-gluon's
    # kernel (test_lower_to_gluon.py), which takes host descriptors too but no interpreter runs.
    bundle = tb.compile_bundle(attn, q, k, v, target="cuda:90", config={"warp_specialize": False})
    ttir = bundle.variants["aligned"].ttir
    return bundle, ttir


def _check(attn, q, k, v, **call):
    """The cuda:90 default bundle takes host descriptors and matches float64 in the interpreter."""
    bundle, ttir = _bundle(attn, q, k, v)
    assert bundle.meta["config"].get("host_descriptors") is True
    assert "!tt.tensordesc" in ttir and "tt.make_tensor_descriptor" not in ttir
    (out, _), chosen = interpret(bundle, q, k, v, *attn._build(q, k, v)[1])
    assert chosen is bundle.variants["aligned"]
    want = attn(q.double(), k.double(), v.double(), backend="reference", **call)
    torch.testing.assert_close(out.double(), want, **TOL)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("length", [150, 256])
@pytest.mark.parametrize("mask", [None, causal], ids=["full", "causal"])
def test_default_bundles_read_through_host_descriptors(length, mask, dtype):
    torch.manual_seed(length)
    attn = ae.attention(mask_mod=mask)
    dim = 64 if dtype == torch.float16 else 128
    q, k, v = (torch.randn(1, 2, length, dim).to(dtype) for _ in range(3))
    _check(attn, q, k, v)


def test_transposed_layout_and_gqa():
    """[B, L, H, D] tensors seen as [B, H, L, D] (row stride H * D), two query heads per KV head,
    a batch of two and a ragged length: the descriptors take the tensors' own strides."""
    torch.manual_seed(1)
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625])
    attn = ae.attention(score_mod=lambda s, b, h, i, j: s + slopes[h] * (j - i), mask_mod=causal)
    q = torch.randn(2, 130, 4, 128).to(torch.bfloat16).transpose(1, 2)
    k, v = (torch.randn(2, 130, 2, 128).to(torch.bfloat16).transpose(1, 2) for _ in range(2))
    _check(attn, q, k, v)


@pytest.mark.parametrize("case", ["fp32", "hip", "sm80", "decoding", "table", "backward", "d256"])
def test_where_the_defaults_keep_pointer_loads(case):
    """Host descriptors are on where they were measured: 16-bit forward softmax kernels on sm90 at
    head dims up to 128, past decoding shapes, without a score_mod that gathers from a closure tensor by
    position (the relative-bias table ran 1-2% slower through them)."""
    table = torch.randn(4, 511)
    mods = {"score_mod": lambda s, b, h, i, j: s + table[h, i - j + 255]} if case == "table" else {}
    dtype = torch.float32 if case == "fp32" else torch.bfloat16
    dim = 256 if case == "d256" else 128
    q = torch.randn(1, 4, 8 if case == "decoding" else 256, dim, dtype=dtype)
    k = v = torch.randn(1, 4, 256, dim, dtype=dtype)
    target = {"hip": "hip:gfx942", "sm80": "cuda:80"}.get(case, "cuda:90")
    overrides = {"backward": True} if case == "backward" else {}
    options = presets.options_for("triton", _problem(ae.attention(**mods), q, k, v), target, **overrides)
    assert not options.host_descriptors
    q, k, v = (torch.randn(1, 4, 256, 128, dtype=torch.bfloat16) for _ in range(3))
    options = presets.options_for("triton", _problem(ae.attention(), q, k, v), "cuda:90")
    assert options.host_descriptors and options.tensor_descriptors


def _problem(attn, q, k, v):
    from ae_mlir.core.context import new_context
    from mlir import ir

    with new_context():
        return presets.read_problem(ir.Module.parse(attn.mlir(q, k, v)))


def test_kernel_arguments_of_a_host_descriptor():
    """The argument list follows the tt.func's parameters (a HostDescriptor, then the sizes and
    strides, a dimension of size 1 given the extent inside it, as a contiguous tensor has it);
    Triton's launcher takes the descriptors alone (it passes their sizes and strides on itself)."""
    attn = ae.attention(mask_mod=causal)
    q, k, v = (torch.randn(1, 2, 256, 128).to(torch.bfloat16) for _ in range(3))
    bundle, _ = _bundle(attn, q, k, v)
    variant = bundle.variants["aligned"]
    tensors = runtime.bind(bundle, q, k, v)
    values = kernel_args.argument_values(variant, tensors, [])
    at = variant.args.index("k.tma")
    desc = values[at]
    assert isinstance(desc, kernel_args.HostDescriptor) and desc.base is tensors["k"]
    assert desc.shape == (1, 2, 256, 128) and desc.strides == (2 * 256 * 128, 256 * 128, 128, 1)
    assert values[at + 1: at + 9] == [1, 2, 256, 128, 2 * 256 * 128, 256 * 128, 128, 1]
    # A view whose batch of one has any stride, and a [B, L, H, D] tensor seen as [B, H, L, D].
    odd = torch.randn(2, 2, 256, 128).to(torch.bfloat16)[:1].as_strided((1, 2, 256, 128), (7, 256 * 128, 128, 1))
    assert kernel_args.descriptor_strides(odd) == (2 * 256 * 128, 256 * 128, 128, 1)
    blhd = torch.randn(1, 256, 2, 128).transpose(1, 2)
    assert kernel_args.descriptor_strides(blhd) == (256 * 2 * 128, 128, 2 * 128, 1)
    positions = kernel_args.launcher_positions(variant)
    kept = [variant.args[i] for i in positions]
    assert "k.tma" in kept and not any(".tma." in label for label in kept)
    assert len(kept) == len(variant.args) - 3 * 8  # q, k and v's descriptors, 4 sizes and 4 strides each
    plan = runtime.launch_plan(bundle, tensors, "cpu", lambda kernel: [])
    made = plan[-1].arguments(tensors)[at]
    assert isinstance(made, kernel_args.HostDescriptor) and made.base is tensors["k"]


def test_launcher_signature_of_a_compiled_kernel():
    """A Triton IR source lists a host descriptor's parameter and its sizes and strides; the
    runtime rewrites the compiled kernel's signature to the frontend's single "tensordesc" entry,
    which Triton's launcher builds the descriptor from."""
    pytest.importorskip("triton")
    attn = ae.attention(mask_mod=causal)
    q, k, v = (torch.randn(1, 2, 256, 128).to(torch.bfloat16) for _ in range(3))
    bundle, ttir = _bundle(attn, q, k, v)
    kernel = runtime.compile_ttir(ttir, "cuda:90", bundle.num_warps, bundle.num_stages)
    signature = list(kernel.src.signature.values())
    assert signature.count("tensordesc<bf16[1, 1, 128, 128]>") == 1
    assert signature.count("tensordesc<bf16[1, 1, 64, 128]>") == 2
    assert len(signature) == len(kernel_args.launcher_positions(bundle.variants["aligned"]))
    assert not any(str(t).startswith("!tt.tensordesc") for t in signature)
