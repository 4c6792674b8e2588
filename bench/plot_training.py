"""Plot the training runs: the attention backward's TFLOP/s beside its peers' (from
`bench/backward.py run` JSON files) and the linear-attention training step's time beside fla's
(from a `bench/linear_backward.py run` JSON file).

    python bench/plot_training.py --backward A.json [B.json ...] --linear-step C.json --out PNG

A case that appears in several backward files is taken from the last one that has it (a later
run of one change, e.g. soft-capping with the fast tanh). Needs matplotlib.
"""
from __future__ import annotations

import argparse
import json
import sys

# Each peer's key in the backward JSON's "results", as bench/backward.py writes them; "bwd" is
# ae-mlir's backward at the bundles under test.
BACKWARD_IMPLS = (("bwd", "ae-mlir", "tab:red"), ("flex_attention", "FlexAttention", "tab:blue"),
                  ("sdpa_flash", "SDPA flash", "tab:olive"), ("sdpa_cudnn", "SDPA cuDNN", "tab:green"))
STEP_IMPLS = (("ae_mlir", "ae-mlir", "tab:red"), ("fla", "fla", "tab:purple"))


def backward_cases(paths: list[str]) -> tuple[dict, dict]:
    """({case name: results by implementation}, the first file's header), later files winning."""
    cases, header = {}, None
    for path in paths:
        with open(path) as f:
            doc = json.load(f)
        header = header or {key: doc.get(key) for key in ("gpu", "torch", "triton", "date", "shape", "dtype")}
        for case in doc["cases"]:
            cases[case["case"]] = case["results"]
    return cases, header


def step_cases(path: str) -> tuple[dict, dict]:
    with open(path) as f:
        doc = json.load(f)
    return ({case["case"]: case["results"] for case in doc["cases"]},
            {key: doc.get(key) for key in ("gpu", "torch", "triton", "date", "shape", "dtype")})


def _shape(shape) -> str:
    return " ".join(f"{k}{v}" for k, v in shape.items()) if isinstance(shape, dict) else str(shape)


def _bars(ax, names: list[str], values: dict, impls, ylabel: str) -> None:
    width = 0.8 / len(impls)
    for i, (key, label, color) in enumerate(impls):
        xs = [n + (i - (len(impls) - 1) / 2) * width for n in range(len(names))]
        ys = [values[name].get(key) for name in names]
        ax.bar([x for x, y in zip(xs, ys) if y is not None], [y for y in ys if y is not None], width,
               label=label, color=color)
        for x, y in zip(xs, ys):
            if y is None:
                ax.text(x, 0, "n/a", rotation=90, ha="center", va="bottom", fontsize=6)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=30, ha="right", fontsize=7)
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7)


def plot(backward: list[str], linear_step: str | None, out: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = 1 + (linear_step is not None)
    fig, axes = plt.subplots(1, panels, figsize=(7 * panels, 4.2), squeeze=False,
                             gridspec_kw={"width_ratios": [3, 1][:panels]})
    cases, header = backward_cases(backward)
    tflops = {name: {key: r.get("tflops") for key, r in results.items() if isinstance(r, dict)}
              for name, results in cases.items()}
    _bars(axes[0][0], list(tflops), tflops, BACKWARD_IMPLS, "backward TFLOP/s (2.5x the forward's FLOPs)")
    axes[0][0].set_title(f"attention backward, {header['dtype']} {_shape(header['shape'])}, {header['gpu']} "
                         f"({header['date']})", fontsize=8)
    if linear_step is not None:
        steps, step_header = step_cases(linear_step)
        ms = {name: {key: r.get("forward_backward_ms") for key, r in results.items()}
              for name, results in steps.items()}
        _bars(axes[0][1], list(ms), ms, STEP_IMPLS, "forward + backward ms (lower is faster)")
        axes[0][1].set_title(f"linear training step, {_shape(step_header['shape'])}\n({step_header['date']}; "
                             "n/a: fla refuses)", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backward", nargs="+", required=True, help="bench/backward.py run JSON files")
    p.add_argument("--linear-step", default=None, help="a bench/linear_backward.py run JSON file")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    print(plot(args.backward, args.linear_step, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
