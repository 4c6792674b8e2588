"""The public Python API: `attention` (softmax family); `linear_attention` (the recurrence) lives
in `linear_api` and builds on the helpers here and in `module_text`."""
from __future__ import annotations

import math

from . import checks, index_check, relative_reads
from ..core.memo import kept
from .emit import loc_suffix, strip_locations
from .l0_modules import attention_module
from .locations import definition_location, user_location
from .module_text import Captures, as_float, mod_name, signature
from .trace import F32, I1, INDEX, TraceError, trace

NORMALIZERS = ("softmax", "sigmoid", "relu", "none")
# What a score_mod and a mask_mod are traced with: (score, b, h, q_idx, kv_idx) and (b, h, q_idx, kv_idx).
SCORE_MOD_ARGS = [F32, INDEX, INDEX, INDEX, INDEX]
MASK_MOD_ARGS = [INDEX, INDEX, INDEX, INDEX]


class attention:
    """Softmax-family attention: `o = attn(q, k, v)`, `o, lse = attn(q, k, v, return_lse=True)`.

    score_mod(score, b, h, q_idx, kv_idx) and mask_mod(b, h, q_idx, kv_idx) have FlexAttention's
    signatures; `normalize` is "softmax", "sigmoid", "relu", "none" or an
    `ae_mlir.OnlineNormalizer` (a user-defined online normalizer). With `layout="blhd"` q/k/v are
    FlashAttention's [B, L, H, D] and the output is [B, L, H, Dv]; lse is [B, H, L] in both.
    A closure-tensor index out of range is clamped into the tensor; `check_indices=True` (or
    AE_MLIR_CHECK=1) raises IndexError for it instead.

    `kv_len` (an int32/int64 tensor [B] on q's device) gives each batch entry's number of keys:
    entry b attends to keys 0 .. kv_len[b] - 1 only (the mods see the same indices), so a KV cache
    allocated once serves every decoding step without recompiling; the kernels read no key past
    it (what the cache holds there does not matter). A length outside [0, Lk] acts as the nearest
    end of that range; in checked mode it raises ValueError.

    The output is differentiable when q, k, v or a closure tensor requires grad: the backward is
    the compiler's derivative (`attn-differentiate`), run as generated kernels (softmax and the
    element-wise normalizers on the cpu and triton backends, the closure tensors' gradients
    included) or evaluated by torch otherwise. float64 inputs run on backend="reference" only, for
    torch.autograd.gradcheck. Under torch.compile a call is one custom op, `ae_mlir::attention`
    (no graph break, no MLIR while tracing) that reads the closure tensors' current values from
    where the mods find them (a closure variable, a global, or one attribute of either, such as
    `self.table`); construct the attention outside the compiled function.

    `autotune=True` searches the forward kernels' launch configuration for each new module
    (variant and shapes) on its first call, on that call's tensors, and keeps the fastest on disk
    (`ae_mlir.autotune`): block sizes, warps and pipeline stages on the Triton backend, the tiles
    on the CPU. A module whose shapes round up to the same powers of two as a searched one's
    (its shape bucket) takes that choice without a search. The default launches the presets'
    committed configs.
    """

    def __init__(self, score_mod=None, mask_mod=None, normalize="softmax", scale=None, layout="bhld",
                 check_indices=None, autotune=False):
        if _compiling():
            # Dynamo cannot trace the tracer, and an attention built per call would register a new
            # variant, and so recompile, on every call.
            raise RuntimeError("ae_mlir.attention cannot be constructed inside a torch.compile'd function; "
                               "construct ae.attention outside the compiled function (e.g. in the module's "
                               "__init__) and call it inside")
        if score_mod is not None and not callable(score_mod):
            raise TypeError(f"score_mod must be callable or None, got {type(score_mod).__name__}")
        if mask_mod is not None and not callable(mask_mod):
            raise TypeError(f"mask_mod must be callable or None, got {type(mask_mod).__name__}")
        from ..normalizers import OnlineNormalizer

        if not isinstance(normalize, OnlineNormalizer) and normalize not in NORMALIZERS:
            raise ValueError(f"normalize must be one of {', '.join(map(repr, NORMALIZERS))} or an "
                             f"OnlineNormalizer, got {normalize!r}")
        if scale is not None:
            checks.default_scale(scale, 1)
        checks.check_layout(layout)
        checks.check_flag("check_indices", check_indices)
        checks.check_bool("autotune", autotune)
        self.score_mod = score_mod
        self.mask_mod = mask_mod
        self.normalize = normalize
        self.scale = scale
        self.layout = layout
        self.check_indices = check_indices
        self.autotune = autotune
        from . import closure_sources, variant_registry

        self._key = variant_registry.register(self)
        self._sources = closure_sources.find(self)

    def __getstate__(self):
        # The per-call caches (module texts, compiled calls) are rebuilt by the copy's own calls.
        return {key: value for key, value in self.__dict__.items() if key not in ("_texts", "_calls", "_passed")}

    def __setstate__(self, state):
        # A copy is a variant of its own: sharing the original's key would make compiled calls of
        # the copy run the original (or fail once it is gone).
        from . import variant_registry

        self.__dict__.update(state)
        self.__dict__.setdefault("autotune", False)  # pickled before the option existed
        self._key = variant_registry.register(self)

    @staticmethod
    def _validate_as(layout, q, k, v):
        q, k, v = (checks.to_bhld(t, layout) for t in (q, k, v))
        checks.check_common(q, k, v, checks.FORMS[layout], float64=True)
        checks.same("k", k.shape[1], "v", v.shape[1], "number of heads")
        checks.same("k", k.shape[2], "v", v.shape[2], "sequence length")
        h, hkv = q.shape[1], k.shape[1]
        if hkv == 0 or h % hkv:
            raise ValueError(f"q heads ({h}) must be a multiple of k/v heads ({hkv}) for GQA")

    def _validate(self, q, k, v):
        """q, k, v checked in this attention's layout and returned as [B, H, L, D] views."""
        return self._validated(q, k, v)[0]

    def _validated(self, q, k, v):
        """(`_validate`'s views, the record of tensors like these or None). Tensors like ones that
        passed before (the shapes, dtypes and devices the checks read) pass unchecked, as every
        torch call costs a call from Python microseconds; the record, a dict, keeps the backend
        each `backend` argument resolved to for them."""
        key = checks.tensors_key(q, k, v)
        record = None
        if key is not None:
            passed = self.__dict__.setdefault("_passed", {})
            key = (self.layout, key)
            record = passed.get(key)
        if record is None:
            checks.with_layout_hint(self._validate_as, self.layout, q, k, v)
            if key is not None:
                record = kept(passed, key, dict, 64)
        return tuple(checks.to_bhld(t, self.layout) for t in (q, k, v)), record

    def mlir(self, q, k, v, debug_info: bool = False, kv_len=None, block_table=None, cu_seqlens_q=None,
             cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None, compose: bool = True) -> str:
        """The L0 `attn` module for these tensors' shapes and dtypes (generic form); with
        `debug_info`, every op ends with its location in the user's source, as compiling sees it.
        The other arguments are as for a call; of kv_len, block_table and the offsets only the
        shapes are read (with offsets on the "meta" device, give max_seqlen_q and max_seqlen_k).
        `compose=False` keeps closure reads indexed by a function of kv_idx - q_idx as the
        score_mod wrote them (the reference backend's module; relative_reads)."""
        if cu_seqlens_q is not None or cu_seqlens_k is not None:
            from . import varlen

            q, k, v = varlen.packed_views(q, k, v, self.layout)
            self._validate_as("bhld", q, k, v)
            sequences = varlen.prepare(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, False)
            text, _ = self._build(q, k, v, sequences=sequences)
            return text if debug_info else strip_locations(text)
        q, k, v, block_table = self._validate_cache(q, k, v, block_table)
        if kv_len is not None and tuple(kv_len.shape) != (q.shape[0],):
            raise ValueError(f"kv_len must have shape ({q.shape[0]},), got {tuple(kv_len.shape)}")
        text, _ = self._build(q, k, v, kv_len=kv_len, block_table=block_table, compose=compose)
        return text if debug_info else strip_locations(text)

    def _validate_cache(self, q, k, v, block_table):
        """(q, k, v, block_table): q, k, v as [B, H, L, D] views, or with a block table, k and v
        as page pools [P, Hkv, S, D] and the table as int32 [B, M]."""
        if block_table is None:
            return (*self._validate(q, k, v), None)
        q, k, v = (checks.to_bhld(t, self.layout) for t in (q, k, v))
        checks.paged_cache(q, k, v, block_table, checks.FORMS[self.layout])
        return q, k, v, block_table

    def _build(self, q, k, v, clamp: bool = True, kv_len=None, block_table=None, sequences=None,
               compose: bool = True) -> tuple[str, list]:
        """(the L0 module, its closure tensors): `_build_captures` with the tensors alone."""
        text, caps = self._build_captures(q, k, v, clamp, kv_len, block_table, sequences, compose)
        return text, caps.tensors

    def _build_captures(self, q, k, v, clamp: bool = True, kv_len=None, block_table=None, sequences=None,
                        compose: bool = True) -> tuple[str, "Captures"]:
        """The L0 module with locations: ops a mod produced point at its lines, the mod ops at its
        definition, the rest at the user's call. `kv_len` (int32 [B]) becomes a closure tensor
        after the mods', the mask's operand; with `block_table` (int32 [B, M]) k and v are page
        pools [P, Hkv, S, D] and the table the last closure tensor; with `sequences`
        (varlen.Sequences) q, k, v are packed [1, H, T, D], the offsets the last two closure
        tensors, and the results are packed back. With `compose` (and `clamp`), closure reads
        indexed by a function of kv_idx - q_idx alone read a tensor composed for this call
        (relative_reads)."""
        b, h, lq, dk = q.shape
        lk = v.shape[2] if block_table is None else v.shape[2] * block_table.shape[1]
        if sequences is not None:
            b, lq, lk, kv_len = sequences.kv_len.shape[0], sequences.longest_q, sequences.longest_k, sequences.kv_len
        call = user_location()
        mods = trace_mods(self, lq, lk, compose and clamp)
        caps = Captures()
        positions = [caps.add(state) for _, _, state in mods]
        added = [kv_len, block_table] + ([] if sequences is None else [sequences.cu_q, sequences.cu_k])
        for t in added:
            if t is not None:
                caps.add_call_tensor(t)
        scale = checks.default_scale(self.scale, dk)
        # Everything the text is a function of: a call like an earlier one (the same mods traced to
        # the same expressions, shapes, dtypes and locations) takes that call's text, unwritten.
        key = (q.shape, k.shape, v.shape, q.dtype, b, lq, lk, clamp, scale, call, tuple(caps.types()),
               tuple(None if t is None else tuple(t.shape) for t in added), normalizer_key(self.normalize),
               tuple((role, definition_location(getattr(self, role)), signature(expr, where))
                     for (role, expr, _), where in zip(mods, positions)))
        return kept(self.__dict__.setdefault("_texts", {}), key,
                    lambda: self._checked_module(q, k, v, mods, caps, clamp, kv_len, block_table, sequences, b, lq, lk,
                                                 scale, loc_suffix(call)), 64), caps

    def _checked_module(self, q, k, v, mods: list, caps: "Captures", *args) -> str:
        """`l0_modules.attention_module`'s text, whose closure tensors must be the call's `caps` (in order)."""
        text, emitted = attention_module(self, q, k, v, mods, *args)
        if [id(t) for t in emitted.tensors] != [id(t) for t in caps.tensors]:
            # The two orders are built by separate code; a module whose %c<i> named other
            # tensors than the call passes would read the wrong tensors silently.
            raise RuntimeError("internal error: the L0 module's closure tensors are not the call's")
        return text

    def __call__(self, q, k, v, return_lse: bool = False, backend: str | None = None, kv_len=None,
                 block_table=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None):
        if return_lse and self.normalize != "softmax":
            name = self.normalize if isinstance(self.normalize, str) else self.normalize.name
            raise ValueError(f"return_lse=True needs normalize='softmax', not {name!r}")
        if cu_seqlens_q is not None or cu_seqlens_k is not None:
            if kv_len is not None or block_table is not None:
                raise ValueError("cu_seqlens_q/k do not combine with kv_len or block_table: a packed batch's "
                                 "offsets give each sequence's keys")
            from .varlen import call_packed

            return call_packed(self, q, k, v, return_lse, backend, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                               max_seqlen_k)
        record = None
        if block_table is None:
            (q, k, v), record = self._validated(q, k, v)
        else:
            q, k, v, block_table = self._validate_cache(q, k, v, block_table)
        checked = index_check.enabled(self.check_indices)
        keys = k.shape[2] if block_table is None else k.shape[2] * block_table.shape[1]
        kv_len = checks.key_lengths(kv_len, q, keys, checked)
        if block_table is not None:
            checks.paged_for_inference(q, k, v)
            if checked:
                checks.pages_in_use(block_table, kv_len, k.shape[0], k.shape[2])
            block_table = checks.page_table(block_table, k.shape[0])
        if backend is not None and type(backend) is not str:
            record = None  # an unhashable or odd `backend` gets backend_for's message
        resolved = record.get(backend) if record is not None else None
        if resolved is None:
            resolved = checks.backend_for(backend, [("q", q), ("k", k), ("v", v)])
            checks.check_float64_backend(q, resolved)
            if record is not None:
                record[backend] = resolved
        backend = resolved
        if q.shape[0] * q.shape[1] * q.shape[2] == 0 or keys == 0:
            # Nothing to compute: no queries, or no keys (every row is empty: o = 0, lse = -inf).
            import torch

            b, h, lq = q.shape[:3]
            out = torch.zeros(b, h, lq, v.shape[3], dtype=q.dtype, device=q.device)
            lse = torch.full((b, h, lq), -math.inf, dtype=torch.float32, device=q.device)
            return (self._out(out), lse) if return_lse else self._out(out)
        if _compiling():
            from .torch_op import compiled_attention

            out, lse = compiled_attention(self, q, k, v, backend, kv_len, block_table)
            return (self._out(out), lse) if return_lse else self._out(out)
        # The reference backend evaluates the mods as written: it is the oracle of the composition.
        compose = backend != "reference"
        text, captures = self._prepare(q, k, v, kv_len, block_table, compose=compose)
        if wants_grad([q, k, v] + captures):
            from .autograd import compiled_call, differentiable_call

            out, lse = differentiable_call(compiled_call(self, text, q, k, v, backend, kv_len=kv_len, compose=compose),
                                           q, k, v, captures)
            return (self._out(out), lse) if return_lse else self._out(out)
        results = _execute(text, [q, k, v] + captures, backend, out_dtype=q.dtype, autotune=self.autotune)
        return (self._out(results[0]), results[1]) if return_lse else self._out(results[0])

    def _prepare(self, q, k, v, kv_len=None, block_table=None, sequences=None,
                 compose: bool = True) -> tuple[str, list]:
        """The L0 module for these [B, H, L, D] tensors (and per-entry key lengths, a paged cache,
        packed sequences) and the closure tensors it takes, checked (devices; indices in checked
        mode); `compose` as `_build` takes it. Closure tensors come with a unit last stride
        (`checks.with_unit_last_stride`)."""
        text, caps = self._prepare_captures(q, k, v, kv_len, block_table, sequences, compose)
        return text, checks.with_unit_last_strides(caps.tensors, q, k, v)

    def _prepare_captures(self, q, k, v, kv_len=None, block_table=None, sequences=None,
                          compose: bool = True) -> tuple[str, "Captures"]:
        """`_prepare` with the closure tensors as `_build_captures` gives them."""
        text, caps = self._build_captures(q, k, v, kv_len=kv_len, block_table=block_table, sequences=sequences,
                                          compose=compose)
        captures = caps.tensors
        checks.check_capture_devices(captures, q.device)
        if index_check.enabled(self.check_indices) and captures:
            unclamped, read = self._build(q, k, v, clamp=False, kv_len=kv_len, block_table=block_table,
                                          sequences=sequences)
            mods = {(op, 0): index_check.describe(fn, role) for op, fn, role in (
                ("attn.score_mod", self.score_mod, "score_mod"), ("attn.mask", self.mask_mod, "mask_mod"))
                if fn is not None}
            grid = None
            if kv_len is not None or block_table is not None or sequences is not None:
                from .varlen import checked_grid

                grid = checked_grid(q, k, kv_len, block_table, sequences)
            index_check.check_module(unclamped, [q, k, v] + read, 3, mods, grid)
        return text, caps

    def _out(self, out):
        """The output in the caller's layout (a view); lse stays [B, H, L], as FlashAttention's."""
        return out.transpose(1, 2) if self.layout == "blhd" else out


