"""Where an eager training step's host time goes on the GPU machine: `torch.autograd.grad(attn(q,
k, v), (q, k, v), dO)` through the API, for causal attention and the catalogue's causal document
mask (a closure tensor read at call time), at a small shape whose kernels take a few tens of
microseconds (B=1, L=256) and at the training bench's L=2048 (B=8), bf16, H=16, D=128.

    python bench/host_path.py build --out bench/bundles/host_path   # here: a kernel cache
    python bench/host_path.py run --bundles bench/bundles/host_path --out DIR [--label NAME]   # GPU

For each implementation (ae-mlir; FlexAttention compiled, its BlockMask built once outside the
step; for causal attention torch SDPA) `run` records: `step_ms`, the median wall time of a step
in a loop of 50 (synchronized at the loop's end, seven loops): what the step costs when the host
issues steps back to back; `host_us`, the median time a step's call takes to return after the GPU
was synchronized before it (the host's work alone: the kernels run asynchronously); the same two
for a forward without grad. For ae-mlir also the host time of the step's parts (`prepare_host_us`:
tracing the mods and writing or finding the module; `backward_host_us`: the backward alone, on one
retained graph) and cProfile's top functions over 100 steps (per step, own and cumulative
microseconds; the profiler's own cost inflates them, their ratios hold). Per case,
`identity_function_step_host_us`: a step through an autograd.Function that returns q and fresh
gradients, the least any custom op's eager step costs that host.
`--label` names the results file, so a run of another version of the sources (PYTHONPATH) lands
beside this one's.
"""
from __future__ import annotations

import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import harness  # noqa: E402
import suite  # noqa: E402

HEADS, DIM = 16, 128
SHAPES = [(1, 256), (8, 2048)]
VARIANTS = ["causal", "document"]
LABEL = "host-path"
_Identity = None  # an autograd.Function made when torch is imported (_identity)


def _case(variant: str, batch: int, length: int) -> suite.Case:
    return suite.Case(part="catalogue", variant=variant, dtype="bfloat16", batch=batch, heads=HEADS, seq=length,
                      dim=DIM)


def _cases():
    return [(variant, batch, length) for variant in VARIANTS for batch, length in SHAPES]


def build(out: str) -> None:
    os.environ["AE_MLIR_CACHE_DIR"] = os.path.abspath(out)
    from ae_mlir import runtime

    runtime.CACHE.clear_memory()
    for variant, batch, length in _cases():
        suite.cache_training_step(_case(variant, batch, length))
        print("built", variant, batch, length, flush=True)


def _timings(call) -> dict:
    """step_ms (back to back) and host_us (after a synchronize) of `call`, medians."""
    import statistics

    import torch

    for _ in range(5):
        call()
    torch.cuda.synchronize()
    loops = []
    for _ in range(7):
        start = time.perf_counter()
        for _ in range(50):
            call()
        torch.cuda.synchronize()
        loops.append((time.perf_counter() - start) / 50 * 1e3)
    host = []
    for _ in range(200):
        torch.cuda.synchronize()
        start = time.perf_counter()
        call()
        host.append((time.perf_counter() - start) * 1e6)
    torch.cuda.synchronize()
    return {"step_ms": statistics.median(loops), "host_us": statistics.median(host)}


def _host_us(call, calls: int = 300) -> float:
    """The median time `call` takes to return, the GPU synchronized before each call."""
    import statistics

    import torch

    for _ in range(10):
        call()
    times = []
    for _ in range(calls):
        torch.cuda.synchronize()
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(times)


def _pieces(attn, q, k, v, d_out) -> dict:
    """Host times of a step's parts: writing (or finding) the module, the backward alone (on one
    retained graph)."""
    import torch

    detached = [t.detach() for t in (q, k, v)]
    out = attn(q, k, v)
    return {"prepare_host_us": _host_us(lambda: attn._prepare(*detached)),
            "backward_host_us": _host_us(lambda: torch.autograd.grad(out, (q, k, v), d_out, retain_graph=True))}


def _identity():
    import torch

    class Identity(torch.autograd.Function):
        """The least a custom autograd op's eager step costs the host: q back, fresh gradients."""

        @staticmethod
        def forward(ctx, q, k, v):
            return q.clone()

        @staticmethod
        def backward(ctx, d_out):
            return d_out, torch.empty_like(d_out), torch.empty_like(d_out)

    return Identity


def _sdpa(q, k, v):
    import torch

    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


def run(bundles: str, out_dir: str) -> None:
    os.environ["AE_MLIR_CACHE_DIR"] = os.path.abspath(bundles)
    import torch

    global _Identity
    _Identity = _identity()
    device = torch.device("cuda")
    doc = harness.results_doc(out_dir, __doc__, heads=HEADS, dim=DIM, dtype="bfloat16", label=LABEL,
                              sources=os.path.dirname(os.path.dirname(os.path.abspath(suite.__file__))))
    for variant, batch, length in _cases():
        attn, shape = suite.softmax_problem(_case(variant, batch, length), device)
        q, k, v = (t.requires_grad_() for t in suite.softmax_inputs(shape, "bfloat16", device))
        d_out = torch.randn(q.shape, dtype=q.dtype, device=device)
        rec = {"variant": variant, "batch": batch, "seq": length, "results": {}}
        runs = [("ae_mlir", attn), ("flex_attention", suite.flex_callable(attn, shape, device))]
        if variant == "causal":
            runs.append(("sdpa", _sdpa))
        for label, fn in runs:
            def step(fn=fn):
                return torch.autograd.grad(fn(q, k, v), (q, k, v), d_out)

            def forward(fn=fn):
                with torch.no_grad():
                    return fn(q, k, v)

            try:
                result = _timings(step)
                result.update({f"forward_{key}": value for key, value in _timings(forward).items()})
                if label == "ae_mlir":
                    result.update(_pieces(attn, q, k, v, d_out))
                    result["profile"] = harness.profile_calls(step)
                rec["results"][label] = result
            except Exception as exc:
                rec["results"][label] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        rec["identity_function_step_host_us"] = _host_us(
            lambda: torch.autograd.grad(_Identity.apply(q, k, v), (q, k, v), d_out))
        doc["cases"].append(rec)
        print({key: value for key, value in rec.items() if key != "results"},
              {label: {key: value for key, value in r.items() if key != "profile"}
               for label, r in rec["results"].items()}, flush=True)
        harness.save(doc, out_dir, f"{LABEL}.json")


def main(argv=None) -> int:
    import argparse

    global LABEL
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--label", default=LABEL)
    known, rest = parser.parse_known_args(argv)
    LABEL = known.label
    return harness.main(__doc__, build, run, "host_path", rest)


if __name__ == "__main__":
    sys.exit(main())
