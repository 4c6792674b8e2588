"""attn-lower-to-gluon's backward kernels (dQ, then dK/dV: `warp_specialize` on in the backward
preset, the default at D = 128, launch_defaults.warp_specialized; `reduced`: its five-product
form, `reduce_dq`) against the Triton IR backward kernels (`warp_specialize` off, the default at
D = 64), cuDNN's and SDPA flash's backward, in one process; and both Gluon forms' gradients at
ragged, GQA, fp16, Lq != Lk and strided shapes against float32 autograd.

    python bench/gluon_backward.py build --out bench/bundles/gluon-bwd          # here (no GPU)
    python3 bench/gluon_backward.py run --bundles bench/bundles/gluon-bwd --out DIR   # on the GPU

Checks: bench/warp_specialized.py's CHECKS shapes; the forward (the default bundle) gives out and
lse, the Gluon backward the gradients of sum(out * dO), compared with float32 autograd through the
materialized attention (max |error| over max |gradient|, beside SDPA's own bf16/fp16 backward's).
Timed: bf16, B*L = 16384, H = 16, D in {64, 128}, L in {2048, 8192}, full and causal; each
backward from the same forward's out and lse (`gluon`, `reduced`, `ttir`) and the peers' as forward +
backward less forward, in five alternating rounds, medians of triton.testing.do_bench; FLOPs 2.5x
the forward's 4 B H L^2 D (half for causal). With `--baseline DIR`, DIR's `gluon` bundles (another
version's build) are timed too, alternating with these, as `gluon baseline`. `gluon dkdv` and
`ttir dkdv` time the dK/dV kernel alone (the bundle's dQ stage left out): the dQ kernel's time is
the difference.
"""
from __future__ import annotations

import dataclasses
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import harness  # noqa: E402
from warp_specialized import CHECKS, HEADS, ROUNDS, _attention, _inputs, _timed_cases  # noqa: E402

BUILDS = {"gluon": {"warp_specialize": True, "reduce_dq": False},
          "reduced": {"warp_specialize": True, "reduce_dq": True}, "ttir": {"warp_specialize": False}}
CHECKED = ("gluon", "reduced")  # the builds whose gradients are checked at CHECKS' shapes


def build(out: str) -> None:
    import torch

    from ae_mlir.backends import triton as tb

    os.makedirs(out, exist_ok=True)
    shapes = [(name, batch, HEADS, HEADS, length, length, dim, causal, "bfloat16", builds)
              for name, batch, length, dim, causal in _timed_cases() for builds in [BUILDS]]
    shapes += [(f"check_{c[0]}",) + c[1:9] + ({label: BUILDS[label] for label in CHECKED},) for c in CHECKS]
    for name, batch, heads, kv_heads, lq, lk, dim, causal, dtype, builds in shapes:
        q = torch.empty(batch, heads, lq, dim, dtype=getattr(torch, dtype), device="meta")
        kv = torch.empty(batch, kv_heads, lk, dim, dtype=getattr(torch, dtype), device="meta")
        attn = _attention(causal)
        tb.compile_bundle(attn, q, kv, kv).save(os.path.join(out, f"{name}.fwd.json"))
        for label, config in builds.items():
            tb.build_backward_bundle(attn.mlir(q, kv, kv), "cuda:90", config).save(
                os.path.join(out, f"{name}.{label}.json"))
        print("built", name, flush=True)


def _backward(bundle, q, k, v, d_out, out, lse):
    import torch

    from ae_mlir import runtime

    return runtime.launch_roles(bundle, {"q": q, "k": k, "v": v, "do": d_out, "out": out, "lse": lse,
                                         "dlse": torch.zeros_like(lse)})


def _float_grads(q, k, v, d_out, causal):
    import torch

    group = q.shape[1] // k.shape[1]
    leaves = [t.detach().float().requires_grad_() for t in (q, k, v)]
    kf, vf = (t.repeat_interleave(group, dim=1) for t in leaves[1:])
    scores = (leaves[0] @ kf.transpose(-1, -2)) / q.shape[-1] ** 0.5
    if causal:
        scores = scores.masked_fill(torch.ones(scores.shape[-2:], device=q.device, dtype=torch.bool).triu(1),
                                    float("-inf"))
    return torch.autograd.grad(torch.softmax(scores, dim=-1) @ vf, leaves, d_out.float())


def _relative(got, want) -> float:
    return max(float((g.float() - w).abs().max() / w.abs().max()) for g, w in zip(got, want))


