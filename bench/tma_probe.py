"""What Hopper code generation could gain ae-mlir's Triton lowering: a probe, not a product.

    python bench/tma_probe.py [--out bench/results]      # on the GPU (torch + triton)

A minimal full-attention forward written directly in Triton (bf16, aligned shapes, no mods) in
four forms: pointer loads (what ae-mlir's lowering emits today), tensor-descriptor (TMA) loads
from 2-D descriptors made on the device, from rank-4 descriptors over the whole [B, H, L, D]
tensors (made on the device from the kernel's arguments alone), and from host-made descriptors;
each with and without `warp_specialize` on the KV loop, over a few block sizes and launch
options, timed beside SDPA cuDNN in the same run. ae-mlir's own kernels at the same shapes are in
bench/results/h200-attention-configs-<date>.json (bench/attention_configs.py). Writes
tma-probe.json.
"""
from __future__ import annotations

import argparse
import itertools
import os
import sys

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

LOG2E = 1.4426950408889634
FORMS = ("pointers", "device_descriptors", "rank4_descriptors", "host_descriptors")
# A run of the rank-4 form on the H200 (2026-12-01) printed nothing in 9 minutes: it compiles here
# for cuda:90 at every config, so something hangs at run time; not yet diagnosed. It runs only when
# named in --forms.
DEFAULT_FORMS = ("pointers", "device_descriptors", "host_descriptors")


@triton.jit
def _online_step(q, k, v, m_i, l_i, acc, qk_scale):
    qk = tl.dot(q, tl.trans(k))
    m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
    p = tl.math.exp2(qk * qk_scale - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return m_new, l_i, acc


@triton.jit
def fwd_pointers(Q, K, V, O, qk_scale, SEQ: tl.constexpr, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                 WS: tl.constexpr):
    pid = tl.program_id(0)
    base = tl.program_id(1).to(tl.int64) * SEQ * D
    rows = pid * BM + tl.arange(0, BM)
    cols = tl.arange(0, D)
    q = tl.load(Q + base + rows[:, None] * D + cols[None, :])
    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, D], tl.float32)
    for start in tl.range(0, SEQ, BN, warp_specialize=WS):
        kv_rows = start + tl.arange(0, BN)
        k = tl.load(K + base + kv_rows[:, None] * D + cols[None, :])
        v = tl.load(V + base + kv_rows[:, None] * D + cols[None, :])
        m_i, l_i, acc = _online_step(q, k, v, m_i, l_i, acc, qk_scale)
    tl.store(O + base + rows[:, None] * D + cols[None, :], (acc / l_i[:, None]).to(O.dtype.element_ty))


@triton.jit
def _descriptor_body(dq, dk, dv, do, qk_scale, SEQ: tl.constexpr, D: tl.constexpr, BM: tl.constexpr,
                     BN: tl.constexpr, WS: tl.constexpr):
    row0 = tl.program_id(1) * SEQ
    q = dq.load([row0 + tl.program_id(0) * BM, 0])
    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, D], tl.float32)
    for start in tl.range(0, SEQ, BN, warp_specialize=WS):
        k = dk.load([row0 + start, 0])
        v = dv.load([row0 + start, 0])
        m_i, l_i, acc = _online_step(q, k, v, m_i, l_i, acc, qk_scale)
    do.store([row0 + tl.program_id(0) * BM, 0], (acc / l_i[:, None]).to(q.dtype))


@triton.jit
def fwd_device_descriptors(Q, K, V, O, qk_scale, ROWS, SEQ: tl.constexpr, D: tl.constexpr, BM: tl.constexpr,
                           BN: tl.constexpr, WS: tl.constexpr):
    dq = tl.make_tensor_descriptor(Q, shape=[ROWS, D], strides=[D, 1], block_shape=[BM, D])
    dk = tl.make_tensor_descriptor(K, shape=[ROWS, D], strides=[D, 1], block_shape=[BN, D])
    dv = tl.make_tensor_descriptor(V, shape=[ROWS, D], strides=[D, 1], block_shape=[BN, D])
    do = tl.make_tensor_descriptor(O, shape=[ROWS, D], strides=[D, 1], block_shape=[BM, D])
    _descriptor_body(dq, dk, dv, do, qk_scale, SEQ, D, BM, BN, WS)


