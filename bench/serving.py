"""Serving benchmark: one query token per sequence (bf16, GQA 32/8, D = 128) against KV caches
that are allocated once and partly filled (per-entry `kv_len`) or paged (a block table over a
shuffled page pool), beside peers in the same process:

* ae-mlir with `kv_len` on a cache allocated for Lmax keys, and with a paged cache (page sizes
  16 and 256) holding the same keys;
* FlexAttention with the per-entry lengths as a mask_mod and a block mask built for them;
* SDPA (cuDNN, flash) on a dense cache of exactly max(kv_len) keys, every entry as long: what a
  kernel without per-entry lengths reads at best.

The figure is the bandwidth of the K and V bytes each entry actually has (sum of kv_len x Hkv x
D x 2 bytes x 2) over the time; SDPA's reads max(kv_len) per entry, so its bar is its own bytes.

    python bench/serving.py build --out bench/bundles/serving     # here: needs the MLIR bindings
    python bench/serving.py run --bundles bench/bundles/serving --out DIR   # on the GPU

Times are medians of triton.testing.do_bench; inputs are fresh per case; every output is checked
against float32 SDPA (math backend) run entry by entry on the filled keys.
"""
from __future__ import annotations

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import harness  # noqa: E402

HEADS, KV_HEADS, DIM = 32, 8, 128
# (batch, Lmax, the filled lengths as fractions of Lmax, cycled over the batch)
CASES = [(1, 131072, (1.0,)), (1, 131072, (0.25,)), (8, 32768, (1.0, 0.5, 0.75, 0.3)),
         (32, 8192, (1.0, 0.6, 0.2, 0.9))]
PAGE_SIZES = (16, 256)


def _name(batch: int, lmax: int, fractions) -> str:
    return f"b{batch}_l{lmax}_" + "-".join(str(int(f * 100)) for f in fractions)


def _lengths(batch: int, lmax: int, fractions) -> list[int]:
    return [int(lmax * fractions[i % len(fractions)]) for i in range(batch)]


