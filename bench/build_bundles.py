"""Build Triton bundles for the benchmark variants and shapes on a machine without a GPU.

    python bench/build_bundles.py --out bench/bundles [--target cuda:90] [--variants causal,full]
                                  [--lengths 1024,4096] [--dims 128] [--dtype bfloat16]

Each bundle (one JSON file per variant and shape) holds the Triton IR and launch metadata;
bench/run_bundles.py runs them on a GPU machine that has only torch and triton. Shapes follow
DESIGN.md section 8: B * L = 16k tokens, H = 16.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import ae_mlir as ae  # noqa: E402
import variants  # noqa: E402
from ae_mlir.backends.triton import compile_bundle  # noqa: E402

TOKENS = 16384
HEADS = 16


def bundle_name(variant: str, b: int, l: int, d: int, dtype: str) -> str:
    return f"{variant}-B{b}-H{HEADS}-L{l}-D{d}-{dtype}.json"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "bundles"))
    p.add_argument("--target", default="cuda:90")
    p.add_argument("--variants", default=",".join(variants.NAMES))
    p.add_argument("--lengths", default="512,1024,2048,4096,8192,16384")
    p.add_argument("--dims", default="128")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--config", default=None,
                   help="block_m,block_n,num_warps,num_stages instead of the backend's defaults")
    args = p.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    os.makedirs(args.out, exist_ok=True)
    for name in args.variants.split(","):
        for l in (int(x) for x in args.lengths.split(",")):
            for d in (int(x) for x in args.dims.split(",")):
                b = max(1, TOKENS // l)
                v = variants.make(name, b, HEADS, l)
                attn = ae.attention(score_mod=v.score_mod, mask_mod=v.mask_mod)
                q = torch.empty(b, HEADS, l, d, dtype=dtype, device="meta")
                start = time.time()
                config = None
                suffix = ""
                if args.config:
                    bm, bn, warps, stages = (int(x) for x in args.config.split(","))
                    config = {"block_m": bm, "block_n": bn, "num_warps": warps, "num_stages": stages}
                    suffix = f"-{bm}x{bn}w{warps}s{stages}"
                bundle = compile_bundle(attn, q, q, q, target=args.target, config=config)
                bundle.meta.update(variant=name, B=b, H=HEADS, L=l, D=d, dtype=args.dtype)
                file_name = bundle_name(name, b, l, d, args.dtype).replace(".json", f"{suffix}.json")
                path = bundle.save(os.path.join(args.out, file_name))
                print(f"{path.name}: blocks {bundle.block_m}x{bundle.block_n}, {bundle.num_warps} warps, "
                      f"{bundle.num_stages} stages, grid {bundle.grid}, {time.time() - start:.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
