"""Compiling a Gluon kernel instantiation to Triton GPU IR for sm90 (the text the runtime
compiles on the GPU), shared by the kernels in this package."""
from __future__ import annotations

from triton.experimental.gluon import language as gl

_DTYPES = {"bf16": gl.bfloat16, "fp16": gl.float16, "fp32": gl.float32}


def descriptor_type(element: str, block: list) -> str:
    """The signature type of a TMA descriptor argument: its block and NVMMA shared layout."""
    layout = gl.NVMMASharedLayout.get_default_for(block, _DTYPES[element])
    return f"tensordesc<{element}{block},{layout!r}>"


def backward_ttgir(kernel, element: str, descriptors: list, pointers: tuple, row_stats: tuple, constants: dict,
                   num_warps: int, max_registers: int, float32: tuple = (), closures: tuple = ()) -> str:
    """A backward kernel's Triton GPU IR: `descriptors` [(role, element, block)] first, then each
    (role, strides) of `pointers` with its i32 strides; `row_stats` are float32 and their row
    strides any, the others' strides 16-element multiples (kernel_args.aligned_ok), of
    `element`'s type unless in `float32`; then, for a kernel that takes a `closures` tuple, a
    pointer to each closure tensor, of `closures`' element types (Triton's names)."""
    signature = {f"{role}_desc": descriptor_type(elt, block) for role, elt, block in descriptors}
    divisible = []
    for role, strides in pointers:
        name = "o" if role == "out" else role
        signature[f"{name}_ptr"] = "*fp32" if role in row_stats + float32 else f"*{element}"
        # i32 strides (kernel_args.aligned_ok checks that they fit): half the registers of i64
        # ones, which the dK/dV kernels' consumers, holding four tile accumulators, are short of.
        signature.update({f"{name}_stride{d}": "i32" for d in range(strides)})
        divisible += [f"{name}_ptr"] + ([] if role in row_stats else [f"{name}_stride{d}" for d in range(strides)])
    if "closures" in kernel.arg_names:
        signature["closures"] = tuple(f"*{elt}" for elt in closures)
    return gluon_ttgir(kernel, signature, constants, divisible, num_warps, max_registers)


def gluon_ttgir(kernel, signature: dict, constants: dict, divisible: list, num_warps: int, max_registers: int) -> str:
    """`kernel` with `constants` as its constexprs and `divisible` arguments hinted 16-divisible,
    through Triton's stages up to the one that writes Triton GPU IR (triton.compile would go on to
    LLVM, PTX and a cubin, ~2 s with ptxas, that nothing here uses)."""
    from triton._C.libtriton import ir
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend
    from triton.experimental.gluon._runtime import GluonASTSource

    names = list(signature)
    attrs = {(names.index(name),): [["tt.divisibility", 16]] for name in divisible}
    signature = dict(signature, **{name: "constexpr" for name in constants})
    source = GluonASTSource(kernel, signature, constants, attrs)
    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    registers = {"maxnreg": max_registers} if max_registers else {}
    options = backend.parse_options({"num_warps": num_warps, **registers, **source.parse_options()})
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    module = source.make_ir(target, options, backend.get_codegen_implementation(options), backend.get_module_map(),
                            context)
    stages = {}
    backend.add_stages(stages, options, source.language)
    return str(stages["ttgir"](module, {}))
