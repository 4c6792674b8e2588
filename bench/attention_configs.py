"""Time plain softmax attention (full and causal) under several block sizes, launch options and
code-generation choices, beside SDPA's cuDNN and flash backends in the same run.

    python bench/attention_configs.py build [--out bench/config_bundles]     # here (MLIR)
    python bench/attention_configs.py run --bundles bench/config_bundles     # on the GPU

`build` compiles one bundle per (case, choice) with ae-mlir's Triton lowering, exactly as
`ae.attention` would with that config; a choice named `...+ws` also marks the KV loops of the
Triton IR `tt.warp_specialize`, which Triton 3.6 hands to its Hopper warp-specialization pass.
That edit is an experiment to decide what the lowering should emit, not something ae-mlir does.
"pointers" is the lowering without TMA tile loads (`tensor_descriptors`), the others with them.
`run` times every bundle with `triton.testing.do_bench` (median; warmup 25 ms, rep 100 ms) on fresh
random bf16 inputs and writes attention-configs.json: TFLOP/s of each choice and of the peers.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

# (name, causal, batch, heads, seq, head dim): B * L = 16384 as in the suite's catalogue part.
CASES = [(f"{'causal' if causal else 'full'}-d{d}-l{seq}", causal, 16384 // seq, 16, seq, d)
         for causal in (False, True) for d in (64, 128) for seq in (2048, 8192)]
# (name, config overrides or None for ae-mlir's default, warp-specialize the KV loops). The
# default loads tiles through TMA tensor descriptors on sm90; "pointers" is the lowering without.
_M128N64W4S3 = {"block_m": 128, "block_n": 64, "num_warps": 4, "num_stages": 3}
_M128N128W8S3 = {"block_m": 128, "block_n": 128, "num_warps": 8, "num_stages": 3}
CHOICES = [
    ("pointers", {"tensor_descriptors": False}, False),
    ("default", None, False),
    ("default+ws", None, True),
    ("m128n64w4s3", _M128N64W4S3, False),
    ("m128n64w4s3+ws", _M128N64W4S3, True),
    ("m128n128w8s3", _M128N128W8S3, False),
    ("m128n128w8s3+ws", _M128N128W8S3, True),
]
# bf16 outputs of values within [-1, 1] that agree with cuDNN's to a few bf16 ulps.
MAX_ERROR = 0.05


def _warp_specialized(ttir: str) -> str:
    """The Triton IR with every top-level scf.for (the KV loops) marked tt.warp_specialize."""
    lines = ttir.splitlines()
    out = []
    for line in lines:
        # A KV loop closes at the function body's indentation (4 spaces) with its result types.
        if re.match(r"^    \}\) : \(i32, i32, i32, ", line):
            line = line.replace("}) : (", "}) {tt.warp_specialize} : (", 1)
        out.append(line)
    return "\n".join(out) + "\n"


def build(out_dir: str) -> None:
    import torch

    import ae_mlir as ae
    from ae_mlir import runtime
    from ae_mlir.backends import triton as tb

    os.makedirs(out_dir, exist_ok=True)
    manifest = []
    for case, causal, b, h, seq, d in CASES:
        q = torch.empty(b, h, seq, d, dtype=torch.bfloat16)
        attn = ae.attention(mask_mod=(lambda b, h, i, j: i >= j) if causal else None)
        for choice, config, ws in CHOICES:
            bundle = tb.compile_bundle(attn, q, q, q, target="cuda:90", config=config)
            if ws:
                # A copy: the compile cache hands out the same object for the same config.
                bundle = runtime.Bundle.from_json(bundle.to_json())
                for variant in bundle.variants.values():
                    variant.ttir = _warp_specialized(variant.ttir)
            name = f"{case}.{choice}.json"
            bundle.save(os.path.join(out_dir, name))
            manifest.append({"case": case, "choice": choice, "file": name, "causal": causal,
                             "shape": [b, h, seq, d], "config": bundle.meta.get("config")})
            print("built", name, flush=True)
    with open(os.path.join(out_dir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)


def _compile(path: str, target: str) -> str:
    from ae_mlir import runtime

    bundle = runtime.Bundle.load(path)
    try:
        for variant in bundle.variants.values():
            runtime.compile_ttir(variant.ttir, target, bundle.num_warps, bundle.num_stages)
    except Exception as err:  # recorded again by the timing pass
        return f"{type(err).__name__}: {err}"
    return ""


def run(bundle_dir: str, out_dir: str) -> None:
    import concurrent.futures as futures
    import multiprocessing

    import torch
    import torch.nn.functional as F
    import triton
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench

    from ae_mlir import runtime

    with open(os.path.join(bundle_dir, "manifest.json")) as f:
        manifest = json.load(f)
    # Compiles first, in parallel processes; Triton's disk cache keeps them for the timing pass.
    paths = [os.path.join(bundle_dir, e["file"]) for e in manifest]
    with futures.ProcessPoolExecutor(min(14, os.cpu_count() or 1), mp_context=multiprocessing.get_context("spawn")) as pool:
        list(pool.map(_compile, paths, [runtime.current_target()] * len(paths)))
    records, wanted = {}, {}
    for entry in manifest:
        b, h, seq, d = entry["shape"]
        rec = records.setdefault(entry["case"], {"shape": entry["shape"], "causal": entry["causal"], "tflops": {}})
        flops = 4 * b * h * seq * seq * d * ((seq + 1) / (2 * seq) if entry["causal"] else 1.0)
        # Every choice of a case sees the same inputs (seeded by the case), checked against cuDNN's output.
        gen = torch.Generator(device="cuda").manual_seed(len(records))
        q, k, v = (torch.randn(b, h, seq, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
        if not rec["tflops"]:
            rec["reference"] = "SDPA cuDNN output"
            for peer, backend in (("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa_flash", SDPBackend.FLASH_ATTENTION)):
                with sdpa_kernel([backend]):
                    def call():
                        return F.scaled_dot_product_attention(q, k, v, is_causal=entry["causal"])
                    if peer == "sdpa_cudnn":
                        wanted[entry["case"]] = call()
                    ms = do_bench(call, warmup=25, rep=100, return_mode="median")
                rec["tflops"][peer] = flops / ms / 1e9
        bundle = runtime.Bundle.load(os.path.join(bundle_dir, entry["file"]))
        try:
            got = runtime.launch(bundle, q, k, v)[0]
            err = float((got.float() - wanted[entry["case"]].float()).abs().max())
            rec.setdefault("max_error_vs_cudnn", {})[entry["choice"]] = err
            if err > MAX_ERROR:
                raise AssertionError(f"max error {err:.3g} against cuDNN, above {MAX_ERROR}")
            ms = do_bench(lambda: runtime.launch(bundle, q, k, v), warmup=25, rep=100, return_mode="median")
            rec["tflops"][entry["choice"]] = flops / ms / 1e9
        except Exception as e:  # a choice that does not compile, run or agree is recorded, not timed
            rec.setdefault("errors", {})[entry["choice"]] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
        print(entry["case"], entry["choice"], round(rec["tflops"].get(entry["choice"], 0.0), 1), flush=True)
        del q, k, v
        torch.cuda.empty_cache()
    doc = {"date": datetime.date.today().isoformat(), "gpu": torch.cuda.get_device_name(),
           "torch": torch.__version__, "triton": triton.__version__,
           "benchmark": "triton.testing.do_bench median, warmup 25 ms, rep 100 ms; bf16; ae-mlir launches "
                        "through ae_mlir.runtime.launch (the same path as a call)", "cases": records}
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "attention-configs.json"), "w") as f:
        json.dump(doc, f, indent=1)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=("build", "run"))
    p.add_argument("--bundles", default=os.path.join(HERE, "config_bundles"))
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    args = p.parse_args(argv)
    if args.mode == "build":
        build(args.bundles)
    else:
        run(args.bundles, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
