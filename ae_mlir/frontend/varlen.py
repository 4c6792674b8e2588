"""Packed variable-length batches for `attention` (FlashAttention's cu_seqlens convention): the
checks, and the shapes the module is compiled for.

A call with cu_seqlens compiles for (total rows, a power-of-two bucket of the sequence count and
of the longest sequence), not for the lengths themselves: the offsets are read by the kernels at
run time, so batches of other lengths reuse the compiled kernels while their totals and buckets
stay the same.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..core import abi
from ..core.memo import kept
from . import checks


@dataclass(frozen=True)
class Sequences:
    """What the module takes for a packed batch: the padded offsets (int32 [S' + 1]), each
    sequence's number of keys (int32 [S'], the mask's kv_len) and the longest sequences the
    module is built for (Lq, Lk bounds)."""

    cu_q: object
    cu_k: object
    kv_len: object
    longest_q: int
    longest_k: int


def _bucket(n: int, least: int = 16) -> int:
    return max(least, 1 << max(0, n - 1).bit_length())


def check_offsets(name: str, cu) -> int:
    """The sequence count of offsets `cu` (an int32/int64 vector of S + 1 >= 2 entries)."""
    import torch

    if not isinstance(cu, torch.Tensor):
        raise TypeError(f"{name} must be a tensor of sequence offsets [S + 1], got {type(cu).__name__}")
    if cu.dtype not in (torch.int32, torch.int64) or cu.dim() != 1 or cu.shape[0] < 2:
        raise ValueError(f"{name} must be an int32 or int64 vector of S + 1 >= 2 offsets, got "
                         f"{cu.dtype} of shape {tuple(cu.shape)}")
    return cu.shape[0] - 1


def _offsets(name: str, cu, rows: int, device, checked: bool):
    import torch

    check_offsets(name, cu)
    if cu.device != device and device.type != "meta":
        raise ValueError(f"{name} is on '{cu.device}' but q is on '{device}'")
    if cu.device.type != "meta" and not torch.compiler.is_compiling():
        # One read of the offsets (a device sync on GPUs; under torch.compile it would stop the
        # graph, so there the caller's word is taken): a wrong offset would leave packed rows
        # unwritten or cut a sequence short, silently.
        steps = cu[1:] - cu[:-1]
        first, last, longest, decreasing = torch.stack([cu[0], cu[-1], steps.max(), (steps < 0).any()]).tolist()
        if first != 0 or decreasing or last != rows:
            raise ValueError(f"{name} must start at 0, never decrease and end at the {rows} packed rows, got "
                             f"{cu.tolist() if cu.numel() <= 20 else f'offsets from {first} to {last}'}")
        return cu.to(torch.int32), longest
    return cu.to(torch.int32), None


def _longest(actual: int | None, given, name: str) -> int:
    if given is None and actual is None:
        raise ValueError(f"{name} is needed here (an int: the longest sequence): under torch.compile, or for "
                         "offsets on the meta device, the module is built for it and the offsets are not read")
    if given is None:
        return actual
    if isinstance(given, bool) or not isinstance(given, int) or given < 0:
        raise ValueError(f"{name} must be a non-negative int or None, got {given!r}")
    if actual is not None and given < actual:
        raise ValueError(f"{name} = {given} is shorter than the longest sequence ({actual})")
    return given


_PREPARED: dict = {}


def prepare(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, checked: bool,
            names: tuple | None = None) -> Sequences:
    """Check the offsets of a packed call (q, k already [1, H, T, D]) and pad them to the
    module's bucketed sequence count with empty sequences. `names` (offsets, bound) replaces the
    arguments' names in messages when queries and keys share one set of offsets.

    Kept per offsets tensor (its memory and version) and call shape: the layers of a model call
    attention on the same offsets one after another, and each would otherwise read them back (a
    device sync on GPUs) and make new key counts, whose tile tables (a mask that reads closure
    tensors) are then classified anew."""
    import torch

    offsets = (cu_seqlens_q, cu_seqlens_k)
    if torch.compiler.is_compiling() or not all(isinstance(cu, torch.Tensor) and cu.device.type != "meta"
                                                  for cu in offsets):
        return _prepare(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, checked, names)
    key = tuple((cu.data_ptr(), tuple(cu.shape), cu.stride(), cu.dtype, str(cu.device), cu._version) for cu in offsets)
    key += (q.shape[2], k.shape[2], str(q.device), max_seqlen_q, max_seqlen_k, checked, names)
    # The entry holds the offsets: while it lives, no other tensor can take their memory.
    return kept(_PREPARED, key, lambda: (offsets, _prepare(q, k, *offsets, max_seqlen_q, max_seqlen_k, checked,
                                                           names)), 64)[1]


def _prepare(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, checked: bool, names) -> Sequences:
    import torch

    if cu_seqlens_k is None or cu_seqlens_q is None:
        raise ValueError("cu_seqlens_q and cu_seqlens_k go together: pass both (they may be the same tensor)")
    cu_name_q, cu_name_k, max_name_q, max_name_k = (
        ("cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k") if names is None
        else (names[0], names[0], names[1], names[1]))
    cu_q, actual_q = _offsets(cu_name_q, cu_seqlens_q, q.shape[2], q.device, checked)
    if cu_seqlens_k is cu_seqlens_q and k.shape[2] == q.shape[2]:
        cu_k, actual_k = cu_q, actual_q  # one read of shared offsets
    else:
        cu_k, actual_k = _offsets(cu_name_k, cu_seqlens_k, k.shape[2], q.device, checked)
    checks.same(cu_name_q, cu_q.shape[0], cu_name_k, cu_k.shape[0], "number of offsets")
    longest_q = _longest(actual_q, max_seqlen_q, max_name_q)
    longest_k = _longest(actual_k, max_seqlen_k, max_name_k)
    count = cu_q.shape[0] - 1
    padded = _bucket(count, 1)
    if padded > count:
        cu_q, cu_k = (torch.cat([cu, cu[-1:].expand(padded - count)]) for cu in (cu_q, cu_k))
    kv_len = (cu_k[1:] - cu_k[:-1]).contiguous()
    return Sequences(cu_q.contiguous(), cu_k.contiguous(), kv_len, _bucket(longest_q), _bucket(longest_k))


def packed_views(q, k, v, layout: str):
    """Packed q, k, v ([T, H, D] under "blhd", [H, T, D] under "bhld") as [1, H, T, D] views."""
    import torch

    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 3:
            form = "[T, H, D]" if layout == "blhd" else "[H, T, D]"
            raise ValueError(f"with cu_seqlens, {name} must be a packed {form} tensor (layout={layout!r}), "
                             f"got shape {tuple(t.shape)}")
    return tuple(checks.to_bhld(t.unsqueeze(0), layout) for t in (q, k, v))


def check_trainable(attn, backend: str) -> None:
    """Gradients of a packed batch come from the backward kernels alone (the torch evaluation of
    the derivative knows no packing): a built-in normalizer or a user's, the CPU or Triton backend."""
    kinds = tuple(k for k in abi.BACKWARD_NORMALIZERS if k != "online")
    normalize = attn.normalize
    supported = normalize in kinds if isinstance(normalize, str) else True
    if backend not in ("cpu", "triton") or not supported:
        raise ValueError("gradients of packed variable-length calls (cu_seqlens) run as backward kernels: "
                         f"normalize={' or '.join(repr(k) for k in kinds)} or an OnlineNormalizer "
                         f"on the 'cpu' or 'triton' backend, "
                         f"not normalize={getattr(normalize, 'name', normalize)!r} on {backend!r}")


def any_rows(shape) -> tuple:
    """A packed [1, H, T(, ...)] shape with its rows T of any size (None): one compiled module
    serves every total of the batches that share its buckets."""
    return tuple(None if d == abi.PACKED_ROWS_DIM else n for d, n in enumerate(shape))


def packed_type(t, elt: str) -> str:
    """The type of packed [1, H, T, D] `t` in a module, of any row count T."""
    from .emit import tensor_type

    return tensor_type(any_rows(t.shape), elt)


def packed_module_lines(body: list, caps, sequences: Sequences, q, k, v, ret_vals: list, ret_types: list,
                        call: str):
    """Views of the packed q, k, v at the top of the L0 `body`, the results packed back at its
    end (the offsets become the next two closure tensors of `caps`); returns the packed results'
    names and types."""
    from .emit import mlir_elt, tensor_type

    cu_q, cu_k = (caps.add_call_tensor(t) for t in (sequences.cu_q, sequences.cu_k))
    cu_type = tensor_type(sequences.cu_q.shape, "i32")
    elt = mlir_elt(q.dtype)
    lines = []
    for name, t, cu, longest in (("q", q, cu_q, sequences.longest_q), ("k", k, cu_k, sequences.longest_k),
                                 ("v", v, cu_k, sequences.longest_k)):
        view = tensor_type((sequences.kv_len.shape[0], t.shape[1], longest, t.shape[3]), elt)
        lines.append(f'%{name}_logical = "attn.unpack_sequences"(%{name}, {cu}) : '
                     f'({packed_type(t, elt)}, {cu_type}) -> {view}' + call)
    body[:0] = lines
    packed_vals, packed_types = [], []
    for value, ty in zip(ret_vals, ret_types):
        rows = (1, q.shape[1], None) + ((v.shape[3],) if value == "%out" else ())
        packed = tensor_type(rows, elt if value == "%out" else "f32")
        body.append(f'{value}_packed = "attn.pack_sequences"({value}, {cu_q}) : ({ty}, {cu_type}) -> {packed}' + call)
        packed_vals.append(f"{value}_packed")
        packed_types.append(packed)
    return packed_vals, packed_types


def call_packed(attn, q, k, v, return_lse, backend, cu_q, cu_k, max_q, max_k):
    """`attn` on a packed variable-length batch: q [T, H, D] (layout "blhd") or [H, T, D],
    offsets cu_seqlens [S + 1]; returns the output packed the same way and lse [H, T]."""
    from . import index_check
    from .api import _compiling, _execute, wants_grad

    q, k, v = packed_views(q, k, v, attn.layout)
    attn._validate_as("bhld", q, k, v)
    backend = checks.backend_for(backend, [("q", q), ("k", k), ("v", v)])
    checks.check_float64_backend(q, backend)
    sequences = prepare(q, k, cu_q, cu_k, max_q, max_k, index_check.enabled(attn.check_indices))
    if _compiling():
        from . import closure_sources
        from .torch_op import compiled_attention

        captures = closure_sources.fetch(attn, attn._sources) if attn._sources is not None else []
        if wants_grad([q, k, v] + captures):
            check_trainable(attn, backend)
        out, *lse = compiled_attention(attn, q, k, v, backend, sequences=sequences)
    else:
        text, captures = attn._prepare(q, k, v, sequences=sequences)
        if wants_grad([q, k, v] + captures):
            from .autograd import compiled_call, differentiable_call

            check_trainable(attn, backend)
            call = compiled_call(attn, text, q, k, v, backend, sequences=sequences)
            out, *lse = differentiable_call(call, q, k, v, captures)
        else:
            out, *lse = _execute(text, [q, k, v] + captures, backend, out_dtype=q.dtype, autotune=attn.autotune)
    out = out[0].transpose(0, 1) if attn.layout == "blhd" else out[0]
    return (out, lse[0][0]) if return_lse else out


def unpacked(t, cu, longest: int):
    """The [S, H, longest(, D)] view of packed [1, H, T(, D)] rows (zero past each sequence), a
    copy: for checked mode, which evaluates the mods on what they see."""
    view = t.new_zeros(cu.shape[0] - 1, t.shape[1], longest, *t.shape[3:])
    starts = cu.tolist()
    for s, (lo, hi) in enumerate(zip(starts, starts[1:])):
        view[s, :, :hi - lo] = t[0, :, lo:hi]
    return view


def checked_grid(q, k, kv_len, block_table, sequences: Sequences | None) -> tuple:
    """What checked mode evaluates the mods on (index_check.check_module's `grid`): the q and k
    the mods see -- a paged cache's keys gathered, packed sequences unpacked -- and how many query
    rows and keys each batch entry has. Built in checked mode only: it copies q and k."""
    import torch

    if sequences is None:
        if block_table is not None:
            n_pages, heads, size, dim = k.shape
            picked = k[block_table.long().clamp(0, n_pages - 1)]
            k = picked.permute(0, 2, 1, 3, 4).reshape(block_table.shape[0], heads, -1, dim)
        return q, k, None, kv_len

    lengths_q = (sequences.cu_q[1:] - sequences.cu_q[:-1]).to(torch.int64)
    return (unpacked(q, sequences.cu_q, sequences.longest_q), unpacked(k, sequences.cu_k, sequences.longest_k),
            lengths_q, sequences.kv_len)
