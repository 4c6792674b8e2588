"""Decoding benchmark: one query token per sequence against a long KV cache (bf16, GQA 32/8,
D = 128), ae-mlir's split-KV kernels beside SDPA (cuDNN, flash) and FlexAttention in the same
process, as the bandwidth of reading K and V once (bytes of K and V / time).

    python bench/decoding.py build --out bench/bundles/decoding      # here: needs the MLIR bindings
    python bench/decoding.py run --bundles bench/bundles/decoding --out DIR   # on the GPU

Times are medians of triton.testing.do_bench; inputs are drawn fresh per case; outputs are checked
against float32 SDPA (math backend) on the whole batch.
"""
from __future__ import annotations

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import harness  # noqa: E402

HEADS, KV_HEADS, DIM = 32, 8, 128
CASES = [(1, 8192), (1, 32768), (1, 131072), (8, 8192), (8, 32768), (32, 8192)]
# Other configs built and timed beside the preset's for these cases (config overrides by name).
SWEEP_CASES = [(1, 32768), (1, 131072), (8, 8192), (8, 32768)]
SWEEP = {f"k{n}": {"kv_splits": n} for n in (2, 4, 8, 12, 16, 20, 24, 33)}


def _name(batch: int, seq: int) -> str:
    return f"decode_b{batch}_l{seq}"


def _attention():
    import ae_mlir as ae

    return ae.attention()


def build(out: str) -> None:
    import torch

    from ae_mlir.backends import triton as tb

    os.makedirs(out, exist_ok=True)
    for batch, seq in CASES:
        q = torch.empty(batch, HEADS, 1, DIM, dtype=torch.bfloat16, device="meta")
        kv = torch.empty(batch, KV_HEADS, seq, DIM, dtype=torch.bfloat16, device="meta")
        bundle = tb.compile_bundle(_attention(), q, kv, kv, target="cuda:90")
        bundle.save(os.path.join(out, _name(batch, seq) + ".json"))
        print("built", _name(batch, seq), bundle.meta["config"], flush=True)
        if (batch, seq) in SWEEP_CASES:
            for label, overrides in SWEEP.items():
                config = dict(bundle.meta["config"], **overrides)
                if label == "unpacked":
                    config.pop("kv_splits", None)
                tb.compile_bundle(_attention(), q, kv, kv, target="cuda:90", config=config).save(
                    os.path.join(out, f"{_name(batch, seq)}.{label}.json"))


def run(bundles: str, out_dir: str) -> None:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.flex_attention import flex_attention

    from ae_mlir import runtime

    device = torch.device("cuda")
    doc = harness.results_doc(out_dir, __doc__, heads=HEADS, kv_heads=KV_HEADS, dim=DIM, dtype="bfloat16")
    records = doc["cases"]
    flex = torch.compile(flex_attention, dynamic=False)
    torch.manual_seed(0)
    for batch, seq in CASES:
        q = torch.randn(batch, HEADS, 1, DIM, dtype=torch.bfloat16, device=device)
        k = torch.randn(batch, KV_HEADS, seq, DIM, dtype=torch.bfloat16, device=device)
        v = torch.randn(batch, KV_HEADS, seq, DIM, dtype=torch.bfloat16, device=device)
        nbytes = 2 * k.numel() * k.element_size()
        with sdpa_kernel(SDPBackend.MATH):
            ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), enable_gqa=True)
        bundle = runtime.Bundle.load(os.path.join(bundles, _name(batch, seq) + ".json"))
        impls = {"ae_mlir": lambda: runtime.launch(bundle, q, k, v)[0]}
        for file in sorted(os.listdir(bundles)):
            if file.startswith(_name(batch, seq) + ".") and file.count(".") == 2:
                other = runtime.Bundle.load(os.path.join(bundles, file))
                impls["ae_mlir_" + file.split(".")[1]] = lambda other=other: runtime.launch(other, q, k, v)[0]
        for label, backend in (("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa_flash", SDPBackend.FLASH_ATTENTION)):
            def sdpa(backend=backend):
                with sdpa_kernel(backend):
                    return torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
            impls[label] = sdpa
        impls["flex_attention"] = lambda: flex(q, k, v, enable_gqa=True)
        rec = {"case": _name(batch, seq), "B": batch, "Lk": seq, "kv_bytes": nbytes,
               "config": bundle.meta.get("config"), "results": {}}
        for label, fn in impls.items():
            result = harness.measure(fn, lambda out: float((out.float() - ref).abs().max()))
            if "ms" in result:
                result["tb_per_s"] = nbytes / (result["ms"] * 1e-3) / 1e12
            rec["results"][label] = result
        records.append(rec)
        print(json.dumps(rec), flush=True)
        harness.save(doc, out_dir, "decoding.json")


def main(argv=None) -> int:
    return harness.main(__doc__, build, run, "decoding", argv)


if __name__ == "__main__":
    sys.exit(main())
