"""Attention objects by key, for the custom op `ae_mlir::attention` (torch_op.py).

A torch custom op takes tensors and simple values only, so the op that `torch.compile` records
names its variant by a string; the op looks the attention object up here when it runs. Entries
go when their attention object does.

The closure tensors a variant's mods read become the op's tensor inputs, so that a compiled
graph sees them (a learnable bias table receives its gradient). Tracing happens outside the
graph, so they are found once, when the attention is constructed, by tracing its mods (tracing
needs no shapes); each compiled call checks that the mods still read tensors of the same shapes.
"""
from __future__ import annotations

import itertools
import weakref

_VARIANTS: "weakref.WeakValueDictionary[str, object]" = weakref.WeakValueDictionary()
_NEXT = itertools.count()


def register(attn) -> str:
    key = f"attention-{next(_NEXT)}"
    _VARIANTS[key] = attn
    return key


def lookup(key: str):
    attn = _VARIANTS.get(key)
    if attn is None:
        raise RuntimeError(f"ae_mlir attention {key!r} no longer exists; keep the ae_mlir.attention object alive "
                           "for as long as a compiled model calls it")
    return attn


def closure_tensors(attn) -> list | None:
    """The closure tensors the mods of `attn` read, as the user holds them, in the order of the L0
    module's closure arguments; None when a mod cannot be traced (calling it says why)."""
    from .api import MASK_MOD_ARGS, SCORE_MOD_ARGS, _Captures, _mod_name
    from .trace import TraceError, trace

    captures = _Captures()
    for fn, role, args in ((attn.score_mod, "score_mod", SCORE_MOD_ARGS), (attn.mask_mod, "mask_mod", MASK_MOD_ARGS)):
        if fn is None:
            continue
        try:
            _, state = trace(fn, _mod_name(fn, role), args)
        except TraceError:
            return None
        captures.add(state)
    return captures.sources
