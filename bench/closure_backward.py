"""Gradients of learnable closure tensors on the GPU: ae-mlir's backward kernels (the dQ kernel adds
each tile's share into dc<i> with atomic adds) beside FlexAttention's backward with the same
tensor requiring grad, bf16, B=8 H=16 L=2048 D=128, in the same process.

    python bench/closure_backward.py build --out bench/bundles/closure_backward   # here (MLIR)
        [--config mirror_reads=false]   # backward preset overrides (for a --baseline directory)
    python bench/closure_backward.py run --bundles bench/bundles/closure_backward --out DIR   # GPU
        [--baseline OLD]   # also OLD's bundles (another version's), alternating, in the same process
    python bench/closure_backward.py cpu --out DIR [--case alibi]   # the CPU kernels beside eager torch, here

Cases (the catalogue's entries, their tensors made learnable): alibi (slopes [H], causal: one
atomic add per tile), relative_bias (table [H, 2L - 1], no mask: one per score; and
relative_bias_uncomposed, the table read at q_idx - kv_idx + c as written, as the kernels read a
table at a query's position in a cache, q_idx + offset[b] - kv_idx), t5_bias (bias
[H, 32] by log bucket, no mask: the kernels read it composed per distance, [H, 2L - 1], one add
per score into that, whose gradient reaches the bias through torch's gather backward, timed with
the kernels). For each, the backward
alone in ms and TFLOP/s (2.5x the forward's FLOPs), with the tensor's gradient and without it
(ae-mlir: the bundle built with closure_grads=False; FlexAttention: the tensor not requiring
grad), so the cost of the gradient shows. ae-mlir's backward is timed alone (both kernels, from
the forward's output and logsumexp); FlexAttention's as forward + backward minus forward
(triton.testing.do_bench medians); ae-mlir's forward alone as well. Gradients are checked against float32 autograd through the
materialized attention (bench/suite.py): dq, dk, dv on batch 0, the closure tensor's over the
whole batch, for ae-mlir and FlexAttention alike.
"""
from __future__ import annotations

import itertools
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import harness  # noqa: E402
import suite  # noqa: E402

# relative_bias_uncomposed: the catalogue's table read as written, at q_idx - kv_idx + c, as the
# kernels read a table at a query's position in a cache (not composed per call).
CASES = ["alibi", "relative_bias", "t5_bias", "relative_bias_uncomposed"]
BATCH, HEADS, SEQ, DIM = 8, 16, 2048, 128
UNCOMPOSED = "_uncomposed"


def _case(variant: str) -> suite.Case:
    return suite.Case(part="backward", variant=variant.removesuffix(UNCOMPOSED), dtype="bfloat16", batch=BATCH,
                      heads=HEADS, seq=SEQ, dim=DIM)


def build(out: str, config: dict | None = None) -> None:
    from ae_mlir.backends import triton as tb

    os.makedirs(out, exist_ok=True)
    for variant in CASES:
        attn, shape = suite.softmax_problem(_case(variant), "cpu")
        q, k, v = suite.meta_like(shape, "bfloat16")
        text = attn.mlir(q, k, v, compose=not variant.endswith(UNCOMPOSED))
        forward = tb.build_bundle(text, "cuda:90", config)
        forward.meta["l0"] = text
        forward.save(os.path.join(out, f"{variant}.fwd.json"))
        tb.build_backward_bundle(text, "cuda:90", config).save(os.path.join(out, f"{variant}.bwd.json"))
        tb.build_backward_bundle(text, "cuda:90", dict(config or {}, closure_grads=False)).save(
            os.path.join(out, f"{variant}.bwd_without.json"))
        print("built", variant, flush=True)


def _reference(attn, table, q, k, v, d_out):
    """float32 autograd through the materialized attention: (dq, dk, dv) of batch 0 and the
    table's gradient over the whole batch."""
    import torch

    leaves = [t.detach().float().requires_grad_() for t in (q, k, v)]
    rows = torch.arange(q.shape[2], device=q.device)
    out = suite.attention_reference(attn, *leaves, rows)
    grads = torch.autograd.grad(out, leaves + [table], d_out.float())
    return [g[:1] for g in grads[:3]], grads[3]


