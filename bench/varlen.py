"""Varlen prefill benchmark: a packed batch of causal sequences (bf16, H = 16, D = 128, 16384
tokens in all) through ae-mlir's cu_seqlens kernels, beside peers in the same process:

* FlexAttention with a document mask (sequence ids of query and key equal, causal within) on the
  packed tokens, its block mask built once outside the timing (its build is timed apart);
* SDPA (cuDNN, flash) causal on the batch padded to the longest sequence.

TFLOP/s count the causal work of the real tokens only (4 x H x D x L(L+1)/2 per sequence), the
same for everyone.

    python bench/varlen.py build --out bench/bundles/varlen     # here: needs the MLIR bindings
    python bench/varlen.py run --bundles bench/bundles/varlen --out DIR [--baseline OLD]   # on the GPU
        (OLD: another version's bundles, or ones built with `build --config key=value,...` (the
        forward's preset overrides), timed beside this one's)

Times are medians of triton.testing.do_bench; inputs are fresh per case; outputs are checked
against SDPA (math backend, float32) sequence by sequence.
"""
from __future__ import annotations

import json
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import harness  # noqa: E402

HEADS, DIM, TOKENS = 16, 128, 16384


def _lengths(case: str) -> list[int]:
    if case == "equal8x2048":
        return [2048] * 8
    if case == "equal2x8192":
        return [8192] * 2
    rng = random.Random(0)
    lengths = []
    while sum(lengths) < TOKENS:
        lengths.append(min(rng.randint(64, 4096), TOKENS - sum(lengths)))
    return lengths


CASES = ("equal8x2048", "equal2x8192", "mixed64to4096")


def _attention():
    import ae_mlir as ae

    return ae.attention(mask_mod=lambda b, h, i, j: i >= j, layout="blhd")


def _offsets(lengths: list[int], device):
    """(cu_seqlens padded to the module's sequence-count bucket, each sequence's keys), as the
    frontend passes them to the kernels (its `varlen.prepare`, which needs no MLIR)."""
    import torch

    from ae_mlir.frontend import varlen

    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32, device=device)
    rows = torch.empty(1, 1, sum(lengths), 1, device="meta")
    sequences = varlen.prepare(rows, rows, cu, cu, None, None, False)
    return sequences.cu_q, sequences.kv_len


def build(out: str, config: dict | None = None) -> None:
    import torch

    from ae_mlir.backends import triton as tb

    os.makedirs(out, exist_ok=True)
    for case in CASES:
        lengths = _lengths(case)
        q = torch.empty(TOKENS, HEADS, DIM, dtype=torch.bfloat16, device="meta")
        cu = torch.empty(len(lengths) + 1, dtype=torch.int32, device="meta")
        bundle = tb.compile_bundle(_attention(), q, q, q, target="cuda:90", cu_seqlens_q=cu, cu_seqlens_k=cu,
                                   max_seqlen_q=max(lengths), max_seqlen_k=max(lengths), config=config)
        bundle.save(os.path.join(out, case + ".json"))
        backward = tb.build_backward_bundle(bundle.meta["l0"], "cuda:90")
        backward.save(os.path.join(out, case + ".bwd.json"))
        print("built", case, len(lengths), "sequences", bundle.meta["config"], backward.meta["config"], flush=True)


def run(bundles: str, out_dir: str, baseline: str | None = None) -> None:
    import torch
    import triton
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from ae_mlir import runtime

    device = torch.device("cuda")
    doc = harness.results_doc(out_dir, __doc__, heads=HEADS, dim=DIM, tokens=TOKENS, dtype="bfloat16")
    records = doc["cases"]
    flex = torch.compile(flex_attention, dynamic=False)
    gen = torch.Generator().manual_seed(0)
    for case in CASES:
        lengths = _lengths(case)
        q, k, v = (torch.randn(TOKENS, HEADS, DIM, generator=gen).to(device, torch.bfloat16) for _ in range(3))
        flops = sum(4 * HEADS * DIM * n * (n + 1) / 2 for n in lengths)
        starts = [0] + torch.tensor(lengths).cumsum(0).tolist()
        ref = torch.empty(TOKENS, HEADS, DIM, device=device)
        with sdpa_kernel(SDPBackend.MATH):
            for lo, hi in zip(starts, starts[1:]):
                ref[lo:hi] = torch.nn.functional.scaled_dot_product_attention(
                    *(t[lo:hi].transpose(0, 1).float() for t in (q, k, v)), is_causal=True).transpose(0, 1)
        bundle = runtime.Bundle.load(os.path.join(bundles, case + ".json"))
        cu, kv_len = _offsets(lengths, device)
        q4, k4, v4 = (t.unsqueeze(0).transpose(1, 2) for t in (q, k, v))
        impls = {"ae_mlir": lambda: runtime.launch(bundle, q4, k4, v4, kv_len, cu, cu)[0][0].transpose(0, 1)}
        if baseline is not None:
            old = runtime.Bundle.load(os.path.join(baseline, case + ".json"))
            impls["ae_mlir_baseline"] = lambda: runtime.launch(old, q4, k4, v4, kv_len, cu, cu)[0][0].transpose(0, 1)
        seq_id = torch.repeat_interleave(torch.arange(len(lengths), device=device),
                                         torch.tensor(lengths, device=device))

        def document_causal(b, h, q_idx, kv_idx):
            return (seq_id[q_idx] == seq_id[kv_idx]) & (q_idx >= kv_idx)

        build_ms = triton.testing.do_bench(lambda: create_block_mask(document_causal, None, None, TOKENS, TOKENS,
                                                                     device=device), warmup=3, rep=30)
        block_mask = create_block_mask(document_causal, None, None, TOKENS, TOKENS, device=device)
        impls["flex_document_mask"] = lambda: flex(q4, k4, v4, block_mask=block_mask)[0].transpose(0, 1)
        longest = max(lengths)
        padded = [torch.zeros(len(lengths), HEADS, longest, DIM, device=device, dtype=torch.bfloat16) for _ in range(3)]
        for i, (lo, hi) in enumerate(zip(starts, starts[1:])):
            for dst, src in zip(padded, (q, k, v)):
                dst[i, :, :hi - lo] = src[lo:hi].transpose(0, 1)

        def unpad(out):
            return torch.cat([out[i, :, :hi - lo].transpose(0, 1) for i, (lo, hi) in enumerate(zip(starts, starts[1:]))])

        for label, backend in (("sdpa_cudnn_padded", SDPBackend.CUDNN_ATTENTION),
                               ("sdpa_flash_padded", SDPBackend.FLASH_ATTENTION)):
            def sdpa(backend=backend):
                with sdpa_kernel(backend):
                    return torch.nn.functional.scaled_dot_product_attention(*padded, is_causal=True)
            impls[label] = sdpa
        rec = {"case": case, "sequences": len(lengths), "longest": longest, "lengths": lengths,
               "config": bundle.meta.get("config"), "flex_block_mask_build_ms": float(build_ms), "results": {}}
        for label, fn in impls.items():
            result = harness.measure(fn, lambda out, label=label: float(
                ((unpad(out) if "padded" in label else out).float() - ref).abs().max()))
            if "ms" in result:
                result["tflops"] = flops / (result["ms"] * 1e-3) / 1e12
            rec["results"][label] = result
        rec["results"].update(_backward(bundles, case, lengths, flops, (q4, k4, v4), padded, flex, block_mask,
                                        (bundle, kv_len, cu), baseline))
        records.append(rec)
        print(json.dumps({key: value for key, value in rec.items() if key != "lengths"}), flush=True)
        harness.save(doc, out_dir, "varlen.json")


