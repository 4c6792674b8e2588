"""Backward-pass benchmark: ae-mlir's backward kernels (attn-tile-backward) beside FlexAttention's
backward and SDPA's (flash, cuDNN) in the same process, bf16, B=8 H=16 L=2048.

    python bench/backward.py build --out bench/bundles/backward      # here: needs the MLIR bindings
        [--config tensor_descriptors=true]   # backward preset overrides for every case
        [--edits ws]   # experimental Triton IR edits of the backward kernels (bench/ttir_edits.py)
    python bench/backward.py run --bundles bench/bundles/backward --out DIR   # on the GPU: torch + triton
        [--baseline DIR]   # also time DIR's bundles (built by another version) in the same process
    python bench/backward.py sweep --bundles bench/bundles/backward --out DIR # each kernel alone, per config
    python bench/backward.py cpu --out DIR     # the CPU backward beside torch SDPA's, on this machine

`build` writes, per case, the forward bundle and the backward bundle at the preset's config, and
for the SWEEP_CASES one backward bundle per SWEEP config, which `sweep` times kernel by kernel. `run` times, per case and implementation,
the forward alone and forward + backward (triton.testing.do_bench, median of its repetitions,
inputs drawn fresh per case), and reports the backward as their difference, in TFLOP/s of 2.5x
the forward's FLOPs (FlashAttention's convention). ae-mlir's backward is timed alone (both
kernels, from the forward's saved output and logsumexp). Gradients are
checked on batch 0 against float32 autograd through the materialized attention (the entry's own
mods, bench/suite.py), for ae-mlir and FlexAttention alike.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import harness  # noqa: E402
import suite  # noqa: E402
import ttir_edits  # noqa: E402

CASES = [("full", 128), ("causal", 128), ("softcap", 128), ("alibi", 128), ("full", 64), ("causal", 64),
         ("sigmoid", 128), ("relu", 128), ("retnet", 128), ("tempered", 128), ("sliding_window", 128),
         ("causal_sliding", 128), ("document", 128), ("document_rows", 128), ("dilated", 128), ("gqa", 128),
         ("mla_dims", 128)]
BATCH, HEADS, SEQ = 8, 16, 2048
# (block_m, block_n, num_warps, num_stages): each kernel of the backward timed alone under each
# (the `sweep` mode), for full and causal attention.
SWEEP = [(64, 64, 4, 2), (64, 64, 4, 3), (64, 64, 8, 2), (128, 64, 4, 2), (128, 64, 8, 2), (128, 32, 4, 3),
         (32, 128, 4, 3), (64, 128, 4, 2), (64, 128, 8, 2), (32, 64, 4, 3), (128, 128, 8, 2), (32, 128, 8, 2),
         (32, 128, 8, 3), (64, 128, 8, 3), (128, 128, 8, 3), (128, 64, 8, 3), (128, 64, 4, 3)]
SWEEP_CASES = [("full", 128), ("causal", 128), ("full", 64), ("causal", 64), ("sliding_window", 128),
               ("document", 128), ("dilated", 128), ("softcap", 128), ("alibi", 128)]
# The masks that cut many tiles (launch_defaults.CUT_TILES_MAX) sweep these alone.
SWEEP_CUT = [(64, 64, 4, 2), (64, 64, 4, 3), (64, 128, 8, 3), (64, 128, 4, 3), (32, 64, 4, 3), (32, 128, 4, 3),
             (64, 32, 4, 3), (128, 64, 8, 2)]
CUT_MASKS = ("sliding_window", "causal_sliding", "document", "dilated")


def _case(variant: str, dim: int) -> suite.Case:
    return suite.Case(part="backward", variant=variant, dtype="bfloat16", batch=BATCH, heads=HEADS, seq=SEQ,
                      dim=dim)


def _selected(only: str) -> list[tuple[str, int]]:
    """CASES, or those named in `only` ("retnet_d128,causal_d128")."""
    names = {n for n in only.split(",") if n}
    unknown = names - {f"{v}_d{d}" for v, d in CASES}
    if unknown:
        raise SystemExit(f"unknown cases: {', '.join(sorted(unknown))}")
    return [(v, d) for v, d in CASES if not names or f"{v}_d{d}" in names]


def build(out: str, only: str = "", sweep_configs: bool = True, config: dict | None = None,
          edits: tuple = ()) -> None:
    from ae_mlir.backends import triton as tb
    from ae_mlir.backends.call_time_tiles import backward_call_time_tiles
    from build_suite import build_one

    os.makedirs(out, exist_ok=True)
    for variant, dim in _selected(only):
        case = _case(variant, dim)
        attn, shape = suite.softmax_problem(case, "cpu")
        q, k, v = suite.meta_like(shape, case.dtype)
        text = attn.mlir(q, k, v)
        name = f"{variant}_d{dim}"
        build_one(case, "cuda:90").save(os.path.join(out, f"{name}.fwd.json"))
        # The catalogue's closure tensors (ALiBi's slopes) are constants: no gradient of theirs is
        # built, as for a call whose tensors do not require grad. A mask read at call time takes
        # the tiles its tables on the case's closure tensors ask for, as a call's does.
        empty = suite.softmax_inputs(shape, case.dtype, "cpu", empty=True)
        roles = dict(zip(("q", "k", "v"), empty), **{f"c{i}": t for i, t in enumerate(attn._build(*empty)[1])})
        tiles = backward_call_time_tiles(text, "cuda:90", roles)
        bwd = tb.build_backward_bundle(text, "cuda:90", dict(tiles, closure_grads=False, **(config or {})))
        if edits:
            bwd = ttir_edits.edited(bwd, [ttir_edits.EDITS[e] for e in edits])
        bwd.save(os.path.join(out, f"{name}.bwd.json"))
        if sweep_configs and (variant, dim) in SWEEP_CASES:
            for bm, bn, warps, stages in (SWEEP_CUT if variant in CUT_MASKS else SWEEP):
                config = {"block_m": bm, "block_n": bn, "num_warps": warps, "num_stages": stages,
                          "dkdv_block_m": bm, "dkdv_block_n": bn, "dkdv_num_warps": warps, "dkdv_num_stages": stages}
                tb.build_backward_bundle(text, "cuda:90", config).save(
                    os.path.join(out, f"{name}.sweep_{bm}x{bn}w{warps}s{stages}.json"))
        print("built", name, flush=True)


def _kernel_alone(bundle, part: str):
    """The bundle cut down to one of its two kernels ("dkdv": its own; "dq": its stage)."""
    import dataclasses

    if part == "dkdv":
        return dataclasses.replace(bundle, stages=[])
    stage = bundle.stages[0]
    return dataclasses.replace(bundle, name=stage.name, grid=stage.grid, variants=stage.variants,
                               tables=stage.tables, num_warps=stage.num_warps, num_stages=stage.num_stages,
                               stages=[])


def _compile_bundle(path: str) -> str:
    """Compile a backward bundle's aligned kernels (its stage's and its own), for Triton's disk
    cache; an error is recorded again when the kernel is timed."""
    from ae_mlir import runtime

    bundle = runtime.Bundle.load(path)
    try:
        for kernel in [bundle] + list(bundle.stages):
            runtime.compile_variant(kernel.variants["aligned"], runtime.current_target(), kernel.num_warps,
                                 kernel.num_stages)
    except Exception as err:
        return f"{type(err).__name__}: {err}"
    return ""


def _compile_all(paths: list[str]) -> None:
    """Compile the bundles in parallel processes first: one at a time, in the timing process, the
    sweep's kernels took most of its time."""
    import concurrent.futures as futures
    import multiprocessing

    with futures.ProcessPoolExecutor(min(14, os.cpu_count() or 1), mp_context=multiprocessing.get_context("spawn")) as pool:
        list(pool.map(_compile_bundle, paths))