def _check(bundles: str, doc: dict) -> None:
    import torch
    import torch.nn.functional as F

    from ae_mlir import runtime

    for i, (name, batch, heads, kv_heads, lq, lk, dim, causal, dtype, layout) in enumerate(CHECKS):
        fwd = runtime.Bundle.load(os.path.join(bundles, f"check_{name}.fwd.json"))
        q, k, v = _inputs(batch, heads, kv_heads, lq, lk, dim, getattr(torch, dtype), layout, 200 + i)
        d_out = torch.randn_like(q)
        out, lse = runtime.launch(fwd, q, k, v)
        want = _float_grads(q, k, v, d_out, causal)
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        sdpa = torch.autograd.grad(F.scaled_dot_product_attention(*leaves, is_causal=causal,
                                                                  enable_gqa=heads != kv_heads), leaves, d_out)
        for label in CHECKED:
            bwd = runtime.Bundle.load(os.path.join(bundles, f"check_{name}.{label}.json"))
            # The gradients the runtime allocates are contiguous: the inputs decide the variant.
            aligned = runtime.aligned_ok(bwd, {"q": q, "k": k, "v": v, "do": d_out, "out": out, "lse": lse})
            grads = _backward(bwd, q, k, v, d_out, out, lse)
            torch.cuda.synchronize()
            rec = {"name": name, "build": label, "B": batch, "H": heads, "Hkv": kv_heads, "Lq": lq, "Lk": lk,
                   "D": dim, "causal": causal, "dtype": dtype, "layout": layout,
                   "variant": bwd.variants["aligned" if aligned else "generic"].ir,
                   "max_rel_err": _relative([grads["dq"], grads["dk"], grads["dv"]], want),
                   "dq_rel_err": _relative([grads["dq"]], want[:1]), "sdpa_max_rel_err": _relative(sdpa, want)}
            doc["checks"].append(rec)
            print("check", rec, flush=True)


def run(bundles: str, out_dir: str, baseline: str | None = None) -> None:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from ae_mlir import runtime

    doc = harness.results_doc(out_dir, __doc__, rounds=ROUNDS)
    doc["checks"] = []
    _check(bundles, doc)
    harness.save(doc, out_dir, "gluon-backward.json")
    for name, batch, length, dim, causal in _timed_cases():
        q, k, v = _inputs(batch, HEADS, HEADS, length, length, dim, torch.bfloat16, "bhld", length + dim + causal)
        d_out = torch.randn_like(q)
        fwd = runtime.Bundle.load(os.path.join(bundles, f"{name}.fwd.json"))
        out, lse = runtime.launch(fwd, q, k, v)
        engines, grads = {}, {}
        for label in BUILDS:
            bundle = runtime.Bundle.load(os.path.join(bundles, f"{name}.{label}.json"))
            grads[label] = _backward(bundle, q, k, v, d_out, out, lse)
            engines[label] = lambda bundle=bundle: _backward(bundle, q, k, v, d_out, out, lse)
            if label == "reduced":
                continue
            # The dK/dV kernel alone (the dQ kernel, which writes its delta, left out): the dQ
            # kernel's time is the difference.
            alone = dataclasses.replace(bundle, stages=[])
            engines[f"{label} dkdv"] = lambda bundle=alone: _backward(bundle, q, k, v, d_out, out, lse)
        if baseline:
            bundle = runtime.Bundle.load(os.path.join(baseline, f"{name}.gluon.json"))
            engines["gluon baseline"] = lambda bundle=bundle: _backward(bundle, q, k, v, d_out, out, lse)
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        peers = {}
        for label, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
            def sdpa(a, b, c, backend=backend):
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(a, b, c, is_causal=causal)
            peers[label] = sdpa
        flops = 2.5 * 4 * batch * HEADS * length * length * dim * (0.5 if causal else 1.0)
        times = {label: [] for label in list(engines) + list(peers)}
        for _ in range(ROUNDS):
            for label, fn in engines.items():
                times[label].append(harness.bench_ms(fn))
            for label, fn in peers.items():
                times[label].append(harness.peer_backward(fn, leaves, leaves, d_out, flops)["backward_ms"])
        ms = {label: statistics.median(t) for label, t in times.items()}
        rec = {"case": name, "B": batch, "L": length, "D": dim, "causal": causal, "ms": ms,
               "tflops": {label: flops / m * 1e-9 for label, m in ms.items()}, "rounds_ms": times,
               "gluon_vs_ttir_grads": _relative([grads["gluon"][r] for r in ("dq", "dk", "dv")],
                                                [grads["ttir"][r].float() for r in ("dq", "dk", "dv")]),
               "reduced_vs_gluon_grads": _relative([grads["reduced"][r] for r in ("dq", "dk", "dv")],
                                                   [grads["gluon"][r].float() for r in ("dq", "dk", "dv")]),
               "gluon_over_cudnn": ms["cudnn"] / ms["gluon"], "reduced_over_cudnn": ms["cudnn"] / ms["reduced"],
               "gluon_over_ttir": ms["ttir"] / ms["gluon"]}
        doc["cases"].append(rec)
        print(name, " ".join(f"{label} {tf:.0f}" for label, tf in rec["tflops"].items()),
              f"x cudnn {rec['gluon_over_cudnn']:.3f} reduced x cudnn {rec['reduced_over_cudnn']:.3f} "
              f"x ttir {rec['gluon_over_ttir']:.3f}", flush=True)
        harness.save(doc, out_dir, "gluon-backward.json")


if __name__ == "__main__":
    sys.exit(harness.main(__doc__, build, run, "gluon-bwd"))
