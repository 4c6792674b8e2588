"""The ae-mlir passes: registry, typed options, and pipelines that mix them with upstream passes.

A pass is a frozen dataclass subclass of `ModulePass`: class attributes `name` and `summary`,
options as dataclass fields (field `block_m` is option `block-m`), and `apply(module_op)`, which
rewrites a `builtin.module` in place and raises `CompileError` with located diagnostics on bad
input. Adding a pass is one module under passes/ plus one line in `_REGISTRY`.

A `PassPipeline` registers a name for a sequence of passes, ae and upstream, with typed options of
its own (`attn-lower-to-cpu`): adding it to a PassManager adds its elements, each a pass of its own
in `--mlir-print-ir-after-all`.

Inside an `mlir.passmanager.PassManager` an ae pass is a Python external pass; upstream passes go
through the PassManager's own textual parser, so both kinds mix freely in one pipeline:

    builtin.module(attn-verify,canonicalize,attn-tile{block-m=64 block-n=64},func.func(cse))
"""
from __future__ import annotations

import abc
import contextlib
import dataclasses
import importlib
import os
import re
import shlex
import sys
import tempfile
import traceback
import typing
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from ..core.context import CompileError

# Pass name -> "module:Class" under this package; modules are imported on first use only.
_REGISTRY: dict[str, str] = {
    "attn-verify": "verify:AttnVerify",
    "attn-differentiate": "differentiate:Differentiate",
    "attn-fuse-online-softmax": "fuse_online_softmax:FuseOnlineSoftmax",
    "attn-tile": "tile:AttnTile",
    "attn-tile-backward": "tile_backward:AttnTileBackward",
    "attn-chunk-recurrence": "chunk_recurrence:ChunkRecurrence",
    "attn-fold-index-clamps": "fold_index_clamps:FoldIndexClamps",
    "attn-lower-to-cpu": "lower_to_cpu:LowerToCpu",
    "attn-cpu-grid-loops": "cpu_grid_loops:GridLoops",
    "attn-cpu-split-empty-tensors": "cpu_split_empty_tensors:SplitEmptyTensors",
    "attn-cpu-amx-tile-products": "cpu_amx_tile_products:AmxTileProducts",
    "attn-cpu-widen-matmul-operands": "cpu_widen_matmul_operands:WidenMatmulOperands",
    "attn-cpu-lower-scatter": "cpu_lower_scatter:LowerScatter",
    "attn-cpu-vectorize": "cpu_vectorize:Vectorize",
    "attn-cpu-carry-state-in-place": "cpu_carry_state:CarryStateInPlace",
    "attn-cpu-bufferize": "cpu_bufferize:Bufferize",
    "attn-cpu-pin-unit-inner-stride": "cpu_unit_inner_stride:PinUnitInnerStride",
    "attn-cpu-lower-vectors": "cpu_lower_vectors:LowerVectors",
    "attn-cpu-expand-sin-cos": "cpu_expand_sin_cos:ExpandSinCos",
    "attn-cpu-legalize-for-llvm": "cpu_legalize_for_llvm:LegalizeForLlvm",
    "attn-cpu-claim-programs": "cpu_claim_programs:ClaimPrograms",
    "attn-cpu-define-bf16-truncation": "cpu_bf16_truncation:DefineBf16Truncation",
    "attn-cpu-bf16-memory-as-integers": "cpu_bf16_memory:Bf16MemoryAsIntegers",
    "attn-cpu-no-avx512-bf16": "cpu_target_features:NoAvx512Bf16",
    "attn-cpu-narrow-isa": "cpu_target_features:NarrowIsa",
    "attn-cpu-amx-features": "cpu_target_features:AmxFeatures",
    "attn-lower-to-triton": "lower_to_triton:LowerToTriton",
    "attn-lower-to-gluon": "lower_to_gluon:LowerToGluon",
}

