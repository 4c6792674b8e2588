"""What the GPU benchmarks that build bundles here and run them on a GPU share: the two-mode
command line and the timing of one implementation."""
from __future__ import annotations

import argparse
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))


def measure(fn, error_of) -> dict:
    """{"ms": median of triton.testing.do_bench, "max_abs_err": error_of(fn())}, or {"error": ...}
    when the implementation fails: a peer that cannot run a case is recorded, not fatal."""
    import triton

    try:
        err = error_of(fn())
        ms = float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))
        return {"ms": ms, "max_abs_err": err}
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}


def save(doc: dict, out_dir: str, name: str) -> None:
    """Rewrite the results file after every case, so a run cut short keeps what it measured."""
    with open(os.path.join(out_dir, name), "w") as f:
        json.dump(doc, f, indent=1)


def main(description: str, build, run, bundles: str, argv=None) -> int:
    """`build --out DIR` (here, with the MLIR bindings) or `run --bundles DIR --out DIR` (on the
    GPU, torch and triton only)."""
    parser = argparse.ArgumentParser(description=description.splitlines()[0])
    parser.add_argument("mode", choices=("build", "run"))
    parser.add_argument("--out", required=True)
    parser.add_argument("--bundles", default=os.path.join(HERE, "bundles", bundles))
    args = parser.parse_args(argv)
    if args.mode == "build":
        build(args.out)
    else:
        run(args.bundles, args.out)
    return 0


def results_doc(out_dir: str, method: str, **fields) -> dict:
    """The results document of a run on this GPU (its name, the torch and triton versions, the
    date, how it was measured, and `fields`), with an empty "cases" list to fill; makes out_dir."""
    import datetime

    import torch
    import triton

    os.makedirs(out_dir, exist_ok=True)
    return {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "date": datetime.date.today().isoformat(), **fields, "method": method, "cases": []}
