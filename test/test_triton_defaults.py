"""The Triton backend at its default launch configuration (the block sizes `compile_bundle` picks
for a target when it is given no config) on ragged shapes: sequences shorter than a block or not a
multiple of it, head dims that are not powers of two. Each bundle is compiled for the target as for
a GPU and run in the NumPy TTIR interpreter against the float64 reference executor; one is also
compiled by Triton for both GPU families.

Other suites compile with small explicit blocks; these shapes only go wrong at the defaults'
larger ones, where the last KV tile can be shorter than half a block.
"""
from __future__ import annotations

import pytest
import torch

import ae_mlir as ae
from ae_mlir import runtime
from ae_mlir.backends import call_time_tiles as ctt
from ae_mlir.backends import triton as tb
from ae_mlir.reference import run_module_text
from bundle_interp import interpret
from inputs import qkv

pytest.importorskip("mlir", reason="compile_bundle needs the MLIR bindings")

TARGETS = ("cuda:90", "hip:gfx942")
DTYPES = (torch.float32, torch.bfloat16)
# Outputs are in the input dtype; P is rounded to it before P @ V, as on the GPU.
TOL = {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


def check_default_config(q, k, v, target: str):
    attn = ae.attention()
    # The Triton IR kernels at the defaults; attn-lower-to-gluon's, the cuda:90 default of 16-bit
    # attention at D = 128, runs on a GPU only (test_lower_to_gluon.py).
    bundle = tb.compile_bundle(attn, q, k, v, target=target, config={"warp_specialize": False})
    (out, lse), _ = interpret(bundle, q, k, v)
    ref_out, ref_lse = run_module_text(attn.mlir(q, k, v), [q, k, v], torch.float64)
    assert not torch.isnan(out).any(), "the kernel left output elements unwritten"
    torch.testing.assert_close(out.double(), ref_out, **TOL[q.dtype])
    torch.testing.assert_close(lse.double(), ref_lse.double(), atol=1e-4, rtol=1e-4)


# Shapes whose last KV tile canonicalize made static and shorter than half the default block: the
# lowering failed with "'tensor.pad' op pads a slice of a function argument only".
REPORTED = [
    (torch.float32, (1, 2, 77, 64)),
    (torch.float32, (2, 3, 200, 48)),
    (torch.bfloat16, (1, 2, 200, 48)),
    (torch.float32, (1, 2, 40, 32)),
]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype,shape", REPORTED, ids=lambda x: "x".join(map(str, x)) if isinstance(x, tuple)
                         else str(x).removeprefix("torch."))
def test_reported_ragged_shapes(dtype, shape, target):
    b, h, length, dim = shape
    q, k, v = qkv(b=b, h=h, lq=length, dk=dim, dtype=dtype, seed=length + dim)
    check_default_config(q, k, v, target)


@pytest.mark.parametrize("target,kind,needle", [("cuda:90", "ptx", "wgmma"), ("hip:gfx942", "amdgcn", "mfma")])
def test_reported_shape_compiles_for_the_gpu(target, kind, needle):
    q = torch.empty(1, 2, 200, 48, dtype=torch.bfloat16, device="meta")
    bundle = tb.compile_bundle(ae.attention(), q, q, q, target=target)
    compiled = runtime.compile_variant(bundle.variants["aligned"], target, bundle.num_warps, bundle.num_stages)
    assert needle in compiled.asm[kind]


LENGTHS = (1, 5, 40, 77, 130, 200)
HEAD_DIMS = (16, 48, 64, 80, 128)


def _sweep():
    """Each target and dtype sees every length as Lq and as Lk and every head dim, paired by a
    rotation that differs between them (so Lq = Lk in one group, Lq != Lk in the others)."""
    cases = []
    for t, target in enumerate(TARGETS):
        for d, dtype in enumerate(DTYPES):
            shift = 2 * t + d
            for i, lq in enumerate(LENGTHS):
                lk = LENGTHS[(i + shift) % len(LENGTHS)]
                dim = HEAD_DIMS[(i + shift) % len(HEAD_DIMS)]
                name = f"{target}-{str(dtype).removeprefix('torch.')}-lq{lq}-lk{lk}-d{dim}"
                cases.append(pytest.param(target, dtype, lq, lk, dim, id=name))
    return cases