def _backward(bundles, case, lengths, flops, packed, padded, flex, block_mask, forward, baseline=None) -> dict:
    """Backward times (2.5x the forward's FLOPs) of ae-mlir's backward kernels (and `baseline`'s,
    another version's bundles), FlexAttention's and SDPA's on the padded batch; the first
    sequence's dQ checked against float32 autograd."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from ae_mlir import runtime

    q4, k4, v4 = packed
    bundle, kv_len, cu = forward
    gen = torch.Generator().manual_seed(1)
    d_out = torch.randn(q4.shape, generator=gen).to(q4.device, q4.dtype)
    first = lengths[0]
    ref_q = q4[0, :, :first].float().requires_grad_()
    with sdpa_kernel(SDPBackend.MATH):
        ref_out = torch.nn.functional.scaled_dot_product_attention(ref_q, k4[0, :, :first].float(),
                                                                   v4[0, :, :first].float(), is_causal=True)
    (ref_dq,) = torch.autograd.grad(ref_out, ref_q, d_out[0, :, :first].float())

    def first_dq_error(dq):
        return float((dq[0, :, :first].float() - ref_dq).abs().max())

    out, lse = runtime.launch(bundle, q4, k4, v4, kv_len, cu, cu)
    backward = runtime.Bundle.load(os.path.join(bundles, case + ".bwd.json"))
    tensors = {"q": q4, "k": k4, "v": v4, "out": out, "do": d_out, "lse": lse, "dlse": torch.zeros_like(lse),
               "c0": kv_len, "c1": cu, "c2": cu}
    impls = {"ae_mlir": (lambda: runtime.launch_roles(backward, tensors)["dq"], first_dq_error)}
    if baseline is not None:
        old = runtime.Bundle.load(os.path.join(baseline, case + ".bwd.json"))
        impls["ae_mlir_baseline"] = (lambda: runtime.launch_roles(old, tensors)["dq"], first_dq_error)
    leaves = [t.detach().requires_grad_() for t in (q4, k4, v4)]
    flex_out = flex(*leaves, block_mask=block_mask)
    impls["flex_document_mask"] = (lambda: torch.autograd.grad(flex_out, leaves, d_out, retain_graph=True)[0],
                                   first_dq_error)
    d_padded = torch.zeros_like(padded[0])
    for i, n in enumerate(lengths):
        lo = sum(lengths[:i])
        d_padded[i, :, :n] = d_out[0, :, lo:lo + n]
    for label, backend in (("sdpa_cudnn_padded", SDPBackend.CUDNN_ATTENTION),
                           ("sdpa_flash_padded", SDPBackend.FLASH_ATTENTION)):
        pad_leaves = [t.detach().requires_grad_() for t in padded]
        with sdpa_kernel(backend):
            pad_out = torch.nn.functional.scaled_dot_product_attention(*pad_leaves, is_causal=True)
        impls[label] = (lambda o=pad_out, ls=pad_leaves: torch.autograd.grad(o, ls, d_padded, retain_graph=True)[0],
                        lambda dq: float((dq[0, :, :first].float() - ref_dq).abs().max()))
    results = {}
    for label, (fn, error_of) in impls.items():
        result = harness.measure(fn, error_of)
        if "ms" in result:
            result["tflops"] = 2.5 * flops / (result["ms"] * 1e-3) / 1e12
        results["backward_" + label] = result
    return results


def main(argv=None) -> int:
    return harness.main(__doc__, build, run, "varlen", argv)


if __name__ == "__main__":
    sys.exit(main())