def _error(got, want) -> float:
    return float((got.float() - want).abs().max() / want.abs().max())


def run(bundles: str, out_dir: str, baseline: str | None = None) -> None:
    import torch

    from ae_mlir import runtime

    device = torch.device("cuda")
    doc = harness.results_doc(out_dir, __doc__, shape={"B": BATCH, "H": HEADS, "L": SEQ, "D": DIM}, dtype="bfloat16")
    torch.manual_seed(0)
    for variant in CASES:
        attn, shape = suite.softmax_problem(_case(variant), device)
        q, k, v = suite.softmax_inputs(shape, "bfloat16", device)
        d_out = torch.randn(*q.shape[:3], v.shape[3], dtype=q.dtype, device=device)
        (table,) = attn._build(q, k, v, compose=False)[1]  # each case reads one float tensor
        kept = suite.kept_fraction(attn.mask_mod, shape.seq_q, shape.seq_k, device)
        flops = 2.5 * suite.softmax_flops(shape, kept)
        rec = {"case": variant, "table_shape": list(table.shape), "kept_fraction": kept, "backward_flops": flops,
               "results": {}}
        table.requires_grad_(True)
        want_qkv, want_table = _reference(attn, table, q, k, v, d_out)
        # What the kernels read: the table, or (T5) the table composed per distance from it.
        (fed,) = attn._build(q, k, v, compose=not variant.endswith(UNCOMPOSED))[1]
        rec["kernel_table_shape"] = list(fed.shape)
        fwd = runtime.Bundle.load(os.path.join(bundles, f"{variant}.fwd.json"))
        out, lse = runtime.launch(fwd, q, k, v, fed.detach())
        tensors = {"q": q, "k": k, "v": v, "do": d_out, "out": out, "lse": lse, "dlse": torch.zeros_like(lse),
                   "c0": fed.detach()}
        # With a baseline, both versions' bundles in turn, twice (the order of the timing shows).
        sources = [("", bundles)] if baseline is None else [("", bundles), ("baseline_", baseline)] * 2
        for prefix, directory in sources:
            # The forward alone too (its bundles may differ between the versions).
            forward = runtime.Bundle.load(os.path.join(directory, f"{variant}.fwd.json"))
            label = prefix + "ae_mlir_forward"
            label += "_round2" if label in rec["results"] else ""
            ms = harness.bench_ms(lambda forward=forward: runtime.launch(forward, q, k, v, fed.detach()))
            rec["results"][label] = {"forward_ms": ms, "tflops": flops / 2.5 / (ms * 1e-3) / 1e12}
        for (prefix, directory), (label, file) in itertools.product(
                sources, (("ae_mlir", "bwd"), ("ae_mlir_without_table_grad", "bwd_without"))):
            label = prefix + label
            label += "_round2" if label in rec["results"] else ""
            bwd = runtime.Bundle.load(os.path.join(directory, f"{variant}.{file}.json"))

            def backward(bwd=bwd):
                grads = runtime.launch_roles(bwd, tensors)
                if "dc0" in grads and fed is not table:
                    grads["dc0"] = torch.autograd.grad(fed, table, grads["dc0"], retain_graph=True)[0]
                return grads

            try:
                grads = backward()
                errors = {"qkv": max(_error(grads[r][:1], w) for r, w in zip(("dq", "dk", "dv"), want_qkv))}
                if "dc0" in grads:
                    errors["table"] = _error(grads["dc0"], want_table)
                ms = harness.bench_ms(backward)
                rec["results"][label] = {"backward_ms": ms, "tflops": flops / (ms * 1e-3) / 1e12,
                                         "max_rel_err": errors, "config": bwd.meta.get("config")}
            except Exception as exc:
                rec["results"][label] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        for label, learnable in (("flex_attention", True), ("flex_attention_without_table_grad", False)):
            try:
                table.requires_grad_(learnable)
                fn = suite.flex_callable(attn, shape, device)
                leaves = [t.detach().requires_grad_() for t in (q, k, v)]
                wrt = leaves + ([table] if learnable else [])
                grads = torch.autograd.grad(fn(*leaves), wrt, d_out)
                errors = {"qkv": max(_error(g[:1], w) for g, w in zip(grads[:3], want_qkv))}
                if learnable:
                    errors["table"] = _error(grads[3], want_table)
                rec["results"][label] = dict(harness.peer_backward(fn, leaves, wrt, d_out, flops),
                                             max_rel_err=errors)
            except Exception as exc:
                rec["results"][label] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        table.requires_grad_(False)
        doc["cases"].append(rec)
        print(rec, flush=True)
        harness.save(doc, out_dir, "closure-backward.json")


