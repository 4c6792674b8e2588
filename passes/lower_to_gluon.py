"""`attn-lower-to-gluon`: softmax attention with no score_mod, and no mask or the causal one,
becomes the warp-specialized Hopper kernel of `passes/gluon/attention_forward.py` (level L2, as
Triton GPU IR).

    L0: attn.score{scale} [-> attn.mask (q >= kv)] -> attn.normalize{softmax} -> attn.aggregate
    L2: tt.func @name {attn.ttgir = "<the kernel's Triton GPU IR>", attn.kernel_args = [...], ...}

The kernel is written in Gluon because the schedule it needs (a TMA loader warp, consumer
warpgroups overlapping exponentials with tensor-core products) is one Triton's own pipeliner does
not produce from Triton IR. The pass instantiates it for the module's shapes, element type, scale,
GQA group and mask (and, with `programs=N`, a persistent grid of at most N programs looping over
query blocks; with `warpgroups=2` at head dim 64, programs of two consumer warpgroups, 128 rows,
for the default three), and compiles it for sm90 with Triton's Gluon frontend (the text is Triton's; this
pass writes none). The tt.func it leaves is a stub whose `attn.ttgir` attribute holds the kernel:
`triton_text` prints that attribute, so `ae-opt --pipeline=triton` prints what the runtime
compiles. The runtime passes host-made TMA descriptors over the whole q, k, v (`<role>.tma`
labels) and out's and lse's strides but the last (the aligned variant's layout: unit last strides,
16-element multiples elsewhere).

With `backward=true` it writes the backward instead, as two stubs in launch order
(`passes/gluon/attention_backward.py`): `<name>_bwd_dq`, which also writes delta, and
`<name>_bwd_dkdv`, each taking host descriptors over q, k, v and do, then its pointers and their
strides (`backward_labels`); the backward preset takes it only when `warp_specialize` is asked for.
The backward's kernels take a score_mod too: its region and attn-differentiate's derivative of it
(`@<name>_grad`'s attn.score_mod_grad, consumed with the function) become Gluon functions the
kernels call where they recompute P and form dS (`passes/gluon/score_mod.py`; `fast-tanh` as
attn-lower-to-triton's).
With `reduce-dq=true` the backward is the five-product form instead
(`passes/gluon/attention_backward_fused.py`): `<name>_bwd_delta` (delta, and the float32 dQ sums
zeroed), `<name>_bwd_dkdvdq` (the dK/dV kernel that also adds dS K into the sums by TMA
reduce-adds, through a `dq_sums.tma` descriptor) and `<name>_bwd_convert` (dQ from the sums).

What it takes (anything else is a located error; the triton preset picks this pass only where
`presets.read_problem` found `simple_mask`, or for the backward `gluon_backward`): bf16 or f16 q,
k, v of one type; Dk = Dv in {64, 128}; query heads a multiple of the KV heads; the causal mask
with as many queries as keys; in the backward, a score_mod (its closure tensors' gradients are
the Triton IR kernels' to compute: the presets keep such a backward there). Every
kernel's grid is 1-D (work items of a query or key block, batch entry and head), so batch x heads
has no grid-axis limit.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..core import abi
from ..core.context import CompileError
from ..core.grid_schedule import section_heads
from . import ModulePass, option
from .differentiate import CLOSURE_ARGS, GRAD_SUFFIX
from .l1_ops import fail

# Kernel constants the stub records (the runtime reads nothing else of the kernel).
TTGIR = "attn.ttgir"
MAX_REGISTERS = "attn.max_registers"
HEAD_DIMS = (64, 128)
_ELEMENTS = {"bf16": "bf16", "f16": "fp16"}


def causal_mask(region) -> bool:
    """Whether an attn.mask region is exactly q_idx >= kv_idx (in either operand order)."""
    from mlir import ir

    block = region.blocks[0]
    ops = [op.operation for op in block.operations]
    if len(ops) != 2 or ops[0].name != "arith.cmpi" or ops[1].name != "gpu.yield":
        return False
    if list(ops[1].operands) != [ops[0].results[0]]:
        return False
    predicate = ir.IntegerAttr(ops[0].attributes["predicate"]).value
    query, key = block.arguments[2], block.arguments[3]
    # arith.cmpi predicates: 5 sge, 3 sle, 9 uge, 7 ule.
    lhs, rhs = ops[0].operands
    return ((predicate in (5, 9) and (lhs, rhs) == (query, key))
            or (predicate in (3, 7) and (lhs, rhs) == (key, query)))


@dataclass(frozen=True)
class Match:
    """What the kernel is instantiated from."""

    func: object
    scale: float
    causal: bool
    score_mod: object = None  # the attn.score_mod op (the backward's kernels take one)


def match(func, backward: bool = False) -> Match:
    """The L0 function as the Gluon kernels take it (the backward's a score_mod too); a located
    CompileError where they cannot."""
    from mlir import ir

    scale, causal, seen, mod = None, False, [], None
    for op in func.regions[0].blocks[0].operations:
        op = op.operation
        seen.append(op.name)
        if op.name == "attn.score":
            scale = ir.FloatAttr(op.attributes["scale"]).value
        elif op.name == "attn.mask":
            if len(op.operands) or not causal_mask(op.regions[0]):
                raise fail(op, "is not the causal mask (q_idx >= kv_idx), the only mask attn-lower-to-gluon "
                               "lowers")
            causal = True
        elif op.name == "attn.normalize":
            kind = ir.StringAttr(op.attributes["kind"]).value
            if kind != "softmax" or any(len(r.blocks) for r in op.regions):
                raise fail(op, f"is a {kind} normalizer; attn-lower-to-gluon lowers softmax")
        elif op.name == "attn.score_mod" and backward:
            from .gluon.score_mod import check, closures_of

            q, k = abi.input_types(func)[:2]
            check(op, (q.shape[0], q.shape[1], q.shape[2], k.shape[2]), closures_of(abi.input_types(func), 3))
            mod = op
        elif op.name not in ("attn.aggregate", "func.return"):
            raise fail(op, "is not lowered by attn-lower-to-gluon (softmax attention with no score_mod, or one "
                           "in the backward, and no mask or the causal one)")
    if scale is None or "attn.aggregate" not in seen:
        raise fail(func, "is not an attention function (attn.score ... attn.aggregate)")
    return Match(func, scale, causal, mod)


def _check_types(m: Match) -> tuple:
    q, k, v = abi.input_types(m.func)[:3]
    elt = str(q.element_type)
    if elt not in _ELEMENTS or str(k.element_type) != elt or str(v.element_type) != elt:
        raise fail(m.func, f"has {q.element_type} inputs; attn-lower-to-gluon takes bf16 or f16 q, k, v of one type")
    (batch, heads, seq_q, dk), (_, kv_heads, seq_k, _), dv = q.shape, k.shape, v.shape[3]
    if dk != dv or dk not in HEAD_DIMS:
        raise fail(m.func, f"has head dims {dk} (q, k) and {dv} (v); attn-lower-to-gluon takes equal ones "
                           f"of {' or '.join(map(str, HEAD_DIMS))}")
    if heads % kv_heads:
        raise fail(m.func, f"has {heads} query heads over {kv_heads} KV heads, not a multiple")
    if seq_k < 1 or seq_q < 1:
        raise fail(m.func, "has no queries or no keys")
    if m.causal and seq_q != seq_k:
        raise fail(m.func, f"is causal with {seq_q} queries and {seq_k} keys; attn-lower-to-gluon takes "
                           "equal lengths")
    return _ELEMENTS[elt], batch, heads, heads // kv_heads, seq_q, seq_k, dk


@dataclass(frozen=True)
class Instance:
    """The kernel as the pass instantiates it for one L0 function."""

    element: str  # Triton's name of q's type
    dim: int
    constants: dict  # the kernel's constexprs (`kernel_constants`)
    grid: tuple
    score_mod: object = None  # the backward's score mod as Gluon functions (gluon.score_mod.ScoreMod)


def instance(func, pingpong: bool, programs: int = 0, wave_programs: int = 0, consumers: int = 0) -> Instance:
    """What the pass instantiates for the L0 function, with `programs` persistent programs (0: a
    program per query block, causal ones started in sections of heads that fill `wave_programs`)
    and `consumers` consumer warpgroups (0: the head dim's); a located CompileError where it
    cannot."""
    from .gluon.attention_forward import WARPGROUP_CHOICES, block_m, kernel_constants, warpgroups

    m = match(func)
    element, batch, heads, group, seq_q, seq_k, dim = _check_types(m)
    if consumers and consumers not in WARPGROUP_CHOICES[dim]:
        raise fail(func, f"asks for {consumers} consumer warpgroups at head dim {dim}; the kernel takes "
                         f"{' or '.join(map(str, WARPGROUP_CHOICES[dim]))} there")
    if pingpong and warpgroups(dim, consumers) != 2:
        raise fail(func, f"asks for ping-pong with {warpgroups(dim, consumers)} consumer warpgroups (head dim "
                         f"{dim}); the ping-pong schedule takes two")
    blocks = -(-seq_q // block_m(dim, consumers))
    # A persistent grid's programs take fixed items, head after head (grid_schedule); a grid of
    # every item starts them in order, so causal ones go longest first across a section.
    section = section_heads(wave_programs, blocks, batch * heads) if m.causal and not programs else 1
    constants = kernel_constants(batch, heads, group, seq_q, seq_k, dim, m.scale, m.causal, pingpong, programs > 0,
                                 section, consumers)
    items = blocks * batch * heads
    return Instance(element, dim, constants, (min(items, programs) if programs else items, 1, 1))


def _score_mod_grad(func, grad_func):
    """attn-differentiate's attn.score_mod_grad op in @<name>_grad."""
    if grad_func is not None:
        for op in grad_func.regions[0].blocks[0].operations:
            if op.operation.name == "attn.score_mod_grad":
                return op.operation
    raise fail(func, "has a score_mod whose derivative attn-lower-to-gluon reads from attn-differentiate's "
                     "@<name>_grad (run attn-differentiate first)")


def backward_instances(func, reduce_dq: bool = False, grad_func=None,
                       fast_tanh: bool = False) -> list[tuple[str, Instance]]:
    """The backward's kernels as the pass instantiates them for the L0 function, in launch order:
    "dq" and "dkdv", or with `reduce_dq` "delta", "dkdvdq" and "convert"; a score_mod's
    derivative is read from `grad_func` (attn-differentiate's). A located CompileError where it
    cannot."""
    from .gluon import attention_backward as bwd, attention_backward_fused as fused
    from mlir import ir

    from .gluon.score_mod import closures_of, lower_score_mod

    m = match(func, backward=True)
    element, batch, heads, group, seq_q, seq_k, dim = _check_types(m)
    kv_heads = heads // group
    mod = None
    if m.score_mod is not None:
        grad_op = _score_mod_grad(func, grad_func)
        # The derivative's closure parameters, after its two tiles, stand for the forward's
        # arguments attn.closure_args names (none where it reads none).
        grad_closures = closures_of(abi.input_types(grad_func), 2,
                                    list(ir.DenseI64ArrayAttr(grad_func.attributes[CLOSURE_ARGS]))) \
            if CLOSURE_ARGS in grad_func.attributes else {}
        mod = lower_score_mod(m.score_mod, grad_op, fast_tanh, closures_of(abi.input_types(func), 3), grad_closures)
    if reduce_dq:
        return [(kernel, Instance(element, dim,
                                  fused.kernel_constants(kernel, heads, kv_heads, seq_q, seq_k, dim, m.scale, m.causal),
                                  fused.grid(kernel, batch, heads, kv_heads, seq_q, seq_k), mod))
                for kernel in fused.KERNELS]
    return [(kernel, Instance(element, dim,
                              bwd.kernel_constants(kernel, heads, kv_heads, seq_q, seq_k, m.scale, m.causal),
                              bwd.grid(kernel, batch, heads, kv_heads, seq_q, seq_k), mod))
            for kernel in bwd.KERNELS]


def lowers(func, backward: bool = False) -> bool:
    """Whether this pass lowers the L0 function (presets.read_problem's `simple_mask`; with
    `backward`, its `gluon_backward`)."""
    try:
        _check_types(match(func, backward))
    except CompileError:
        return False
    return True


def kernel_labels() -> list[str]:
    """The tt.func's argument labels, in the Gluon kernel's order: each descriptor is followed by
    the tensor's four sizes and four strides (abi.descriptor_label)."""
    labels = []
    for role in abi.INPUTS:
        label = abi.descriptor_label(role)
        labels += [label] + [f"{label}.size{d}" for d in range(4)] + [f"{label}.stride{d}" for d in range(4)]
    return labels + ["out"] + [f"out.stride{d}" for d in range(3)] + ["lse"] + [f"lse.stride{d}" for d in range(2)]


def backward_labels(kernel: str, closures: int = 0) -> list[str]:
    """A backward kernel's argument labels: its descriptors, each followed by the tensor's four
    sizes and four strides, then its pointers with their strides, then, in a kernel that takes
    the score mod's `closures` (the dQ and dK/dV kernels), c0, c1, ..."""
    from .gluon import attention_backward as bwd, attention_backward_fused as fused

    if kernel in fused.KERNELS:
        roles, pointers = fused.descriptor_roles(kernel), fused.pointer_args(kernel)
    else:
        roles, pointers = bwd.DESCRIPTORS, bwd.pointer_args(kernel)
    labels = []
    for role in roles:
        label = abi.descriptor_label(role)
        labels += [label] + [f"{label}.size{d}" for d in range(4)] + [f"{label}.stride{d}" for d in range(4)]
    for role, strides in pointers:
        labels += [role] + [f"{role}.stride{d}" for d in range(strides)]
    if kernel in ("dq", "dkdv", "dkdvdq"):
        labels += [abi.capture(i) for i in range(closures)]
    return labels


def _stub(func, name: str, grid, block_m: int, block_n: int, labels: list, registers: int, ttgir: str) -> None:
    """A tt.func before `func` that stands for a Gluon kernel: its launch facts and its Triton GPU IR."""
    from mlir import ir

    with func.context, func.location:
        i64 = ir.IntegerType.get_signless(64)
        attributes = {
            "function_type": ir.TypeAttr.get(ir.FunctionType.get([], [])),
            "sym_name": ir.StringAttr.get(name),
            "sym_visibility": ir.StringAttr.get("public"),
            "noinline": ir.IntegerAttr.get(ir.IntegerType.get_signless(1), 0),
            abi.GRID: ir.DenseI64ArrayAttr.get(list(grid)),
            abi.BLOCK_M: ir.IntegerAttr.get(i64, block_m),
            abi.BLOCK_N: ir.IntegerAttr.get(i64, block_n),
            abi.KERNEL_ARGS: ir.ArrayAttr.get([ir.StringAttr.get(s) for s in labels]),
            abi.TABLES: ir.ArrayAttr.get([]),
            MAX_REGISTERS: ir.IntegerAttr.get(i64, registers),
            TTGIR: ir.StringAttr.get(ttgir),
        }
        stub = ir.Operation.create("tt.func", attributes=attributes, regions=1, loc=func.location,
                                   ip=ir.InsertionPoint(func))
        block = stub.regions[0].blocks.append()
        ir.Operation.create("gpu.yield", ip=ir.InsertionPoint(block))


@dataclass(frozen=True)
class LowerToGluon(ModulePass):
    name: ClassVar[str] = "attn-lower-to-gluon"
    summary: ClassVar[str] = ("Lower softmax attention (no score_mod; no mask or causal), or its backward, to "
                              "warp-specialized Hopper kernels in Triton GPU IR, compiled from Gluon (sm90)")

    pingpong: bool = option(False, "the forward's two consumer warpgroups take turns issuing their tensor-core "
                                   "products (FlashAttention-3's ping-pong schedule)")
    backward: bool = option(False, "the backward's kernels instead of the forward's: dQ (which writes delta) and "
                                   "dK/dV, in launch order")
    reduce_dq: bool = option(False, "with backward: the five-product form, whose dK/dV kernel adds dQ into float32 "
                                    "sums by TMA reduce-adds (in an order that varies between runs), between a "
                                    "kernel that writes delta and zeroes the sums and one that converts them")
    programs: int = option(0, "the forward's grid: 0 for a program per query block of a batch entry and head, "
                              "N for at most N persistent programs, each taking one block a round")
    fast_tanh: bool = option(False, "the backward's score_mod takes tanh from the hardware's approximation "
                                    "(tanh.approx, sm75+), as attn-lower-to-triton's fast-tanh does")
    wave_programs: int = option(0, "the programs the GPU runs at once (its multiprocessors): a causal forward's "
                                   "grid of a program per block starts every head's longest block first across "
                                   "sections of heads that fill it (0: head after head)")
    warpgroups: int = option(0, "the forward's consumer warpgroups of 64 query rows: 2, or 3 at head dim 64 (0: "
                                "three at head dim 64, two at 128)")

    def __post_init__(self):
        for name, value in (("programs", self.programs), ("wave-programs", self.wave_programs),
                            ("warpgroups", self.warpgroups)):
            if value < 0:
                raise ValueError(f"{name} must be at least 0, got {value}")

    def apply(self, module_op) -> None:
        from mlir import ir

        if self.reduce_dq and not self.backward:
            raise CompileError("attn-lower-to-gluon: reduce-dq is an option of the backward (backward=true)")
        funcs = abi.functions(module_op)
        grads = {}
        if self.backward:
            # attn-differentiate's @<name>_grad beside @<name>: the derivative of its score_mod.
            names = {abi.name(f) for f in funcs}
            grads = {abi.name(f): f for f in funcs
                     if abi.name(f).endswith(GRAD_SUFFIX) and abi.name(f)[:-len(GRAD_SUFFIX)] in names}
            funcs = [f for f in funcs if abi.name(f) not in grads]
        if len(funcs) != 1:
            raise CompileError(f"attn-lower-to-gluon lowers a module with one function (and its @<name>_grad), "
                               f"found {len(funcs)}")
        func = funcs[0]
        name = ir.StringAttr(func.attributes["sym_name"]).value
        if self.backward:
            self._backward(func, name, grads.get(name + GRAD_SUFFIX))
        else:
            from .gluon import attention_forward as fwd

            kernel = instance(func, self.pingpong, self.programs, self.wave_programs, self.warpgroups)
            _stub(func, name, kernel.grid, fwd.block_m(kernel.dim, self.warpgroups), fwd.BLOCK_N, kernel_labels(),
                  fwd.MAX_REGISTERS[fwd.warpgroups(kernel.dim, self.warpgroups)],
                  fwd.compile_ttgir(kernel.element, kernel.dim, kernel.constants))
        func.erase()
        for grad in grads.values():
            grad.erase()

    def _backward(self, func, name: str, grad_func) -> None:
        from .gluon import attention_backward as bwd, attention_backward_fused as fused

        if self.pingpong or self.programs or self.warpgroups:
            raise fail(func, "asks for the backward with ping-pong, persistent programs or consumer warpgroups, "
                             "options of the forward kernel only")
        for kernel, inst in backward_instances(func, self.reduce_dq, grad_func, self.fast_tanh):
            if self.reduce_dq:
                block_m, block_n = (bwd.BLOCK_M, bwd.BLOCK_N) if kernel == "dkdvdq" else (fused.SUM_ROWS, inst.dim)
                registers = bwd.MAX_REGISTERS if kernel == "dkdvdq" else 0
                ttgir = fused.compile_ttgir(kernel, inst.element, inst.dim, inst.constants, inst.score_mod)
            else:
                block_m, block_n = (2 * bwd.HALF, bwd.DQ_BLOCK_N) if kernel == "dq" else (bwd.BLOCK_M, bwd.BLOCK_N)
                registers = bwd.MAX_REGISTERS
                ttgir = bwd.compile_ttgir(kernel, inst.element, inst.dim, inst.constants, inst.score_mod)
            closures = len(inst.score_mod.closures) if inst.score_mod is not None else 0
            _stub(func, abi.backward_kernel_name(name, kernel), inst.grid, block_m, block_n,
                  backward_labels(kernel, closures), registers, ttgir)
