"""The order a kernel whose tiles a call classifies starts its programs in (the document masks'):
the runtime's (`core.block_tables.program_order`: heads in sections that fill the GPU, heaviest
first) against the grid order such kernels had before it (each head's blocks from the last down,
head after head), the same bundles timed alternately in one process, forward and backward.

    python bench/build_suite.py --parts catalogue                      # here: the forward bundles
    python bench/backward.py build --out bench/bundles/backward --cases document_d128,document_rows_d128 --no-sweep
    python3 bench/call_time_order.py --out DIR                            # on the GPU

Cases: the catalogue's `document` and `document_rows` (ids per batch row), bf16, B*L = 16384,
H = 16, D = 128, forward at L 2048 and 8192, backward at L 2048 (B 8), each at the preset's
tiles for the call (those the bench suite and `bench/backward.py` build). Five rounds per case,
median of `triton.testing.do_bench` each; the outputs of both orders are compared (each program
computes the same sums either way, so they are equal bit for bit).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import harness  # noqa: E402
import suite  # noqa: E402

VARIANTS = ("document", "document_rows")
LENGTHS = (2048, 8192)
ROUNDS = 5


def _forward_case(variant: str, length: int) -> suite.Case:
    return suite.Case("catalogue", variant, suite.TOKENS // length, suite.HEADS, length, 128, "bfloat16")


def _grid_order(counts, batch, heads, group, wave, limit):
    """The order without a table: head after head, each head's blocks from the last down."""
    import torch

    blocks = counts.shape[-1]
    ids = torch.arange(batch * (heads // group) * blocks, device=counts.device, dtype=torch.int32)
    return ids.view(-1, blocks).flip(-1).reshape(-1)


def _timed(fn, orders: dict, rec: dict, flops: float) -> None:
    """Time `fn` under each order alternately; record medians, TFLOP/s, and whether the outputs
    agree."""
    import torch

    from ae_mlir import block_mask

    times = {label: [] for label in orders}
    outputs = {}
    for _ in range(ROUNDS):
        for label, order in orders.items():
            block_mask.program_order = order
            block_mask._CACHE.clear()
            outputs[label] = fn()
            times[label].append(harness.bench_ms(fn))
    first, second = (outputs[label] for label in orders)
    rec["bitwise_equal"] = all(torch.equal(a, b) for a, b in zip(first, second))
    for label, taken in times.items():
        ms = statistics.median(taken)
        rec[label] = {"ms": ms, "tflops": flops / (ms * 1e-3) / 1e12, "rounds": taken}
    rec["speedup"] = rec["grid"]["ms"] / rec["runtime"]["ms"]


def run(bundles: str, backward: str, out_dir: str) -> None:
    import torch

    from ae_mlir import block_mask, runtime

    orders = {"grid": _grid_order, "runtime": block_mask.program_order}
    doc = harness.results_doc(out_dir, __doc__)
    for variant in VARIANTS:
        for length in LENGTHS:
            case = _forward_case(variant, length)
            attn, shape = suite.softmax_problem(case, "cuda")
            q, k, v = suite.softmax_inputs(shape, case.dtype, "cuda")
            captures = attn._build(q, k, v)[1]
            bundle = runtime.Bundle.load(os.path.join(bundles, case.bundle_file))
            kept = suite.kept_fraction(attn.mask_mod, length, length, "cuda", batch=suite.mask_batch(variant, shape))
            rec = {"case": f"{variant} forward L{length}", "block_m": bundle.block_m, "block_n": bundle.block_n}
            _timed(lambda: runtime.launch(bundle, q, k, v, *captures)[:1], orders, rec, suite.softmax_flops(shape, kept))
            doc["cases"].append(rec)
            print(rec["case"], round(rec["grid"]["ms"], 4), round(rec["runtime"]["ms"], 4),
                  f"{rec['speedup']:.3f}", rec["bitwise_equal"], flush=True)
            harness.save(doc, out_dir, "call-time-order.json")
        case = suite.Case("backward", variant, 8, suite.HEADS, 2048, 128, "bfloat16")
        attn, shape = suite.softmax_problem(case, "cuda")
        q, k, v = suite.softmax_inputs(shape, case.dtype, "cuda")
        captures = attn._build(q, k, v)[1]
        fwd = runtime.Bundle.load(os.path.join(backward, f"{variant}_d128.fwd.json"))
        bwd = runtime.Bundle.load(os.path.join(backward, f"{variant}_d128.bwd.json"))
        out, lse = runtime.launch(fwd, q, k, v, *captures)[:2]
        tensors = {"q": q, "k": k, "v": v, "do": torch.randn_like(out), "out": out, "lse": lse,
                   "dlse": torch.zeros_like(lse), **{f"c{i}": t for i, t in enumerate(captures)}}
        kept = suite.kept_fraction(attn.mask_mod, 2048, 2048, "cuda", batch=suite.mask_batch(variant, shape))
        rec = {"case": f"{variant} backward L2048"}

        def backward():
            grads = runtime.launch_roles(bwd, tensors)
            return [grads["dq"], grads["dk"], grads["dv"]]

        _timed(backward, orders, rec, 2.5 * suite.softmax_flops(shape, kept))
        doc["cases"].append(rec)
        print(rec["case"], round(rec["grid"]["ms"], 4), round(rec["runtime"]["ms"], 4), f"{rec['speedup']:.3f}",
              rec["bitwise_equal"], flush=True)
        harness.save(doc, out_dir, "call-time-order.json")
    block_mask.program_order = orders["runtime"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundles", default=os.path.join(HERE, "bundles"), help="build_suite.py's bundles")
    parser.add_argument("--backward", default=os.path.join(HERE, "bundles", "backward"),
                        help="backward.py build's bundles")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    run(args.bundles, args.backward, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