def cpu(out_dir: str, case: str = "relative_bias") -> None:
    """Forward + backward with a learnable closure tensor and a causal mask on the CPU (fp32, B=1
    H=4 L=1024 D=64): `relative_bias`, a table [H, 2L - 1] (one add per score), or `alibi`, slopes
    [H] (summed over each tile, one add per tile). ae-mlir's kernels (`attn(q, k, v,
    backend="cpu")`, then backward), the same with the tensor not requiring grad (the cost of its
    gradient), and eager torch autograd through the materialized scores (scores + bias, masked
    softmax, P V), alternating, median of 7 after a warm-up, fresh inputs per repetition."""
    import datetime
    import statistics
    import time

    import torch

    import ae_mlir as ae

    heads, length, dim = 4, 1024, 64
    rows = torch.arange(length)
    distance = (rows.view(1, -1) - rows.view(-1, 1)).view(1, 1, length, length)
    causal = rows.view(-1, 1) >= rows.view(1, -1)
    if case == "alibi":
        tensor = torch.tensor([2.0 ** -(h + 1) for h in range(heads)], requires_grad=True)
        attn = ae.attention(score_mod=lambda s, b, h, i, j: s + tensor[h] * (j - i), mask_mod=lambda b, h, i, j: i >= j)

        def bias():
            return tensor.view(1, heads, 1, 1) * distance
    else:
        tensor = torch.randn(heads, 2 * length - 1, requires_grad=True)
        attn = ae.attention(score_mod=lambda s, b, h, i, j: s + tensor[h, i - j + length - 1],
                            mask_mod=lambda b, h, i, j: i >= j)
        offsets = (length - 1 - distance).view(1, -1).expand(heads, -1)

        def bias():
            return tensor.gather(1, offsets).view(1, heads, length, length)

    def eager(q, k, v):
        s = (q @ k.transpose(-1, -2)) * dim ** -0.5 + bias()
        return torch.softmax(s.masked_fill(~causal, float("-inf")), dim=-1) @ v

    def compiled(q, k, v):
        return attn(q, k, v, backend="cpu")

    impls = {"ae_mlir": (compiled, True), "ae_mlir_no_tensor_grad": (compiled, False), "torch_eager": (eager, True)}
    times = {name: [] for name in impls}
    for rep in range(8):
        for name, (fn, learnable) in impls.items():
            q, k, v = (torch.randn(1, heads, length, dim, requires_grad=True) for _ in range(3))
            tensor.grad = None
            tensor.requires_grad_(learnable)
            start = time.perf_counter()
            fn(q, k, v).sum().backward()
            if rep:  # the first round compiles and warms up
                times[name].append((time.perf_counter() - start) * 1e3)
    doc = {"machine": harness.cpu_description(), "cores": len(os.sched_getaffinity(0)),
           "torch": torch.__version__, "date": datetime.date.today().isoformat(), "case": case,
           "method": cpu.__doc__, "median_ms": {name: statistics.median(t) for name, t in times.items()},
           "ms": times}
    print(doc["median_ms"])
    os.makedirs(out_dir, exist_ok=True)
    harness.save(doc, out_dir, f"closure-backward-cpu-{case}.json")


if __name__ == "__main__":
    if sys.argv[1:2] == ["cpu"]:
        import argparse

        parser = argparse.ArgumentParser(description=cpu.__doc__.splitlines()[0])
        parser.add_argument("mode", choices=("cpu",))
        parser.add_argument("--out", required=True)
        parser.add_argument("--case", choices=("relative_bias", "alibi"), default="relative_bias")
        args = parser.parse_args()
        cpu(args.out, args.case)
        sys.exit(0)
    sys.exit(harness.main(__doc__, build, run, "closure_backward"))
