"""attn-lower-to-gluon's warp-specialized Hopper kernel (the default aligned variant of plain and
causal softmax on sm90) against the Triton IR kernel it replaced, cuDNN and SDPA flash, in one
process; and its outputs and logsumexp at ragged, GQA, fp16, Lq != Lk and strided shapes
against float32 SDPA.

    python bench/warp_specialized.py build --out bench/bundles/ws          # here (no GPU)
    python3 bench/warp_specialized.py run --bundles bench/bundles/ws --out DIR   # on the GPU

Timed: bf16, B*L = 16384, H = 16, D in {64, 128}, L in {2048, 8192}, full and causal; the
builds of each: `default` (the preset's choice, launch_defaults.warp_specialized and
gluon_schedule), `gluon` (warp_specialize=true, one program per query block), `pingpong` (with
pingpong=true; at D = 128 only: the D = 64 kernel's three consumer warpgroups do not take it),
`persistent` (a program per multiprocessor looping over query blocks), `pingpong_persistent`
(both, D = 128) and `ttir` (warp_specialize=false); at D = 64 also `<build>_wg2`, those Gluon
builds with two consumer warpgroups (128-row programs; `warpgroups=2`) instead of three; and
the peers, in five alternating rounds,
medians of triton.testing.do_bench; FLOPs 4 B H L^2 D (half for causal).
"""
from __future__ import annotations

import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import harness  # noqa: E402

TOKENS, HEADS, ROUNDS = 16384, 16, 5
BUILDS = {"default": {},
          "gluon": {"warp_specialize": True, "pingpong": False, "persistent": False},
          "pingpong": {"warp_specialize": True, "pingpong": True, "persistent": False},
          "persistent": {"warp_specialize": True, "pingpong": False, "persistent": True},
          "pingpong_persistent": {"warp_specialize": True, "pingpong": True, "persistent": True},
          "ttir": {"warp_specialize": False}}
# At D = 64 the kernel also takes two consumer warpgroups (128-row programs) for three.
BUILDS.update({f"{label}_wg2": dict(BUILDS[label], warpgroups=2)
               for label in ("gluon", "pingpong", "persistent", "pingpong_persistent")})
CHECKED = ("gluon", "persistent", "pingpong_persistent", "gluon_wg2", "pingpong_persistent_wg2")  # the builds whose outputs are checked at CHECKS' shapes
# (name, batch, heads, kv heads, Lq, Lk, D, causal, dtype, layout): "bhld" contiguous, "blhd" a
# transposed view of [B, L, H, D] memory.
CHECKS = [
    ("ragged_causal", 2, 4, 4, 1000, 1000, 128, True, "bfloat16", "bhld"),
    ("short_fp16", 1, 3, 3, 333, 333, 64, False, "float16", "bhld"),
    ("gqa_causal", 2, 8, 2, 1000, 1000, 64, True, "bfloat16", "bhld"),
    ("one_tile", 1, 2, 2, 64, 64, 128, True, "bfloat16", "bhld"),
    ("ragged_full", 2, 2, 2, 2112, 2112, 128, False, "bfloat16", "bhld"),
    ("lq_lt_lk", 2, 4, 4, 300, 1000, 128, False, "bfloat16", "bhld"),
    ("strided_causal", 2, 4, 4, 1024, 1024, 128, True, "bfloat16", "blhd"),
    ("strided_gqa_fp16", 1, 8, 4, 777, 777, 64, False, "float16", "blhd"),
]


def _causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def _attention(causal: bool):
    import ae_mlir as ae

    return ae.attention(mask_mod=_causal) if causal else ae.attention()


def _timed_cases():
    for dim in (64, 128):
        for length in (2048, 8192):
            for causal in (False, True):
                yield f"{'causal' if causal else 'full'}_d{dim}_{length}", TOKENS // length, length, dim, causal


def _builds(dim: int, labels=tuple(BUILDS)) -> dict:
    """The builds timed at head dim `dim`: ping-pong takes two consumer warpgroups, which D = 64's
    kernel has only where asked for."""
    return {label: BUILDS[label] for label in labels
            if BUILDS[label].get("warpgroups") == 2 and dim == 64
            or "warpgroups" not in BUILDS[label] and (dim == 128 or not BUILDS[label].get("pingpong"))}


def build(out: str) -> None:
    import torch

    from ae_mlir.backends import triton as tb

    os.makedirs(out, exist_ok=True)
    for name, batch, length, dim, causal in _timed_cases():
        q = torch.empty(batch, HEADS, length, dim, dtype=torch.bfloat16, device="meta")
        for label, config in _builds(dim).items():
            tb.compile_bundle(_attention(causal), q, q, q, config=config).save(os.path.join(out, f"{name}.{label}.json"))
        print("built", name, flush=True)
    for name, batch, heads, kv_heads, lq, lk, dim, causal, dtype, _ in CHECKS:
        q = torch.empty(batch, heads, lq, dim, dtype=getattr(torch, dtype), device="meta")
        kv = torch.empty(batch, kv_heads, lk, dim, dtype=getattr(torch, dtype), device="meta")
        for label, config in _builds(dim, CHECKED).items():
            tb.compile_bundle(_attention(causal), q, kv, kv, config=config).save(
                os.path.join(out, f"check_{name}.{label}.json"))
        print("built", name, flush=True)