def build(out: str) -> None:
    import torch

    import ae_mlir as ae
    from ae_mlir.backends import triton as tb

    os.makedirs(out, exist_ok=True)
    attn = ae.attention()
    for batch, lmax, fractions in CASES:
        name = _name(batch, lmax, fractions)
        q = torch.empty(batch, HEADS, 1, DIM, dtype=torch.bfloat16, device="meta")
        kv = torch.empty(batch, KV_HEADS, lmax, DIM, dtype=torch.bfloat16, device="meta")
        lengths = torch.empty(batch, dtype=torch.int32, device="meta")
        bundle = tb.compile_bundle(attn, q, kv, kv, target="cuda:90", kv_len=lengths)
        bundle.save(os.path.join(out, name + ".kv_len.json"))
        print("built", name, "kv_len", bundle.meta["config"], flush=True)
        for size in PAGE_SIZES:
            pages = torch.empty(batch * lmax // size, KV_HEADS, size, DIM, dtype=torch.bfloat16, device="meta")
            table = torch.empty(batch, lmax // size, dtype=torch.int32, device="meta")
            bundle = tb.compile_bundle(attn, q, pages, pages, target="cuda:90", kv_len=lengths, block_table=table)
            bundle.save(os.path.join(out, f"{name}.paged{size}.json"))
            print("built", name, f"paged{size}", bundle.meta["config"], flush=True)
            if size < bundle.meta["config"]["block_n"]:
                # Tiles of one page each: slices instead of the preset's row gather.
                config = dict(bundle.meta["config"], block_n=size)
                tb.compile_bundle(attn, q, pages, pages, target="cuda:90", kv_len=lengths, block_table=table,
                                  config=config).save(os.path.join(out, f"{name}.paged{size}_n{size}.json"))


def _paged(k, v, size: int, gen):
    """k, v [B, Hkv, Lmax, D] as shuffled page pools [P, Hkv, size, D] and the block table."""
    import torch

    b, hkv, lmax, d = k.shape
    per = lmax // size
    order = torch.randperm(b * per, generator=gen).to(k.device)
    table = order.view(b, per).to(torch.int32)
    pools = []
    for t in (k, v):
        pool = torch.empty(b * per, hkv, size, d, dtype=t.dtype, device=t.device)
        pool[order] = t.view(b, hkv, per, size, d).permute(0, 2, 1, 3, 4).reshape(b * per, hkv, size, d)
        pools.append(pool)
    return pools[0], pools[1], table


def run(bundles: str, out_dir: str) -> None:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from ae_mlir import runtime

    device = torch.device("cuda")
    doc = harness.results_doc(out_dir, __doc__, heads=HEADS, kv_heads=KV_HEADS, dim=DIM, dtype="bfloat16")
    records = doc["cases"]
    flex = torch.compile(flex_attention, dynamic=False)
    gen = torch.Generator().manual_seed(0)
    for batch, lmax, fractions in CASES:
        name = _name(batch, lmax, fractions)
        lengths_list = _lengths(batch, lmax, fractions)
        lengths = torch.tensor(lengths_list, dtype=torch.int32, device=device)
        q = torch.randn(batch, HEADS, 1, DIM, generator=gen).to(device, torch.bfloat16)
        k, v = (torch.randn(batch, KV_HEADS, lmax, DIM, generator=gen).to(device, torch.bfloat16) for _ in range(2))
        filled = 2 * sum(lengths_list) * KV_HEADS * DIM * k.element_size()
        ref = torch.empty(batch, HEADS, 1, DIM, device=device)
        with sdpa_kernel(SDPBackend.MATH):
            for i, n in enumerate(lengths_list):
                ref[i] = torch.nn.functional.scaled_dot_product_attention(
                    q[i:i + 1].float(), k[i:i + 1, :, :n].float(), v[i:i + 1, :, :n].float(), enable_gqa=True)[0]
        impls = {}
        bundle = runtime.Bundle.load(os.path.join(bundles, name + ".kv_len.json"))
        impls["ae_mlir_kv_len"] = (lambda: runtime.launch(bundle, q, k, v, lengths)[0], filled)
        for size in PAGE_SIZES:
            k_pages, v_pages, table = _paged(k, v, size, gen)
            for variant in (f"paged{size}", f"paged{size}_n{size}"):
                path = os.path.join(bundles, f"{name}.{variant}.json")
                if os.path.exists(path):
                    paged = runtime.Bundle.load(path)
                    impls["ae_mlir_" + variant] = (lambda paged=paged, kp=k_pages, vp=v_pages, t=table:
                                                   runtime.launch(paged, q, kp, vp, lengths, t)[0], filled)

        def within(b, h, q_idx, kv_idx):
            return kv_idx < lengths[b]

        block_mask = create_block_mask(within, batch, None, 1, lmax, device=device)
        impls["flex_attention"] = (lambda: flex(q, k, v, block_mask=block_mask, enable_gqa=True), filled)
        longest = max(lengths_list)
        kd, vd = k[:, :, :longest].contiguous(), v[:, :, :longest].contiguous()
        dense_bytes = 2 * kd.numel() * kd.element_size()
        for label, backend in (("sdpa_cudnn_dense", SDPBackend.CUDNN_ATTENTION),
                               ("sdpa_flash_dense", SDPBackend.FLASH_ATTENTION)):
            def sdpa(backend=backend):
                with sdpa_kernel(backend):
                    return torch.nn.functional.scaled_dot_product_attention(q, kd, vd, enable_gqa=True)
            impls[label] = (sdpa, dense_bytes)
        rec = {"case": name, "B": batch, "Lmax": lmax, "kv_len": lengths_list, "filled_bytes": filled,
               "configs": {"kv_len": bundle.meta.get("config")}, "results": {}}
        # The dense SDPA rows past an entry's length see keys the others do not.
        comparable = len(set(lengths_list)) == 1
        for label, (fn, nbytes) in impls.items():
            result = harness.measure(fn, lambda out, label=label: float((out.float() - ref).abs().max())
                                     if "dense" not in label or comparable else None)
            if "ms" in result:
                result["tb_per_s"] = nbytes / (result["ms"] * 1e-3) / 1e12
            rec["results"][label] = result
        records.append(rec)
        print(json.dumps(rec), flush=True)
        harness.save(doc, out_dir, "serving.json")


def main(argv=None) -> int:
    return harness.main(__doc__, build, run, "serving", argv)


if __name__ == "__main__":
    sys.exit(main())
