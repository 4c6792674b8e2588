"""`attn-cpu-widen-matmul-operands`: a tile product of 16-bit operands takes them converted to f32
once, before the product, instead of converting each element inside it.

    %p = linalg.matmul ins(%a, %b : tensor<64x64xbf16>, tensor<64x128xbf16>) (extf in the body)
  becomes
    %a32 = linalg.generic {extf} ins(%a)  (placed after %a's definition, so a loop-invariant Q
    %b32 = linalg.generic {extf} ins(%b)   tile is converted once per query block)
    %p = linalg.matmul ins(%a32, %b32 : tensor<64x64xf32>, tensor<64x128xf32>)

Why: the L1 kernels keep the inputs' 16-bit type on the products (the GPUs' tensor cores take
them so), and the CPU computes in f32. Vectorized as it stands, the product converts both
operands at every multiply-add, each element once per row or column of the other operand: bf16
attention ran at 0.58-0.61x torch SDPA's speed on a 2-core AVX-512 host against about 1.0x for
the same kernel on f32 inputs. Converted once, each element costs one conversion per tile. A
conversion whose operand comes from an element-wise linalg.generic used only here (K's
transposed copy, P truncated to bf16) is folded into that generic, so the tile is not walked
twice. Written by hand: upstream's linalg passes fold casts into contractions, never out of them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from . import ModulePass
from .cpu_support import walk

_NARROW = ("bf16", "f16")


@dataclass(frozen=True)
class WidenMatmulOperands(ModulePass):
    name: ClassVar[str] = "attn-cpu-widen-matmul-operands"
    summary: ClassVar[str] = ("CPU lowering: convert a tile product's 16-bit operands to f32 once before it, "
                              "not at every multiply-add inside it")

    def apply(self, module_op) -> None:
        widen_matmul_operands(module_op)


def widen_matmul_operands(module_op) -> None:
    from mlir import ir

    from .l1_builders import matmul

    for op in walk(module_op, "linalg.matmul"):
        a, b, acc = op.operands
        if not any(_element(v) in _NARROW for v in (a, b)) or _element(acc) != "f32":
            continue
        replaced = []
        with op.location:
            wide = [_widened(v, replaced) for v in (a, b)]
            with ir.InsertionPoint(op):
                product = matmul(wide[0], wide[1], acc)
        op.results[0].replace_all_uses_with(product)
        op.erase()
        for old in replaced:
            old.erase()


def _element(value) -> str:
    from mlir import ir

    return str(ir.RankedTensorType(value.type).element_type)


def _widened(value, replaced: list):
    """`value` as f32: itself, its producing generic rebuilt to yield f32 (the old one goes on
    `replaced`, to erase once the product no longer uses it), or a conversion after it."""
    from mlir import ir

    if _element(value) not in _NARROW:
        return value
    owner = value.owner
    producer = None if isinstance(owner, ir.Block) else owner.operation
    if producer is not None and producer.name == "linalg.generic" and _foldable(producer, value):
        replaced.append(producer)
        return _rebuilt_as_f32(producer)
    point = ir.InsertionPoint.after(producer) if producer is not None else ir.InsertionPoint.at_block_begin(owner)
    with point:
        return _to_f32(value)


def _foldable(generic, value) -> bool:
    """An element-wise generic with one result, used only by the product, whose body does not
    read its output."""
    parallel = all("parallel" in str(it) for it in generic.attributes["iterator_types"])
    body = generic.regions[0].blocks[0]
    reads_output = len(list(body.arguments[len(body.arguments) - 1].uses)) > 0
    return parallel and len(generic.results) == 1 and len(list(value.uses)) == 1 and not reads_output


def _to_f32(value):
    from mlir import ir
    from mlir.dialects import arith, linalg

    from .l1_builders import empty, identity_maps

    rank = ir.RankedTensorType(value.type).rank
    f32 = ir.F32Type.get()
    out_type = ir.RankedTensorType.get(list(ir.RankedTensorType(value.type).shape), f32)
    op = linalg.GenericOp([out_type], [value], [empty(out_type)], identity_maps(rank, 2),
                          ir.ArrayAttr.get([ir.Attribute.parse("#linalg.iterator_type<parallel>")] * rank))
    block = op.regions[0].blocks.append(ir.RankedTensorType(value.type).element_type, f32,
                                        arg_locs=[ir.Location.current] * 2)
    with ir.InsertionPoint(block):
        linalg.YieldOp([arith.extf(f32, block.arguments[0])])
    return op.result


def _rebuilt_as_f32(generic):
    """The element-wise generic again, yielding its value extended to f32 into an f32 tensor."""
    from mlir import ir
    from mlir.dialects import arith, linalg

    from .l1_builders import empty

    f32 = ir.F32Type.get()
    old_type = ir.RankedTensorType(generic.results[0].type)
    out_type = ir.RankedTensorType.get(list(old_type.shape), f32)
    n_inputs = len(generic.operands) - 1
    with generic.location, ir.InsertionPoint(generic):
        op = linalg.GenericOp([out_type], list(generic.operands)[:n_inputs], [empty(out_type)],
                              generic.attributes["indexing_maps"], generic.attributes["iterator_types"])
        old_block = generic.regions[0].blocks[0]
        block = op.regions[0].blocks.append(*[arg.type for arg in old_block.arguments][:n_inputs], f32,
                                            arg_locs=[ir.Location.current] * (n_inputs + 1))
        mapping = dict(zip([a for a in old_block.arguments][:n_inputs], block.arguments))
        with ir.InsertionPoint(block):
            for inner in old_block.operations:
                inner = inner.operation
                if inner.name == "linalg.yield":
                    yielded = mapping.get(inner.operands[0], inner.operands[0])
                    linalg.YieldOp([arith.extf(f32, yielded)])
                    continue
                clone = inner.clone()
                for i, operand in enumerate(clone.operands):
                    if operand in mapping:
                        clone.operands[i] = mapping[operand]
                for old, new in zip(inner.results, clone.results):
                    mapping[old] = new
    return op.result
