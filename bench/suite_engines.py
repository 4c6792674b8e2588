"""The engines run_suite.py's cases run on: `Gpu` (timings with triton.testing.do_bench, the peers,
the sampled references) and `DryRun` (the same code on the CPU at full size, each ae-mlir launch
bound rather than run, zeros for the peers: run_suite.py --dry-run)."""
from __future__ import annotations

import statistics
import time

import suite

BENCH = {"warmup": 25, "rep": 100}  # triton.testing.do_bench, milliseconds, median


class Gpu:
    dry = False

    def __init__(self):
        import torch

        self.torch = torch
        self.device = torch.device("cuda")

    def sync(self) -> None:
        self.torch.cuda.synchronize()

    def bench(self, fn) -> float:
        from triton.testing import do_bench

        return float(do_bench(fn, warmup=BENCH["warmup"], rep=BENCH["rep"], return_mode="median"))

    def wall_ms(self, fn, reps: int = 5) -> float:
        """Median wall time with the device drained before and after: for host-driven work (tile
        classification launches many small kernels), where GPU event time would miss the gaps."""
        times = []
        for _ in range(reps):
            self.sync()
            start = time.perf_counter()
            fn()
            self.sync()
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times)

    def outputs(self, bundle) -> dict:
        from ae_mlir import runtime

        made = [self.torch.empty(s.shape, dtype=runtime.torch_dtype(s.dtype), device=self.device)
                for s in bundle.outputs]
        return {"out": made[0], "lse": made[1] if len(made) > 1 else None}

    def launch(self, bundle, *args, out, lse):
        from ae_mlir import runtime

        return runtime.launch(bundle, *args, out=out, lse=lse)

    def kernel_info(self, bundle, args, outs) -> dict:
        from ae_mlir import runtime

        variant = runtime.choose_variant(bundle, runtime.bind(bundle, *args, **outs))
        info = {"block_m": bundle.block_m, "block_n": bundle.block_n, "num_warps": bundle.num_warps,
                "num_stages": bundle.num_stages, "grid": bundle.grid,
                "kernel_variant": "aligned" if variant.aligned else "generic"}
        if not self.dry:
            kernel = runtime.compile_variant(variant, runtime.current_target(), bundle.num_warps, bundle.num_stages)
            info.update(registers=getattr(kernel, "n_regs", None), spills=getattr(kernel, "n_spills", None),
                        shared_bytes=kernel.metadata.shared)
        if bundle.stages:
            # The kernels launched before this one (a split linear recurrence's chunk states).
            info["stages"] = []
            for stage in bundle.stages:
                entry = {"name": stage.name, "grid": stage.grid, "num_warps": stage.num_warps,
                         "num_stages": stage.num_stages}
                if not self.dry:
                    kernel = runtime.compile_variant(stage.variants[info["kernel_variant"]],
                                                  runtime.current_target(), stage.num_warps, stage.num_stages)
                    entry.update(registers=getattr(kernel, "n_regs", None), spills=getattr(kernel, "n_spills", None),
                                 shared_bytes=kernel.metadata.shared)
                info["stages"].append(entry)
        return info

    def rows(self, length: int):
        return suite.sample_rows(length)

    def ref_heads(self, heads: int) -> list[int]:
        return suite.reference_heads(heads)

    def sdpa_reference(self, q, k, v, causal: bool):
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(SDPBackend.MATH):
            return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)

    def sdpa(self, backend: str, causal: bool, gqa: bool):
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        chosen = getattr(SDPBackend, backend)

        def run(q, k, v):
            with sdpa_kernel(chosen):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)

        return run

    def flex(self, attn, shape, batch=None):
        return suite.flex_callable(attn, shape, self.device, batch)

    def block_mask_ms(self, attn, shape, batch=None) -> float | None:
        from torch.nn.attention.flex_attention import create_block_mask

        return self.wall_ms(lambda: create_block_mask(attn.mask_mod, batch, None, shape.seq_q, shape.seq_k,
                                                      device=self.device))

    def fla(self, variant: str):
        return suite.fla_op(variant)


class DryRun(Gpu):
    """Runs every case's code on the CPU at full size with the same inputs, captures, call-time
    tables, references and bookkeeping, but binds each ae-mlir launch (argument checks, kernel
    variant choice, argument list) instead of running it and stands zeros in for the peers."""

    dry = True

    def __init__(self):
        import torch

        self.torch = torch
        self.device = torch.device("cpu")

    def sync(self) -> None:
        pass

    def bench(self, fn) -> float:
        fn()
        return 1.0

    def launch(self, bundle, *args, out, lse):
        from ae_mlir import runtime

        tensors = runtime.bind(bundle, *args, out=out, lse=lse)
        variant = runtime.choose_variant(bundle, tensors)
        values = runtime.argument_values(variant, tensors, runtime.device_tables(bundle, self.device))
        if len(values) != len(variant.args):
            raise AssertionError(f"{len(values)} arguments for {len(variant.args)} kernel parameters")
        return [tensors[s.role].zero_() for s in bundle.outputs]

    def rows(self, length: int):
        return suite.sample_rows(length, edge=2, spread=4)

    def ref_heads(self, heads: int) -> list[int]:
        return [heads - 1]

    def sdpa_reference(self, q, k, v, causal: bool):
        return self.torch.zeros(*q.shape[:3], v.shape[-1])

    def sdpa(self, backend: str, causal: bool, gqa: bool):
        return lambda q, k, v: self.torch.zeros(*q.shape[:3], v.shape[-1], dtype=q.dtype)

    def flex(self, attn, shape, batch=None):
        # FlexAttention's BlockMask evaluates the mod under vmap: check it does, where it is cheap.
        if attn.mask_mod is not None and shape.seq_q <= 2048:
            from torch.nn.attention.flex_attention import create_block_mask

            create_block_mask(attn.mask_mod, batch, None, shape.seq_q, shape.seq_k, device="cpu")
        return lambda q, k, v: self.torch.zeros(*q.shape[:3], v.shape[-1], dtype=q.dtype)

    def block_mask_ms(self, attn, shape, batch=None) -> float | None:
        return super().block_mask_ms(attn, shape, batch) if shape.seq_q <= 2048 else None

    def fla(self, variant: str):
        return lambda q, k, v, g: self.torch.zeros(*q.shape[:3], v.shape[-1], dtype=q.dtype)


# --- one case -----------------------------------------------------------------------------------------
