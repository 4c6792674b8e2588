"""Training steps through the API on the GPU, as users run them: `torch.autograd.grad(attn(q, k,
v), (q, k, v), dO)` with q, k, v requiring grad, for causal attention and for a mask read at call
time (the catalogue's causal document mask, its ids a closure tensor), beside FlexAttention's (its
BlockMask built once, outside the step, as its users do) and, for causal attention, torch SDPA's
(its default choice, and cuDNN's), bf16, B*L = 16384, H=16 D=128, in the same process.

    python bench/training_steps.py build --out bench/bundles/training_steps   # here: a kernel cache
    python bench/training_steps.py run --bundles bench/bundles/training_steps --out DIR   # GPU

`build` fills a kernel cache (AE_MLIR_CACHE_DIR) with what the run's calls need on a machine
without the MLIR bindings: the forward and backward bundles at the tiles the document mask takes,
the problem each module poses and the variant's derivative. `run` times each step (median of
`triton.testing.do_bench`): ae-mlir's as users call it; FlexAttention's. For the document mask
also both with new document ids at every step ("fresh_ids", as a training loop over packed
batches has them): the ids tensor the mask reads is overwritten in place before each step, so
ae-mlir classifies it again (one evaluation of the mask for the step's three kernels) and
FlexAttention builds its BlockMask in the step. ae-mlir's and FlexAttention's forward alone too
(without grad), and each step captured in a CUDA graph and replayed (`graph_step_ms`: the GPU's time
without the host's). `--variants causal,document` picks the cases of either mode; `--profile` adds each
implementation's kernels with their mean time a step (torch.profiler).
Gradients of batch 0 against float32 autograd through the materialized attention
(`suite.attention_reference`), as the largest error relative to the largest gradient.
"""
from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import harness  # noqa: E402
import suite  # noqa: E402

HEADS, DIM, TOKENS = 16, 128, 16384
LENGTHS = (2048, 8192)
VARIANTS = ["causal", "document"]
PROFILE = False  # --profile: also each implementation's kernels and their mean times a step


def _case(variant: str, length: int) -> suite.Case:
    return suite.Case(part="catalogue", variant=variant, dtype="bfloat16", batch=TOKENS // length, heads=HEADS,
                      seq=length, dim=DIM)


def _cases():
    return [(variant, length) for variant in VARIANTS for length in LENGTHS]


def build(out: str) -> None:
    os.environ["AE_MLIR_CACHE_DIR"] = os.path.abspath(out)
    from ae_mlir import runtime

    runtime.CACHE.clear_memory()
    for variant, length in _cases():
        tiles = suite.cache_training_step(_case(variant, length))
        print("built", variant, length, tiles, flush=True)


def _error(got, want) -> float:
    return float((got.float() - want).abs().max() / want.abs().max())


def _reference(attn, q, k, v, d_out):
    """dq, dk, dv of batch 0 from float32 autograd through the materialized attention."""
    import torch

    leaves = [t[:1].detach().float().requires_grad_() for t in (q, k, v)]
    out = suite.attention_reference(attn, *leaves, torch.arange(q.shape[2], device=q.device))
    return torch.autograd.grad(out, leaves, d_out[:1].float())


def _sdpa(backend: str | None):
    """torch SDPA's causal attention, with its default backend choice or the one named."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def run(q, k, v):
        if backend is None:
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        with sdpa_kernel(getattr(SDPBackend, backend)):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    return run


def _graphed(fn, q, k, v, d_out, want) -> dict:
    """The step captured in a CUDA graph and replayed (no host work per step): its median ms and
    the replayed gradients' error, or why it could not be captured."""
    import torch

    def step():
        return torch.autograd.grad(fn(q, k, v), (q, k, v), d_out)

    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the capture stream, as torch's CUDA graph docs do
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            grads = step()
        graph.replay()
        return {"graph_step_ms": harness.bench_ms(graph.replay),
                "graph_max_rel_err": max(_error(g[:1], w) for g, w in zip(grads, want))}
    except Exception as exc:
        return {"graph_error": f"{type(exc).__name__}: {str(exc)[:300]}"}


