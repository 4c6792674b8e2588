"""Time softmax attention variants (catalogue entries) under several block sizes, launch options and
code-generation choices, beside SDPA's cuDNN and flash backends (full and causal) in the same run.

    python bench/attention_configs.py build [--bundles bench/config_bundles] [--variants full,causal]
                                            [--dims 64,128] [--seqs 2048,8192] [--choices a,b,...]
    python bench/attention_configs.py run --bundles bench/config_bundles [--rounds 3]   # on the GPU

`build` compiles one bundle per (case, choice) with ae-mlir's Triton lowering, exactly as
`ae.attention` would with that config (the case is bench/suite.py's catalogue entry, B * L =
16384, H = 16, bf16); a choice may add experimental edits of the Triton IR, `+ws` (the KV loops
marked `tt.warp_specialize`) or `+lazy` (the accumulator rescaled only when a row's max grew by
2^8; bench/ttir_edits.py): experiments to decide what the lowering should emit, not something
ae-mlir does.
"default" is the preset's config, "tma..." load tiles through TMA tensor descriptors
(`tensor_descriptors`; made on the host where the preset makes them so, `host_descriptors`), the
others through pointers.
`run` times every bundle with `triton.testing.do_bench` (median; warmup 25 ms, rep 100 ms) on
fresh random inputs, each case's choices in turn for `--rounds` rounds (so that drift over the
run falls on every choice alike), and writes attention-configs.json: the median TFLOP/s of each
choice, each round's, and the peers'. Outputs are checked against the first choice's (and
cuDNN's where it computes the same attention).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import suite  # noqa: E402
import ttir_edits  # noqa: E402

# (name, config overrides or None for ae-mlir's default). A tile choice without "tma" loads through
# pointers, whatever the preset's default.
_POINTERS = {"tensor_descriptors": False}
_M128N64W4S3 = {"block_m": 128, "block_n": 64, "num_warps": 4, "num_stages": 3, **_POINTERS}
_M128N128W8S3 = {"block_m": 128, "block_n": 128, "num_warps": 8, "num_stages": 3, **_POINTERS}
_M64N64W4S3 = {"block_m": 64, "block_n": 64, "num_warps": 4, "num_stages": 3, **_POINTERS}
_M64N128W4S3 = {"block_m": 64, "block_n": 128, "num_warps": 4, "num_stages": 3, **_POINTERS}
CHOICES = {
    "default": None,
    "tma": {"tensor_descriptors": True},
    "m128n64w4s3": _M128N64W4S3,
    "m128n128w8s3": _M128N128W8S3,
    "tma-m128n128w8s3": dict(_M128N128W8S3, tensor_descriptors=True),
    "m64n64w4s3": _M64N64W4S3,
    "m64n128w4s3": _M64N128W4S3,
    "m64n32w4s3": {"block_m": 64, "block_n": 32, "num_warps": 4, "num_stages": 3, **_POINTERS},
}
# Any other tile choice by name: [tma-|dtma-]m<block_m>n<block_n>w<num_warps>s<num_stages>, "dtma"
# with the descriptors made on the device whatever the preset's default.
_TILES = re.compile(r"(tma-|dtma-)?m(\d+)n(\d+)w(\d+)s(\d+)$")
# Experimental edits of the Triton IR a choice may add, each as "+name".
EDITS = ttir_edits.EDITS


def choice(name: str) -> tuple | None:
    """(config overrides or None, [Triton IR edits]) of a choice name; None if it names none."""
    base, *edits = name.split("+")
    if any(e not in EDITS for e in edits):
        return None
    if base in CHOICES:
        return CHOICES[base], [EDITS[e] for e in edits]
    found = _TILES.match(base)
    if found is None:
        return None
    tma, m, n, w, s = found.groups()
    config = {"block_m": int(m), "block_n": int(n), "num_warps": int(w), "num_stages": int(s)}
    if tma == "dtma-":
        config["host_descriptors"] = False
    return dict(config, tensor_descriptors=bool(tma)), [EDITS[e] for e in edits]


# Peers that compute the same attention as these catalogue entries.
SDPA_CAUSAL = {"full": False, "causal": True}
# bf16 outputs of values within [-1, 1] that agree to a few bf16 ulps (RetNet's unnormalized
# outputs are not among the cases).
MAX_ERROR = 0.05


def _cases(variants: list[str], dims: list[int], seqs: list[int]) -> list:
    return [suite.Case("catalogue", variant, suite.TOKENS // seq, suite.HEADS, seq, dim, "bfloat16")
            for variant in variants for dim in dims for seq in seqs]


def build(out_dir: str, cases: list, choices: list[str]) -> None:
    from ae_mlir.backends import triton as tb

    os.makedirs(out_dir, exist_ok=True)
    manifest = []
    for case in cases:
        attn, shape = suite.softmax_problem(case, "cpu")
        for picked in choices:
            config, edits = choice(picked)
            bundle = tb.compile_bundle(attn, *suite.meta_like(shape, case.dtype), target="cuda:90", config=config)
            if edits:
                bundle = ttir_edits.edited(bundle, edits)
            name = f"{case.name}.{picked}.json"
            bundle.save(os.path.join(out_dir, name))
            manifest.append({"case": case.as_dict(), "choice": picked, "file": name,
                             "config": bundle.meta.get("config")})
            print("built", name, flush=True)
    with open(os.path.join(out_dir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)


def _compile(path: str, target: str) -> str:
    from ae_mlir import runtime

    bundle = runtime.Bundle.load(path)
    try:
        for variant in bundle.variants.values():
            runtime.compile_variant(variant, target, bundle.num_warps, bundle.num_stages)
    except Exception as err:  # recorded again by the timing pass
        return f"{type(err).__name__}: {err}"
    return ""


def _error(exc: Exception) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}" if str(exc) else type(exc).__name__


def _run_case(case, entries: list, bundle_dir: str, rounds: int) -> dict:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench

    from ae_mlir import runtime

    attn, shape = suite.softmax_problem(case, "cuda")
    q, k, v = suite.softmax_inputs(shape, case.dtype, "cuda")
    captures = attn._build(q, k, v)[1]
    flops = suite.softmax_flops(shape, suite.kept_fraction(attn.mask_mod, shape.seq_q, shape.seq_k, "cuda",
                                                                batch=suite.mask_batch(case.variant, shape)))
    rec = {"case": case.as_dict(), "tflops": {}, "rounds": {}, "max_error": {}, "errors": {}, "configs": {}}

    def bench(fn) -> float:
        return flops / do_bench(fn, warmup=25, rep=100, return_mode="median") / 1e9

    want = None
    if case.variant in SDPA_CAUSAL:
        for peer, backend in (("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa_flash", SDPBackend.FLASH_ATTENTION)):
            with sdpa_kernel([backend]):
                def call():
                    return F.scaled_dot_product_attention(q, k, v, is_causal=SDPA_CAUSAL[case.variant])
                want = call() if want is None else want
                rec["tflops"][peer] = bench(call)
    calls = {}
    for entry in entries:
        bundle = runtime.Bundle.load(os.path.join(bundle_dir, entry["file"]))
        rec["configs"][entry["choice"]] = entry["config"]
        try:
            got = runtime.launch(bundle, q, k, v, *captures)[0]
            want = got if want is None else want
            err = float((got.float() - want.float()).abs().max())
            rec["max_error"][entry["choice"]] = err
            if not err <= MAX_ERROR:
                raise AssertionError(f"max error {err:.3g} against the reference output, above {MAX_ERROR}")
            calls[entry["choice"]] = (lambda b=bundle: runtime.launch(b, q, k, v, *captures))
        except Exception as exc:  # a choice that does not compile, run or agree is recorded, not timed
            rec["errors"][entry["choice"]] = _error(exc)
    for _ in range(rounds):
        for choice, call in calls.items():
            rec["rounds"].setdefault(choice, []).append(bench(call))
    for choice, values in rec["rounds"].items():
        rec["tflops"][choice] = statistics.median(values)
        print(case.name, choice, round(rec["tflops"][choice], 1), flush=True)
    for choice, message in rec["errors"].items():
        print(case.name, choice, "error:", message, flush=True)
    return rec


def run(bundle_dir: str, out_dir: str, rounds: int) -> None:
    import concurrent.futures as futures
    import multiprocessing

    import torch
    import triton

    from ae_mlir import runtime

    with open(os.path.join(bundle_dir, "manifest.json")) as f:
        manifest = json.load(f)
    # Compiles first, in parallel processes; Triton's disk cache keeps them for the timing pass.
    paths = [os.path.join(bundle_dir, e["file"]) for e in manifest]
    with futures.ProcessPoolExecutor(min(14, os.cpu_count() or 1), mp_context=multiprocessing.get_context("spawn")) as pool:
        list(pool.map(_compile, paths, [runtime.current_target()] * len(paths)))
    by_case: dict = {}
    for entry in manifest:
        by_case.setdefault(json.dumps(entry["case"], sort_keys=True), []).append(entry)
    records = []
    for key, entries in by_case.items():
        records.append(_run_case(suite.Case(**json.loads(key)), entries, bundle_dir, rounds))
        torch.cuda.empty_cache()
    doc = {"date": datetime.date.today().isoformat(), "gpu": torch.cuda.get_device_name(),
           "torch": torch.__version__, "triton": triton.__version__,
           "benchmark": f"triton.testing.do_bench median, warmup 25 ms, rep 100 ms, each choice of a case in "
                        f"turn for {rounds} rounds, median of the rounds; bf16; ae-mlir launches through "
                        "ae_mlir.runtime.launch (the same path as a call)", "cases": records}
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "attention-configs.json"), "w") as f:
        json.dump(doc, f, indent=1)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=("build", "run"))
    p.add_argument("--bundles", default=os.path.join(HERE, "config_bundles"))
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    p.add_argument("--variants", default="full,causal", help="catalogue entries (ae_mlir.variants)")
    p.add_argument("--dims", default="64,128")
    p.add_argument("--seqs", default="2048,8192")
    p.add_argument("--choices", default=",".join(CHOICES),
                   help=f"some of {', '.join(CHOICES)}, or any [tma-|dtma-]m<M>n<N>w<warps>s<stages>, each "
                        f"optionally with +{' +'.join(EDITS)}")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    if args.mode == "build":
        choices = args.choices.split(",")
        unknown = [c for c in choices if choice(c) is None]
        if unknown:
            raise SystemExit(f"--choices: unknown {', '.join(unknown)} (known: {', '.join(CHOICES)})")
        cases = _cases(args.variants.split(","), [int(d) for d in args.dims.split(",")],
                       [int(s) for s in args.seqs.split(",")])
        build(args.bundles, cases, choices)
    else:
        run(args.bundles, args.out, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
