"""Triton interop for the TTIR interpreter's tests (imports triton lazily): `ttir_from_triton` gives
Triton's own TTIR for a @triton.jit function in generic form, without a GPU;
`generic_from_pretty_ttir` does the rewrite."""

import re

from tt_interp import _Type

__all__ = ["generic_from_pretty_ttir", "ttir_from_triton"]


# Triton interop: Triton prints TTIR only in its custom syntax, which needs Triton's dialects to
# parse. The upstream bindings already know the syntax of arith/math/scf, so only the tt ops are
# rewritten here, line by line, into generic form; tt.func/return/call share func's syntax and
# properties, so they parse as func ops and are renamed back after generic printing.

_PRETTY_TT = re.compile(r"^(\s*)(?:(%[\w#]+)\s*=\s*)?tt\.([\w.]+)(.*)$")
_KEYWORDS = {
    "cacheModifier": ("cache", {"none": 1, "ca": 2, "cg": 3, "wb": 4, "cs": 5, "wt": 6, "cv": 7}),
    "evictionPolicy": ("evict", {"evict_normal": 1, "evict_first": 2, "evict_last": 3}),
    "inputPrecision": ("inputPrecision", {"tf32": 0, "tf32x3": 1, "ieee": 2, "bf16x3": 3, "bf16x6": 4}),
    "rounding": ("rounding", {"rtz": 0, "rtne": 1}),
    "propagateNan": ("propagateNan", {"none": 0, "all": 65535}),
}
_AXES = {"x": 0, "y": 1, "z": 2}
_CONVERSIONS = {"splat", "broadcast", "expand_dims", "reshape", "trans", "fp_to_fp", "bitcast"}
_SAME_TYPE = {"precise_sqrt", "precise_divf", "clampf"}


def _split_top(text, sep):
    """Split at `sep` outside brackets; '->' is an arrow, not a closing bracket."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "<([{":
            depth += 1
        elif ch in ">)]}" and not (ch == ">" and i and text[i - 1] == "-"):
            depth -= 1
        elif depth == 0 and text.startswith(sep, i):
            parts.append(text[start:i].strip())
            start = i + len(sep)
    parts.append(text[start:].strip())
    return parts


def _with_elem(type_text, elem):
    t = _Type(type_text)
    return f"tensor<{'x'.join(map(str, t.shape))}x{elem}>" if t.shape else elem


def _with_defaults(attrs, *defaults):
    """Spell out inherent attributes Triton's printer elides at their default, as the compiler does."""
    given = {a.split("=")[0].strip() for a in attrs}
    return [d for d in defaults if d.split(" =")[0] not in given] + attrs