@triton.jit
def fwd_rank4_descriptors(Q, K, V, O, qk_scale, B, H, SEQ: tl.constexpr, D: tl.constexpr, BM: tl.constexpr,
                          BN: tl.constexpr, WS: tl.constexpr):
    # Descriptors over the whole [B, H, L, D] tensors, indexed by (batch, head, row, 0): what a
    # lowering can build once per kernel from the arguments alone, whatever the strides.
    dq = tl.make_tensor_descriptor(Q, shape=[B, H, SEQ, D], strides=[H * SEQ * D, SEQ * D, D, 1], block_shape=[1, 1, BM, D])
    dk = tl.make_tensor_descriptor(K, shape=[B, H, SEQ, D], strides=[H * SEQ * D, SEQ * D, D, 1], block_shape=[1, 1, BN, D])
    dv = tl.make_tensor_descriptor(V, shape=[B, H, SEQ, D], strides=[H * SEQ * D, SEQ * D, D, 1], block_shape=[1, 1, BN, D])
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    q = dq.load([b, h, tl.program_id(0) * BM, 0]).reshape(BM, D)
    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, D], tl.float32)
    for start in tl.range(0, SEQ, BN, warp_specialize=WS):
        k = dk.load([b, h, start, 0]).reshape(BN, D)
        v = dv.load([b, h, start, 0]).reshape(BN, D)
        m_i, l_i, acc = _online_step(q, k, v, m_i, l_i, acc, qk_scale)
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    cols = tl.arange(0, D)
    base = bh.to(tl.int64) * SEQ * D
    tl.store(O + base + rows[:, None] * D + cols[None, :], (acc / l_i[:, None]).to(O.dtype.element_ty))


@triton.jit
def fwd_host_descriptors(dq, dk, dv, do, qk_scale, SEQ: tl.constexpr, D: tl.constexpr, BM: tl.constexpr,
                         BN: tl.constexpr, WS: tl.constexpr):
    _descriptor_body(dq, dk, dv, do, qk_scale, SEQ, D, BM, BN, WS)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--forms", default=",".join(DEFAULT_FORMS), help=f"some of {', '.join(FORMS)}")
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = p.parse_args()
    forms = args.forms.split(",")
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench

    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    records = []
    for d, seq in itertools.product((64, 128), (2048, 8192)):
        b, h = 16384 // seq, 16
        gen = torch.Generator(device="cuda").manual_seed(seq + d)
        q, k, v = (torch.randn(b, h, seq, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
        flops = 4 * b * h * seq * seq * d
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            want = torch.nn.functional.scaled_dot_product_attention(q, k, v)
            ms = do_bench(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v), warmup=25, rep=100, return_mode="median")
        rec = {"d": d, "seq": seq, "batch": b, "heads": h, "tflops": {"sdpa_cudnn": flops / ms / 1e9}, "errors": {}}
        qk_scale = d ** -0.5 * LOG2E
        rows = b * h * seq
        for form, (bm, bn, warps, stages), ws in itertools.product(
                forms,
                ((128, 64, 8, 3), (128, 128, 8, 2), (128, 64, 4, 3), (128, 128, 8, 3)), (False, True)):
            name = f"{form}-m{bm}n{bn}w{warps}s{stages}{'+ws' if ws else ''}"
            o = torch.empty_like(q)
            grid = (seq // bm, b * h)
            meta = dict(SEQ=seq, D=d, BM=bm, BN=bn, WS=ws, num_warps=warps, num_stages=stages)
            if form == "pointers":
                def call():
                    fwd_pointers[grid](q, k, v, o, qk_scale, **meta)
            elif form == "rank4_descriptors":
                def call():
                    fwd_rank4_descriptors[grid](q, k, v, o, qk_scale, b, h, **meta)
            elif form == "device_descriptors":
                def call():
                    fwd_device_descriptors[grid](q, k, v, o, qk_scale, rows, **meta)
            else:
                flat = [t.view(rows, d) for t in (q, k, v, o)]
                descs = [TensorDescriptor.from_tensor(t, [bs, d]) for t, bs in zip(flat, (bm, bn, bn, bm))]

                def call():
                    fwd_host_descriptors[grid](*descs, qk_scale, **meta)
            try:
                call()
                torch.cuda.synchronize()
                err = float((o.float() - want.float()).abs().max())
                if err > 0.05:
                    raise AssertionError(f"max error {err}")
                rec["tflops"][name] = flops / do_bench(call, warmup=25, rep=100, return_mode="median") / 1e9
            except Exception as e:  # a form this Triton cannot compile for Hopper is recorded
                rec["errors"][name] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}" if str(e) else type(e).__name__
            print(d, seq, name, round(rec["tflops"].get(name, 0.0), 1), rec["errors"].get(name, ""), flush=True)
        records.append(rec)
    doc = harness.results_doc(args.out, "triton.testing.do_bench median (warmup 25 ms, rep 100 ms), bf16")
    doc["cases"] = records
    harness.save(doc, args.out, "tma-probe.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
