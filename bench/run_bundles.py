"""Run prebuilt Triton bundles on a GPU and compare them with torch SDPA and FlexAttention.

    python bench/run_bundles.py --bundles bench/bundles [--out bench/results/triton-<gpu>.json]

Needs torch and triton only (ae_mlir.runtime imports no MLIR). For every bundle: check the output
against a float32 reference (torch SDPA in float32 where it computes the same attention, else a
materialized float32 softmax over a sample of query rows), then time ae-mlir, SDPA (flash and
cuDNN backends where applicable) and torch.compile'd FlexAttention in the same process with
triton.testing.do_bench (median). FLOPs = 4 * B * H * L * L * D * (fraction of kept pairs).
"""
from __future__ import annotations

import argparse
import datetime
import glob
import json
import math
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
from triton.testing import do_bench  # noqa: E402

import variants  # noqa: E402
from ae_mlir import runtime  # noqa: E402

SAMPLE_ROWS = 256


def kept_fraction(v: variants.Variant, b: int, h: int, l: int, device) -> float:
    """The exact fraction of (query, key) pairs the mask keeps (heads and batches alike here)."""
    if v.mask_mod is None:
        return 1.0
    kv = torch.arange(l, device=device)
    kept = 0
    for start in range(0, l, 1024):
        q = torch.arange(start, min(start + 1024, l), device=device)[:, None]
        kept += int(v.mask_mod(0, 0, q, kv[None, :]).sum())
    return kept / (l * l)


def reference_rows(v: variants.Variant, q, k, v_, scale: float, rows):
    """float32 attention for the query rows `rows`, with the mods applied on index grids."""
    b, h = q.shape[:2]
    qi = rows[:, None]
    kv = torch.arange(k.shape[2], device=q.device)[None, :]
    s = torch.einsum("bhqd,bhkd->bhqk", q[:, :, rows].float(), k.float()) * scale
    if v.score_mod is not None:
        bi = torch.arange(b, device=q.device).view(b, 1, 1, 1)
        hi = torch.arange(h, device=q.device).view(1, h, 1, 1)
        s = v.score_mod(s, bi, hi, qi, kv)
    if v.mask_mod is not None:
        keep = v.mask_mod(0, 0, qi, kv).expand_as(s)
        s = s.masked_fill(~keep, -math.inf)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return torch.einsum("bhqk,bhkd->bhqd", p, v_.float())


def flex_callable(v: variants.Variant, b: int, h: int, l: int, device):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    # A fresh compile per shape and variant: dynamo's recompile limit would otherwise silently
    # fall back to eager FlexAttention after a few bundles.
    torch._dynamo.reset()
    compiled = torch.compile(flex_attention, dynamic=False)
    block_mask = None
    if v.mask_mod is not None:
        block_mask = create_block_mask(v.mask_mod, None, None, l, l, device=device)
    return lambda q, k, vv: compiled(q, k, vv, score_mod=v.score_mod, block_mask=block_mask)


def sdpa_callables(v: variants.Variant):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if v.sdpa_causal is None:
        return {}

    def with_backend(backend):
        def run(q, k, vv):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, vv, is_causal=v.sdpa_causal)
        return run

    return {"sdpa_flash": with_backend(SDPBackend.FLASH_ATTENTION),
            "sdpa_cudnn": with_backend(SDPBackend.CUDNN_ATTENTION)}


