"""Attention objects by key, for the custom op `ae_mlir::attention` (torch_op.py).

A torch custom op takes tensors and simple values only, so the op that `torch.compile` records
names its variant by a string; the op looks the attention object up here when it runs. Entries
go when their attention object does (a compiled backward keeps its attention alive); a copy of an
attention (deepcopy, pickle) registers itself under a key of its own.

The closure tensors a variant's mods read become the op's tensor inputs, so that a compiled
graph sees them (a learnable bias table receives its gradient); `closure_sources` says where a
compiled call reads them from.
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

