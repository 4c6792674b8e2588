"""Compiling a Gluon kernel instantiation to Triton GPU IR for sm90 (the text the runtime
compiles on the GPU), shared by the kernels in this package."""
from __future__ import annotations

from triton.experimental.gluon import language as gl

_DTYPES = {"bf16": gl.bfloat16, "fp16": gl.float16}


def descriptor_type(element: str, block: list) -> str:
    """The signature type of a TMA descriptor argument: its block and NVMMA shared layout."""
    layout = gl.NVMMASharedLayout.get_default_for(block, _DTYPES[element])
    return f"tensordesc<{element}{block},{layout!r}>"


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
    options = backend.parse_options({"num_warps": num_warps, "maxnreg": max_registers, **source.parse_options()})
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    module = source.make_ir(target, options, backend.get_codegen_implementation(options), backend.get_module_map(),
                            context)
    stages = {}
    backend.add_stages(stages, options, source.language)
    return str(stages["ttgir"](module, {}))