def _inputs(batch, heads, kv_heads, lq, lk, dim, dtype, layout, seed):
    import torch

    gen = torch.Generator(device="cuda").manual_seed(seed)

    def make(h, length):
        if layout == "blhd":
            return torch.randn(batch, length, h, dim, device="cuda", dtype=dtype, generator=gen).transpose(1, 2)
        return torch.randn(batch, h, length, dim, device="cuda", dtype=dtype, generator=gen)

    return make(heads, lq), make(kv_heads, lk), make(kv_heads, lk)


def _check(bundles: str, doc: dict) -> None:
    import torch
    import torch.nn.functional as F

    from ae_mlir import runtime

    for i, (name, batch, heads, kv_heads, lq, lk, dim, causal, dtype, layout) in enumerate(CHECKS):
        for label in _builds(dim, CHECKED):
            bundle = runtime.Bundle.load(os.path.join(bundles, f"check_{name}.{label}.json"))
            q, k, v = _inputs(batch, heads, kv_heads, lq, lk, dim, getattr(torch, dtype), layout, 100 + i)
            tensors = runtime.bind(bundle, q, k, v)
            variant = runtime.choose_variant(bundle, tensors)
            out, lse = runtime.launch(bundle, q, k, v)
            torch.cuda.synchronize()
            group = heads // kv_heads
            kf, vf = (t.float().repeat_interleave(group, dim=1) for t in (k, v))
            scores = (q.float() @ kf.transpose(-1, -2)) / math.sqrt(dim)
            if causal:
                scores = scores.masked_fill(torch.ones(lq, lk, device="cuda", dtype=torch.bool).triu(1), float("-inf"))
            want = torch.softmax(scores, dim=-1) @ vf
            rec = {"name": name, "B": batch, "H": heads, "Hkv": kv_heads, "Lq": lq, "Lk": lk, "D": dim, "causal": causal,
                   "dtype": dtype, "layout": layout, "build": label, "variant": variant.ir,
                   "max_abs_err": float((out.float() - want).abs().max()),
                   "lse_max_abs_err": float((lse - torch.logsumexp(scores, dim=-1)).abs().max()),
                   "sdpa_bf16_err": float((F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=group > 1)
                                           .float() - want).abs().max())}
            doc["checks"].append(rec)
            print("check", rec, flush=True)


def run(bundles: str, out_dir: str) -> None:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from ae_mlir import runtime

    doc = harness.results_doc(out_dir, __doc__, rounds=ROUNDS)
    doc["checks"] = []
    _check(bundles, doc)
    harness.save(doc, out_dir, "warp-specialized.json")
    for name, batch, length, dim, causal in _timed_cases():
        q, k, v = _inputs(batch, HEADS, HEADS, length, length, dim, torch.bfloat16, "bhld", length + dim + causal)
        want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
        engines, errors = {}, {}
        for label in _builds(dim):
            bundle = runtime.Bundle.load(os.path.join(bundles, f"{name}.{label}.json"))
            errors[label] = float((runtime.launch(bundle, q, k, v)[0].float() - want).abs().max())
            engines[label] = lambda bundle=bundle: runtime.launch(bundle, q, k, v)
        for label, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
            def call(backend=backend):
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            errors[label] = float((call().float() - want).abs().max())
            engines[label] = call
        host = {label: harness.host_profile(engines[label]) for label in ("default", "ttir")}
        engines.update({f"{label} graph": harness.graphed(fn) for label, fn in list(engines.items())})
        flops = 4 * batch * HEADS * length * length * dim * (0.5 if causal else 1.0)
        timed = harness.rounds_timed(engines, ROUNDS, flops)
        ms = timed["ms"]
        rec = {"case": name, "B": batch, "L": length, "D": dim, "causal": causal, "max_abs_err": errors, **timed,
               "default_over_cudnn": ms["cudnn"] / ms["default"], "default_over_ttir": ms["ttir"] / ms["default"],
               "graph_default_over_cudnn": ms["cudnn graph"] / ms["default graph"], "host": host}
        doc["cases"].append(rec)
        print(name, " ".join(f"{label} {tf:.0f}" for label, tf in rec["tflops"].items()),
              f"default x cudnn {rec['default_over_cudnn']:.3f} (graphs {rec['graph_default_over_cudnn']:.3f}) "
              f"x ttir {rec['default_over_ttir']:.3f}", "host us", {k: round(v["host_us"]) for k, v in host.items()},
              flush=True)
        if length == 2048:
            print(host["default"]["top"], flush=True)
        harness.save(doc, out_dir, "warp-specialized.json")


if __name__ == "__main__":
    sys.exit(harness.main(__doc__, build, run, "ws"))
