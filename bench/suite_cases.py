"""One case of the benchmark suite on the GPU (run_suite.py's parts): ae-mlir's bundle and its peers
timed on fresh inputs, each output checked against the case's float32 reference, the records the
part writes. Imports torch, triton and ae-mlir's runtime where it uses them, never MLIR."""
from __future__ import annotations

import math
import time

import suite

def error_text(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0][:400] if lines else ''}"


def measure(eng, fn, flops: float, error) -> dict:
    """Run once (that call compiles or autotunes where the callable does), check, then time."""
    try:
        start = time.monotonic()
        out = fn()
        eng.sync()
        result = {"first_call_s": round(time.monotonic() - start, 3), "max_abs_err": error(out)}
        del out
        ms = eng.bench(fn)
        result.update(ms=ms, tflops=flops / (ms * 1e-3) / 1e12)
        return result
    except Exception as err:
        return {"error": error_text(err)}


def kernel_info(eng, bundle, args, outs) -> dict:
    try:
        return eng.kernel_info(bundle, args, outs)
    except Exception as err:
        return {"kernel_info_error": error_text(err)}


def _speedups(results: dict) -> dict:
    mine = results.get("ae_mlir", {})
    if not isinstance(mine, dict) or "ms" not in mine:
        return {}
    return {peer: r["ms"] / mine["ms"] for peer, r in results.items()
            if peer != "ae_mlir" and isinstance(r, dict) and "ms" in r}


def softmax_case(case, bundle, eng, budget) -> dict:
    import torch

    from ae_mlir import block_mask, runtime
    from ae_mlir.core.regions import ScalarProgram

    attn, shape = suite.softmax_problem(case, eng.device)
    q, k, v = suite.softmax_inputs(shape, case.dtype, eng.device)
    normalize = attn.normalize if isinstance(attn.normalize, str) else attn.normalize.name
    gqa = shape.kv_heads != shape.heads
    rec = {"case": case.name, "part": case.part, "variant": case.variant, "dtype": case.dtype, "B": shape.batch,
           "H": shape.heads, "Hkv": shape.kv_heads, "L": shape.seq_q, "Dk": shape.dim_qk, "Dv": shape.dim_v,
           "normalize": normalize}
    captures = attn._build(q, k, v)[1]
    tables = runtime.call_time_tables(bundle, q, k, v, *captures)
    outs = eng.outputs(bundle)
    # The runtime adds the call-time tables itself, as `ae.attention` calls it.
    args = (q, k, v, *captures)
    batch = suite.mask_batch(case.variant, shape)
    kept = suite.kept_fraction(attn.mask_mod, shape.seq_q, shape.seq_k, eng.device, batch=batch)
    flops = suite.softmax_flops(shape, kept)
    rec.update(kept_fraction=kept, flops=flops, closure_tensors=len(captures), call_time_tables=bool(tables))
    if case.part == "verify":
        rows = None
        ref = eng.sdpa_reference(q, k, v, causal=case.variant == "causal")
        rec["reference"] = "float32 SDPA (math backend), all rows"
    else:
        rows = eng.rows(shape.seq_q)
        ref = suite.attention_reference(attn, q, k, v, rows)
        rec["reference"] = f"float32 materialized attention, {len(rows)} query rows"
    rec["reference_max_abs"] = float(ref.abs().max())
    rec["reference_finite"] = bool(torch.isfinite(ref).all())

    def error(o):
        picked = o if rows is None else o[:, :, rows.to(o.device)]
        return float((picked.float() - ref).abs().max())

    results = {"ae_mlir": measure(eng, lambda: eng.launch(bundle, *args, **outs)[0], flops, error)}
    rec.update(kernel_info(eng, bundle, args, outs))
    causal = case.variant == "causal" if case.part == "verify" else suite.SDPA_EQUIVALENT.get(case.variant)
    if causal is None:
        results["sdpa"] = "n/a: SDPA has no equivalent of this variant"
    else:
        for name, backend in (("sdpa_flash", "FLASH_ATTENTION"), ("sdpa_cudnn", "CUDNN_ATTENTION")):
            fn = eng.sdpa(backend, causal, gqa)
            results[name] = measure(eng, lambda fn=fn: fn(q, k, v), flops, error)
    if normalize != "softmax":
        results["flex_attention"] = f"n/a: FlexAttention has no {normalize} normalizer"
    elif not budget.allow("flex"):
        results["flex_attention"] = {"skipped": "time budget"}
    else:
        start = time.monotonic()
        try:
            flex = eng.flex(attn, shape, batch)
            results["flex_attention"] = measure(eng, lambda: flex(q, k, v), flops, error)
        except Exception as err:
            results["flex_attention"] = {"error": error_text(err)}
        results["flex_attention"]["compile_s"] = round(time.monotonic() - start, 2)
        budget.observe("flex", time.monotonic() - start)
    if tables:
        # What the call-time tables cost when the closure tensors change (uncached) and when they
        # do not (the cache hit every later call takes), beside FlexAttention's create_block_mask.
        bm, bn = bundle.block_m, bundle.block_n
        program = bundle.meta[runtime.MASK_PROGRAM]
        uncached = eng.wall_ms(lambda: block_mask.classify_program(
            ScalarProgram.from_json(program), [q, k, v, *captures], shape.seq_q, shape.seq_k, bm, bn, eng.device))
        classification = {"ms": uncached,
                          "cached_ms": eng.wall_ms(lambda: runtime.call_time_tables(bundle, q, k, v, *captures)),
                          "flex_create_block_mask_ms": eng.block_mask_ms(attn, shape, batch)}
        if "ms" in results["ae_mlir"]:
            classification["fraction_of_attention"] = uncached / results["ae_mlir"]["ms"]
        rec["classification"] = classification
    rec["results"] = results
    rec["speedup"] = _speedups(results)
    return rec


