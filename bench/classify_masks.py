"""Call-time tile classification of document masks: ae-mlir's classifier through the mask's
intervals (the default), the same classifier element by element (the intervals off), and
FlexAttention's create_block_mask, in one process on fresh sorted document ids each round.

    python bench/classify_masks.py build --out bench/bundles/classify      # the mask programs (MLIR)
    python bench/classify_masks.py run --out DIR [--device cuda] [--rounds 15]

`build` writes each case's mask program (the JSON the kernels carry); `run` needs torch alone
(a GPU machine without the MLIR bindings runs it from the built programs). Cases: document ids
shared by the batch and per batch row, causal within documents, H 16, B * L = 16k at L 2048 and
8192, about one document per 512 tokens (at least 4). ae-mlir's classifier as the runtime runs it
(`default`), through the intervals always (`intervals`) and without them (`element_by_element`;
on a GPU the default up to block_mask.GPU_ELEMENT_WISE_MAX mask entries); its tables as the runtime makes them
on a cache miss: `forward`, a forward call's (64 x 64 tiles, the H200 default for masks that cut
many tiles); `step`, a training step's (the forward's, then the dQ kernel's 64 x 64 and the dK/dV
kernel's 32 x 64: one evaluation of the mask, pooled). FlexAttention's BlockMask (its default
128 x 128) serves its forward and backward.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from harness import cpu_description  # noqa: E402

HEADS, TOKENS = 16, 16384
# The tiles of a document mask's forward, dQ and dK/dV kernels on CUDA at D 128 (launch_defaults).
STEP = [(64, 64, "forward"), (64, 64, "dq"), (32, 64, "dkdv")]
# The runtime's choice (on a GPU: element by element up to block_mask.GPU_ELEMENT_WISE_MAX
# entries), through the intervals always, and element by element always.
HOWS = ("default", "intervals", "element_by_element")
CASES = [(kind, length) for kind in ("shared", "rows") for length in (2048, 8192)]


def _mask(kind: str, doc):
    if kind == "shared":
        return lambda b, h, q, kv: (doc[q] == doc[kv]) & (q >= kv)
    return lambda b, h, q, kv: (doc[b, q] == doc[b, kv]) & (q >= kv)


def _ids(kind: str, batch: int, length: int, device, gen):
    import torch

    docs = max(4, length // 512)
    rows = 1 if kind == "shared" else batch
    ids = torch.sort(torch.randint(0, docs, (rows, length), generator=gen), dim=-1).values.to(device)
    return ids[0] if kind == "shared" else ids


def build(out: str) -> None:
    import torch

    import ae_mlir as ae
    from ae_mlir.core.context import new_context, parse_module
    from ae_mlir.core.regions import from_region

    os.makedirs(out, exist_ok=True)
    programs = {}
    for kind, length in CASES:
        batch = TOKENS // length
        doc = _ids(kind, batch, length, "cpu", torch.Generator().manual_seed(0))
        q = torch.empty(batch, HEADS, length, 64, device="meta")
        module = parse_module(ae.attention(mask_mod=_mask(kind, doc)).mlir(q, q, q), new_context())
        func = next(op for op in module.body.operations if op.operation.name == "func.func")
        mask = next(op for op in func.regions[0].blocks[0].operations if op.operation.name == "attn.mask")
        programs[f"{kind}-{length}"] = from_region(mask.regions[0]).to_json()
    with open(os.path.join(out, "programs.json"), "w") as f:
        json.dump(programs, f)


def run(programs_dir: str, out: str, device: str, rounds: int) -> None:
    import torch
    from torch.nn.attention.flex_attention import create_block_mask

    from ae_mlir import block_mask
    from ae_mlir.core.regions import ScalarProgram

    with open(os.path.join(programs_dir, "programs.json")) as f:
        programs = {name: ScalarProgram.from_json(text) for name, text in json.load(f).items()}
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    real_bounds, element_max = block_mask.tile_bounds, block_mask.GPU_ELEMENT_WISE_MAX
    doc_out = {"device": torch.cuda.get_device_name() if device.startswith("cuda") else
               f"{cpu_description()}, torch on {torch.get_num_threads()} threads",
               "torch": torch.__version__, "date": datetime.date.today().isoformat(),
               "command": " ".join(["python", "bench/classify_masks.py"] + sys.argv[1:]),
               "method": f"median ms of {rounds} rounds, each on fresh sorted document ids, the three "
                         "classifiers in turn", "cases": []}
    gen = torch.Generator().manual_seed(1)
    for kind, length in CASES:
        batch = TOKENS // length
        program = programs[f"{kind}-{length}"]
        q = torch.empty(batch, HEADS, length, 64, device="meta")
        text = program.to_json()
        names = [f"{what}_{how}" for what in ("forward", "step") for how in HOWS]
        times = {name: [] for name in names + ["flex_create_block_mask"]}

        def ours(ids, what: str, how: str):
            """The tables a forward call (64x64 tiles) or a training step (its dQ and dK/dV
            kernels' too) takes from fresh ids: what the runtime's cache computes on a miss."""
            block_mask.tile_bounds = (lambda *a, **k: None) if how == "element_by_element" else real_bounds
            block_mask.GPU_ELEMENT_WISE_MAX = -1 if how == "intervals" else element_max
            block_mask._CACHE.clear()
            block_mask._FLAGS.clear()
            try:
                return [block_mask.call_time_tables(text, [q, q, q, ids], length, length, bm, bn, device, layout)
                        for bm, bn, layout in (STEP if what == "step" else STEP[:1])]
            finally:
                block_mask.tile_bounds = real_bounds
                block_mask.GPU_ELEMENT_WISE_MAX = element_max

        def flex(ids):
            mask = _mask(kind, ids)
            return create_block_mask(mask, batch if kind == "rows" else None, None, length, length, device=device)

        for r in range(rounds + 1):
            ids = _ids(kind, batch, length, device, gen)
            results = {}
            for name in names + ["flex_create_block_mask"]:
                sync()
                start = time.perf_counter()
                results[name] = flex(ids) if name.startswith("flex") else ours(ids, *name.split("_", 1))
                sync()
                if r:  # the first round warms up
                    times[name].append((time.perf_counter() - start) * 1e3)
            for what in ("forward", "step"):
                a = results[f"{what}_element_by_element"]
                for how in HOWS[:2]:
                    b = results[f"{what}_{how}"]
                    assert all(torch.equal(x, y) for ta, tb in zip(a, b) for x, y in zip(ta, tb)), "the tables differ"
        case = {"mask": kind, "batch": batch, "heads": HEADS, "length": length,
                **{f"{name}_ms": round(statistics.median(ts), 3) for name, ts in times.items()}}
        case["flex_over_step"] = round(case["flex_create_block_mask_ms"] / case["step_default_ms"], 2)
        doc_out["cases"].append(case)
        print(json.dumps(case))
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, f"classify-masks-{device.split(':')[0]}.json"), "w") as f:
            json.dump(doc_out, f, indent=1)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("build", "run"))
    parser.add_argument("--out", required=True)
    parser.add_argument("--programs", default=os.path.join(HERE, "bundles", "classify"),
                        help="run: the directory build wrote")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args(argv)
    if args.mode == "build":
        build(args.out)
    else:
        run(args.programs, args.out, args.device, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
