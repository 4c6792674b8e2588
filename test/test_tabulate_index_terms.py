"""attn-tabulate-index-terms (passes/tabulate_index_terms.py): which terms become tables, which
stay computed, and that the tables hold what the terms compute (the lit test shows the IR; the
catalogue tests run T5 through every backend against the float64 reference)."""
from __future__ import annotations

import pytest
import torch

from ae_mlir import variants
from ae_mlir.backends import triton as tb
from ae_mlir.core.context import new_context, parse_module
from ae_mlir.passes import build_pass_manager

KERNEL = """
func.func @f(%t: tensor<32x64xf32>, %bias: tensor<64xf32>) -> tensor<32x64xf32>
    attributes {{attn.grid = array<i64: 1, 1, {blocks}>}} {{
  %pid = "attn.program_id"() {{axis = 2 : i64}} : () -> index
  %c32 = arith.constant 32 : index
  %c0 = arith.constant 0 : index
  %c63 = arith.constant 63 : index
  %c7 = arith.constant 7.0 : f32
  %row0 = arith.muli %pid, %c32 : index
  %g = linalg.generic {{indexing_maps = [affine_map<(i, j) -> (i, j)>], iterator_types = ["parallel", "parallel"]}}
      outs(%t : tensor<32x64xf32>) {{
  ^bb0(%o: f32):
    %i = linalg.index 0 : index
    %j = linalg.index 1 : index
    %q = arith.addi %row0, %i : index
    %d = arith.{combine} %q, %j : index
    %d64 = arith.index_cast %d : index to i64
    %df = arith.sitofp %d64 : i64 to f32
    %e = {costly} %df, %c7 : f32
    %n64 = arith.fptosi %e : f32 to i64
    %n = arith.index_cast %n64 : i64 to index
    %lo = arith.maxsi %n, %c0 : index
    %at = arith.minsi %lo, %c63 : index
    %b = tensor.extract %bias[%at] : tensor<64xf32>
    %y = arith.addf %o, %b : f32
    linalg.yield %y : f32
  }} -> tensor<32x64xf32>
  return %g : tensor<32x64xf32>
}}
"""


def _run(blocks: int = 2, combine: str = "subi", costly: str = "arith.divf", padded: bool = False) -> str:
    return _tabulate(blocks, combine, costly, padded)[0]


def _tabulate(blocks: int = 2, combine: str = "subi", costly: str = "arith.divf", padded: bool = False):
    """The module's text after the pass and its i32 tables (numpy arrays)."""
    import numpy as np
    from mlir import ir

    context = new_context()
    module = parse_module(KERNEL.format(blocks=blocks, combine=combine, costly=costly), context)
    pipeline = f"builtin.module(attn-tabulate-index-terms{{padded-tiles={str(padded).lower()}}})"
    build_pass_manager(pipeline, context).run(module.operation)
    tables = []

    def visit(op):
        value = op.attributes["value"] if op.name == "arith.constant" else None
        if isinstance(value, ir.DenseIntElementsAttr) and not value.is_splat:
            tables.append(np.array(value))
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return str(module), tables


def test_division_of_the_distance_becomes_a_table():
    """q in [0, 63] (two blocks of 32 rows), k in [0, 63]: d = q - k in [-63, 63], 127 entries,
    each clamp((d / 7) truncated, 0, 63) as the reference computes it."""
    import numpy as np

    text, tables = _tabulate()
    assert "arith.divf" not in text and "math" not in text.split("linalg.generic")[1]
    assert "tensor<127xi32>" in text and len(tables) == 1
    d = np.arange(-63, 64)
    assert (tables[0] == np.clip(np.trunc(d / 7.0), 0, 63)).all()


def test_padding_lanes_widen_the_table():
    """With Triton's padding lanes a 32x64 tile is computed on 32x64 lanes still (powers of two), a
    grid of 3 query blocks puts q in [0, 95]: the table covers d in [-63, 95]."""
    assert "tensor<159xi32>" in _run(blocks=3, padded=True)


def test_cheap_terms_stay_computed():
    """Without a division or a transcendental the chain (a product, conversions, clamps) costs
    less than the load that would replace it."""
    text = _run(costly="arith.mulf")
    assert "xi32>" not in text and "arith.mulf %" in text


def test_unbounded_or_wide_indices_stay_computed():
    """q * k over a grid of 4096 query blocks reaches 2^17 * 63 values: beyond the table limit."""
    text = _run(blocks=4096, combine="muli")
    assert "arith.divf" in text and "xi32>" not in text


def test_terms_the_evaluator_cannot_run_stay_computed():
    """math.atan2 has no rule in the scalar evaluator (nor does the tracer emit it)."""
    assert "math.atan2" in _run(costly="math.atan2")


@pytest.mark.parametrize("target", ["cuda:90", "hip:gfx942"])
def test_t5_kernels_read_buckets_from_a_table(target):
    """T5 at the default GPU config of L = 2048: no log left in the forward kernel, one i32 table
    argument of 2 * 2048 - 1 + padding entries, and its reads unmasked."""
    attn, shape = variants.build("t5_bias", variants.Shape(1, 2, 2048, 2048, 64, 64))
    q, k, v = variants.inputs(shape, torch.bfloat16)
    bundle = tb.compile_bundle(attn, q, k, v, target=target)
    ttir = "\n".join(variant.ttir for variant in bundle.variants.values())
    assert "\"math.log\"(" not in ttir  # the bucket's log (the logsumexp takes math.log2)
    assert ttir.count("!tt.ptr<i32>") >= 1
    table_loads = [line for line in ttir.splitlines() if "tt.load" in line and "x!tt.ptr<i32>>)" in line]
    assert table_loads and all("tensor<" in line and "xi1>" not in line for line in table_loads)