def linear_case(case, bundle, eng, budget) -> dict:
    import torch

    data = suite.linear_inputs(case, eng.device)
    q, k, v, g = data["ae"]
    fq, fk, fv, fg = data["fla"]
    decay = suite.LINEAR_DECAYS[case.variant]
    flops = suite.linear_flops(case)
    rec = {"case": case.name, "part": case.part, "variant": case.variant, "decay": decay, "dtype": case.dtype,
           "B": case.batch, "H": case.heads, "L": case.seq, "Dk": case.dim, "Dv": case.dim, "chunk": suite.CHUNK,
           "layout": "[B, T, H, D] storage (fla's); ae-mlir reads [B, H, T, D] views of it", "flops": flops}
    heads = eng.ref_heads(case.heads)
    picked = torch.tensor(heads, device=eng.device)
    g_ref = g[picked] if decay == "head" else g[:, picked]
    ref = suite.linear_reference(q[:, picked], k[:, picked], v[:, picked], g_ref, decay)
    rec.update(reference=f"float32 chunked recurrence, heads {heads}", reference_max_abs=float(ref.abs().max()),
               reference_finite=bool(torch.isfinite(ref).all()))

    def error(o):
        return float((o[:, picked].float() - ref).abs().max())

    outs = eng.outputs(bundle)

    def ae():
        return eng.launch(bundle, q, k, v, suite.ae_decay(g), **outs)[0]

    results = {"ae_mlir": measure(eng, ae, flops, error)}
    rec.update(kernel_info(eng, bundle, (q, k, v, suite.ae_decay(g)), outs))
    peer = f"fla_chunk_{case.variant}"
    try:
        op = eng.fla(case.variant)
    except ImportError as err:
        op = None
        results[peer] = {"error": error_text(err)}
    if op is not None and not budget.allow("fla"):
        results[peer] = {"skipped": "time budget"}
    elif op is not None:
        results[peer] = measure(eng, lambda: op(fq, fk, fv, fg), flops, lambda o: error(o.transpose(1, 2)))
        budget.observe("fla", results[peer].get("first_call_s", 0.0))
        if "ms" in results[peer] and "ms" in results["ae_mlir"]:
            theirs = op(fq, fk, fv, fg).transpose(1, 2)
            rec["max_abs_diff_ae_vs_fla"] = float((ae().float() - theirs.float()).abs().max())
    rec["results"] = results
    rec["speedup"] = _speedups(results)
    return rec


# --- the run ---------------------------------------------------------------------------------------


def finite(x):
    """JSON without NaN/Infinity tokens (strict parsers reject them): non-finite floats as strings."""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite(v) for v in x]
    return x


def summary_line(rec: dict) -> str:
    if "results" not in rec:
        return f"{rec['case']}: {rec.get('error') or rec.get('skipped')}"
    parts = []
    for name, r in rec["results"].items():
        if isinstance(r, str):
            continue
        if "tflops" in r:
            text = f"{name} {r['tflops']:.1f} TF/s err {r['max_abs_err']:.1e}"
            if name in rec["speedup"]:
                text += f" (ae {rec['speedup'][name]:.2f}x)"
        else:
            text = f"{name} {r.get('error') or r.get('skipped')}"
        parts.append(text)
    extra = ""
    if "classification" in rec:
        c = rec["classification"]
        extra = f" | tables {c['ms']:.2f} ms uncached, {c['cached_ms']:.3f} ms cached"
    return f"{rec['case']}: " + " | ".join(parts) + extra
