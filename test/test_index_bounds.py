"""The interval analysis behind attn-fold-index-clamps and the Triton gathers' bounds masks
(passes/index_bounds.py): each op's rule, the i32 wrap-around it must not assume away, padding
lanes, and that every catalogue variant's kernels keep their closure reads inside their tensors
at the default GPU configs (the TTIR interpreter faults on any read outside a buffer)."""
from __future__ import annotations

import math

import pytest
import torch

from ae_mlir import variants
from ae_mlir.backends import triton as tb
from ae_mlir.core.context import new_context, parse_module
from ae_mlir.passes.index_bounds import UNKNOWN, IndexBounds
from ae_mlir.passes.triton.values import padded_size

from bundle_interp import interpret

INF = math.inf

BODY = """
func.func @f(%x: index, %y: i64, %f: f32, %c: i1) -> index attributes {attn.grid = array<i64: 1, 4, 8>} {
  %c0 = arith.constant 0 : index
  %c3 = arith.constant 3 : index
  %c7 = arith.constant 7 : index
  %c100 = arith.constant 100 : index
  %cbig = arith.constant 2147483000 : index
  %pid = "attn.program_id"() {axis = 2 : i64, t = "pid"} : () -> index
  %tile = arith.muli %pid, %c100 {t = "tile"} : index
  %wrap = arith.addi %tile, %cbig {t = "wrap"} : index
  %low = arith.maxsi %x, %c0 {t = "low"} : index
  %clamped = arith.minsi %low, %c7 {t = "clamped"} : index
  %open_add = arith.addi %low, %c3 {t = "open_add"} : index
  %diff = arith.subi %clamped, %c7 {t = "diff"} : index
  %abs64 = arith.index_cast %diff {t = "abs64"} : index to i64
  %abs = math.absi %abs64 {t = "abs"} : i64
  %rem = arith.remsi %tile, %c7 {t = "rem"} : index
  %div = arith.divsi %tile, %c7 {t = "div"} : index
  %sel = arith.select %c, %clamped, %c100 {t = "sel"} : index
  %ylow = arith.maxsi %y, %abs64 {t = "ylow"} : i64
  %ycast = arith.index_cast %ylow {t = "ycast"} : i64 to index
  %flag = arith.extsi %c {t = "flag"} : i1 to i64
  %t = tensor.empty() : tensor<24x128xf32>
  %g = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>], iterator_types = ["parallel", "parallel"]}
      outs(%t : tensor<24x128xf32>) {
  ^bb0(%o: f32):
    %i = linalg.index 0 : index
    %j = linalg.index 1 : index
    %s = arith.addi %i, %j {t = "s"} : index
    linalg.yield %o : f32
  } -> tensor<24x128xf32>
  return %c0 : index
}
"""


def _tagged(text: str) -> tuple:
    """The values of `text`'s ops by their tag `t`, and the module that owns them."""
    from mlir import ir

    module = parse_module(text, new_context())
    named = {}

    def visit(op):
        if "t" in op.attributes:
            named[ir.StringAttr(op.attributes["t"]).value] = op.results[0]
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return named, module


def _values(lanes=None) -> tuple:
    """The analysis, the values of BODY's ops by their tag `t`, and the module that owns them."""
    named, module = _tagged(BODY)
    return IndexBounds(lanes), named, module


@pytest.mark.parametrize("name,expected", [
    ("pid", (0, 7)),                 # attn.grid bounds program id 2
    ("tile", (0, 700)),
    ("wrap", UNKNOWN),               # 2147483000 + 700 leaves i32: it could wrap
    ("low", (0, INF)),               # max/min cannot wrap: an open side stays open
    ("clamped", (0, 7)),
    ("open_add", UNKNOWN),           # arithmetic on an open side could wrap
    ("diff", (-7, 0)),
    ("abs", (0, 7)),
    ("rem", (0, 6)),
    ("div", (0, 100)),
    ("sel", (0, 100)),
    ("ylow", (-7, INF)),
    ("ycast", UNKNOWN),              # an i64 truncated to index keeps only a closed bound
    ("flag", (-1, 0)),               # an i1 sign-extends to -1 or 0
])
def test_rules(name, expected):
    bounds, named, _module = _values()
    assert bounds.bounds(named[name]) == expected


