"""`attn-fuse-online-softmax`: score -> [score_mod] -> [mask] -> normalize -> aggregate becomes
one `attn.online_attention` op whose regions carry the mods and the online normalizer.

This is the step that turns "materialize the [Lq, Lk] scores, normalize, multiply by V" into the
FlashAttention form, where a running row state replaces the materialized row. The normalizer's
update rules come from `ae_mlir.normalizers` (softmax is written there like any other).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..core.context import CompileError, Diagnostic, location_parts, parse_module
from ..normalizers import BUILTIN, region_texts
from ..core.regions import TextEmitter, emit_scalar, from_region
from . import ModulePass
from .l1_text import ops_named


def _fail(op, message: str) -> CompileError:
    filename, line, col = location_parts(op.location)
    return CompileError(message, [Diagnostic("error", f"'{op.name}' op {message}", filename, line, col)])


def _producer(value, name: str, consumer, role: str):
    owner = value.owner
    op = getattr(owner, "operation", None)
    if op is None or op.name != name:
        raise _fail(consumer, f"cannot fuse: its {role} must come from '{name}'")
    return op


def _single_use(op, consumer):
    uses = list(op.results[0].uses)
    if len(uses) != 1:
        raise _fail(consumer, f"cannot fuse: the result of '{op.name}' has {len(uses)} uses; fusion needs "
                              "the chain score -> score_mod -> mask -> normalize -> aggregate unshared")


def _region_text(program, arg_decls: list[tuple[str, str]], externals: list[str], prefix: str) -> str:
    em = TextEmitter(prefix)
    result = emit_scalar(program, [n for n, _ in arg_decls], em, externals)
    decls = ", ".join(f"{n}: {t}" for n, t in arg_decls)
    body = "".join(f"        {line}\n" for line in em.lines)
    return (f"{{\n      ^bb0({decls}):\n{body}"
            f'        "gpu.yield"({result}) : ({program.result_type}) -> ()\n      }}')


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

        captures: list = []

        def capture_names(program) -> list[str]:
            names = []
            for value in program.externals:
                for i, c in enumerate(captures):
                    if c == value:
                        break
                else:
                    captures.append(value)
                    i = len(captures) - 1
                names.append(f"%a{3 + i}")
            return names

        idx = [("%b", "index"), ("%h", "index"), ("%q_idx", "index"), ("%kv_idx", "index")]
        regions = []
        if score_mod is not None:
            program = from_region(score_mod.regions[0])
            regions.append(_region_text(program, [("%s", "f32")] + idx, capture_names(program), "s"))
        else:
            regions.append("{}")
        if mask is not None:
            program = from_region(mask.regions[0])
            regions.append(_region_text(program, idx, capture_names(program), "m"))
        else:
            regions.append("{}")
        with_lse = len(norm.results) > 1
        if kind == "online":
            user = [from_region(r) for r in norm.regions]
            for program in user:
                if program is not None and program.externals:
                    raise _fail(norm, "a user normalizer's regions must not read values from outside them")
            pair = [("%x", "f32"), ("%y", "f32")]
            regions += [_region_text(p, pair, [], "n") if p is not None else "{}" for p in user] + ["{}"]
            stat, log2_domain = ("max" if user[1] is not None else "none"), False
        else:
            normalizer = BUILTIN[kind]
            texts = region_texts(normalizer, with_lse)
            regions += [texts.get(key, "{}") for key in ("prob", "rescale", "finalize", "lse")]
            stat, log2_domain = normalizer.stat or "none", normalizer.log2_domain

        q, k = score.operands[0], score.operands[1]
        v = agg.operands[1]
        values = [q, k, v] + captures
        operand_types = [str(x.type) for x in values]
        result_types = [str(agg.results[0].type)] + ([str(norm.results[1].type)] if with_lse else [])
        scale = str(score.attributes["scale"])
        params = ", ".join(f"%a{i}: {t}" for i, t in enumerate(operand_types))
        args = "%a0, %a1, %a2"
        text = (
            f"func.func @fused({params}) {{\n"
            f'  %r:{len(result_types)} = "attn.online_attention"({args}) ({", ".join(regions)}) '
            f'{{scale = {scale}, normalizer = "{kind}", stat = "{stat}", '
            f"log2_domain = {str(log2_domain).lower()}, "
            f"resultSegmentSizes = array<i32: 1, {int(with_lse)}>}} : "
            f"({', '.join(operand_types[:3])}) -> ({', '.join(result_types)})\n"
            f"  return\n}}\n"
        )
        template = parse_module(text, module_op.context, "<attn-fuse-online-softmax>")
        template_func = template.body.operations[0]
        fused_template = template_func.regions[0].blocks[0].operations[0]
        with module_op.context, agg.location:
            fused = fused_template.operation.clone(ip=ir.InsertionPoint(agg))
        # The clone still reads the template's arguments; rebinding them moves every use,
        # inside the regions too, onto the real values.
        for arg, value in zip(template_func.regions[0].blocks[0].arguments, values):
            arg.replace_all_uses_with(value)
        agg.results[0].replace_all_uses_with(fused.results[0])
        if with_lse:
            norm.results[1].replace_all_uses_with(fused.results[1])
        for op in (agg, norm, mask, score_mod, score):
            if op is not None:
                op.erase()