@pytest.mark.parametrize("target,dtype,lq,lk,dim", _sweep())
def test_default_config_sweep(target, dtype, lq, lk, dim):
    q, k, v = qkv(b=1, h=1, lq=lq, lk=lk, dk=dim, dtype=dtype, seed=lq * 7 + lk + dim)
    check_default_config(q, k, v, target)


def _documents_call(keep):
    """(attention, L0 text, call inputs) of a mask `keep(doc)` over documents of 100-300 tokens
    (a closure tensor, so classified at call time): bf16, B=1 H=2 L=1000 D=128."""
    doc = torch.repeat_interleave(torch.arange(6), torch.tensor([130, 250, 100, 300, 120, 100]))
    attn = ae.attention(mask_mod=keep(doc))
    q, k, v = qkv(b=1, h=2, lq=1000, dk=128, dtype=torch.bfloat16, seed=3)
    return attn, attn.mlir(q, k, v), [q, k, v, *attn._build(q, k, v)[1]]


@pytest.mark.parametrize("name, keep, tiles, backward", [
    # (B 1, H 2: so few dK/dV programs that the preset's backward already takes 32 x 64 there.)
    ("documents", lambda doc: lambda b, h, q, kv: doc[q] == doc[kv], (64, 64, 4, 3),
     {"block_m": 64, "num_warps": 4, "num_stages": 2}),
    ("padding", lambda doc: lambda b, h, q, kv: doc[kv] < 3, (128, 64, 8, 3), {}),
])
def test_call_time_masks_take_the_tiles_their_first_tables_ask_for(name, keep, tiles, backward):
    """A mask that reads a closure tensor is classified at call time; its first call's tables at
    the preset's 128 x 64 tiles (16-bit, D = 128) say how many tiles it cuts per query block: a
    block diagonal of documents of 100-300 tokens cuts more than a causal diagonal does, so the
    module runs at 64 x 64 from then on; a padding mask over keys cuts one, and keeps the tiles.
    The bundle chosen is checked in the TTIR interpreter against the reference."""
    _, text, inputs = _documents_call(keep)
    bundle = tb._default_bundle(text, "cuda:90", inputs)
    config = bundle.meta["config"]
    assert (config["block_m"], config["block_n"], config["num_warps"], config["num_stages"]) == tiles
    assert tb._default_bundle(text, "cuda:90", inputs) is bundle
    # The backward's kernels take their smaller tiles from the same decision (dQ 64 x 64, dK/dV 32 x 64).
    roles = dict(zip(("q", "k", "v", "c0"), inputs))
    assert ctt.backward_call_time_tiles(text, "cuda:90", roles) == backward
    (out, _), _ = interpret(bundle, *inputs)
    ref_out, _ = run_module_text(text, inputs, torch.float64)
    torch.testing.assert_close(out.double(), ref_out, **TOL[torch.bfloat16])


@pytest.mark.parametrize("backward", [False, True])
def test_fast_tanh_at_the_default_config(backward):
    """bf16 soft-capping on cuda:90 at its default config takes tanh.approx.f32 (the interpreter
    computes it as tanh: this checks the lowering around it), forward and backward, against float64."""
    torch.manual_seed(3)
    attn = ae.attention(score_mod=lambda s, b, h, i, j: 20.0 * torch.tanh(s / 20.0),
                        mask_mod=lambda b, h, i, j: i >= j)
    q, k, v = ((torch.randn(1, 2, 150, 64) * 3).to(torch.bfloat16) for _ in range(3))
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    want, want_lse = attn(*leaves, backend="reference", return_lse=True)
    if not backward:
        bundle = tb.compile_bundle(attn, q, k, v, target="cuda:90")
        assert "tanh.approx.f32" in bundle.variants["aligned"].ttir
        (out, _), _ = interpret(bundle, q, k, v)
        torch.testing.assert_close(out.double(), want.detach(), **TOL[torch.bfloat16])
        return
    from bundle_interp import interpret_roles

    d_out = torch.randn(1, 2, 150, 64).to(torch.bfloat16)
    grads = torch.autograd.grad(want, leaves, d_out.double())
    bundle = tb.build_backward_bundle(attn.mlir(q, k, v), "cuda:90")
    assert all("tanh.approx.f32" in kern.variants["aligned"].ttir for kern in [bundle] + list(bundle.stages))
    got = interpret_roles(bundle, {"q": q, "k": k, "v": v, "out": want.detach().to(torch.bfloat16), "do": d_out,
                                   "lse": want_lse.detach().float(), "dlse": torch.zeros(1, 2, 150)})
    for role, reference in zip(("dq", "dk", "dv"), grads):
        scale = reference.abs().max()
        torch.testing.assert_close(got[role].double() / scale, reference / scale, atol=3e-2, rtol=0, msg=role)