def option(default: Any, help: str) -> Any:
    """Declare a pass option: a dataclass field with a default and a one-line help text."""
    return dataclasses.field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class Registered(abc.ABC):
    """What ae passes and pass pipelines share: a name, a summary, and options that are the fields
    of a frozen dataclass subclass."""

    name: ClassVar[str]
    summary: ClassVar[str]

    @classmethod
    def options(cls) -> list[OptionInfo]:
        hints = typing.get_type_hints(cls)
        return [
            OptionInfo(f.name.replace("_", "-"), f.name, hints[f.name], f.default, f.metadata.get("help", ""))
            for f in dataclasses.fields(cls)
        ]

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> Registered:
        """Build the pass from option values keyed by CLI name (`block-m`) or field name.

        String values are parsed according to the field's type; other values must have that type.
        """
        by_key = {}
        for info in cls.options():
            by_key[info.cli_name] = info
            by_key[info.field] = info
        values: dict[str, Any] = {}
        for key, raw in options.items():
            info = by_key.get(key)
            if info is None:
                known = ", ".join(i.cli_name for i in cls.options()) or "none"
                raise CompileError(f"pass '{cls.name}' has no option '{key}' (its options: {known})")
            if info.field in values:
                raise CompileError(f"option '{info.cli_name}' of pass '{cls.name}' is given twice")
            values[info.field] = _convert(cls.name, info, raw)
        try:
            return cls(**values)
        except ValueError as err:
            raise CompileError(f"invalid options for pass '{cls.name}': {err}") from None


@dataclass(frozen=True)
class ModulePass(Registered):
    """Base of every ae pass."""

    @abc.abstractmethod
    def apply(self, module_op) -> None:
        """Transform the `builtin.module` operation in place; raise `CompileError` on bad input."""


@dataclass(frozen=True)
class PassPipeline(Registered):
    """Base of every named pipeline: a sequence of passes that `add_pass` and `add_pipeline` add in
    its place, so each runs, fails and prints as a pass of its own."""

    @abc.abstractmethod
    def elements(self) -> list[str]:
        """The pipeline elements for these option values, in textual pipeline syntax."""


@dataclass(frozen=True)
class OptionInfo:
    cli_name: str
    field: str
    type: Any
    default: Any
    help: str

    def type_name(self) -> str:
        if typing.get_origin(self.type) is Literal:
            return "|".join(str(c) for c in typing.get_args(self.type))
        return {bool: "boolean", int: "integer", float: "number", str: "string"}[self.type]


class UnknownPassError(CompileError):
    """A pipeline names a pass that neither ae-mlir nor upstream MLIR registers."""

    def __init__(self, pass_name: str):
        self.pass_name = pass_name
        super().__init__(f"unknown pass '{pass_name}' (not an ae-mlir pass nor a registered MLIR pass)")


_TRUE, _FALSE = ("true", "1", "on", "yes"), ("false", "0", "off", "no")


def _convert(pass_name: str, info: OptionInfo, raw: Any) -> Any:
    typ = info.type
    what = f"option '{info.cli_name}' of pass '{pass_name}'"
    if typing.get_origin(typ) is Literal:
        choices = typing.get_args(typ)
        for choice in choices:
            if raw == choice or str(choice) == raw:
                return choice
        raise CompileError(f"{what} must be one of {', '.join(map(str, choices))}, got '{raw}'")
    if not isinstance(raw, str):
        if type(raw) is typ or (typ is float and type(raw) is int):
            return typ(raw)
        raise CompileError(f"{what} expects {_with_article(info.type_name())}, got {raw!r}")
    if typ is bool:
        if raw.lower() in _TRUE:
            return True
        if raw.lower() in _FALSE:
            return False
        raise CompileError(f"{what} expects true or false, got '{raw}'")
    try:
        return typ(raw)
    except ValueError:
        raise CompileError(f"{what} expects {_with_article(info.type_name())}, got '{raw}'") from None


def _with_article(noun: str) -> str:
    return f"an {noun}" if noun[0] in "aeiou" else f"a {noun}"


def parse_option_text(text: str, separator: Literal["space", "comma"] = "space") -> dict[str, str]:
    """Split `block-m=64 block-n=64` (pipeline syntax) or `block-m=64,block-n=64` (CLI flag
    syntax) into raw values; a bare option name means `true`, as in MLIR's pass options."""
    lexer = shlex.shlex(text, posix=True)
    lexer.whitespace_split = True
    lexer.whitespace = " \t\n" + ("," if separator == "comma" else "")
    try:
        tokens = list(lexer)
    except ValueError as err:
        raise CompileError(f"cannot parse pass options '{text}': {err}") from None
    options: dict[str, str] = {}
    for token in tokens:
        key, eq, value = token.partition("=")
        if not key:
            raise CompileError(f"cannot parse pass options '{text}': '{token}' has no option name")
        options[key] = value if eq else "true"
    return options


