"""A packed batch with a mask that reads a closure tensor per sequence (prefix-LM: causal, plus
the first prefix[s] keys of sequence s seen by all its queries), forward and backward on the GPU,
against the same compiler with `call_time_tables=false` (every tile visited with the mask), in
one process. bf16, H 16, D 128, eight sequences of 2048 tokens with prefixes from 0 to 1024.

    python bench/packed_prefix_lm.py build --out bench/bundles/prefix                # here
    python bench/packed_prefix_lm.py build --out bench/bundles/prefix-off --config call_time_tables=false
    python3 bench/packed_prefix_lm.py run --bundles bench/bundles/prefix --baseline bench/bundles/prefix-off --out DIR

Times are medians of triton.testing.do_bench over alternating rounds; the outputs and dQ of both
builds are compared with each other and the forward with float32 SDPA per sequence.
"""
from __future__ import annotations

import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import harness  # noqa: E402

HEADS, DIM, SEQUENCES, LENGTH = 16, 128, 8, 2048
PREFIXES = [0, 1024, 17, 512, 2000, 0, 100, 700]


def _attention(prefix):
    import ae_mlir as ae

    return ae.attention(mask_mod=lambda b, h, q_idx, kv_idx: (kv_idx <= q_idx) | (kv_idx < prefix[b]),
                        layout="blhd")


def build(out: str, config: dict | None = None) -> None:
    import torch

    from ae_mlir.backends import triton as tb

    os.makedirs(out, exist_ok=True)
    tokens = SEQUENCES * LENGTH
    q = torch.empty(tokens, HEADS, DIM, dtype=torch.bfloat16, device="meta")
    cu = torch.empty(SEQUENCES + 1, dtype=torch.int32, device="meta")
    attn = _attention(torch.tensor(PREFIXES))
    bundle = tb.compile_bundle(attn, q, q, q, target="cuda:90", cu_seqlens_q=cu, cu_seqlens_k=cu,
                               max_seqlen_q=LENGTH, max_seqlen_k=LENGTH, config=config)
    bundle.save(os.path.join(out, "forward.json"))
    tb.build_backward_bundle(bundle.meta["l0"], "cuda:90", config=config).save(os.path.join(out, "backward.json"))
    print("built", out, bundle.meta["config"], flush=True)


def run(bundles: str, out_dir: str, baseline: str | None = None, rounds: int = 5) -> None:
    import torch
    import triton

    from ae_mlir import runtime

    device = torch.device("cuda")
    tokens = SEQUENCES * LENGTH
    gen = torch.Generator().manual_seed(0)
    q, k, v, d_out = (torch.randn(tokens, HEADS, DIM, generator=gen).to(device, torch.bfloat16) for _ in range(4))
    q4, k4, v4, do4 = (t.unsqueeze(0).transpose(1, 2) for t in (q, k, v, d_out))
    cu = torch.arange(0, SEQUENCES + 1, dtype=torch.int32, device=device) * LENGTH
    kv_len = torch.full((SEQUENCES,), LENGTH, dtype=torch.int32, device=device)
    prefix = torch.tensor(PREFIXES, device=device)
    captures = (prefix, kv_len, cu, cu)
    builds = {"ae_mlir": bundles} | ({"ae_mlir_baseline": baseline} if baseline else {})
    calls, outputs = {}, {}
    for label, path in builds.items():
        forward = runtime.Bundle.load(os.path.join(path, "forward.json"))
        backward = runtime.Bundle.load(os.path.join(path, "backward.json"))
        out, lse = runtime.launch(forward, q4, k4, v4, *captures)
        given = {"q": q4, "k": k4, "v": v4, "out": out, "do": do4, "lse": lse, "dlse": torch.zeros_like(lse),
                 **{f"c{i}": c for i, c in enumerate(captures)}}
        outputs[label] = (out, runtime.launch_roles(backward, given)["dq"])
        calls[label + "_forward"] = lambda f=forward: runtime.launch(f, q4, k4, v4, *captures)
        calls[label + "_backward"] = lambda b=backward, g=given: runtime.launch_roles(b, g)
    errors = {}
    i = torch.arange(LENGTH, device=device)
    for s in range(SEQUENCES):
        rows = slice(s * LENGTH, (s + 1) * LENGTH)
        keep = (i[None, :] <= i[:, None]) | (i[None, :] < PREFIXES[s])
        want = torch.nn.functional.scaled_dot_product_attention(
            *(t[rows].transpose(0, 1).float() for t in (q, k, v)), attn_mask=keep).transpose(0, 1)
        for label, (out, _) in outputs.items():
            got = out[0, :, rows].transpose(0, 1).float()
            errors[label] = max(errors.get(label, 0.0), float((got - want).abs().max()))
    if baseline:
        errors["dq_between_builds"] = float((outputs["ae_mlir"][1].float() - outputs["ae_mlir_baseline"][1].float())
                                            .abs().max())
    times = {label: [] for label in calls}
    for _ in range(rounds):
        for label, fn in calls.items():
            times[label].append(triton.testing.do_bench(fn, warmup=25, rep=100))
    kept = sum(sum(min(LENGTH, max(r + 1, p)) for r in range(LENGTH)) for p in PREFIXES)
    flops = 4 * HEADS * DIM * kept
    doc = harness.results_doc(out_dir, __doc__, heads=HEADS, dim=DIM, sequences=SEQUENCES, length=LENGTH,
                              prefixes=PREFIXES, dtype="bfloat16")
    doc["errors"] = errors
    doc["results"] = {label: {"ms": statistics.median(ts), "rounds": ts,
                              "tflops": (2.5 if label.endswith("backward") else 1.0) * flops
                              / (statistics.median(ts) * 1e-3) / 1e12}
                      for label, ts in times.items()}
    harness.save(doc, out_dir, "packed-prefix-lm.json")
    for label, result in doc["results"].items():
        print(f"{label}: {result['ms']:.4f} ms, {result['tflops']:.0f} TFLOP/s", flush=True)
    print("errors", errors, flush=True)


def main(argv=None) -> int:
    return harness.main(__doc__, build, run, "packed-prefix-lm", argv)


if __name__ == "__main__":
    sys.exit(main())