def test_fast_logistic_at_the_default_config():
    """bf16 sigmoid attention on cuda:90 at its default config: the normalizer's 1 / (1 + e^-s)
    as 0.5 + 0.5 tanh(s / 2) through tanh.approx.f32 (interpreted as tanh), forward and backward,
    against float64."""
    from bundle_interp import interpret_roles

    torch.manual_seed(4)
    attn = ae.attention(normalize="sigmoid", mask_mod=lambda b, h, i, j: i >= j)
    q, k, v = ((torch.randn(1, 2, 150, 64) * 2).to(torch.bfloat16) for _ in range(3))
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    want = attn(*leaves, backend="reference")
    bundle = tb.compile_bundle(attn, q, k, v, target="cuda:90")
    assert "tanh.approx.f32" in bundle.variants["aligned"].ttir
    assert '"arith.divf"' not in bundle.variants["aligned"].ttir
    (out, *_), _ = interpret(bundle, q, k, v)
    # Unnormalized: P is rounded to bf16 before P @ V over up to 150 keys, so relative to the largest.
    scale = want.abs().max()
    torch.testing.assert_close(out.double() / scale, want.detach() / scale, atol=1e-2, rtol=0)
    d_out = torch.randn(1, 2, 150, 64).to(torch.bfloat16)
    grads = torch.autograd.grad(want, leaves, d_out.double())
    backward = tb.build_backward_bundle(attn.mlir(q, k, v), "cuda:90")
    got = interpret_roles(backward, {"q": q, "k": k, "v": v, "do": d_out})
    for role, reference in zip(("dq", "dk", "dv"), grads):
        scale = reference.abs().max()
        torch.testing.assert_close(got[role].double() / scale, reference / scale, atol=3e-2, rtol=0, msg=role)


