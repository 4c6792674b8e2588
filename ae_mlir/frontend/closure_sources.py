"""Where a compiled call finds the current closure tensors of an `ae_mlir.attention`.

Eager calls trace the mods on every call, so they read whatever tensor a closure variable holds
now. Under torch.compile the mods are not traced (dynamo records one custom op), so the op's
closure-tensor inputs must be fetched some other way, and fetched again on every call: a model
that rebinds `self.doc = doc` per batch, or reassigns a Parameter, must see the new tensor.

At construction each closure tensor the mods read is looked up, by identity, among the places a
mod's code reads names from: its closure cells, its globals, and one attribute of either (for
`self.table` where `self` is a cell). The compiled call reads the tensor from there with plain
Python that dynamo traces, so it stays one graph. A tensor found nowhere becomes a `Missing`,
which refuses the compiled call instead of passing a tensor that may be stale.
"""
from __future__ import annotations

from dataclasses import dataclass

ROLES = ("score_mod", "mask_mod")


def roles(attn) -> tuple:
    """The attributes holding `attn`'s mods: an attention's, or those its class names
    (`MOD_ROLES`, linear attention's q/k/v mods)."""
    return getattr(attn, "MOD_ROLES", ROLES)


@dataclass(frozen=True)
class Source:
    """A closure tensor as `getattr(attn, role)` reaches it: closure cell `slot` (an index) or
    global `slot` (a name), then attribute `attr` of that object when set."""

    role: str
    in_cell: bool
    slot: int | str
    attr: str | None

    def fetch(self, attn):
        fn = getattr(attn, self.role)
        base = fn.__closure__[self.slot].cell_contents if self.in_cell else fn.__globals__[self.slot]
        return base if self.attr is None else getattr(base, self.attr)


@dataclass(frozen=True)
class Missing:
    """A closure tensor no `Source` reaches (an element of a list, an attribute two levels deep)."""

    role: str
    position: int
    shape: tuple

    def fetch(self, attn):
        from .module_text import mod_name

        fn = getattr(attn, self.role, None)
        raise RuntimeError(
            f"ae_mlir.{type(attn).__name__} under torch.compile: closure tensor {self.position} (shape {self.shape}) that "
            f"{mod_name(fn, self.role) if fn is not None else self.role} reads is neither a variable of its closure or "
            "globals nor an attribute of one, so the compiled call cannot read its current value; bind it to "
            "a name the mod reads directly (a closure variable, a global, or e.g. self.<name>) before "
            "constructing the attention, or call the attention outside torch.compile")


def find(attn) -> list | None:
    """A `Source` or `Missing` per closure tensor of `attn`, in the L0 module's order; None when a
    mod cannot be traced (calling it says why)."""
    from .api import MASK_MOD_ARGS, SCORE_MOD_ARGS
    from .module_text import Captures, mod_name
    from .trace import TraceError, trace

    captures = Captures()
    found = []
    for role, args in zip(ROLES, (SCORE_MOD_ARGS, MASK_MOD_ARGS)):
        fn = getattr(attn, role)
        if fn is None:
            continue
        try:
            _, state = trace(fn, mod_name(fn, role), args)
        except TraceError:
            return None
        captures.add(state)
        for position in range(len(found), len(captures.sources)):
            tensor = captures.sources[position]
            found.append(locate(attn, tensor, role, position))
    return found


def locate(attn, tensor, role: str, position: int):
    """A `Source` of closure tensor `position` (read by the mod `role`), else a `Missing`."""
    return _search(attn, tensor) or Missing(role, position, tuple(tensor.shape))


def fetch(attn, sources: list) -> list:
    """The tensors `sources` reach now."""
    return [s.fetch(attn) for s in sources]


def _search(attn, tensor) -> Source | None:
    """The first place holding `tensor`: a cell or global of a mod, else an attribute of one that
    the mod's code names."""
    bases = []
    for role in roles(attn):
        fn = getattr(attn, role)
        if fn is None or not hasattr(fn, "__code__"):
            continue
        for i, cell in enumerate(fn.__closure__ or ()):
            try:
                bases.append((Source(role, True, i, None), cell.cell_contents))
            except ValueError:  # a cell not yet bound
                continue
        names = fn.__code__.co_names
        bases += [(Source(role, False, name, None), fn.__globals__[name]) for name in names
                  if name in fn.__globals__]
    for source, value in bases:
        if value is tensor:
            return source
    for source, value in bases:
        for name in getattr(attn, source.role).__code__.co_names:
            if _attribute(value, name) is tensor:
                return Source(source.role, source.in_cell, source.slot, name)
    return None


def _attribute(value, name: str):
    # Only names the mod's code reads, and any failure of a property counts as absent.
    try:
        return getattr(value, name, None)
    except Exception:
        return None
