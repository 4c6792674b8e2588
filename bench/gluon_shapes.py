"""attn-lower-to-gluon's forward on grids that fill the GPU unevenly: the persistent grid, a
program per query block and the Triton IR kernel at batch x heads x length where the Gluon
kernel's query blocks (128 rows at D = 128, 192 at D = 64) leave a partly filled last wave, with
cuDNN in the same process.

    python bench/gluon_shapes.py build --out bench/bundles/gluon-shapes          # here (no GPU)
    python3 bench/gluon_shapes.py run --bundles bench/bundles/gluon-shapes --out DIR   # on the GPU

`--masks causal` (either mode) keeps the causal cases only. Timed: bf16, D in {64, 128}, full and
causal, the SHAPES below; builds `default` (the preset's choice), `persistent`, `gluon` (a
program per query block; causal blocks started longest first across sections of heads that fill
the GPU), `gluon_heads` (the same, head after head) and `ttir` (warp_specialize=false);
every engine replayed from a CUDA graph (these kernels run tens of microseconds, below the host's
launch path), medians of triton.testing.do_bench over three alternating rounds; FLOPs
4 B H L^2 D (half for causal). Each build's output is checked against float32 SDPA.
"""
from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import harness  # noqa: E402
from warp_specialized import BUILDS, _attention, _inputs  # noqa: E402

ROUNDS = 3
BUILDS = dict(BUILDS, gluon_heads=dict(BUILDS["gluon"], wave_programs=0))
LABELS = ("default", "persistent", "gluon", "gluon_heads", "ttir")
MASKS = ["full", "causal"]
# (batch, heads, length): prefill-sized problems whose query blocks fill 0.65-0.98 of the last
# wave of 132 multiprocessors at one of the two head dims.
SHAPES = [(1, 8, 2048), (2, 4, 4096), (1, 4, 8192), (4, 8, 1024), (1, 16, 4096), (1, 32, 2048),
          (1, 12, 8192), (2, 16, 1024), (1, 16, 8192), (8, 16, 2048)]


def _cases():
    for dim in (64, 128):
        for batch, heads, length in SHAPES:
            for causal in [mask == "causal" for mask in MASKS]:
                yield f"{'causal' if causal else 'full'}_d{dim}_b{batch}_h{heads}_l{length}", batch, heads, length, dim, causal


def build(out: str) -> None:
    import torch

    from ae_mlir.backends import triton as tb

    os.makedirs(out, exist_ok=True)
    for name, batch, heads, length, dim, causal in _cases():
        q = torch.empty(batch, heads, length, dim, dtype=torch.bfloat16, device="meta")
        for label in LABELS:
            tb.compile_bundle(_attention(causal), q, q, q, config=BUILDS[label]).save(
                os.path.join(out, f"{name}.{label}.json"))
        print("built", name, flush=True)


def run(bundles: str, out_dir: str) -> None:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from ae_mlir import runtime

    doc = harness.results_doc(out_dir, __doc__, rounds=ROUNDS,
                              multiprocessors=torch.cuda.get_device_properties(0).multi_processor_count)
    for name, batch, heads, length, dim, causal in _cases():
        q, k, v = _inputs(batch, heads, heads, length, length, dim, torch.bfloat16, "bhld", length + dim + heads)
        want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
        engines, errors = {}, {}
        for label in LABELS:
            bundle = runtime.Bundle.load(os.path.join(bundles, f"{name}.{label}.json"))
            errors[label] = float((runtime.launch(bundle, q, k, v)[0].float() - want).abs().max())
            engines[label] = harness.graphed(lambda bundle=bundle: runtime.launch(bundle, q, k, v))

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        errors["cudnn"] = float((cudnn().float() - want).abs().max())
        engines["cudnn"] = harness.graphed(cudnn)
        flops = 4 * batch * heads * length * length * dim * (0.5 if causal else 1.0)
        rec = {"case": name, "B": batch, "H": heads, "L": length, "D": dim, "causal": causal, "max_abs_err": errors,
               **harness.rounds_timed(engines, ROUNDS, flops)}
        doc["cases"].append(rec)
        print(name, " ".join(f"{label} {tf:.0f}" for label, tf in rec["tflops"].items()),
              "err", max(errors.values()), flush=True)
        harness.save(doc, out_dir, "gluon-shapes.json")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--masks", default=",".join(MASKS))
    known, rest = parser.parse_known_args()
    if not set(known.masks.split(",")) <= set(MASKS):
        parser.error(f"--masks takes {','.join(MASKS)}, got {known.masks!r}")
    MASKS[:] = known.masks.split(",")
    sys.exit(harness.main(__doc__, build, run, "gluon-shapes", rest))
