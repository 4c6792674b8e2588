"""`attn-fuse-online-softmax`: score -> [score_mod] -> [mask] -> normalize -> aggregate becomes
one `attn.online_attention` op whose regions carry the mods and the online normalizer.

This is the step that turns "materialize the [Lq, Lk] scores, normalize, multiply by V" into the
FlashAttention form, where a running row state replaces the materialized row. The fused op is
built with the bindings' builders: the mods' and a user normalizer's regions move into it whole
(their ops keep their locations, the user's source lines), the built-in normalizers' regions come
from `ae_mlir.core.normalizer_regions`, and the op itself is located at the ops it replaces.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..core.normalizer_regions import BUILTIN, build_regions
from ..core.regions import from_region
from . import ModulePass
from .l1_ops import fail, ops_named


def _producer(value, name: str, consumer, role: str):
    owner = value.owner
    op = getattr(owner, "operation", None)
    if op is None or op.name != name:
        raise fail(consumer, f"cannot fuse: its {role} must come from '{name}'")
    return op


def _single_use(op, consumer):
    uses = list(op.results[0].uses)
    if len(uses) != 1:
        raise fail(consumer, f"cannot fuse: the result of '{op.name}' has {len(uses)} uses; fusion needs "
                             "the chain score -> score_mod -> mask -> normalize -> aggregate unshared")


def _move_body(source, target) -> None:
    """Move the blocks of region `source` into the empty region `target`; the ops stay what they
    are (values read from outside, the function's arguments and constants, stay valid: the fused
    op sits where the aggregate was, after all of them)."""
    for block in list(source.blocks):
        block.append_to(target)


@dataclass(frozen=True)
class FuseOnlineSoftmax(ModulePass):
    name: ClassVar[str] = "attn-fuse-online-softmax"
    summary: ClassVar[str] = ("Fuse score, score_mod, mask, normalize and aggregate into "
                              "attn.online_attention (running row max and sum, exp2, one final division)")

    def apply(self, module_op) -> None:
        for agg in ops_named(module_op, "attn.aggregate"):
            self._fuse(module_op, agg)

    def _fuse(self, module_op, agg) -> None:
        from mlir import ir

        norm = _producer(agg.operands[0], "attn.normalize", agg, "probabilities")
        _single_use(norm, agg)
        seg = [int(x) for x in norm.attributes["operandSegmentSizes"]]
        kind = norm.attributes["kind"].value
        scores = norm.operands[0]
        mask = _producer(norm.operands[1], "attn.mask", norm, "mask") if seg[1] else None
        score_mod = None
        if getattr(scores.owner, "operation", None) is not None and scores.owner.operation.name == "attn.score_mod":
            score_mod = scores.owner.operation
            _single_use(score_mod, norm)
            scores = score_mod.operands[0]
        score = _producer(scores, "attn.score", score_mod or norm, "scores")
        _single_use(score, score_mod or norm)
        if mask is not None:
            _single_use(mask, norm)

        with_lse = len(norm.results) > 1
        if kind == "online":
            for region in norm.regions:
                program = from_region(region)
                if program is not None and program.externals:
                    raise fail(norm, "a user normalizer's regions must not read values from outside them")
            stat, log2_domain = ("max" if list(norm.regions[1].blocks) else "none"), False
        else:
            stat, log2_domain = BUILTIN[kind].stat, BUILTIN[kind].log2_domain

        chain = [op for op in (agg, norm, mask, score_mod, score) if op is not None]
        kv_len = list(mask.operands) if mask is not None else []
        with module_op.context:
            result_types = [agg.results[0].type] + ([norm.results[1].type] if with_lse else [])
            attributes = {
                "scale": score.attributes["scale"],
                "normalizer": ir.StringAttr.get(kind),
                "stat": ir.StringAttr.get(stat),
                "log2_domain": ir.BoolAttr.get(log2_domain),
                "resultSegmentSizes": ir.DenseI32ArrayAttr.get([1, int(with_lse)]),
            }
            fused = ir.Operation.create(
                "attn.online_attention", results=result_types,
                operands=[score.operands[0], score.operands[1], agg.operands[1]] + kv_len, attributes=attributes,
                regions=6, loc=ir.Location.fused([op.location for op in chain]), ip=ir.InsertionPoint(agg))
            if score_mod is not None:
                _move_body(score_mod.regions[0], fused.regions[0])
            if mask is not None:
                _move_body(mask.regions[0], fused.regions[1])
            normalizer_regions = [fused.regions[i] for i in range(2, 6)]
            if kind == "online":
                for source, target in zip(norm.regions, normalizer_regions):
                    _move_body(source, target)
            else:
                build_regions(kind, normalizer_regions, with_lse, norm.location)
        agg.results[0].replace_all_uses_with(fused.results[0])
        if with_lse:
            norm.results[1].replace_all_uses_with(fused.results[1])
        for op in chain:
            op.erase()