@pytest.mark.parametrize("name,expected", [
    ("wrap", (2147483000, 2147483700)),   # exact in 64 bits
    ("open_add", UNKNOWN),                # an open side stays open
    ("ycast", (-7, INF)),                 # an i64 read into a 64-bit index keeps its value
])
def test_rules_in_64_bits(name, expected):
    """`bits=64` (the Triton lowering's question: which ops need 64 bits) bounds the exact values
    up to i64's range."""
    _bounds, named, _module = _values()
    assert IndexBounds(bits=64).bounds(named[name]) == expected


def test_given_argument_bounds():
    """A region's positions, which no op of the IR bounds, are given (the Gluon score_mod's)."""
    named, module = _tagged(BODY)
    x = module.body.operations[0].regions[0].blocks[0].arguments[0]
    assert IndexBounds().bounds(named["open_add"]) == UNKNOWN
    assert IndexBounds(arguments={x: (0, 10)}).bounds(named["open_add"]) == (3, 13)


NARROW = """
func.func @g(%t8: tensor<4xi8>, %tab: tensor<4x3xi32>, %x: index) -> index {
  %c0 = arith.constant 0 : index
  %c7 = arith.constant 7 : index
  %c100 = arith.constant 100 : i8
  %e = tensor.extract %t8[%c0] {t = "e"} : tensor<4xi8>
  %u = arith.index_castui %e {t = "u"} : i8 to index
  %ab = math.absi %e {t = "ab"} : i8
  %hi = arith.maxsi %e, %c100 {t = "hi"} : i8
  %wrap = arith.addi %hi, %c100 {t = "wrap8"} : i8
  %low = arith.maxsi %x, %c0 : index
  %q = arith.minsi %low, %c7 {t = "q"} : index
  %d = arith.subi %q, %c7 {t = "d"} : index
  %r = arith.remsi %d, %c7 {t = "rem_neg"} : index
  %ru = arith.remsi %x, %c7 {t = "rem_any"} : index
  %v = arith.divsi %d, %c7 {t = "div_neg"} : index
  %f = arith.floordivsi %d, %c7 {t = "floordiv_neg"} : index
  %and = arith.andi %q, %c7 {t = "and"} : index
  %xor = arith.xori %q, %c7 {t = "xor"} : index
  %b = tensor.extract %tab[%c0, %c0] {attn.bounds = array<i64: 0, 2>, t = "listed"} : tensor<4x3xi32>
  return %c0 : index
}
"""


@pytest.mark.parametrize("name,expected", [
    ("e", (-128, 127)),         # an i8 read: its type's range
    ("u", (0, 255)),            # zero-extended, a negative i8 reads as its unsigned value
    ("ab", (-128, 127)),        # absi(-128) wraps to -128 in i8
    ("wrap8", (-128, 127)),     # 100..127 + 100 wraps in i8
    ("rem_neg", (-6, 0)),       # remsi takes the dividend's sign
    ("rem_any", (-6, 6)),       # whatever the dividend
    ("div_neg", (-1, 0)),       # divsi truncates toward zero: -7 / 7, 0 / 7
    ("floordiv_neg", (-1, 0)),
    ("and", (0, 7)),
    ("xor", (0, 7)),
    ("listed", (0, 2)),         # a call-time table's block number carries its range (abi.BOUNDS)
])
def test_narrow_types_signed_division_bitwise_and_listed_blocks(name, expected):
    named, _module = _tagged(NARROW)
    assert IndexBounds().bounds(named[name]) == expected


def test_linalg_index_counts_padding_lanes():
    exact, named, _m1 = _values()
    padded, named_p, _m2 = _values(padded_size)
    # A tile dimension of 24 runs on 32 lanes in Triton; their indices reach 31.
    assert exact.bounds(named["s"]) == (0, 23 + 127)
    assert padded.bounds(named_p["s"]) == (0, 31 + 127)


@pytest.mark.parametrize("name", ["relative_bias", "t5_bias", "alibi", "document"])
@pytest.mark.parametrize("target", ["cuda:90", "hip:gfx942"])
def test_catalogue_closure_reads_stay_inside(name, target):
    """A ragged shape (L = 200 on 128-row and 64-column tiles: padding rows and columns in the
    last tiles) at the default configs; the interpreter raises OutOfBoundsError on a read outside
    any buffer, and the output matches the float64 reference."""
    attn, shape = variants.build(name, variants.Shape(1, 2, 200, 200, 64, 64))
    q, k, v = variants.inputs(shape, torch.float32)
    bundle = tb.compile_bundle(attn, q, k, v, target=target)
    out = interpret(bundle, q, k, v, *attn._build(q, k, v)[1])[0][0]
    expected = attn(q.double(), k.double(), v.double(), backend="reference")
    assert (out.double() - expected).abs().max().item() < 1e-4
