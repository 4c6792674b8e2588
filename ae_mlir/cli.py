"""`ae-opt`: run ae-mlir and upstream MLIR passes over attn IR, following mlir-opt's conventions.

Every user error becomes an MLIR-style diagnostic on stderr and exit status 1; a bug inside the
compiler is reported as `error: internal compiler error: ...`, never as a Python traceback.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shlex
import sys
import tempfile
from dataclasses import dataclass
from typing import Callable

from .core.context import CompileError, Diagnostic, location_parts

EMIT_KINDS = ("mlir", "ttir", "ptx", "amdgcn", "llvmir")
SPLIT_MARKER = "// -----"
_TARGET = re.compile(r"cuda:\d+|hip:gfx[0-9a-z]+|host")


@dataclass(frozen=True)
class EmitOptions:
    target: str | None
    generic: bool
    # A preset's (num_warps, num_stages) by kernel name and abi.CHUNK_STAGE, as the runtime
    # launches them.
    launch: Callable[[str, str | None], tuple[int, int]] | None = None
    debug_info: bool = False  # print each op's location (--mlir-print-debuginfo)


def _emit_mlir(module, options: EmitOptions) -> str:
    return module.operation.get_asm(print_generic_op_form=options.generic, enable_debug_info=options.debug_info)


def _emit_triton(kind: str) -> Callable[[object, EmitOptions], str]:
    def emit(module, options: EmitOptions) -> str:
        from .backends.triton import emit as triton_emit

        return triton_emit(kind, module, options.target, options.launch)

    return emit


# What `--emit=KIND` writes, from the module the pipeline produced. A kind of EMIT_KINDS with no
# entry here is reported as not available yet.
EMITTERS: dict[str, Callable[[object, EmitOptions], str]] = {
    "mlir": _emit_mlir,
    "ttir": _emit_triton("ttir"),
    "ptx": _emit_triton("ptx"),
    "amdgcn": _emit_triton("amdgcn"),
}


class _ArgumentParser(argparse.ArgumentParser):
    def error(self, message):
        raise CompileError(message)


def _parser() -> argparse.ArgumentParser:
    p = _ArgumentParser(
        prog="ae-opt",
        allow_abbrev=False,
        description="Run ae-mlir and upstream MLIR passes over attn IR (mlir-opt conventions). "
        "Any other --NAME[=opt=value,...] runs the pass NAME (ae-mlir or upstream) in order.",
    )
    p.add_argument("file", nargs="?", default="-", help="input file; '-' or none reads stdin")
    p.add_argument("-o", dest="output", default="-", metavar="OUT", help="output file (default: stdout)")
    p.add_argument("--pass-pipeline", metavar="PIPELINE", help="e.g. 'builtin.module(attn-verify,canonicalize)'")
    p.add_argument("--pipeline", metavar="NAME", help="a named preset pipeline (cpu, triton), options "
                   "derived from the input and the target; NAME{opt=value ...} overrides them "
                   "(e.g. 'triton{assume-aligned=false}')")
    p.add_argument("--emit", default="mlir", help=f"what to write: {', '.join(EMIT_KINDS)} (default: mlir)")
    p.add_argument("--target", help="cuda:<sm>, hip:<gfx arch> or host")
    p.add_argument("--split-input-file", action="store_true", help=f"process chunks between '{SPLIT_MARKER}' lines separately")
    p.add_argument("--verify-diagnostics", action="store_true", help="check diagnostics against expected-* comments")
    p.add_argument("--mlir-print-ir-after-all", action="store_true", help="print the IR after every pass to stderr")
    p.add_argument("--dump-pass-pipeline", action="store_true", help="print the pass pipeline to stderr before running it")
    p.add_argument(
        "--mlir-print-op-generic",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="print ops in generic form (default; IRDL ops have no custom form)",
    )
    p.add_argument("--mlir-print-debuginfo", action="store_true", help="print each op's location")
    p.add_argument("--list-passes", action="store_true", help="list the ae-mlir passes and pipelines")
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(sys.argv[1:] if argv is None else argv)
    except CompileError as err:
        print(err.render(), file=sys.stderr)
        return 1
    except BrokenPipeError:
        # Stop the interpreter from complaining again while flushing stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as err:
        print(f"error: internal compiler error: {type(err).__name__}: {err}", file=sys.stderr)
        return 1


@dataclass(frozen=True)
class _Job:
    source_name: str
    pipeline: _Pipeline
    emit: Callable
    emit_options: EmitOptions
    print_ir_after_all: bool
    dump_pass_pipeline: bool


def _main(argv: list[str]) -> int:
    args, extras = _parser().parse_known_args(argv)
    if args.list_passes:
        print(_list_passes())
        return 0
    job = _Job(
        source_name="<stdin>" if args.file == "-" else args.file,
        pipeline=_pipeline(args, extras),
        emit=_emitter(args.emit),
        emit_options=EmitOptions(_target(args.target), args.mlir_print_op_generic,
                                 debug_info=args.mlir_print_debuginfo),
        print_ir_after_all=args.mlir_print_ir_after_all,
        dump_pass_pipeline=args.dump_pass_pipeline,
    )
    _check_pipeline(job.pipeline)
    text = _read_input(args.file)

    chunks = _split_input(text) if args.split_input_file else [(text, 0)]
    outputs, ok = [], True
    for chunk, line_offset in chunks:
        output, diagnostics, failed = _process(chunk, line_offset, job)
        if args.verify_diagnostics:
            diagnostics = _verify_diagnostics(chunk, line_offset, diagnostics)
            failed = bool(diagnostics)
        for diag in diagnostics:
            print(diag.format(job.source_name), file=sys.stderr)
        ok = ok and not failed
        if output is not None:
            outputs.append(output)
    if not ok:
        return 1
    _write_output(args.output, (SPLIT_MARKER + "\n").join(o if o.endswith("\n") else o + "\n" for o in outputs))
    return 0


# --- pipeline ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Pipeline:
    """The pipeline of one run: `--pass-pipeline` text, single-pass flags, or a named preset,
    whose passes and options `ae_mlir.presets` derives from each input module."""

    text: str = ""
    flags: bool = False
    preset: str | None = None
    target: str | None = None
    overrides: tuple = ()

    def resolve(self, module):
        """(pipeline text, the preset's options or None) for `module` (None: no input)."""
        if self.preset is None:
            return self.text, None
        from . import presets

        problem = presets.read_problem(module) if module is not None else None
        if module is not None and problem is None:
            # Without this the pipeline's passes leave such a module as it is (cpu) or report a
            # missing L1 kernel at its last pass (triton), neither saying what is wrong.
            message = (f"the module has no attention function for --pipeline={self.preset} (a func.func whose "
                       "first three arguments are the [B, H, L, D] q, k and v, as ae.attention and "
                       "ae.linear_attention write it)")
            # An implicit module has no location of its own: point at its first op (an empty
            # file's module is at 0:0, its first line then).
            where = next(iter(module.body.operations), module).operation
            filename, line, col = location_parts(where.location)
            if not line and filename:
                line, col = 1, 1
            raise CompileError(message, [Diagnostic("error", f"'{where.name}' op {message}", filename, line, col)])
        options = presets.options_for(self.preset, problem, self.target, **dict(self.overrides))
        return presets.pipeline_text(self.preset, options), options if self.preset == "triton" else None

    def add_to(self, pm, text: str) -> None:
        from . import passes

        try:
            passes.add_pipeline(pm, text)
        except passes.UnknownPassError as err:
            if not self.flags:
                raise
            raise CompileError(f"unknown option or pass '--{err.pass_name}' (see ae-opt --help and --list-passes)") from None


def _pipeline(args, extras: list[str]) -> _Pipeline:
    flags = [_pass_flag(extra) for extra in extras]
    sources = [bool(args.pass_pipeline is not None), bool(args.pipeline is not None), bool(flags)]
    if sum(sources) > 1:
        raise CompileError("use only one of --pass-pipeline, --pipeline and individual pass options")
    if args.pass_pipeline is not None:
        return _Pipeline(text=args.pass_pipeline)
    if args.pipeline is not None:
        from . import passes

        name, brace, rest = args.pipeline.partition("{")
        if brace and not rest.endswith("}"):
            raise CompileError(f"cannot parse --pipeline '{args.pipeline}' (expected NAME or NAME{{opt=value ...}})")
        overrides = passes.parse_option_text(rest[:-1]) if brace else {}
        return _Pipeline(preset=name, target=_preset_target(name, args), overrides=tuple(overrides.items()))
    return _Pipeline(text=",".join(flags), flags=True)


def _preset_target(preset: str, args) -> str | None:
    """--target, else the preset's own (the triton preset tunes for the GPU family --emit names)."""
    if args.target is not None or preset != "triton":
        return args.target
    return "hip:gfx942" if args.emit == "amdgcn" else "cuda:90"


def _pass_flag(arg: str) -> str:
    """`--NAME=opt=value,...` as a pipeline element `NAME{opt=value ...}`."""
    from . import passes

    if not arg.startswith("--") or arg == "--":
        if arg.startswith("-"):
            raise CompileError(f"unknown option '{arg}' (see ae-opt --help)")
        raise CompileError(f"unexpected argument '{arg}': ae-opt takes one input file")
    name, has_options, text = arg[2:].partition("=")
    options = passes.parse_option_text(text, "comma") if has_options else {}
    if not options:
        return name
    return name + "{" + " ".join(f"{key}={shlex.quote(value)}" for key, value in options.items()) + "}"


def _check_pipeline(pipeline: _Pipeline) -> None:
    """Report pipeline errors before touching the input, as mlir-opt does."""
    from mlir import ir, passmanager

    with ir.Context() as ctx:
        pm = passmanager.PassManager("builtin.module", context=ctx)
        pipeline.add_to(pm, pipeline.resolve(None)[0])


def _emitter(kind: str) -> Callable:
    if kind not in EMIT_KINDS:
        raise CompileError(f"unknown --emit kind '{kind}' (expected one of {', '.join(EMIT_KINDS)})")
    if kind not in EMITTERS:
        raise CompileError(f"--emit={kind} is not available yet")
    return EMITTERS[kind]


def _target(target: str | None) -> str | None:
    if target is not None and not _TARGET.fullmatch(target):
        raise CompileError(f"unknown --target '{target}' (expected cuda:<sm>, hip:<gfx arch> or host)")
    return target


def _list_passes() -> str:
    from . import passes, presets

    lines = ["ae-mlir passes (in --pass-pipeline='builtin.module(NAME{opt=value ...})' or as --NAME=opt=value,...):"]
    for name, cls in passes.get_all_passes().items():
        lines.append(f"  {name}  {cls.summary}")
        for opt in cls.options():
            default = str(opt.default).lower() if isinstance(opt.default, bool) else opt.default
            lines.append(f"      {opt.cli_name}=<{opt.type_name()}>  {opt.help} (default: {default})")
    lines.append("")
    lines.append("Upstream MLIR passes (canonicalize, cse, inline, ...) are accepted by name too, with their")
    lines.append("own options, and may nest: func.func(cse). `mlir-opt --help` lists them.")
    lines.append("")
    lines.append("Pipelines (--pipeline=NAME):")
    for name in presets.PRESETS:
        lines.append(f"  {name}  {presets.outline(name)}")
    lines.append("Their options follow the input module and --target; --dump-pass-pipeline prints them.")
    return "\n".join(lines)


# --- input, processing, output -----------------------------------------------------------------


def _read_input(path: str) -> str:
    try:
        if path == "-":
            data = sys.stdin.buffer.read()
        else:
            with open(path, "rb") as f:
                data = f.read()
    except OSError as err:
        raise CompileError(f"cannot open input file '{path}': {err.strerror}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise CompileError(f"input file '{path}' is not UTF-8 text (byte {err.start})") from None


def _split_input(text: str) -> list[tuple[str, int]]:
    """Chunks between marker lines, each with the number of lines that precede it in the file."""
    chunks, current, start = [], [], 0
    for number, line in enumerate(text.splitlines(keepends=True)):
        if line.strip().startswith(SPLIT_MARKER):
            chunks.append(("".join(current), start))
            current, start = [], number + 1
        else:
            current.append(line)
    chunks.append(("".join(current), start))
    return chunks


class _Collector:
    """Receives every diagnostic of a context (errors included) in emission order."""

    def __init__(self, ctx):
        from .core.context import diagnostic_from_mlir

        self.diagnostics: list[Diagnostic] = []
        self._convert = diagnostic_from_mlir
        ctx.emit_error_diagnostics = True
        self._handler = ctx.attach_diagnostic_handler(self._on_diagnostic)

    def _on_diagnostic(self, diag) -> bool:
        self.diagnostics.append(self._convert(diag))
        return True

    def detach(self) -> None:
        self._handler.detach()


def _process(chunk: str, line_offset: int, job: _Job) -> tuple[str | None, list[Diagnostic], bool]:
    """Parse, verify, run the pipeline and emit one chunk in a fresh context.

    Returns (output or None, diagnostics with file-relative lines, whether it failed)."""
    from mlir import ir, passmanager

    from .core.context import diagnostic_from_mlir, new_context, parse_module
    from .core.verifier import verify_module

    ctx = new_context()
    ctx.enable_multithreading(False)
    collector = _Collector(ctx)
    output, failed, summary = None, False, None
    try:
        module = parse_module(chunk, ctx, job.source_name)
        errors = verify_module(module)
        if errors:
            raise CompileError("invalid attn IR", errors)
        text, options = job.pipeline.resolve(module)
        launch = None if options is None else options.kernel_launch
        if job.dump_pass_pipeline:
            print(text, file=sys.stderr)
            if options is not None:
                print(f"// launch: {options.launch_text()}", file=sys.stderr)
        with ctx:
            pm = passmanager.PassManager("builtin.module")
            job.pipeline.add_to(pm, text)
            if job.print_ir_after_all:
                pm.enable_ir_printing(print_generic_op_form=job.emit_options.generic)
            sys.stdout.flush()
            sys.stderr.flush()
            pm.run(module.operation)
        output = job.emit(module, dataclasses.replace(job.emit_options, launch=launch))
    except CompileError as err:
        failed, summary = True, err.summary
        collector.diagnostics.extend(err.diagnostics)
    except ir.MLIRError as err:
        failed, summary = True, "pass pipeline failed"
        collector.diagnostics.extend(diagnostic_from_mlir(d) for d in err.error_diagnostics)
    finally:
        collector.detach()
    diagnostics = [_shift(d, line_offset) for d in collector.diagnostics]
    if failed and not any(d.severity == "error" for d in diagnostics):
        diagnostics.append(Diagnostic("error", summary, None, None, None))
    return output, diagnostics, failed


def _shift(diag: Diagnostic, line_offset: int) -> Diagnostic:
    """Make a chunk-relative location relative to the whole input file."""
    line = diag.line
    if diag.filename == "-" and line is not None:
        line += line_offset
    return dataclasses.replace(diag, line=line, notes=tuple(_shift(n, line_offset) for n in diag.notes))


def _write_output(path: str, text: str) -> None:
    """Write to stdout, or atomically to `path` (a temporary file beside it, then a rename)."""
    if path == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    directory = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    except OSError as err:
        raise CompileError(f"cannot write output file '{path}': {err.strerror}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, _new_file_mode(path))
        os.replace(tmp, path)
    except OSError as err:
        os.unlink(tmp)
        raise CompileError(f"cannot write output file '{path}': {err.strerror}") from None


def _new_file_mode(path: str) -> int:
    """Keep an existing file's mode; otherwise what open() would give (mkstemp uses 0600)."""
    try:
        return os.stat(path).st_mode & 0o7777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


# --- --verify-diagnostics ------------------------------------------------------------------------

_EXPECTED = re.compile(r"expected-(error|warning|note|remark)\s*(?:@(above|below|unknown|[+-]\d+))?\s*\{\{(.*)\}\}")


@dataclass
class _Expectation:
    severity: str
    message: str
    line: int | None  # None: a diagnostic without a location in the input
    comment_line: int
    comment_col: int
    matched: bool = False


def _expectations(chunk: str, line_offset: int) -> list[_Expectation]:
    """mlir-opt's designators: none (this line), @+N / @-N, @above (the last line that is not an
    expected-* line), @below (the next such line), @unknown (no location)."""
    found: list[_Expectation] = []
    below: list[_Expectation] = []
    last_plain = line_offset
    lines = chunk.splitlines()
    for index, text in enumerate(lines):
        number = line_offset + index + 1
        match = _EXPECTED.search(text)
        if match is None:
            for exp in below:
                exp.line = number
            below.clear()
            last_plain = number
            continue
        severity, where, message = match.groups()
        exp = _Expectation(severity, message, number, number, match.start() + 1)
        if where == "above":
            exp.line = last_plain
        elif where == "below":
            below.append(exp)
        elif where == "unknown":
            exp.line = None
        elif where is not None:
            exp.line = number + int(where)
        found.append(exp)
    for exp in below:
        exp.line = line_offset + len(lines)
    return found


def _verify_diagnostics(chunk: str, line_offset: int, diagnostics: list[Diagnostic]) -> list[Diagnostic]:
    """Match diagnostics against the chunk's expected-* comments; return the mismatches as errors."""
    expectations = _expectations(chunk, line_offset)
    problems: list[Diagnostic] = []
    for diag in _flatten(diagnostics):
        line = diag.line if diag.filename == "-" else None
        candidates = [
            e for e in expectations if e.severity == diag.severity and e.line == line and e.message in diag.message
        ]
        if candidates:
            next((e for e in candidates if not e.matched), candidates[0]).matched = True
        else:
            problems.append(dataclasses.replace(diag, severity="error", message=f"unexpected {diag.severity}: {diag.message}", notes=()))
    for exp in expectations:
        if not exp.matched:
            problems.append(
                Diagnostic("error", f'expected {exp.severity} "{exp.message}" was not produced', "-", exp.comment_line, exp.comment_col)
            )
    return problems


def _flatten(diagnostics: list[Diagnostic]):
    for diag in diagnostics:
        yield diag
        # mlir-opt turns these off under --verify-diagnostics; the bindings cannot, so skip them.
        yield from _flatten([n for n in diag.notes if not n.message.startswith("see current operation")])


if __name__ == "__main__":
    sys.exit(main())
