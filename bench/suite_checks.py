"""The dry run's checks (run_suite.py --dry-run, without a GPU): each record's problems, the warm-up
worker's compile of a bundle, and the float32 references against ae-mlir's CPU backend and
reference executor (and fla's naive forms where fla is installed)."""
from __future__ import annotations

import os
import time

import suite
import warm


def record_problems(rec: dict) -> list:
    """What went wrong in a case's record: its error or skip, each failing implementation, a
    reference that is not finite."""
    if "results" not in rec:
        return [f"{rec['case']}: {rec.get('error') or rec.get('skipped')}"]
    out = [f"{rec['case']}: {name}: {r['error']}" for name, r in rec["results"].items()
           if isinstance(r, dict) and "error" in r]
    if not rec.get("reference_finite", True):
        out.append(f"{rec['case']}: the float32 reference is not finite")
    return out


def check_warm(bundles: dict, todo: list, directory: str, expected_variant, log) -> list:
    """A warm-up worker compiles the first bundle (at the kernel variant `expected_variant(case,
    bundle)` names), and fla's autotuners split over the workers cover all their configs."""
    problems = []
    first = next((c for c in todo if not isinstance(bundles[c], str)), None)
    if first is not None:
        task = (f"ae {first.name}", warm.compile_ae,
                (os.path.join(directory, first.bundle_file), expected_variant(first, bundles[first]), "cuda:90"))
        stats = warm.run_pool([task], 1, time.monotonic() + 300, log)
        if stats["done"] != 1:
            problems.append(f"warm-up pool: {stats}")
    try:
        for variant in suite.LINEAR_DECAYS:
            suite.fla_op(variant)
    except ImportError as err:
        log(f"fla is not importable here ({err}); its autotuner split is not checked")
        return problems
    tuners = warm.fla_autotuners()
    covered = {id(t): set() for t in tuners}
    shares = 14
    for part in range(shares):
        warm.partition_fla(part, shares)
        for t in tuners:
            covered[id(t)] |= {str(c) for c in t.configs}
    uncovered = [t for t in tuners if covered[id(t)] != {str(c) for c in t.__dict__["_all_configs"]}]
    log(f"fla: {len(tuners)} autotuners, {sum(len(t.__dict__['_all_configs']) for t in tuners)} configs "
        f"(CPU-side lists), split {shares} ways")
    if not tuners or uncovered:
        problems.append(f"fla autotuner split: {len(tuners)} found, {len(uncovered)} not covered")
    return problems


def check_references(log) -> list:
    """The suite's float32 references against ae-mlir's CPU backend and reference executor (and
    fla's naive forms where fla is installed), and the kept fractions against brute force."""
    import torch
    import torch.nn.functional as F

    import ae_mlir as ae
    from ae_mlir.variants import CATALOGUE, Shape, build

    problems = []
    for name in CATALOGUE:
        attn, shape = build(name, Shape(2, 4, 300, 300, 32, 32), seed=suite.SEED)
        q, k, v = suite.softmax_inputs(shape, "float32", "cpu")
        got = suite.attention_reference(attn, q, k, v, torch.arange(300))
        for backend in ("cpu", "reference"):
            want = attn(q, k, v, backend=backend).float()
            err = float((got - want).abs().max()) / max(1.0, float(want.abs().max()))
            if err < 1e-5:
                continue
            message = f"reference {name}: relative error {err:.1e} against ae-mlir's {backend} backend"
            if backend == "cpu":
                problems.append(message)
            else:
                # The executor evaluates float32 mods in float64 (with float32-rounded constants);
                # where a mod floors a float, as t5_bias does at |q - kv| = 16, 32, 64, it then
                # disagrees with float32 torch, the CPU backend and the Triton kernels alike.
                log(f"note: {message}, while the float32 CPU backend agrees")
        if attn.mask_mod is not None:
            b, h, qi, ki = (torch.arange(n).view(*s) for n, s in ((1, (1, 1, 1, 1)), (1, (1, 1, 1, 1)),
                                                                 (300, (1, 1, 300, 1)), (300, (1, 1, 1, 300))))
            brute = int(attn.mask_mod(b, h, qi, ki).expand(1, 1, 300, 300).sum()) / 300**2
            if brute != suite.kept_fraction(attn.mask_mod, 300, 300, "cpu", block=64):
                problems.append(f"kept fraction {name}: blockwise count differs from the brute-force one")
    try:
        from fla.ops.gla.naive import naive_recurrent_gla
        from fla.ops.retention.naive import naive_retention
        from fla.ops.simple_gla.naive import naive_recurrent_simple_gla
    except ImportError:
        naive = None
    else:
        naive = {"retention": lambda q, k, v, g: naive_retention(q.transpose(1, 2), k.transpose(1, 2),
                                                                 v.transpose(1, 2)).transpose(1, 2),
                 "simple_gla": lambda q, k, v, g: naive_recurrent_simple_gla(q, k, v, g)[0],
                 "gla": lambda q, k, v, g: naive_recurrent_gla(q, k, v, g)[0]}
    for variant, decay in suite.LINEAR_DECAYS.items():
        case = suite.Case("linear", variant, 2, 3, 150, 16, "float32")
        data = suite.linear_inputs(case, "cpu")
        q, k, v, g = data["ae"]
        if decay != "head":
            # Stronger gates than the benchmark's, so that decay errors would show.
            g = F.logsigmoid(torch.randn(g.shape, generator=torch.Generator().manual_seed(5)))
        got = suite.linear_reference(q, k, v, g, decay)
        lin = ae.linear_attention(decay=decay, chunk_size=suite.CHUNK)
        checks = {"ae-mlir's reference executor": lin(q, k, v, g, backend="reference").float()}
        if naive is not None:
            fg = None if decay == "head" else g.transpose(1, 2)
            checks[f"fla's naive {variant}"] = naive[variant](*data["fla"][:3], fg).transpose(1, 2).float()
        for label, want in checks.items():
            err = float((got - want).abs().max()) / max(1.0, float(want.abs().max()))
            if not err < 1e-4:
                problems.append(f"linear reference {variant}: relative error {err:.1e} against {label}")
    log(f"references checked against ae-mlir's CPU backend and reference executor{' and fla' if naive else ''}")
    return problems
