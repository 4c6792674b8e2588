"""MLIR contexts with the `attn` and `tt` dialects loaded, and module parsing with diagnostics.

Everything here imports `mlir` lazily so that `import ae_mlir` and the runtime stay light.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import resources


@dataclass(frozen=True)
class Diagnostic:
    """One MLIR diagnostic, detached from the context that produced it."""

    severity: str  # "error" | "warning" | "note" | "remark"
    message: str
    filename: str | None
    line: int | None
    col: int | None
    notes: tuple["Diagnostic", ...] = ()

    def format(self, source_name: str | None = None) -> str:
        name = self.filename
        if source_name is not None and name in (None, "-", "<stdin>"):
            name = source_name
        where = f"{name}:{self.line}:{self.col}: " if self.line is not None else (f"{name}: " if name else "")
        text = f"{where}{self.severity}: {self.message}"
        for note in self.notes:
            text += "\n" + note.format(source_name)
        return text


class CompileError(Exception):
    """Raised when parsing, verification or a pass fails; carries MLIR-style diagnostics."""

    def __init__(self, summary: str, diagnostics: list[Diagnostic] | None = None):
        self.summary = summary
        self.diagnostics = list(diagnostics or [])
        super().__init__(self.render())

    def render(self, source_name: str | None = None) -> str:
        if not self.diagnostics:
            return f"error: {self.summary}"
        return "\n".join(d.format(source_name) for d in self.diagnostics)


_SEVERITY_NAMES = {0: "error", 1: "warning", 2: "note", 3: "remark"}


def _severity_name(sev) -> str:
    name = getattr(sev, "name", None)
    if name:
        return name.lower()
    return _SEVERITY_NAMES.get(int(sev), "error")


def location_parts(loc) -> tuple[str | None, int | None, int | None]:
    """Return (file, line, col) of the first file location inside `loc`, or Nones."""
    try:
        if loc.is_a_file():
            return loc.filename, loc.start_line, loc.start_col
        if loc.is_a_name():
            return location_parts(loc.child_loc)
        if loc.is_a_callsite():
            return location_parts(loc.callee)
        if loc.is_a_fused():
            for inner in loc.locations:
                parts = location_parts(inner)
                if parts[1] is not None:
                    return parts
    except (AttributeError, ValueError, TypeError):
        pass
    return None, None, None


def diagnostic_from_mlir(diag) -> Diagnostic:
    """Convert an `ir.Diagnostic` or `ir.DiagnosticInfo` into a detached `Diagnostic`."""
    filename, line, col = location_parts(diag.location)
    notes = tuple(diagnostic_from_mlir(n) for n in diag.notes)
    return Diagnostic(_severity_name(diag.severity), str(diag.message), filename, line, col, notes)


def _dialect_text(name: str) -> str:
    return resources.files("ae_mlir.dialects").joinpath(name).read_text()


@functools.lru_cache(maxsize=None)
def dialect_path(name: str = "attn.irdl.mlir") -> str:
    """Filesystem path of a dialect definition (for `mlir-opt --irdl-file=`)."""
    return str(resources.files("ae_mlir.dialects").joinpath(name))


def load_dialects(context) -> None:
    """Load the `attn` and `tt` IRDL dialects into a caller's `mlir.ir.Context`.

    Idempotent per context: loading twice is a no-op.
    """
    from mlir import ir
    from mlir.dialects import irdl

    if getattr(context, "_ae_mlir_loaded", False):
        return
    with context, ir.Location.unknown():
        for name in ("attn.irdl.mlir", "tt.irdl.mlir"):
            try:
                text = _dialect_text(name)
            except FileNotFoundError:
                continue
            irdl.load_dialects(ir.Module.parse(text))
    context._ae_mlir_loaded = True


def new_context():
    """A fresh context with every upstream dialect and ae-mlir's dialects loaded."""
    from mlir import ir

    ctx = ir.Context()
    load_dialects(ctx)
    return ctx


def parse_module(text: str, context, source_name: str = "-"):
    """Parse `text` in `context`; raise `CompileError` with located diagnostics on failure."""
    from mlir import ir

    with context:
        try:
            module = ir.Module.parse(text)
        except ir.MLIRError as err:
            diags = [diagnostic_from_mlir(d) for d in err.error_diagnostics]
            raise CompileError(f"cannot parse {source_name}", diags) from None
    return module