def test_a_machine_without_mlir_runs_the_calls_a_compile_prepared(tmp_path, monkeypatch):
    """Where kernels only run (a GPU machine without the MLIR bindings, its cache shipped from a
    machine that compiled), a call still picks the tiles its mask asks for: the problem a module
    poses is read from the record the compiling machine left beside the bundles, not by parsing
    the module. Without a record the call takes the preset's tiles, and a missing bundle is the
    backend's own error, not an import failure."""
    import os
    import subprocess
    import sys
    import textwrap

    monkeypatch.setenv("AE_MLIR_CACHE_DIR", str(tmp_path / "cache"))
    runtime.CACHE.clear_memory()
    ctt._PROBLEMS.clear()
    ctt._CUTS.clear()
    ctt._BACKWARD_TILES.clear()
    attn, text, inputs = _documents_call(lambda doc: lambda b, h, q, kv: doc[q] == doc[kv])
    q, k, v = inputs[:3]
    bundle = tb._default_bundle(text, "cuda:90", inputs)
    backward = ctt.backward_call_time_tiles(text, "cuda:90", dict(zip(("q", "k", "v", "c0"), inputs)))
    backward_key = tb.get_backward_bundle(text, "cuda:90", tiles=backward).key
    uncompiled = attn.mlir(q[:, :, :500], k[:, :, :500], v[:, :, :500])
    torch.save({"text": text, "inputs": inputs, "uncompiled": uncompiled}, tmp_path / "call.pt")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = textwrap.dedent(f"""
        import sys
        sys.modules["mlir"] = None
        import torch
        from ae_mlir.backends import call_time_tiles as ctt
        from ae_mlir.backends import triton as tb
        from ae_mlir.core.context import CompileError
        call = torch.load({str(tmp_path / "call.pt")!r})
        text, inputs = call["text"], call["inputs"]
        from ae_mlir import runtime
        # The entry points a call takes, with the launches stubbed: there is no GPU here.
        runtime.current_target = lambda device=None: "cuda:90"
        runtime.launch = lambda bundle, *tensors: [bundle.key]
        runtime.launch_roles = lambda bundle, tensors: bundle.key
        print(tb.run(text, inputs, torch.bfloat16)[0])
        print(tb.run_backward(text, dict(zip(("q", "k", "v", "c0"), inputs))))
        print(ctt.backward_call_time_tiles(text, "cuda:90", dict(zip(("q", "k", "v", "c0"), inputs))))
        ctt._PROBLEMS.clear(); ctt._CUTS.clear(); ctt._BACKWARD_TILES.clear()
        import os, shutil
        shutil.rmtree(os.path.join(os.environ["AE_MLIR_CACHE_DIR"], "problems"))
        print(ctt._call_time_cut(text, "cuda:90", inputs))
        try:
            tb._default_bundle(call["uncompiled"], "cuda:90", [t[:, :, :500] for t in inputs[:3]] + inputs[3:])
        except CompileError as err:
            print("CompileError", "MLIR bindings are not installed" in str(err))
    """)
    env = dict(os.environ, AE_MLIR_QUIET="1")
    result = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [bundle.key, backward_key, repr(backward), "0.0", "CompileError True"]


def test_a_machine_without_mlir_trains_with_the_derivative_a_compile_recorded(tmp_path, monkeypatch):
    """Autograd through `ae.attention` needs the variant's derivative (which backward kernels,
    which closure tensors get gradients), built by parsing the module: a machine that compiles
    records it beside the kernels, and one without the MLIR bindings reads that record, the same
    derivative; without a record it says what to do instead of failing to import."""
    import os
    import subprocess
    import sys
    import textwrap

    from ae_mlir.frontend.backward import Derivative

    monkeypatch.setenv("AE_MLIR_CACHE_DIR", str(tmp_path / "cache"))
    slopes = torch.tensor([0.5, 0.25])

    def alibi(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx)

    _, text, _ = _documents_call(lambda doc: lambda b, h, q, kv: doc[q] == doc[kv])
    recorded, missing = (attn.mlir(*qkv(b=1, h=2, lq=lq, dk=16)) for attn, lq in (
        (ae.attention(score_mod=alibi, mask_mod=lambda b, h, q, kv: q >= kv), 70), (ae.attention(), 90)))
    Derivative.of.cache_clear()
    derivatives = [Derivative.of(t) for t in (text, recorded)]
    assert derivatives[1].closure_grads and derivatives[1].score_mod_grad is not None
    torch.save({"texts": [text, recorded], "missing": missing}, tmp_path / "texts.pt")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = textwrap.dedent(f"""
        import pickle, sys
        sys.modules["mlir"] = None
        import torch
        from ae_mlir.core.context import CompileError
        from ae_mlir.frontend.backward import Derivative
        texts = torch.load({str(tmp_path / "texts.pt")!r})
        sys.stdout.buffer.write(pickle.dumps([Derivative.of(t) for t in texts["texts"]]))
        try:
            Derivative.of(texts["missing"])
        except CompileError as err:
            sys.stderr.write("CompileError " + str("ship the cache" in str(err)))
    """)
    result = subprocess.run([sys.executable, "-c", code], cwd=root, env=dict(os.environ, AE_MLIR_QUIET="1"),
                            capture_output=True, timeout=300)
    assert result.returncode == 0, result.stderr.decode()
    import pickle

    assert pickle.loads(result.stdout) == derivatives
    assert result.stderr.decode().endswith("CompileError True")
