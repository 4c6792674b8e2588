"""`attn-differentiate`: the derivative of each attention's score chain, written in the attn
dialect as a function `<name>_grad` beside the forward function `<name>`.

For the chain score -> [score_mod] -> [mask] -> normalize -> aggregate of @f the pass appends

    func.func @f_grad(%scores, %d_probs, <the closure tensors the chain reads>)
        -> (d_scores, <one d_closure per float closure tensor the gradient reaches>)

where %scores is attn.score's result and %d_probs the gradient with respect to attn.normalize's
probs. The body recomputes the modified scores and the mask (copies of the forward's ops, at
their locations), applies attn.normalize_grad, then attn.score_mod_grad and one
attn.closure_grad per closure tensor, whose regions are the chain rule over the score_mod region
(`region_derivative`). A user normalizer's prob and finalize regions are differentiated the same
way into normalize_grad's prob_grad and finalize_grad. The function attribute
`attn.closure_args` gives, per closure parameter, the position of the forward function's
argument it stands for.

What lies outside the chain -- dP = dO V^T, dV = P^T dO, dQ = scale dS K, dK = scale dS^T Q --
is tensor algebra without user code; the caller supplies it (today `ae_mlir.frontend.backward`,
in torch). The forward function is left as it is.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from . import ModulePass
from .kv_len import fold_into_mask
from .l1_ops import ops_named
from .region_derivative import RegionDerivative, copy_region, fail, is_float_element, prune

GRAD_SUFFIX = "_grad"
CLOSURE_ARGS = "attn.closure_args"


def _owner_op(value):
    return getattr(value.owner, "operation", None)


def _producer(value, names: tuple[str, ...], consumer, role: str):
    op = _owner_op(value)
    if op is None or op.name not in names:
        raise fail(consumer, f"cannot differentiate: its {role} must come from {' or '.join(map(repr, names))}")
    return op


def _region_ops(region):
    from mlir import ir

    found = []

    def collect(op):
        found.append(op)
        return ir.WalkResult.ADVANCE

    for block in region.blocks:
        for op in block.operations:
            op.operation.walk(collect)
    return found


def _outer_values(region) -> list[tuple[object, object]]:
    """(value, first op reading it) for each value the region reads from outside itself."""
    inside, outer = set(), {}
    for block in region.blocks:
        inside.update(block.arguments)
    ops = _region_ops(region)
    for op in ops:
        for nested in op.regions:
            for block in nested.blocks:
                inside.update(block.arguments)
        inside.update(op.results)
    for op in ops:
        for value in op.operands:
            if value not in inside and value not in outer:
                outer[value] = op
    return list(outer.items())


@dataclass
class _Chain:
    func: object
    score: object
    score_mod: object | None
    mask: object | None
    normalize: object
    aggregate: object

    @staticmethod
    def of(aggregate) -> "_Chain":
        normalize = _producer(aggregate.operands[0], ("attn.normalize",), aggregate, "probabilities")
        scores = normalize.operands[0]
        score_mod = None
        if _owner_op(scores) is not None and _owner_op(scores).name == "attn.score_mod":
            score_mod = _owner_op(scores)
            scores = score_mod.operands[0]
        score = _producer(scores, ("attn.score",), score_mod or normalize, "scores")
        seg = [int(x) for x in normalize.attributes["operandSegmentSizes"]]
        mask = _producer(normalize.operands[1], ("attn.mask",), normalize, "mask") if seg[1] else None
        func = aggregate.parent
        while func.name != "func.func":
            func = func.parent
        return _Chain(func, score, score_mod, mask, normalize, aggregate)

    def regions(self) -> list[tuple[object, str]]:
        out = []
        if self.score_mod is not None:
            out.append((self.score_mod.regions[0], "score_mod"))
        if self.mask is not None:
            out.append((self.mask.regions[0], "mask"))
        for region, name in zip(self.normalize.regions, ("prob", "rescale", "finalize")):
            if list(region.blocks):
                out.append((region, name))
        return out


@dataclass(frozen=True)
class Differentiate(ModulePass):
    name: ClassVar[str] = "attn-differentiate"
    summary: ClassVar[str] = ("Write the derivative of each attention's score chain (score_mod, closure "
                              "tensors read, normalizer) as a function <name>_grad in the attn dialect")

    def apply(self, module_op) -> None:
        for op in ops_named(module_op, "attn.linear_recurrence"):
            raise fail(op, "has no derivative yet (attn-differentiate handles the softmax family)")
        for aggregate in ops_named(module_op, "attn.aggregate"):
            _GradWriter(module_op, _Chain.of(aggregate)).write()


class _GradWriter:
    def __init__(self, module_op, chain: _Chain):
        self.module_op = module_op
        self.chain = chain
        self.forward_name = chain.func.attributes["sym_name"].value
        self.name = self.forward_name + GRAD_SUFFIX
        taken = {op.attributes["sym_name"].value for op in module_op.regions[0].blocks[0].operations
                 if "sym_name" in op.attributes}
        if self.name in taken:
            raise fail(chain.func, f"cannot differentiate: the module already has a function named '{self.name}'")

    def _outer(self, entry, closures: list, constants: list) -> dict:
        """Forward values the regions read -> the grad function's values: closure arguments map to
        its parameters, constants to copies at the top of its body."""
        from mlir import ir

        outer = {arg: entry.arguments[2 + i] for i, arg in enumerate(closures)}
        with ir.InsertionPoint(entry):
            for value in constants:
                outer[value] = _owner_op(value).clone().results[0]
        return outer

    def _classify_outer(self) -> tuple[list, list]:
        arguments = list(self.chain.func.regions[0].blocks[0].arguments)
        closures, constants = set(), []
        if self.chain.mask is not None:
            closures.update(self.chain.mask.operands)
        for region, where in self.chain.regions():
            for value, reader in _outer_values(region):
                if value in arguments:
                    closures.add(value)
                elif _owner_op(value) is not None and _owner_op(value).name == "arith.constant":
                    constants.append(value)
                else:
                    raise fail(reader, f"reads a value defined outside the {where} region that is neither a "
                                       "function argument nor a constant; it cannot be differentiated")
        return sorted(closures, key=lambda a: a.arg_number), list(dict.fromkeys(constants))

    def write(self) -> None:
        from mlir import ir
        from mlir.dialects import func

        chain = self.chain
        closures, constants = self._classify_outer()
        scores_type = chain.score.results[0].type
        with self.module_op.context, chain.func.location:
            inputs = [scores_type, scores_type] + [c.type for c in closures]
            fn = func.FuncOp(self.name, ir.FunctionType.get(inputs, []),
                             ip=ir.InsertionPoint(self.module_op.regions[0].blocks[0]))
            entry = fn.add_entry_block()
            outer = self._outer(entry, closures, constants)
            scores, d_probs = entry.arguments[0], entry.arguments[1]
            modded, keep = self._recompute(entry, scores, outer)
            d_modded = self._normalize_grad(entry, modded, keep, d_probs, outer)
            results = [d_modded]
            if chain.score_mod is not None:
                results = self._score_mod_grads(entry, scores, d_modded, outer)
            with chain.aggregate.location, ir.InsertionPoint(entry):
                func.ReturnOp(results)
            fn.attributes["function_type"] = ir.TypeAttr.get(
                ir.FunctionType.get(inputs, [r.type for r in results]))
            fn.attributes[CLOSURE_ARGS] = ir.DenseI64ArrayAttr.get([c.arg_number for c in closures])

    def _create(self, name: str, results: list, operands: list, regions: int, loc, block, attributes=None):
        from mlir import ir

        return ir.Operation.create(name, results=results, operands=operands, regions=regions,
                                   attributes=attributes or {}, loc=loc, ip=ir.InsertionPoint(block))

    def _recompute(self, entry, scores, outer):
        """The modified scores and the mask, copied from the forward function."""
        chain = self.chain
        modded, keep = scores, None
        if chain.score_mod is not None:
            op = self._create("attn.score_mod", [scores.type], [scores], 1, chain.score_mod.location, entry)
            copy_region(chain.score_mod.regions[0], op.regions[0], outer, "score_mod")
            modded = op.results[0]
        if chain.mask is not None:
            lengths = [outer[v] for v in chain.mask.operands]
            op = self._create("attn.mask", [chain.mask.results[0].type], lengths, 1, chain.mask.location, entry)
            copy_region(chain.mask.regions[0], op.regions[0], outer, "mask")
            if lengths:
                # The derivative's evaluators take no per-entry key lengths: they become part of
                # the mask. The forward keeps its operand (the backward kernels specialize it).
                op = fold_into_mask(op)
            keep = op.results[0]
        return modded, keep

    def _normalize_grad(self, entry, modded, keep, d_probs, outer):
        from mlir import ir

        norm = self.chain.normalize
        kind = norm.attributes["kind"].value
        stat = "max" if kind == "softmax" or (kind == "online" and list(norm.regions[1].blocks)) else "none"
        operands = [modded] + ([keep] if keep is not None else []) + [d_probs]
        attributes = {"kind": ir.StringAttr.get(kind), "stat": ir.StringAttr.get(stat),
                      "operandSegmentSizes": ir.DenseI32ArrayAttr.get([1, int(keep is not None), 1])}
        op = self._create("attn.normalize_grad", [modded.type], operands, 4, norm.location, entry, attributes)
        if kind == "online":
            prob, finalize = norm.regions[0], norm.regions[2]
            copy_region(prob, op.regions[0], outer, "prob")
            copy_region(finalize, op.regions[1], outer, "finalize")
            self._pair_grad(prob, op.regions[2], outer, "prob", norm.location)
            self._pair_grad(finalize, op.regions[3], outer, "finalize", norm.location)
        return op.results[0]

    def _pair_grad(self, source, target, outer, where: str, loc) -> None:
        """(x, y, g) -> (g * d/dx, g * d/dy) of a normalizer region taking two f32 arguments."""
        from mlir import ir

        f32 = ir.F32Type.get()
        locs = [a.location for a in source.blocks[0].arguments] + [loc]
        block = target.blocks.append(f32, f32, f32, arg_locs=locs)
        derivative = RegionDerivative(source, block, list(block.arguments[:2]), outer, where)
        with loc:
            grads, _ = derivative.gradients(block.arguments[2], [0, 1])
        self._finish(block, grads, source)

    def _score_mod_grads(self, entry, scores, d_modded, outer) -> list:
        """attn.score_mod_grad, then one attn.closure_grad per closure parameter the gradient reaches."""
        from mlir import ir

        source = self.chain.score_mod.regions[0]
        loc = self.chain.score_mod.location
        op = self._create("attn.score_mod_grad", [scores.type], [scores, d_modded], 1, loc, entry)
        block, derivative = self._grad_block(op, source, outer)
        with loc:
            (d_scores,), reads = derivative.gradients(block.arguments[1], [0])
            self._finish(block, [d_scores], source)
        results = [op.results[0]]
        params = list(entry.arguments)[2:]
        reached = [p for p in params if _float_tensor(p) and any(r.closure == p for r in reads)]
        for param in reached:
            shape = param.type.shape
            grad_type = ir.RankedTensorType.get(shape, ir.F32Type.get())
            op = self._create("attn.closure_grad", [grad_type], [scores, d_modded, param], 1, loc, entry)
            block, derivative = self._grad_block(op, source, outer)
            with loc:
                _, reads = derivative.gradients(block.arguments[1], [])
                groups = []
                for read in reversed(reads):
                    if read.closure == param:
                        groups += [read.grad] + read.indices
                self._finish(block, groups, source)
            results.append(op.results[0])
        return results

    def _grad_block(self, op, source, outer):
        """The block (score, grad, b, h, q_idx, kv_idx) of a score_mod derivative op; the
        arguments the score_mod also has keep its arguments' locations."""
        from mlir import ir

        f32, index = ir.F32Type.get(), ir.IndexType.get()
        locs = [a.location for a in source.blocks[0].arguments]
        block = op.regions[0].blocks.append(f32, f32, index, index, index, index,
                                            arg_locs=[locs[0], op.location] + locs[1:])
        args = [block.arguments[0]] + list(block.arguments[2:])
        return block, RegionDerivative(source, block, args, outer, "score_mod")

    def _finish(self, block, values: list, source) -> None:
        """End `block` with a yield at the location of the `source` region's yield."""
        from mlir import ir
        from mlir.dialects import gpu

        with ir.InsertionPoint(block), list(source.blocks[0].operations)[-1].location:
            gpu.yield_(values)
        prune(block)


def _float_tensor(value) -> bool:
    from mlir import ir

    return isinstance(value.type, ir.RankedTensorType) and is_float_element(value.type)
