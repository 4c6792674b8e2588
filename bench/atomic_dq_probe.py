"""Whether one backward kernel with atomic dQ beats FlashAttention-2's two: a probe, not a product.

    python bench/atomic_dq_probe.py [--out DIR]      # on the GPU (torch + triton)

ae-mlir's backward (attn-tile-backward) is two kernels: dK/dV per KV block (four tile products)
and dQ per query block (three: it recomputes the scores and dP). One kernel that also forms a
tile's dQ share (dS K) and adds it into an f32 buffer does five products in all, at the price of
the adds (atomic, so the order of the sums varies between runs) and of zeroing and converting
the buffer. This times, for full bf16 attention written directly in Triton (aligned shapes, no
mods), the dK/dV kernel alone, the dQ kernel alone, and the dK/dV kernel with dQ added by
relaxed per-element atomics or by tensor-descriptor (TMA) reductions, over a few tile configs,
beside SDPA's cuDNN and flash backward in the same run. Each gradient's largest error relative
to float32 autograd's largest is recorded beside its time. Writes atomic-dq-probe.json after
every head dim.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

LOG2E = 1.4426950408889634
MODES = {"none": 0, "atomics": 1, "descriptor": 2}


@triton.jit
def _rows(ptr, rows, D: tl.constexpr):
    """The [len(rows), D] pointers of `rows` of a row-major [L, D] head."""
    return ptr + rows[:, None] * D + tl.arange(0, D)[None, :]


@triton.jit
def _row_tiles(A, B, base, rows, D: tl.constexpr):
    """Tiles of the same rows of two [L, D] heads at `base`."""
    return tl.load(_rows(A + base, rows, D)), tl.load(_rows(B + base, rows, D))


@triton.jit
def dkdv_kernel(Q, K, V, DO, LSE2, DELTA, DK, DV, DQ, qk_scale, sm_scale, SEQ: tl.constexpr, D: tl.constexpr,
                BM: tl.constexpr, BN: tl.constexpr, DQ_MODE: tl.constexpr):
    pid_n = tl.program_id(0)
    bh = tl.program_id(1)
    base = bh.to(tl.int64) * SEQ * D
    offs_n = pid_n * BN + tl.arange(0, BN)
    k, v = _row_tiles(K, V, base, offs_n, D)
    dk = tl.zeros([BN, D], tl.float32)
    dv = tl.zeros([BN, D], tl.float32)
    if DQ_MODE == 2:
        desc = tl.make_tensor_descriptor(DQ + base, shape=[SEQ, D], strides=[D, 1], block_shape=[BM, D])
    for m0 in range(0, SEQ, BM):
        offs_m = m0 + tl.arange(0, BM)
        q, do = _row_tiles(Q, DO, base, offs_m, D)
        lse2 = tl.load(LSE2 + bh * SEQ + offs_m)
        delta = tl.load(DELTA + bh * SEQ + offs_m)
        p_t = tl.math.exp2(tl.dot(k, tl.trans(q)) * qk_scale - lse2[None, :])
        dv = tl.dot(p_t.to(do.dtype), do, dv)
        dp_t = tl.dot(v, tl.trans(do))
        ds_t = (p_t * (dp_t - delta[None, :])).to(q.dtype)
        dk = tl.dot(ds_t, q, dk)
        if DQ_MODE == 1:
            dq = tl.dot(tl.trans(ds_t), k) * sm_scale
            tl.atomic_add(_rows(DQ + base, offs_m, D), dq, sem="relaxed")
        elif DQ_MODE == 2:
            dq = tl.dot(tl.trans(ds_t), k) * sm_scale
            desc.atomic_add([m0, 0], dq)
    tl.store(_rows(DK + base, offs_n, D), (dk * sm_scale).to(k.dtype))
    tl.store(_rows(DV + base, offs_n, D), dv.to(v.dtype))


@triton.jit
def dq_kernel(Q, K, V, DO, LSE2, DELTA, DQ, qk_scale, sm_scale, SEQ: tl.constexpr, D: tl.constexpr,
              BM: tl.constexpr, BN: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    base = bh.to(tl.int64) * SEQ * D
    offs_m = pid_m * BM + tl.arange(0, BM)
    q, do = _row_tiles(Q, DO, base, offs_m, D)
    lse2 = tl.load(LSE2 + bh * SEQ + offs_m)
    delta = tl.load(DELTA + bh * SEQ + offs_m)
    dq = tl.zeros([BM, D], tl.float32)
    for n0 in range(0, SEQ, BN):
        offs_n = n0 + tl.arange(0, BN)
        k, v = _row_tiles(K, V, base, offs_n, D)
        p = tl.math.exp2(tl.dot(q, tl.trans(k)) * qk_scale - lse2[:, None])
        dp = tl.dot(do, tl.trans(v))
        ds = (p * (dp - delta[:, None])).to(k.dtype)
        dq = tl.dot(ds, k, dq)
    tl.store(_rows(DQ + base, offs_m, D), (dq * sm_scale).to(q.dtype))


CONFIGS = [(64, 128, 8, 3), (64, 128, 8, 2), (32, 128, 8, 3), (32, 128, 4, 3), (64, 64, 4, 2), (32, 64, 4, 3),
           (128, 128, 8, 2)]
DQ_CONFIGS = [(128, 128, 8, 3), (128, 64, 8, 3), (64, 64, 4, 2), (128, 32, 4, 3)]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="bench/results")
    p.add_argument("--dims", default="128,64")
    args = p.parse_args()
    from triton.testing import do_bench

    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    bench = lambda f: do_bench(f, warmup=25, rep=200, return_mode="median")
    doc = harness.results_doc(args.out, "do_bench median (warmup 25 ms, rep 200 ms), bf16, B8 H16 L2048, full "
                                        "attention; fused times include zeroing the f32 dQ buffer and converting it "
                                        "to bf16; SDPA's backward is forward + backward less forward")
    for d in (int(x) for x in args.dims.split(",")):
        b, h, seq = 8, 16, 2048
        gen = torch.Generator(device="cuda").manual_seed(d)
        q, k, v, do = (torch.randn(b, h, seq, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(4))
        sm_scale = d ** -0.5
        flops = 2.5 * 4 * b * h * seq * seq * d
        ref = [t.detach().float().requires_grad_() for t in (q, k, v)]
        out_ref = torch.nn.functional.scaled_dot_product_attention(*ref)
        grads_ref = torch.autograd.grad(out_ref, ref, do.float())
        scores = (ref[0] @ ref[1].transpose(-1, -2)).detach() * sm_scale
        lse2 = (torch.logsumexp(scores, -1) * LOG2E).contiguous()
        out = out_ref.detach().to(torch.bfloat16)
        delta = (do.float() * out.float()).sum(-1).contiguous()
        del scores
        rec = {"d": d, "seq": seq, "batch": b, "heads": h, "tflops": {}, "ms": {}, "errors": {}}

        def error(got, want):
            return float((got.float() - want).abs().max() / want.abs().max())

        from torch.nn.attention import SDPBackend, sdpa_kernel
        for backend, label in ((SDPBackend.CUDNN_ATTENTION, "sdpa_cudnn"), (SDPBackend.FLASH_ATTENTION, "sdpa_flash")):
            qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
            with sdpa_kernel(backend):
                o = torch.nn.functional.scaled_dot_product_attention(qq, kk, vv)
                ms_fwd = bench(lambda: torch.nn.functional.scaled_dot_product_attention(qq, kk, vv))
                ms_all = bench(lambda: torch.autograd.grad(torch.nn.functional.scaled_dot_product_attention(qq, kk, vv),
                                                           (qq, kk, vv), do))
            rec["ms"][label] = ms_all - ms_fwd
            rec["tflops"][label] = flops / rec["ms"][label] / 1e9
            del o
        dk, dv, dq = (torch.empty_like(t) for t in (k, v, q))
        dq32 = torch.zeros(b, h, seq, d, device="cuda", dtype=torch.float32)
        qk_scale = sm_scale * LOG2E

        def dkdv_call(bm, bn, warps, stages, mode):
            def call():
                if mode:
                    dq32.zero_()
                dkdv_kernel[(seq // bn, b * h)](q, k, v, do, lse2, delta, dk, dv, dq32, qk_scale, sm_scale, seq, d,
                                                 bm, bn, mode, num_warps=warps, num_stages=stages)
                if mode:
                    dq.copy_(dq32)
            return call

        for bm, bn, warps, stages in CONFIGS:
            for mode_name, mode in MODES.items():
                name = f"dkdv_{mode_name}_{bm}x{bn}w{warps}s{stages}"
                try:
                    call = dkdv_call(bm, bn, warps, stages, mode)
                    call()
                    torch.cuda.synchronize()
                    rec["errors"][name] = {"dk": error(dk, grads_ref[1]), "dv": error(dv, grads_ref[2])}
                    if mode:
                        rec["errors"][name]["dq"] = error(dq, grads_ref[0])
                    rec["ms"][name] = bench(call)
                    rec["tflops"][name] = flops / rec["ms"][name] / 1e9
                except Exception as exc:  # a config that does not compile (shared memory) is reported
                    rec["errors"][name] = f"{type(exc).__name__}: {str(exc)[:200]}"
                print(name, rec["ms"].get(name), rec["errors"][name], flush=True)
        for bm, bn, warps, stages in DQ_CONFIGS:
            name = f"dq_{bm}x{bn}w{warps}s{stages}"
            try:
                call = lambda: dq_kernel[(seq // bm, b * h)](q, k, v, do, lse2, delta, dq, qk_scale, sm_scale, seq, d,
                                                             bm, bn, num_warps=warps, num_stages=stages)
                call()
                torch.cuda.synchronize()
                rec["errors"][name] = {"dq": error(dq, grads_ref[0])}
                rec["ms"][name] = bench(call)
            except Exception as exc:
                rec["errors"][name] = f"{type(exc).__name__}: {str(exc)[:200]}"
            print(name, rec["ms"].get(name), rec["errors"][name], flush=True)
        two = [rec["ms"][n] for n in rec["ms"] if n.startswith("dkdv_none")]
        one_dq = [rec["ms"][n] for n in rec["ms"] if n.startswith("dq_")]
        fused = {m: [rec["ms"][n] for n in rec["ms"] if n.startswith(f"dkdv_{m}_")] for m in ("atomics", "descriptor")}
        rec["best_ms"] = {"two_kernels": min(two) + min(one_dq) if two and one_dq else None,
                          **{f"fused_{m}": min(v) if v else None for m, v in fused.items()}}
        print(d, rec["best_ms"], {k_: rec["tflops"][k_] for k_ in ("sdpa_cudnn", "sdpa_flash")}, flush=True)
        doc["cases"].append(rec)
        harness.save(doc, args.out, "atomic-dq-probe.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