def pass_names() -> list[str]:
    """Names of the registered ae passes and pipelines, without importing them."""
    return sorted(_REGISTRY)


def get_pass(name: str) -> type[ModulePass | PassPipeline]:
    """The pass or pipeline class registered under `name`; raises `UnknownPassError` if there is
    none."""
    entry = _REGISTRY.get(name)
    if entry is None:
        raise UnknownPassError(name)
    module_name, class_name = entry.split(":")
    cls = getattr(importlib.import_module(f"{__name__}.{module_name}"), class_name)
    if cls.name != name:
        raise RuntimeError(f"registry entry '{name}' points at {entry}, whose pass is named '{cls.name}'")
    return cls


def get_all_passes() -> dict[str, type[ModulePass | PassPipeline]]:
    """Every registered ae pass and pipeline by name (imports all pass modules)."""
    return {name: get_pass(name) for name in pass_names()}


def create_pass(name: str, options: dict[str, Any] | None = None) -> ModulePass | PassPipeline:
    return get_pass(name).from_options(dict(options or {}))


# --- running ae passes inside an MLIR PassManager -----------------------------------------------


def _as_external(instance: ModulePass):
    """The callable for `PassManager.add`: errors become MLIR diagnostics plus a pass failure, so
    a caller sees them in the `MLIRError` of `pm.run` (or its diagnostic handler) as for any pass."""
    from mlir import ir

    def run(op, pass_) -> None:
        try:
            if op.name != "builtin.module":
                raise CompileError(f"pass '{instance.name}' runs on builtin.module, not on '{op.name}'")
            instance.apply(op)
        except CompileError as err:
            for diag in err.diagnostics or [None]:
                if diag is None:
                    loc, message = op.location, err.summary
                else:
                    loc = op.location
                    if diag.line is not None:
                        loc = ir.Location.file(diag.filename or "-", diag.line, diag.col or 0, context=op.context)
                    # The bindings can emit errors only, so notes ride along in the message.
                    message = diag.message + "".join(f"\nnote: {n.message}" for n in diag.notes)
                loc.emit_error(message)
            pass_.signal_pass_failure()
        except Exception as err:
            frame = traceback.extract_tb(err.__traceback__)[-1]
            where = f"{os.path.basename(frame.filename)}:{frame.lineno}"
            op.location.emit_error(
                f"internal compiler error in pass '{instance.name}': {type(err).__name__}: {err} (at {where})"
            )
            pass_.signal_pass_failure()

    return run


def _add_instance(pm, instance: ModulePass | PassPipeline) -> None:
    if isinstance(instance, PassPipeline):
        add_pipeline(pm, ",".join(instance.elements()))
        return
    cls = type(instance)
    pm.add(_as_external(instance), name=cls.__name__, argument=cls.name, description=cls.summary)


def add_pass(pm, name: str, **options: Any) -> None:
    """Append one pass to `pm`: an ae pass by name with typed options (`block_m=64`), the passes
    of an ae pipeline, or an upstream pass, whose options are passed through as text."""
    if name in _REGISTRY:
        _add_instance(pm, create_pass(name, options))
        return
    text = name
    if options:
        text += "{" + " ".join(f"{k.replace('_', '-')}={_quote(v)}" for k, v in options.items()) + "}"
    _add_upstream(pm, text)


def add_pipeline(pm, pipeline: str) -> None:
    """Append a textual pipeline to `pm`: `builtin.module(a,b{x=1},func.func(c))` or the bare
    element list `a,b{x=1},func.func(c)`. ae passes may only appear at the module level."""
    elements = _elements(pipeline)
    if len(elements) == 1 and elements[0].name == "builtin.module" and elements[0].nested is not None:
        elements = _elements(elements[0].nested)
    for element in elements:
        if element.nested is not None:
            _reject_nested_ae_passes(element)
            _add_upstream(pm, element.text)
        elif element.name in _REGISTRY:
            options = parse_option_text(element.options) if element.options is not None else {}
            _add_instance(pm, create_pass(element.name, options))
        else:
            _add_upstream(pm, element.text)