def _fresh_ids(attn, length: int, device, count: int = 8):
    """The document ids tensor `attn`'s mask reads, and a step that overwrites it in place with
    the next of `count` other sorted id sequences (documents of L/8 to L/2 tokens, as the
    catalogue's)."""
    import torch

    ids = next(c.cell_contents for c in attn.mask_mod.__closure__ if isinstance(c.cell_contents, torch.Tensor))
    gen = torch.Generator().manual_seed(11)
    pool = []
    for _ in range(count):
        lengths = torch.randint(length // 8, length // 2 + 1, (length,), generator=gen)
        pool.append(torch.repeat_interleave(torch.arange(length), lengths)[:length].to(device, ids.dtype))
    turn = [0]

    def refresh():
        turn[0] += 1
        ids.copy_(pool[turn[0] % count])

    return ids, refresh


def _flex_fresh_mask(attn, shape, device):
    """FlexAttention building its BlockMask from the mask's current ids at every call."""
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    torch._dynamo.reset()
    compiled = torch.compile(flex_attention, dynamic=False)

    def run(q, k, v):
        block_mask = create_block_mask(attn.mask_mod, None, None, shape.seq_q, shape.seq_k, device=device)
        return compiled(q, k, v, score_mod=attn.score_mod, block_mask=block_mask, scale=attn.scale)

    return run


def run(bundles: str, out_dir: str) -> None:
    os.environ["AE_MLIR_CACHE_DIR"] = os.path.abspath(bundles)
    import torch

    device = torch.device("cuda")
    doc = harness.results_doc(out_dir, __doc__, heads=HEADS, dim=DIM, tokens=TOKENS, dtype="bfloat16")
    for variant, length in _cases():
        case = _case(variant, length)
        attn, shape = suite.softmax_problem(case, device)
        q, k, v = (t.requires_grad_() for t in suite.softmax_inputs(shape, "bfloat16", device))
        d_out = torch.randn(q.shape, dtype=q.dtype, device=device)
        kept = suite.kept_fraction(attn.mask_mod, shape.seq_q, shape.seq_k, device)
        rec = {"variant": variant, "batch": case.batch, "seq": length, "kept_fraction": kept,
               "step_flops": 3.5 * suite.softmax_flops(shape, kept), "results": {}}
        want = _reference(attn, q, k, v, d_out)
        runs = [("ae_mlir", attn)]
        if variant == "document":
            runs.append(("ae_mlir_fresh_ids", attn))
        runs.append(("flex_attention", suite.flex_callable(attn, shape, device)))
        if variant == "document":
            runs.append(("flex_attention_fresh_ids", _flex_fresh_mask(attn, shape, device)))
        if variant == "causal":
            runs += [("sdpa", _sdpa(None)), ("sdpa_cudnn", _sdpa("CUDNN_ATTENTION"))]
        for label, fn in runs:
            fresh = label.endswith("fresh_ids")
            if fresh:
                ids, refresh = _fresh_ids(attn, length, device)
                saved = ids.clone()
            try:
                grads = torch.autograd.grad(fn(q, k, v), (q, k, v), d_out)
                result = {"max_rel_err": max(_error(g[:1], w) for g, w in zip(grads, want))}
                if fresh:
                    step = harness.bench_ms(lambda fn=fn: refresh() or torch.autograd.grad(fn(q, k, v), (q, k, v), d_out))
                else:
                    step = harness.bench_ms(lambda fn=fn: torch.autograd.grad(fn(q, k, v), (q, k, v), d_out))
                    with torch.no_grad():
                        result["forward_ms"] = harness.bench_ms(lambda fn=fn: fn(q, k, v))
                    result.update(_graphed(fn, q, k, v, d_out, want))
                result.update(step_ms=step, step_tflops=rec["step_flops"] / (step * 1e-3) / 1e12)
                if PROFILE:
                    result["kernels_us"] = harness.kernel_times(
                        lambda fn=fn: torch.autograd.grad(fn(q, k, v), (q, k, v), d_out))
                rec["results"][label] = result
            except Exception as exc:
                rec["results"][label] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            finally:
                if fresh:
                    ids.copy_(saved)
        doc["cases"].append(rec)
        print(rec, flush=True)
        harness.save(doc, out_dir, "training-steps.json")


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated: " + ", ".join(VARIANTS))
    parser.add_argument("--profile", action="store_true")
    known, rest = parser.parse_known_args(argv)
    global PROFILE
    PROFILE = known.profile
    harness.pick(parser, VARIANTS, known.variants, "variants")
    return harness.main(__doc__, build, run, "training_steps", rest)


if __name__ == "__main__":
    sys.exit(main())