def sweep(bundles: str, out_dir: str) -> None:
    """Each backward kernel alone under each SWEEP config, in milliseconds (median of do_bench)."""
    import torch
    import triton

    from ae_mlir import runtime

    device = torch.device("cuda")
    os.makedirs(out_dir, exist_ok=True)
    _compile_all([os.path.join(bundles, f) for f in sorted(os.listdir(bundles)) if ".sweep_" in f])
    doc = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "date": datetime.date.today().isoformat(), "shape": {"B": BATCH, "H": HEADS, "L": SEQ},
           "dtype": "bfloat16", "method": sweep.__doc__, "cases": []}
    torch.manual_seed(0)
    for variant, dim in SWEEP_CASES:
        name = f"{variant}_d{dim}"
        if not os.path.exists(os.path.join(bundles, f"{name}.fwd.json")):
            continue
        attn, shape = suite.softmax_problem(_case(variant, dim), device)
        q, k, v = suite.softmax_inputs(shape, "bfloat16", device)
        captures = attn._build(q, k, v)[1]
        d_out = torch.randn(*q.shape[:3], v.shape[3], dtype=q.dtype, device=device)
        fwd = runtime.Bundle.load(os.path.join(bundles, f"{name}.fwd.json"))
        out, lse = runtime.launch(fwd, q, k, v, *captures)
        tensors = {"q": q, "k": k, "v": v, "out": out, "do": d_out, "lse": lse, "dlse": torch.zeros_like(lse)}
        tensors.update({f"c{i}": t for i, t in enumerate(captures)})
        rec = {"case": name, "dq_ms": {}, "dkdv_ms": {}}
        for file in sorted(f for f in os.listdir(bundles) if f.startswith(name + ".sweep_")):
            label = file.removeprefix(name + ".sweep_").removesuffix(".json")
            bundle = runtime.Bundle.load(os.path.join(bundles, file))
            for part in ("dq", "dkdv"):
                alone = _kernel_alone(bundle, part)
                try:
                    runtime.launch_roles(alone, tensors)
                    rec[part + "_ms"][label] = harness.bench_ms(lambda: runtime.launch_roles(alone, tensors))
                except Exception as exc:
                    frame = traceback.extract_tb(exc.__traceback__)[-1]
                    rec[part + "_ms"][label] = (f"{type(exc).__name__}: {str(exc)[:200]} "
                                                f"({os.path.basename(frame.filename)}:{frame.lineno})")
        doc["cases"].append(rec)
        print(json.dumps(rec), flush=True)
        with open(os.path.join(out_dir, "backward-sweep.json"), "w") as f:
            json.dump(doc, f, indent=1)




