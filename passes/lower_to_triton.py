"""`attn-lower-to-triton`: an L1 kernel function becomes a Triton IR kernel (`tt.func`, level L2).

The L1 function (from `attn-tile`, or `attn-chunk-recurrence` for linear attention) is rewritten
op by op into tt/arith/math/scf ops on tensors:

* Each tensor argument becomes a `!tt.ptr<elt>` plus its strides; the program coordinates come
  from `tt.get_program_id`, with the query block on axis x (fastest, so the programs that share
  K/V run together) walked from the last block down (causal rows are longest at the end, so the
  longest programs start first), or, where the tiling marked `attn.heavy_blocks`, from the
  heaviest block, across sections of heads that fill `wave-programs` (triton/program_order.py).
  The launch grid is `attn.grid` on the tt.func, in x, y, z order.
* A tile load (`tensor.extract_slice` [+ `tensor.pad`]) is one `tt.load` over a pointer tensor
  built from `tt.make_range`/`tt.expand_dims`/`tt.broadcast`/`tt.addptr`, masked where the slice is
  ragged and filled with zeros. Tile dimensions that are not powers of two (head dims like 80) are
  padded to the next power of two (at least 16, what `tt.dot` needs) and masked, so inputs are
  never copied. `tensor.insert_slice` into a destination argument is a masked `tt.store`.
* `linalg.matmul` is `tt.dot` (f32 accumulator), `linalg.transpose` is `tt.trans`, `linalg.fill` a
  `tt.splat`, `linalg.reduce` a `tt.reduce` (then combined with its init), and `linalg.generic` is
  its body applied to whole tensors: a value that depends only on rows stays [M, 1], only on
  columns [1, N], and is broadcast where it meets a full tile, so `doc[q_idx]` gathers M values,
  not M*N. `linalg.index` is a `tt.make_range`; `tensor.extract` from a closure tensor is a masked
  gather `tt.load` (an out-of-range index reads 0). Math ops Triton cannot lower on both targets
  (negf, tanh, log1p, expm1, powf, floordivsi) are expanded into ones it can. A generic with
  reduction iterators whose body ends in `out + value` (a contraction that is not a matmul) is
  computed over its whole iteration domain and then `tt.reduce`d.
* `attn.scatter_add` (the backward's closure gradients) is a relaxed `tt.atomic_rmw` fadd per
  lane into its destination argument, masked where an index falls outside it; where every index
  tile is constant along a tile axis (it depends on the head, or on the row alone) the values are
  `tt.reduce`d along that axis first, so fewer atomics contend for one address.
* `scf.for` stays `scf.for` with an i32 induction variable; `index` values become i32 (positions
  and their arithmetic in mods are 32-bit on the GPU). A destination threaded through a loop and
  stored inside it is memory, not an iter_arg.
* The block tables (`arith.constant` tensors indexed by the query block) are folded into
  arithmetic where they are affine in the block id (causal masks, unmasked attention), otherwise
  they become extra `!tt.ptr<i32>` arguments read with scalar loads; their contents are in
  `attn.tables` on the tt.func.

`assume-aligned` (default) specializes for the common layout of q/k/v/out/lse, the workspaces
and the closure tensors with rows of a multiple of 16 elements (`abi.aligned_assumption`): unit stride
in the last dimension (no argument for it), 16-byte aligned base pointers and strides that are
multiples of 16 elements (`tt.divisibility` hints, which vectorized loads need), i32 strides and
32-bit offsets inside a tile; the offset of a tile's origin is always computed in i64. Of the
other closure tensors it assumes a unit last stride alone. Without
it every stride is an i64 argument and every offset 64-bit, for any layout. The runtime checks a
call against the aligned variant's assumptions and falls back to the general one.

With `tensor-descriptors` the aligned variant loads a 2-D tile of such a float argument through a
`tt.make_tensor_descriptor` over the argument's last two dimensions at the program's leading
offsets (batch, head), made once at function level, and `tt.descriptor_load` at the tile's
offsets: on Hopper a TMA copy, which fills zeros past the tensor's end just as the masked load
does. Only where the slice is exactly the tile cut at the tensor's end (not a tile cut shorter by
per-entry lengths, which a descriptor would read past) and its leading offsets do not vary in a
loop; every other load keeps its pointers.

`attn.kernel_args` on the tt.func names each kernel argument (`q`, `q.stride0`, ..., `c0`,
`out`, `lse`, `table0`), from the L1 function's `attn.arg_roles` where it has them (`w0`,
`state`, ...); `attn.block_m`/`attn.block_n` are kept. A module of several kernels (the split
chunked recurrence) keeps them in order, the order they run in. Inside ae-mlir the kernel body
and reduce combiners end with `gpu.yield` (IRDL cannot declare terminators, see
dialects/tt.irdl.mlir); `triton_text` prints the module as Triton parses it.

This module is the pass (name, options, summary) and `triton_text`; the lowering itself is
the `passes/triton/` package, one module per concern.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from ..core import abi
from ..core.context import CompileError, parse_module
from . import ModulePass, option
from .triton import Kernel


def triton_text(module, kernel=None) -> str:
    """The module as Triton parses it: generic form, kernel and combiner terminators renamed.
    With `kernel` (one of its tt.func ops), a module holding only that kernel: Triton compiles
    one kernel per module."""
    from mlir import ir

    op = getattr(module, "operation", module)
    kernels = [k for k in op.regions[0].blocks[0].operations if k.operation.name == "tt.func"]
    if not kernels:
        raise CompileError("the module holds no tt.func kernel; run attn-lower-to-triton first")
    if kernel is not None:
        with op.context, op.location:
            single = ir.Module.create()
            kernel.clone(ip=ir.InsertionPoint(single.body))
        op = single.operation
    if kernel is not None and "attn.ttgir" in kernel.attributes:
        # attn-lower-to-gluon's stub: the kernel is Triton GPU IR, compiled by Triton's frontend.
        return ir.StringAttr(kernel.attributes["attn.ttgir"]).value
    text = op.get_asm(print_generic_op_form=True)
    text = text.replace('"gpu.yield"() : () -> ()', '"tt.return"() : () -> ()')
    return text.replace('"gpu.yield"(', '"tt.reduce.return"(')


@dataclass(frozen=True)
class LowerToTriton(ModulePass):
    name: ClassVar[str] = "attn-lower-to-triton"
    summary: ClassVar[str] = ("Lower an L1 attention kernel to Triton IR (tt.func in generic form): tile "
                              "loads/stores, tt.dot, tt.reduce, scf.for over KV tiles")

    assume_aligned: bool = option(True, "specialize for unit last-dim strides, 16-byte aligned pointers and "
                                        "16-element-divisible strides of q/k/v/out, the workspaces and "
                                        "dense closure tensors (32-bit tile offsets)")
    input_precision: Literal["ieee", "tf32", "tf32x3"] = option(
        "ieee", "how tt.dot multiplies f32 tiles (16-bit inputs always use tensor cores)")
    tensor_descriptors: bool = option(
        False, "with assume-aligned, load 2-D tiles of aligned float arguments through TMA tensor "
               "descriptors made once per program (NVIDIA sm90 and later)")
    host_descriptors: bool = option(
        False, "with tensor-descriptors, take each descriptor as a kernel argument over the whole tensor, "
               "which the runtime makes on the host at each launch, rather than making it on the device in "
               "every program")
    fast_tanh: bool = option(
        False, "f32 math.tanh, and the logistic 1 / (1 + exp(-x)) as 0.5 + 0.5 tanh(x / 2), through the "
               "hardware's tanh approximation (PTX tanh.approx.f32, NVIDIA sm75 and later; 2^-11 relative "
               "error) rather than the exact expansions, where the value reaches no comparison")
    wave_programs: int = option(
        0, "the programs the GPU runs at once (its multiprocessors): kernels whose tiling marks "
           "attn.heavy_blocks start their heaviest blocks first across sections of heads that fill it "
           "(0: the heaviest block of each head first, head after head)")

    def __post_init__(self):
        if self.wave_programs < 0:
            raise ValueError(f"wave-programs must be at least 0, got {self.wave_programs}")

    def apply(self, module_op) -> None:
        from mlir import ir

        body = module_op.regions[0].blocks[0]
        kernels = [op.operation for op in body.operations
                   if op.operation.name == "func.func" and abi.GRID in op.operation.attributes]
        if not kernels:
            raise CompileError("attn-lower-to-triton needs an L1 kernel (a func.func with attn.grid); "
                               "run attn-tile first")
        for func in kernels:
            text = Kernel(func, self.assume_aligned, self.input_precision,
                          self.assume_aligned and self.tensor_descriptors, self.fast_tanh,
                          self.host_descriptors, self.wave_programs).build()
            parsed = parse_module(text, module_op.context, "<attn-lower-to-triton>")
            with module_op.context:
                parsed.body.operations[0].operation.clone(ip=ir.InsertionPoint(func))
            func.erase()