def trace_mods(attn: attention, lq: int, lk: int, compose: bool) -> list[tuple]:
    """(role, traced expression, trace state) of the score_mod (composed when `compose`) and the
    mask_mod that `attn` has, in the module's order."""
    mods = []
    if attn.score_mod is not None:
        name = mod_name(attn.score_mod, "score_mod")
        expr, state = trace(attn.score_mod, name, SCORE_MOD_ARGS)
        if expr.type == I1:
            raise TraceError(f"{name} must return a float score, got a boolean")
        if expr.type == INDEX:
            expr = as_float(expr)
        if compose:
            expr = relative_reads.compose(expr, state, lq, lk)
        mods.append(("score_mod", expr, state))
    if attn.mask_mod is not None:
        name = mod_name(attn.mask_mod, "mask_mod")
        expr, state = trace(attn.mask_mod, name, MASK_MOD_ARGS)
        if expr.type != I1:
            raise TraceError(f"{name} must return a boolean (True keeps the pair), got a {expr.type} value")
        mods.append(("mask_mod", expr, state))
    return mods


def normalizer_key(normalize):
    """What of the normalizer the module text is a function of."""
    if isinstance(normalize, str):
        return normalize
    from ..normalizers import region_texts

    return (definition_location(normalize.prob), tuple(sorted(region_texts(normalize).items())))


def _compiling() -> bool:
    import torch

    return torch.compiler.is_compiling()


def wants_grad(tensors: list) -> bool:
    """Whether autograd records this call: grad mode is on and some input requires grad."""
    if not any(t.requires_grad for t in tensors):
        return False
    import torch

    return torch.is_grad_enabled()


def __getattr__(name):
    # `linear_attention` builds on this module's helpers, so it is imported on first use.
    if name == "linear_attention":
        from .linear_api import linear_attention

        return linear_attention
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _execute(text: str, inputs: list, backend: str, out_dtype, autotune: bool = False):
    from .. import backends

    return backends.run(text, inputs, backend, out_dtype, autotune)