def _grads(fn, q, k, v, d_out):
    import torch

    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out = fn(*leaves)
    return torch.autograd.grad(out, leaves, d_out)


def _error(got, want) -> float:
    return max(float((g[:1].float() - w).abs().max() / w.abs().max()) for g, w in zip(got, want))


def run(bundles: str, out_dir: str, baselines: tuple[str, ...] = (), only: str = "") -> None:
    """`baselines`: directories of bundles built by other versions of the compiler, whose backward
    is timed beside this one's in the same process (results labelled by directory name)."""
    import torch
    import triton

    from ae_mlir import runtime

    device = torch.device("cuda")
    os.makedirs(out_dir, exist_ok=True)
    records = []
    doc = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "date": datetime.date.today().isoformat(), "shape": {"B": BATCH, "H": HEADS, "L": SEQ},
           "dtype": "bfloat16", "method": __doc__, "cases": records}
    torch.manual_seed(0)
    for variant, dim in _selected(only):
        case = _case(variant, dim)
        name = f"{variant}_d{dim}"
        attn, shape = suite.softmax_problem(case, device)
        q, k, v = suite.softmax_inputs(shape, case.dtype, device)
        d_out = torch.randn(*q.shape[:3], v.shape[3], dtype=q.dtype, device=device)
        captures = attn._build(q, k, v)[1]
        kept = suite.kept_fraction(attn.mask_mod, shape.seq_q, shape.seq_k, device,
                                   batch=suite.mask_batch(variant, shape))
        flops = 2.5 * suite.softmax_flops(shape, kept)
        fwd = runtime.Bundle.load(os.path.join(bundles, f"{name}.fwd.json"))
        rec = {"case": name, "variant": variant, "D": dim, "kept_fraction": kept, "backward_flops": flops,
               "results": {}}
        # float32 autograd reference on batch 0.
        rows = torch.arange(shape.seq_q, device=device)
        ref = _grads(lambda a, b, c: suite.attention_reference(attn, a, b, c, rows),
                     q[:1].float(), k[:1].float(), v[:1].float(), d_out[:1].float())

        def ae_forward(q=q, k=k, v=v):
            return runtime.launch(fwd, q, k, v, *captures)

        results = ae_forward()
        out, lse = results[0], (results[1] if len(results) > 1 else None)
        configs = [("bwd", os.path.join(bundles, f"{name}.bwd.json"))]
        configs += [("bwd@" + os.path.basename(os.path.normpath(d)), os.path.join(d, f"{name}.bwd.json"))
                    for d in baselines]
        for label, file in configs:
            if not os.path.exists(file):  # a baseline built before this case existed
                continue
            bwd = runtime.Bundle.load(file)

            def ae_backward(bwd=bwd, out=out, lse=lse):
                tensors = {"q": q, "k": k, "v": v, "do": d_out}
                if lse is not None:  # softmax's kernels read the forward's output and logsumexp
                    tensors.update(out=out, lse=lse, dlse=torch.zeros_like(lse))
                tensors.update({f"c{i}": t for i, t in enumerate(captures)})
                return runtime.launch_roles(bwd, tensors)

            try:
                grads = ae_backward()
                err = _error([grads["dq"], grads["dk"], grads["dv"]], ref)
                ms = harness.bench_ms(ae_backward)
                rec["results"][label] = {
                    "backward_ms": ms, "tflops": flops / (ms * 1e-3) / 1e12, "max_rel_err": err,
                    "config": bwd.meta.get("config")}
            except Exception as exc:  # a config that does not fit is a result too
                rec["results"][label] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        forwards = [("ae_mlir_forward", fwd)]
        forwards += [("ae_mlir_forward@" + os.path.basename(os.path.normpath(d)),
                      runtime.Bundle.load(os.path.join(d, f"{name}.fwd.json")))
                     for d in baselines if os.path.exists(os.path.join(d, f"{name}.fwd.json"))]
        for label, bundle in forwards:
            fwd_ms = harness.bench_ms(lambda bundle=bundle: runtime.launch(bundle, q, k, v, *captures))
            rec["results"][label] = {"ms": fwd_ms, "tflops": flops / 2.5 / (fwd_ms * 1e-3) / 1e12}
        peers = {}
        try:
            if attn.normalize == "softmax":  # FlexAttention normalizes by softmax only
                peers["flex_attention"] = suite.flex_callable(attn, shape, device, suite.mask_batch(variant, shape))
            elif not isinstance(attn.normalize, str):
                # No peer runs a user's normalizer: torch autograd through the float32 materialized
                # attention, 256 query rows at a time, is what one writes without ae-mlir.
                peers["torch_eager_f32"] = lambda a, b, c: suite.attention_reference(attn, a, b, c, rows)
        except Exception as exc:
            rec["results"]["flex_attention"] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        causal = suite.SDPA_EQUIVALENT.get(variant)
        if causal is not None:
            from torch.nn.attention import SDPBackend, sdpa_kernel

            for label, backend in (("sdpa_flash", SDPBackend.FLASH_ATTENTION), ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)):
                def sdpa(a, b, c, backend=backend):
                    with sdpa_kernel(backend):
                        return torch.nn.functional.scaled_dot_product_attention(a, b, c, is_causal=causal)
                peers[label] = sdpa
        for label, fn in peers.items():
            try:
                err = _error(_grads(fn, q, k, v, d_out), ref)
                leaves = [t.detach().requires_grad_() for t in (q, k, v)]
                rec["results"][label] = dict(harness.peer_backward(fn, leaves, leaves, d_out, flops), max_rel_err=err)
            except Exception as exc:
                rec["results"][label] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        records.append(rec)
        print(json.dumps(rec), flush=True)
        with open(os.path.join(out_dir, "backward.json"), "w") as f:
            json.dump(doc, f, indent=1)