def build_pass_manager(pipeline: str, context=None):
    """A new `PassManager` on `builtin.module` running `pipeline` (see `add_pipeline`)."""
    from mlir import passmanager

    pm = passmanager.PassManager("builtin.module", context=context)
    add_pipeline(pm, pipeline)
    return pm


@dataclass(frozen=True)
class _Element:
    text: str
    name: str
    options: str | None
    nested: str | None


_ELEMENT = re.compile(r"\s*([^\s{}(),]+)\s*(?:\{(.*)\})?\s*(?:\((.*)\))?\s*", re.DOTALL)


def _elements(pipeline: str) -> list[_Element]:
    out = []
    for text in _split_top_level(pipeline):
        match = _ELEMENT.fullmatch(text)
        if match is None:
            raise CompileError(f"cannot parse pass pipeline element '{text.strip()}' in '{pipeline}'")
        out.append(_Element(text.strip(), match[1], match[2], match[3]))
    return out


def _split_top_level(pipeline: str) -> list[str]:
    """Split at commas outside brackets and quotes, checking that brackets balance."""
    parts, start, stack, quote = [], 0, [], None
    closing = {"(": ")", "{": "}"}
    for i, ch in enumerate(pipeline):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in closing:
            stack.append(closing[ch])
        elif ch in ")}":
            if not stack or stack.pop() != ch:
                raise CompileError(f"unbalanced '{ch}' in pass pipeline '{pipeline}'")
        elif ch == "," and not stack:
            parts.append(pipeline[start:i])
            start = i + 1
    if stack or quote:
        raise CompileError(f"unbalanced brackets or quotes in pass pipeline '{pipeline}'")
    parts.append(pipeline[start:])
    if any(not p.strip() for p in parts):
        if len(parts) == 1:
            return []
        raise CompileError(f"empty element in pass pipeline '{pipeline}'")
    return parts


def _reject_nested_ae_passes(anchor: _Element) -> None:
    for element in _elements(anchor.nested):
        if element.name in _REGISTRY:
            raise CompileError(
                f"pass '{element.name}' runs on builtin.module only; put it at the top level of the "
                f"pipeline, not inside '{anchor.name}(...)'"
            )
        if element.nested is not None:
            _reject_nested_ae_passes(element)


_UNKNOWN_UPSTREAM = re.compile(r"'(.+?)' does not refer to a registered pass or pass pipeline")


def _add_upstream(pm, text: str) -> None:
    with _native_stderr() as captured:
        try:
            pm.add(text)
            failure = None
        except ValueError as err:
            failure = str(err)
    if failure is None:
        return
    unknown = _UNKNOWN_UPSTREAM.search(failure)
    if unknown:
        raise UnknownPassError(unknown[1])
    raise CompileError(f"cannot add '{text}' to the pass pipeline: {_upstream_detail(captured[0] + failure, text)}")


def _upstream_detail(message: str, text: str) -> str:
    """Boil the option parser's multi-line report down to its substance."""
    lines = []
    for line in message.splitlines():
        line = line.strip()
        line = line.split("error: ", 1)[-1]
        line = line.removeprefix("<Pass-Options-Parser>: ").removeprefix(": ")
        if not line or line == text or set(line) <= {"^", " "} or line.startswith("failed to add"):
            continue
        lines.append(line)
    return "; ".join(lines) or message.strip()


@contextlib.contextmanager
def _native_stderr():
    """Capture what native code writes to fd 2 (LLVM's option parser reports there directly)."""
    sys.stderr.flush()
    captured: list[str] = []
    with tempfile.TemporaryFile() as sink:
        saved = os.dup(2)
        os.dup2(sink.fileno(), 2)
        try:
            yield captured
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            captured.append(sink.read().decode(errors="replace"))


def _quote(value: Any) -> str:
    text = str(value).lower() if isinstance(value, bool) else str(value)
    return shlex.quote(text) if re.search(r"[\s{}(),'\"]", text) else text