def _generic_tt_line(indent, result, name, rest):
    head, types = (_split_top(rest, " : ") + [""])[:2]
    attr_text = ""
    dict_match = re.search(r"\{(.*)\}\s*$", head)
    if dict_match:
        attr_text, head = dict_match.group(1), head[:dict_match.start()]
    operands = re.findall(r"%[\w#]+", head)
    attrs = [a for a in _split_top(attr_text, ",") if a]
    for key, value in re.findall(r"(\w+)\s*=\s*(\w+)", re.sub(r"%[\w#]+", "", head)):
        if key not in _KEYWORDS:
            raise NotImplementedError(f"generic_from_pretty_ttir: keyword {key} of tt.{name}")
        prop, values = _KEYWORDS[key]
        attrs.append(f"{prop} = {values[value]} : i32")

    if name in ("get_program_id", "get_num_programs"):
        attrs.append(f"axis = {_AXES[head.strip()]} : i32")
        in_types, out_types = [], [types]
    elif name == "make_range":
        in_types, out_types = [], [types]
    elif name in _CONVERSIONS:
        src, dst = _split_top(types, "->")
        in_types, out_types = [src], [dst]
    elif name in _SAME_TYPE:
        in_types, out_types = [types] * len(operands), [types]
    elif name == "addptr":
        in_types = _split_top(types, ",")
        out_types = in_types[:1]
    elif name == "load":
        pointee = re.search(r"!tt\.ptr<([^,>]+)", types).group(1)
        in_types = [types, _with_elem(types, "i1"), _with_elem(types, pointee)][:len(operands)]
        out_types = [_with_elem(types, pointee)]
        sizes = ", ".join(str(int(len(operands) > i)) for i in range(3))
        attrs = _with_defaults(attrs, f"operandSegmentSizes = array<i32: {sizes}>",
                               "cache = 1 : i32", "evict = 1 : i32", "isVolatile = false")
    elif name == "store":
        pointee = re.search(r"!tt\.ptr<([^,>]+)", types).group(1)
        in_types = [types, _with_elem(types, pointee), _with_elem(types, "i1")][:len(operands)]
        out_types = []
        attrs = _with_defaults(attrs, "cache = 1 : i32", "evict = 1 : i32")
    elif name == "dot":
        ab, c = _split_top(types, "->")
        in_types, out_types = _split_top(ab, "*") + [c], [c]
        attrs = _with_defaults(attrs, "inputPrecision = 0 : i32", "maxNumImpreciseAcc = 0 : i32")
    elif name in ("reduce.return", "scan.return"):
        in_types, out_types = (_split_top(types, ",") if types else []), []
    else:
        raise NotImplementedError(f"generic_from_pretty_ttir: no rule for tt.{name}")

    lhs = f"{result} = " if result else ""
    attr_dict = f" {{{', '.join(attrs)}}}" if attrs else ""
    return (f'{indent}{lhs}"tt.{name}"({", ".join(operands)}){attr_dict} : '
            f'({", ".join(in_types)}) -> ({", ".join(out_types)})')


def generic_from_pretty_ttir(text):
    """Rewrite TTIR as Triton prints it (custom syntax, no locations) into MLIR generic form."""
    from mlir.ir import Context, Module

    lines = []
    for line in text.splitlines():
        m = _PRETTY_TT.match(line)
        if m is None:
            lines.append(line)
        elif m.group(3) in ("func", "return", "call"):
            lines.append(line.replace(f"tt.{m.group(3)}", f"func.{m.group(3)}", 1))
        else:
            lines.append(_generic_tt_line(*m.groups()))
    with Context() as ctx:
        ctx.allow_unregistered_dialects = True
        generic = Module.parse("\n".join(lines)).operation.get_asm(print_generic_op_form=True)
    return re.sub(r'"func\.(func|return|call)"', r'"tt.\1"', generic)


def ttir_from_triton(fn, signature, constexprs=None, target=("cuda", 90, 32)):
    """Triton's own TTIR for the @triton.jit `fn`, in generic form; needs no GPU nor driver.

    `triton.compile` would also run the later stages (ptxas), so this stops after the `ttir` stage:
        backend = triton.compiler.compiler.make_backend(GPUTarget("cuda", 90, 32))
        src = ASTSource(fn, signature, constexprs)
        options = backend.parse_options(src.parse_options())
        context = ir.context(); ir.load_dialects(context); backend.load_dialects(context)
        module = src.make_ir(target, options, backend.get_codegen_implementation(options),
                             backend.get_module_map(), context)
        stages = {}; backend.add_stages(stages, options, src.language)
        stages["ttir"](module, metadata={})        # CUDABackend.make_ttir: target-independent passes
        module.str_nodebug()                       # custom syntax, no locations
    """
    from triton._C.libtriton import ir
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import ASTSource, make_backend

    gpu_target = GPUTarget(*target)
    backend = make_backend(gpu_target)
    src = ASTSource(fn=fn, signature=signature, constexprs=constexprs or {})
    options = backend.parse_options(src.parse_options())
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    module = src.make_ir(gpu_target, options, backend.get_codegen_implementation(options),
                         backend.get_module_map(), context)
    stages = {}
    backend.add_stages(stages, options, src.language)
    module = stages["ttir"](module, {})
    return generic_from_pretty_ttir(module.str_nodebug())
