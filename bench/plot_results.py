"""Plot a run_suite.py results directory: TFLOP/s against sequence length, one panel per variant.

    python bench/plot_results.py bench/results/<run> [--out PNG]

Panels: every catalogue entry (ae-mlir beside FlexAttention and, where it applies, SDPA), the
verify sweep (one panel per dtype and mask; D=128 solid, D=64 dashed) and each linear-attention
op beside fla (D=128 solid, D=64 dashed). Writes <run>/suite.png by default.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

COLORS = {"ae_mlir": "tab:red", "flex_attention": "tab:blue", "sdpa_cudnn": "tab:green",
          "sdpa_flash": "tab:olive", "fla": "tab:purple"}
LABELS = {"ae_mlir": "ae-mlir", "flex_attention": "FlexAttention", "sdpa_cudnn": "SDPA cuDNN",
          "sdpa_flash": "SDPA flash", "fla": "fla"}


def _load(directory: str, part: str) -> list:
    path = os.path.join(directory, f"{part}.json")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [c for c in json.load(f)["cases"] if "results" in c]


def _tflops(case: dict, impl: str):
    for name, r in case["results"].items():
        if (name == impl or (impl == "fla" and name.startswith("fla_"))) and isinstance(r, dict):
            return r.get("tflops")
    return None


def _series(cases: list, impl: str) -> tuple[list, list]:
    points = sorted((c["L"], _tflops(c, impl)) for c in cases if _tflops(c, impl) is not None)
    return [p[0] for p in points], [p[1] for p in points]


def _panel(ax, title: str, groups: list) -> None:
    """groups: (cases, line style, label suffix); one line per implementation and group."""
    lengths = set()
    for cases, style, suffix in groups:
        for impl in COLORS:
            xs, ys = _series(cases, impl)
            if xs:
                ax.plot(xs, ys, style, color=COLORS[impl], marker="o", ms=3, label=LABELS[impl] + suffix)
                lengths.update(xs)
    ax.set_title(title, fontsize=9)
    if lengths:
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(lengths))
        ax.set_xticklabels([str(n) for n in sorted(lengths)], fontsize=7)
    ax.tick_params(axis="y", labelsize=7)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)


def plot(directory: str, out: str | None = None) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    catalogue, verify, linear = (_load(directory, p) for p in ("catalogue", "verify", "linear"))
    panels = []
    for variant, dk in dict.fromkeys((c["variant"], c["Dk"]) for c in catalogue):
        cases = [c for c in catalogue if c["variant"] == variant and c["Dk"] == dk]
        panels.append((f"{variant} (bf16, D={dk})", [(cases, "-", "")]))
    for dtype in dict.fromkeys(c["dtype"] for c in verify):
        for variant in ("full", "causal"):
            chosen = [c for c in verify if c["dtype"] == dtype and c["variant"] == variant]
            groups = [([c for c in chosen if c["Dk"] == d], style, suffix)
                      for d, style, suffix in ((128, "-", ""), (64, "--", " D64"))]
            panels.append((f"verify {variant} ({dtype}, B=2 H=4)", groups))
    for variant in dict.fromkeys(c["variant"] for c in linear):
        chosen = [c for c in linear if c["variant"] == variant]
        groups = [([c for c in chosen if c["Dk"] == d], style, suffix)
                  for d, style, suffix in ((128, "-", ""), (64, "--", " D64"))]
        panels.append((f"linear {variant} (bf16)", groups))
    if not panels:
        raise ValueError(f"no results with measurements in {directory}")
    cols = 5
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3 * rows), squeeze=False)
    for ax, (title, groups) in zip(axes.flat, panels):
        _panel(ax, title, groups)
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    handles = {}
    for ax in axes.flat:
        for h, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, h)
    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=min(8, len(handles)), fontsize=8)
    fig.supxlabel("sequence length", y=0.03)
    fig.supylabel("TFLOP/s")
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    out = out or os.path.join(directory, "suite.png")
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("directory")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    print(plot(args.directory, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
