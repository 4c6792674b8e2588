"""Linear attention on packed variable-length batches (bf16, H = 16, D = 128, 16384 tokens in
all): ae-mlir's cu_seqlens kernels beside fla's chunk_simple_gla (decay "token") and chunk_gla
(decay "token_dim") with the same cu_seqlens, in the same process, forward with the final states.

g = logsigmoid(x) / 16 (float32), as bench/suite.py draws it; q, k, v and g live in fla's
[1, T, H, D] layout and ae-mlir reads [1, H, T, D] views of the same memory.

    python bench/linear_varlen.py build --out bench/bundles/linear_varlen   # here: MLIR bindings
    python bench/linear_varlen.py run --bundles bench/bundles/linear_varlen --out DIR   # on the GPU

Times are medians of triton.testing.do_bench; inputs are fresh per case; both outputs are checked
against a float32 chunked recurrence of the first sequence (ae_mlir.frontend.linear_backward).
"""
from __future__ import annotations

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import harness  # noqa: E402
from varlen import CASES, TOKENS, _lengths, _offsets  # noqa: E402

HEADS, DIM = 16, 128
DECAYS = {"simple_gla": "token", "gla": "token_dim"}


def _layer(decay: str):
    import ae_mlir as ae

    return ae.linear_attention(decay=decay, layout="blhd")


def build(out: str) -> None:
    import torch

    from ae_mlir.backends import triton as tb

    os.makedirs(out, exist_ok=True)
    for case in CASES:
        lengths = _lengths(case)
        cu = torch.empty(len(lengths) + 1, dtype=torch.int32, device="meta")
        q = torch.empty(1, TOKENS, HEADS, DIM, dtype=torch.bfloat16, device="meta")
        for variant, decay in DECAYS.items():
            g = torch.empty((1, TOKENS, HEADS) + ((DIM,) if decay == "token_dim" else ()), device="meta")
            text = _layer(decay).mlir(q, q, q, g, cu_seqlens=cu, max_seqlen=max(lengths))
            bundle = tb.build_bundle(text, "cuda:90", None)
            bundle.save(os.path.join(out, f"{case}.{variant}.json"))
            print("built", case, variant, bundle.meta["config"], flush=True)


def run(bundles: str, out_dir: str) -> None:
    import torch
    import torch.nn.functional as F
    from fla.ops.gla import chunk_gla
    from fla.ops.simple_gla import chunk_simple_gla

    from ae_mlir import runtime
    from ae_mlir.frontend.linear_backward import chunked_recurrence

    device = torch.device("cuda")
    doc = harness.results_doc(out_dir, __doc__, heads=HEADS, dim=DIM, tokens=TOKENS, dtype="bfloat16")
    records = doc["cases"]
    gen = torch.Generator(device=device).manual_seed(0)
    peers = {"simple_gla": chunk_simple_gla, "gla": chunk_gla}
    for case in CASES:
        lengths = _lengths(case)
        cu32, lens32 = _offsets(lengths, device)
        cu64 = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int64, device=device)
        first = lengths[0]
        for variant, decay in DECAYS.items():
            q, k, v = (torch.randn(1, TOKENS, HEADS, DIM, dtype=torch.bfloat16, device=device, generator=gen)
                       for _ in range(3))
            size = (1, TOKENS, HEADS) + ((DIM,) if decay == "token_dim" else ())
            g = F.logsigmoid(torch.randn(size, device=device, generator=gen)) / 16
            want, _ = chunked_recurrence(*(t[:, :first].transpose(1, 2).float() for t in (q, k, v)),
                                         g[:, :first].transpose(1, 2), None, decay, DIM ** -0.5, False, 64)

            def error(out):
                return float((out[0][:, :first].transpose(1, 2).float() - want).abs().max())

            bundle = runtime.Bundle.load(os.path.join(bundles, f"{case}.{variant}.json"))
            views = [t.transpose(1, 2) for t in (q, k, v, g)]
            peer = peers[variant]
            impls = {
                "ae_mlir": lambda: (runtime.launch(bundle, *views, lens32, cu32)[0].transpose(1, 2),),
                "fla": lambda: peer(q, k, v, g=g, cu_seqlens=cu64, output_final_state=True),
            }
            rec = {"case": case, "variant": variant, "decay": decay, "sequences": len(lengths),
                   "longest": max(lengths), "config": bundle.meta.get("config"), "results": {}}
            for label, fn in impls.items():
                rec["results"][label] = harness.measure(fn, error)
            ae_ms, fla_ms = (rec["results"][x].get("ms") for x in ("ae_mlir", "fla"))
            if ae_ms and fla_ms:
                rec["fla_ms_over_ae_ms"] = fla_ms / ae_ms
            records.append(rec)
            print(json.dumps(rec), flush=True)
            harness.save(doc, out_dir, "linear_varlen.json")


def main(argv=None) -> int:
    return harness.main(__doc__, build, run, "linear_varlen", argv)


if __name__ == "__main__":
    sys.exit(main())
