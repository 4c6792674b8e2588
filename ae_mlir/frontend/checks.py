"""Argument checks shared by `attention` and `linear_attention`: tensors, layouts, devices."""
from __future__ import annotations

import math

from ..kernel_args import unit_last_stride

BACKENDS = ("cpu", "triton", "reference")
LAYOUTS = ("bhld", "blhd")
# How each layout spells q/k/v and a per-token g, for messages.
FORMS = {"bhld": "[B, H, L, D]", "blhd": "[B, L, H, D]"}
G_FORMS = {"bhld": {"token": "[B, H, T]", "token_dim": "[B, H, T, Dk]"},
           "blhd": {"token": "[B, T, H]", "token_dim": "[B, T, H, Dk]"}}
_DTYPES = ("float16", "bfloat16", "float32")


def check_tensor(name: str, t, rank: int, form: str = FORMS["bhld"], float64: bool = False):
    """`float64` also lets float64 through: softmax-family attention runs it on the reference
    backend (see `check_float64_backend`)."""
    import torch

    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != rank:
        raise ValueError(f"{name} must have rank {rank} ({form} layout), got shape {tuple(t.shape)}")
    if str(t.dtype).removeprefix("torch.") not in _DTYPES and not (float64 and t.dtype == torch.float64):
        allowed = "float16, bfloat16, float32 or float64 (backend='reference' only)" if float64 else \
            "float16, bfloat16 or float32"
        raise ValueError(f"{name} must be {allowed}, got {t.dtype}")


def tensors_key(*tensors):
    """What the checks of these tensors read (shapes, dtypes, devices), as a hashable key; None
    unless every one is a plain torch.Tensor (a subclass may answer differently, and anything
    else gets the checks' own message)."""
    import torch

    key = []
    for t in tensors:
        if type(t) is not torch.Tensor:
            return None
        key += (t.shape, t.dtype, t.device)
    return tuple(key)


def with_unit_last_stride(t, limit: int):
    """`t`, or a contiguous copy of it where its last dimension is not unit-strided (a stride-0
    broadcast, a transposed table) and it has at most `limit` elements (q's, k's and v's): as a
    closure tensor such a tensor would send the whole call, q, k and v included, to the kernels'
    variant for any strides (element-wise tile loads), while a larger one (a bias broadcast to
    [B, H, Lq, Lk]) would cost more to copy, or not fit. The copy is a torch op, so a tensor that
    requires grad gets its gradient through it."""
    return t if unit_last_stride(t) or t.numel() > limit else t.contiguous()


def with_unit_last_strides(tensors: list, q, k, v) -> list:
    """`with_unit_last_stride` of each closure tensor, at most as large as q, k and v together."""
    if not tensors:
        return tensors
    limit = q.numel() + k.numel() + v.numel()
    return [with_unit_last_stride(t, limit) for t in tensors]


def check_float64_backend(q, backend: str):
    """float64 q/k/v run on the float64 reference only (how torch.autograd.gradcheck checks the
    backward); the compiled backends take float16, bfloat16 and float32."""
    import torch

    if q.dtype == torch.float64 and backend != "reference":
        raise ValueError(f"q must be float16, bfloat16 or float32 for backend={backend!r}, got torch.float64; "
                         "float64 inputs run with backend='reference' only")


def check_float(name: str, t):
    if not t.dtype.is_floating_point or str(t.dtype).removeprefix("torch.") not in _DTYPES:
        raise ValueError(f"{name} must be float16, bfloat16 or float32, got {t.dtype}")


def same(name_a, a, name_b, b, what: str):
    if a != b:
        raise ValueError(f"{name_a} and {name_b} must have the same {what}, got {a} and {b}")


