"""Whether the five-product Gluon backward (passes/gluon/attention_backward_fused.py: the dK/dV
kernel also adds dS K into a float32 dQ buffer by TMA reduce-adds) beats the two-kernel one
(seven products): the probe that made it attn-lower-to-gluon's default at D = 128, timed on the
GPU with torch + triton only, without bundles.

    python3 bench/fused_backward_probe.py --out DIR      # on the GPU

Both forms are JIT-compiled there from the same Gluon sources the lowering instantiates. "two":
the dQ kernel (which writes delta) then the dK/dV kernel; "fused": a Triton kernel that writes
delta and zeroes the buffer, the fused kernel, and a Triton kernel that converts the buffer to
dQ (scale and cast); "fused kernel": the fused kernel alone. Beside them cuDNN's and SDPA flash's
backward (forward + backward less forward), five alternating rounds of do_bench medians, bf16,
B*L = 16384, H 16, D 128 (and 64 with --dims 128,64), full and causal, L 2048 and 8192. Before timing, each form's gradients
are compared with float32 autograd at ragged, GQA and Lq != Lk shapes. Writes
fused-backward-probe.json.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys

import torch
import triton
import triton.language as tl

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402
from gluon_backward import _float_grads, _relative  # noqa: E402


def _kernels():
    # passes/ is a package of the compiler (MLIR bindings); its gluon/ subpackage needs only triton.
    path = os.path.join(os.path.dirname(HERE), "passes", "gluon", "__init__.py")
    spec = importlib.util.spec_from_file_location("gluon_kernels", path,
                                                  submodule_search_locations=[os.path.dirname(path)])
    package = importlib.util.module_from_spec(spec)
    sys.modules["gluon_kernels"] = package
    spec.loader.exec_module(package)
    import gluon_kernels.attention_backward as two
    import gluon_kernels.attention_backward_fused as fused
    return two, fused


@triton.jit
def _delta_kernel(O, DO, DLSE, DELTA, DQ, ROWS, D: tl.constexpr, BLOCK: tl.constexpr):
    # delta = rowsum(dO * O) - dlse over contiguous [rows, D]; the same rows of the f32 dQ buffer zeroed.
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    keep = rows < ROWS
    cols = tl.arange(0, D)
    offs = rows.to(tl.int64)[:, None] * D + cols[None, :]
    o = tl.load(O + offs, mask=keep[:, None], other=0.0).to(tl.float32)
    do = tl.load(DO + offs, mask=keep[:, None], other=0.0).to(tl.float32)
    tl.store(DELTA + rows, tl.sum(o * do, axis=1) - tl.load(DLSE + rows, mask=keep, other=0.0), mask=keep)
    tl.store(DQ + offs, tl.zeros([BLOCK, D], tl.float32), mask=keep[:, None])


@triton.jit
def _convert_kernel(ACC, DQ, N, scale, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    keep = offs < N
    tl.store(DQ + offs, (tl.load(ACC + offs, mask=keep) * scale).to(DQ.dtype.element_ty), mask=keep)


class Backward:
    """Both forms for one shape (contiguous [B, H, L, D] tensors), sharing their buffers."""

    def __init__(self, two, fused, q, k, v, d_out, out, lse, causal):
        from triton.experimental.gluon import language as gl
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

        self.two, self.fused = two, fused
        b, h, lq, d = q.shape
        hkv, lk = k.shape[1], k.shape[2]
        self.q, self.out, self.d_out = q, out, d_out
        self.dlse = torch.zeros_like(lse)
        self.lse = lse
        self.dq, self.dk, self.dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        self.delta = torch.empty_like(lse)
        self.acc = torch.empty(q.shape, dtype=torch.float32, device=q.device)
        self.scale = d ** -0.5
        self.shape = (b, h, hkv, lq, lk, d)
        self.causal = causal

        def descriptors(kernel):
            return [TensorDescriptor(t, list(t.shape), list(t.stride()), block,
                                     gl.NVMMASharedLayout.get_default_for(block, gl.bfloat16 if t.dtype == torch.bfloat16
                                                                          else gl.float16))
                    for t, block in zip((q, k, v, d_out), two.descriptor_blocks(kernel, d))]

        self.desc = {kernel: descriptors(kernel) for kernel in ("dq", "dkdv")}
        block = [1, 1, 64, d // 2]
        self.desc["fused"] = self.desc["dkdv"] + [TensorDescriptor(
            self.acc, list(self.acc.shape), list(self.acc.stride()), block,
            gl.NVMMASharedLayout.get_default_for(block, gl.float32))]

    def _pointers(self, roles):
        tensors = {"out": self.out, "lse": self.lse, "dlse": self.dlse, "dq": self.dq, "delta": self.delta,
                   "dk": self.dk, "dv": self.dv, "acc": self.acc}
        args = []
        for role, strides in roles:
            t = tensors[role]
            args += [t] + [t.stride(i) for i in range(strides)]
        return args

    def _launch(self, fn, kernel, pointers, descriptors=None):
        b, h, hkv, lq, lk, d = self.shape
        fn[self.two.grid(kernel, b, h, hkv, lq, lk)](
            *self.desc[descriptors or kernel], *self._pointers(pointers), (), num_warps=4, maxnreg=168,
            **self.two.kernel_constants(kernel, h, hkv, lq, lk, self.scale, self.causal))

    def run_two(self):
        for kernel in ("dq", "dkdv"):
            self._launch(self.two.kernel_function(kernel), kernel, self.two.pointer_args(kernel))
        return self.dq, self.dk, self.dv

    def run_fused_kernel(self):
        self._launch(self.fused.attention_backward_fused, "dkdv", (("lse", 2), ("delta", 2), ("dk", 3), ("dv", 3)),
                     "fused")

    def run_dkdv(self):
        self._launch(self.two.attention_backward_dkdv, "dkdv", self.two.pointer_args("dkdv"))

    def run_fused(self):
        rows = self.delta.numel()
        d = self.shape[-1]
        _delta_kernel[(triton.cdiv(rows, 64), )](self.out, self.d_out, self.dlse, self.delta, self.acc, rows, d, 64)
        self.run_fused_kernel()
        n = self.acc.numel()
        _convert_kernel[(triton.cdiv(n, 4096), )](self.acc, self.dq, n, self.scale, 4096)
        return self.dq, self.dk, self.dv


def _reference(q, k, v, d_out, causal):
    """float32 autograd's gradients (gluon_backward's), and the forward's output and logsumexp
    as the kernels read them."""
    group = q.shape[1] // k.shape[1]
    k_full, v_full = (t.repeat_interleave(group, dim=1) for t in (k, v))
    out, lse, *_ = torch.ops.aten._scaled_dot_product_flash_attention(q, k_full, v_full, 0.0, causal)
    return _float_grads(q, k, v, d_out, causal), out, lse.contiguous()


# (B, H, Hkv, Lq, Lk, D, causal)
CHECKS = [(2, 4, 4, 1000, 1000, 128, True), (2, 8, 2, 1000, 1000, 128, True), (2, 2, 2, 2112, 2112, 128, False),
          (2, 4, 4, 300, 1000, 128, False), (1, 2, 2, 64, 64, 128, True), (2, 4, 4, 1024, 1024, 128, True),
          (2, 4, 2, 1000, 1000, 64, True), (1, 3, 3, 333, 333, 64, False)]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="bench/results")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--no-checks", action="store_true")
    p.add_argument("--dims", default="128", help="head dims to time, comma-separated (64, 128)")
    args = p.parse_args()
    two, fused = _kernels()
    doc = harness.results_doc(args.out, __doc__, rounds=args.rounds)
    doc["checks"] = []
    for i, (b, h, hkv, lq, lk, d, causal) in enumerate([] if args.no_checks else CHECKS):
        gen = torch.Generator(device="cuda").manual_seed(100 + i)
        q, d_out = (torch.randn(b, h, lq, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
        k, v = (torch.randn(b, hkv, lk, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
        want, out, lse = _reference(q, k, v, d_out, causal)
        bwd = Backward(two, fused, q, k, v, d_out, out, lse, causal)
        got = {"two": [t.clone() for t in bwd.run_two()], "fused": [t.clone() for t in bwd.run_fused()]}
        # Each gradient's largest error relative to its largest magnitude: dq, dk, dv.
        rec = {"shape": [b, h, hkv, lq, lk, d], "causal": causal,
               **{form: [_relative([g], [w]) for g, w in zip(grads, want)] for form, grads in got.items()}}
        doc["checks"].append(rec)
        print("check", rec, flush=True)
    harness.save(doc, args.out, "fused-backward-probe.json")
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import torch.nn.functional as F
    for d, length, causal in [(d, n, c) for d in map(int, args.dims.split(",")) for n in (2048, 8192)
                              for c in (False, True)]:
        b, h = 16384 // length, 16
        gen = torch.Generator(device="cuda").manual_seed(length + causal)
        q, k, v, d_out = (torch.randn(b, h, length, d, device="cuda", dtype=torch.bfloat16, generator=gen)
                          for _ in range(4))
        out, lse, *_ = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal)
        bwd = Backward(two, fused, q, k, v, d_out, out, lse.contiguous(), causal)
        got_two = [t.clone() for t in bwd.run_two()]
        got_fused = [t.clone() for t in bwd.run_fused()]
        engines = {"two": bwd.run_two, "fused": bwd.run_fused, "fused kernel": bwd.run_fused_kernel,
                   "dkdv kernel": bwd.run_dkdv}
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        flops = 2.5 * 4 * b * h * length * length * d * (0.5 if causal else 1.0)
        peers = {}
        for label, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
            def sdpa(a, bb, c, backend=backend):
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(a, bb, c, is_causal=causal)
            peers[label] = sdpa
        times = {label: [] for label in list(engines) + list(peers)}
        for _ in range(args.rounds):
            for label, fn in engines.items():
                times[label].append(harness.bench_ms(fn))
            for label, fn in peers.items():
                times[label].append(harness.peer_backward(fn, leaves, leaves, d_out, flops)["backward_ms"])
        ms = {label: statistics.median(t) for label, t in times.items()}
        rec = {"B": b, "L": length, "D": d, "causal": causal, "ms": ms, "rounds_ms": times,
               "tflops": {label: flops / m * 1e-9 for label, m in ms.items()},
               "fused_vs_two_grads": _relative(got_fused, [t.float() for t in got_two]),
               "kernels_fused": harness.kernel_times(bwd.run_fused),
               "fused_over_cudnn": ms["cudnn"] / ms["fused"], "two_over_cudnn": ms["cudnn"] / ms["two"]}
        doc["cases"].append(rec)
        print(d, length, causal, " ".join(f"{k} {v:.0f}" for k, v in rec["tflops"].items()),
              f"fused/cudnn {rec['fused_over_cudnn']:.3f} two/cudnn {rec['two_over_cudnn']:.3f}", flush=True)
        harness.save(doc, args.out, "fused-backward-probe.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