def cpu(out_dir: str) -> None:
    """Forward + backward of causal fp32 attention on the CPU (B=1 H=4 L=1024 D=64): ae-mlir's
    kernels (`attn(q, k, v, backend="cpu").sum().backward()`) against torch SDPA's, alternating,
    median of 15 each after a warm-up, fresh inputs per repetition; torch's OpenMP wait policy as
    the environment has it (recorded)."""
    import statistics
    import time

    import torch

    import ae_mlir as ae

    attn = ae.attention(mask_mod=lambda b, h, i, j: i >= j)
    impls = {"ae_mlir": lambda q, k, v: attn(q, k, v, backend="cpu"),
             "torch_sdpa": lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)}
    times = {name: [] for name in impls}
    for rep in range(16):
        for name, fn in impls.items():
            q, k, v = (torch.randn(1, 4, 1024, 64, requires_grad=True) for _ in range(3))
            start = time.perf_counter()
            fn(q, k, v).sum().backward()
            if rep:  # the first round compiles and warms up
                times[name].append((time.perf_counter() - start) * 1e3)
    doc = {"machine": harness.cpu_description(), "cores": os.cpu_count(), "torch": torch.__version__,
           "date": datetime.date.today().isoformat(), "method": cpu.__doc__,
           "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "unset"),
           "median_ms": {name: statistics.median(t) for name, t in times.items()}, "ms": times}
    print(json.dumps(doc["median_ms"]))
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "backward-cpu.json"), "w") as f:
        json.dump(doc, f, indent=1)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("build", "run", "sweep", "cpu"))
    parser.add_argument("--out", required=True)
    parser.add_argument("--cases", default="", help="only these cases, e.g. retnet_d128,causal_d128")
    parser.add_argument("--bundles", default=os.path.join(HERE, "bundles", "backward"))
    parser.add_argument("--no-sweep", action="store_true", help="build: leave out the sweep's bundles")
    parser.add_argument("--config", default="", help="build: backward preset overrides for every case, key=value,...")
    parser.add_argument("--edits", default="", help=f"build: Triton IR edits of the backward kernels, some of "
                        f"{','.join(ttir_edits.EDITS)}")
    parser.add_argument("--baseline", action="append", default=[],
                        help="run: also time this directory's backward bundles (another compiler version)")
    args = parser.parse_args(argv)
    if args.mode == "build":
        from build_suite import parse_config

        edits = tuple(e for e in args.edits.split(",") if e)
        unknown = [e for e in edits if e not in ttir_edits.EDITS]
        if unknown:
            parser.error(f"--edits: unknown {', '.join(unknown)} (known: {', '.join(ttir_edits.EDITS)})")
        build(args.out, args.cases, not args.no_sweep, parse_config(args.config), edits)
    elif args.mode == "sweep":
        sweep(args.bundles, args.out)
    elif args.mode == "cpu":
        cpu(args.out)
    else:
        run(args.bundles, args.out, tuple(args.baseline), args.cases)
    return 0


if __name__ == "__main__":
    sys.exit(main())