def check_common(q, k, v, form: str, float64: bool = False):
    """q, k, v already in [B, H, L, D] order; `form` is how the caller's layout spells them."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t, 4, form, float64)
    same("q", q.dtype, "k", k.dtype, "dtype")
    same("q", q.dtype, "v", v.dtype, "dtype")
    same("q", q.device, "k", k.device, "device")
    same("q", q.device, "v", v.device, "device")
    same("q", q.shape[0], "k", k.shape[0], "batch size")
    same("q", q.shape[0], "v", v.shape[0], "batch size")
    same("q", q.shape[3], "k", k.shape[3], "head dim (Dk)")
    for name, t in (("q", q), ("v", v)):
        if t.shape[3] == 0:
            raise ValueError(f"{name} has head dim 0; head dims must be positive")


def default_scale(scale, dk: int) -> float:
    if scale is None:
        return 1.0 / math.sqrt(dk)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ValueError(f"scale must be a finite number or None, got {scale!r}")
    return float(scale)


def check_layout(layout):
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be 'bhld' (q/k/v as {FORMS['bhld']}) or 'blhd' (as {FORMS['blhd']}, "
                         f"FlashAttention's and fla's), got {layout!r}")


def check_bool(name: str, value):
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")


def check_flag(name: str, value):
    if value is not None and not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool or None, got {type(value).__name__}")


def to_bhld(t, layout: str):
    """A [B, L, H, ...] tensor seen as [B, H, L, ...] (a view: the kernels take any strides);
    anything else is returned as it is, for the checks to name."""
    import torch

    if layout == "blhd" and isinstance(t, torch.Tensor) and t.dim() >= 3:
        return t.transpose(1, 2)
    return t


def other_layout(layout: str) -> str:
    return "blhd" if layout == "bhld" else "bhld"


def with_layout_hint(validate, layout: str, *args):
    """Run `validate(layout, *args)`; when it fails and the other layout would fit, the error says
    which layout the tensors look like."""
    try:
        validate(layout, *args)
    except ValueError as err:
        other = other_layout(layout)
        try:
            validate(other, *args)
        except (ValueError, TypeError):
            raise err from None
        raise ValueError(f"{err}; the tensors look like {FORMS[other]}: pass layout={other!r}") from None


def backend_for(backend: str | None, named: list) -> str:
    """The backend to run on tensors `named` [(name, tensor)], all on one device; a backend that
    cannot run there is a ValueError saying what to do, before anything compiles."""
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(map(repr, BACKENDS))} or None, got {backend!r}")
    first, t0 = named[0]
    for name, t in named[1:]:
        same(first, t0.device, name, t.device, "device")
    device = t0.device
    if device.type not in ("cpu", "cuda"):  # ROCm builds of torch report their GPUs as "cuda" too
        raise ValueError(f"no ae-mlir backend runs on device '{device}'; use CPU or CUDA/ROCm tensors")
    if backend is None:
        return "cpu" if device.type == "cpu" else "triton"
    if backend == "triton" and device.type != "cuda":
        raise ValueError(f"backend='triton' runs on CUDA/ROCm tensors, but the tensors are on '{device}'; "
                         "move them to the GPU (e.g. q.cuda()), or use backend='cpu' or backend='reference'")
    if backend == "cpu" and device.type != "cpu":
        raise ValueError(f"backend='cpu' runs on CPU tensors, but the tensors are on '{device}'; move them "
                         "with .cpu(), or use backend='triton' (or None) for GPU tensors, or backend='reference'")
    return backend


def check_capture_devices(captures: list, device):
    """Closure tensors a mod reads must sit where q does: the kernel reads them in place."""
    for i, t in enumerate(captures):
        if t.device != device:
            raise ValueError(f"closure tensor {i} (shape {tuple(t.shape)}) that a mod reads is on '{t.device}' "
                             f"but q is on '{device}'; create it on q's device (e.g. t.to(q.device))")



def key_lengths(kv_len, q, keys: int, checked: bool):
    """`kv_len` (each batch entry's number of keys) as the kernels take it: an int32 vector [B] on
    q's device; None stays None. A length outside [0, Lk] acts as the nearest end of that range,
    as closure indices are clamped; in checked mode it is a ValueError instead."""
    if kv_len is None:
        return None
    import torch

    if not isinstance(kv_len, torch.Tensor):
        raise TypeError(f"kv_len must be a tensor of integers (one length per batch entry) or None, "
                        f"got {type(kv_len).__name__}")
    if kv_len.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"kv_len must be an int32 or int64 tensor, got {kv_len.dtype}")
    if tuple(kv_len.shape) != (q.shape[0],):
        raise ValueError(f"kv_len must have shape ({q.shape[0]},) (one length per batch entry), "
                         f"got {tuple(kv_len.shape)}")
    if kv_len.device != q.device:
        raise ValueError(f"kv_len is on '{kv_len.device}' but q is on '{q.device}'; create it on q's device")
    if checked and not torch.compiler.is_compiling():
        bad = (kv_len < 0) | (kv_len > keys)
        if bool(bad.any()):
            raise ValueError(f"kv_len[{int(bad.nonzero()[0, 0])}] = {int(kv_len[bad][0])} is outside [0, {keys}] "
                             "(k holds that many keys)")
    if kv_len.dtype == torch.int64:
        # Clamped before narrowing, so a length past 2**31 cannot wrap to a small one.
        kv_len = kv_len.clamp(0, keys)
    return kv_len.to(torch.int32).contiguous()


def paged_cache(q, k, v, block_table, form: str):
    """Check q, the page pools k, v ([P, Hkv, S, D] once in [B, H, L, D] order; `form` is how
    the caller's layout spells q) and the block table [B, M]."""
    import torch

    check_tensor("q", q, 4, form, float64=True)
    for name, t in (("k", k), ("v", v)):
        check_tensor(name, t, 4, form.replace("B", "P").replace("L", "S") + " pages", float64=True)
        same("q", q.dtype, name, t.dtype, "dtype")
        same("q", q.device, name, t.device, "device")
    same("k", k.shape[:3], "v", v.shape[:3], "number of pages, heads and page size")
    same("q", q.shape[3], "k", k.shape[3], "head dim (Dk)")
    if k.shape[0] == 0 or k.shape[2] == 0 or v.shape[3] == 0 or q.shape[3] == 0:
        raise ValueError(f"a paged cache needs pages of at least one slot and positive head dims, got k "
                         f"pages of shape {tuple(k.shape)} and v {tuple(v.shape)}")
    if k.shape[1] == 0 or q.shape[1] % k.shape[1]:
        raise ValueError(f"q heads ({q.shape[1]}) must be a multiple of k/v heads ({k.shape[1]}) for GQA")
    if not isinstance(block_table, torch.Tensor):
        raise TypeError(f"block_table must be a tensor of page numbers [B, max_pages] or None, "
                        f"got {type(block_table).__name__}")
    if block_table.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"block_table must be an int32 or int64 tensor, got {block_table.dtype}")
    if block_table.dim() != 2 or block_table.shape[0] != q.shape[0] or block_table.shape[1] == 0:
        raise ValueError(f"block_table must have shape ({q.shape[0]}, max_pages) with max_pages >= 1 (a row of "
                         f"page numbers per batch entry), got {tuple(block_table.shape)}")
    if block_table.device != q.device:
        raise ValueError(f"block_table is on '{block_table.device}' but q is on '{q.device}'")


def page_table(block_table, n_pages: int):
    """The block table as the kernels take it: int32, contiguous; int64 page numbers are clamped
    into [0, n_pages) first (as the kernels clamp them), so none wraps when narrowed."""
    import torch

    if block_table.dtype == torch.int64:
        block_table = block_table.clamp(0, n_pages - 1)
    return block_table.to(torch.int32).contiguous()


def paged_for_inference(q, k, v):
    """A paged cache is read, not trained: no gradients flow into its pages."""
    import torch

    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        raise ValueError("gradients through a paged KV cache (block_table) are not supported: call under "
                         "torch.no_grad(), or pass k and v as [B, H, L, D] tensors to train")


def pages_in_use(block_table, kv_len, n_pages: int, page_size: int):
    """Checked mode: every page number an entry reads (those covering its first kv_len keys)
    lies in [0, n_pages)."""
    import torch

    m = block_table.shape[1]
    lengths = torch.full((block_table.shape[0],), m * page_size, device=block_table.device) if kv_len is None \
        else kv_len.to(torch.int64).clamp(0, m * page_size)
    used = torch.arange(m, device=block_table.device).view(1, m) * page_size < lengths.view(-1, 1)
    bad = used & ((block_table < 0) | (block_table >= n_pages))
    if bool(bad.any()):
        b, j = (int(x) for x in bad.nonzero()[0])
        raise ValueError(f"block_table[{b}, {j}] = {int(block_table[b, j])} is not a page number in "
                         f"[0, {n_pages}) (k and v hold {n_pages} pages)")