def run_one(path: str, device, peers: bool = True) -> dict:
    bundle = runtime.Bundle.load(path)
    meta = bundle.meta
    b, h, l, d = meta["B"], meta["H"], meta["L"], meta["D"]
    dtype = getattr(torch, meta["dtype"])
    v = variants.make(meta["variant"], b, h, l, device)
    g = torch.Generator(device=device).manual_seed(0)
    q, k, vv = (torch.randn(b, h, l, d, device=device, dtype=dtype, generator=g) for _ in range(3))
    out, lse = (torch.empty(s.shape, device=device, dtype=runtime.torch_dtype(s.dtype)) for s in bundle.outputs)
    scale = 1.0 / math.sqrt(d)

    def ae_run():
        return runtime.launch(bundle, q, k, vv, *v.captures, out=out, lse=lse)[0]

    result = {"bundle": os.path.basename(path), "variant": meta["variant"], "B": b, "H": h, "L": l, "D": d,
              "dtype": meta["dtype"], "block_m": bundle.block_m, "block_n": bundle.block_n,
              "num_warps": bundle.num_warps, "num_stages": bundle.num_stages}
    got = ae_run().float()
    torch.cuda.synchronize()
    if v.sdpa_causal is not None:
        ref = F.scaled_dot_product_attention(q.float(), k.float(), vv.float(), is_causal=v.sdpa_causal)
        result["max_abs_err"] = float((got - ref).abs().max())
        result["reference"] = "sdpa_float32"
    else:
        rows = torch.cat([torch.arange(min(SAMPLE_ROWS, l)), torch.arange(max(0, l - SAMPLE_ROWS), l)]).unique()
        rows = rows.to(device)
        ref = reference_rows(v, q, k, vv, scale, rows)
        result["max_abs_err"] = float((got[:, :, rows] - ref).abs().max())
        result["reference"] = f"float32_rows({len(rows)})"
    flops = 4.0 * b * h * l * l * d * kept_fraction(v, b, h, l, device)
    result["flops"] = flops
    variant = runtime.choose_variant(bundle, runtime.bind(bundle, q, k, vv, *v.captures, out=out, lse=lse))
    kernel = runtime.compile_ttir(variant.ttir, runtime.current_target(), bundle.num_warps, bundle.num_stages)
    result.update(kernel_variant="aligned" if variant.aligned else "generic", registers=kernel.n_regs,
                  spills=kernel.n_spills, shared_bytes=kernel.metadata.shared)
    timings = {"ae_mlir": ae_run}
    if peers:
        timings.update(sdpa_callables(v))
        try:
            timings["flex_attention"] = flex_callable(v, b, h, l, device)
        except Exception as err:
            result["flex_attention_error"] = f"{type(err).__name__}: {err}"
    for name, fn in timings.items():
        try:
            if name == "ae_mlir":
                ms = do_bench(fn, warmup=25, rep=100, return_mode="median")
            else:
                ms = do_bench(lambda fn=fn: fn(q, k, vv), warmup=25, rep=100, return_mode="median")
        except Exception as err:
            result[f"{name}_error"] = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
            continue
        result[f"{name}_ms"] = ms
        result[f"{name}_tflops"] = flops / (ms * 1e-3) / 1e12
    for peer in ("sdpa_flash", "sdpa_cudnn", "flex_attention"):
        if f"{peer}_ms" in result and "ae_mlir_ms" in result:
            result[f"speedup_vs_{peer}"] = result[f"{peer}_ms"] / result["ae_mlir_ms"]
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bundles", default=os.path.join(ROOT, "bench", "bundles"))
    p.add_argument("--out", default=None)
    p.add_argument("--filter", default="", help="only bundles whose file name contains this")
    p.add_argument("--no-peers", action="store_true", help="time ae-mlir alone (no SDPA, no FlexAttention)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("run_bundles.py needs a GPU", file=sys.stderr)
        return 1
    device = torch.device("cuda")
    gpu = torch.cuda.get_device_name(device)
    paths = sorted(p for p in glob.glob(os.path.join(args.bundles, "*.json")) if args.filter in os.path.basename(p))
    results = []
    for path in paths:
        try:
            r = run_one(path, device, peers=not args.no_peers)
        except Exception as err:
            r = {"bundle": os.path.basename(path), "error": f"{type(err).__name__}: {err}"}
        results.append(r)
        shown = {k: (round(x, 4) if isinstance(x, float) else x) for k, x in r.items()
                 if k.endswith(("_tflops", "_err", "error")) or k in ("bundle", "registers", "spills")}
        print(json.dumps(shown), flush=True)
    doc = {"gpu": gpu, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
           "torch": torch.__version__, "triton": triton.__version__, "target": runtime.current_target(),
           "results": results}
    out = args.out or os.path.join(ROOT, "bench", "results",
                                   f"triton-{gpu.replace(' ', '_')}-{datetime.date.today()}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
