"""The public `linear_attention` (the chunked recurrence of DESIGN.md section 3)."""
from __future__ import annotations

from . import checks, index_check
from ..core.memo import kept
from .api import _compiling, _execute, wants_grad
from .module_text import Captures, as_float, mod_name, signature
from .emit import loc_suffix, strip_locations
from .l0_modules import FEATURE_ROLES, linear_module
from .locations import user_location
from .trace import F32, I1, INDEX, TraceError, TraceState, trace

DECAYS = (None, "head", "token", "token_dim")


class linear_attention:
    """Linear attention as a chunked recurrence (DESIGN.md section 3).

    Under torch.compile a call is one custom op (`linear_torch_op`), differentiable in q, k, v, g
    and the initial state (not in closure tensors there).

    q_mod/k_mod/v_mod(x, b, h, t, d) map each element, or q_mod(x) maps the value alone (a feature
    map such as `lambda x: F.elu(x) + 1`); `decay` is None, "head", "token" or "token_dim" and `g`
    passed at call time is the log-decay of that shape: g <= 0 (decays in (0, 1], as
    log-sigmoid gates give). It is not checked (that would cost GPU programs a synchronization);
    the GPU kernels of "token_dim" clamp the exponents their factorization assumes to be <= 0,
    so a g > 0 there gives wrong results. With `layout="blhd"` q/k/v are fla's
    [B, T, H, D], g is [B, T, H] or [B, T, H, Dk] and the output [B, T, H, Dv]; the state is
    [B, H, Dk, Dv] in both layouts.

    Packed variable-length batches (fla's `cu_seqlens`): q/k/v [1, T, H, D] ("blhd") or
    [1, H, T, D] hold S sequences back to back, `cu_seqlens` (int32/int64 [S + 1]) their offsets;
    each sequence runs its own recurrence from initial_state[s] ([S, H, Dk, Dv]) and the final
    state is [S, H, Dk, Dv]. The mods see the sequence as b and positions within it as t.

    Outputs (the output and the final state) are differentiable in q, k, v, g, initial_state and
    the floating closure tensors the mods read: the forward is the compiled kernel. The backward
    is more runs of the compiled recurrence on the gradients (`linear_kernel_backward`, packed and
    normalized forms included); on the reference backend, for float64 inputs and for scale = 0 it
    recomputes the recurrence in chunks with torch (`linear_backward`). Both reapply the mods as Python
    functions, so a mod's closure tensors must still be the ones it read when backward runs.

    `autotune=True` tunes the Triton forward's launch configuration per module on its first call,
    as for `ae.attention` (`ae_mlir.autotune`); the backward's runs and the CPU's one-kernel
    recurrence keep the presets' configs.
    """

    def __init__(self, q_mod=None, k_mod=None, v_mod=None, decay=None, scale=None, normalize=False,
                 chunk_size=64, layout="bhld", check_indices=None, autotune=False):
        if _compiling():
            # As for attention: dynamo cannot trace the tracer, and a layer built per call would
            # register a new one, and so recompile, on every call.
            raise RuntimeError("ae_mlir.linear_attention cannot be constructed inside a torch.compile'd function; "
                               "construct it outside the compiled function (e.g. in the module's __init__) and "
                               "call it inside")
        for role, fn in (("q_mod", q_mod), ("k_mod", k_mod), ("v_mod", v_mod)):
            if fn is not None and not callable(fn):
                raise TypeError(f"{role} must be callable or None, got {type(fn).__name__}")
        if decay not in DECAYS:
            raise ValueError(f"decay must be one of {', '.join(map(repr, DECAYS))}, got {decay!r}")
        if not isinstance(normalize, bool):
            raise TypeError(f"normalize must be a bool, got {type(normalize).__name__}")
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or not 1 <= chunk_size <= 1024:
            raise ValueError(f"chunk_size must be an int in [1, 1024], got {chunk_size!r}")
        if scale is not None:
            checks.default_scale(scale, 1)
        checks.check_layout(layout)
        checks.check_flag("check_indices", check_indices)
        checks.check_bool("autotune", autotune)
        self.mods = {"q_mod": q_mod, "k_mod": k_mod, "v_mod": v_mod}
        self.arities = {role: _feature_mod_arity(role, fn) for role, fn in self.mods.items() if fn is not None}
        self.decay = decay
        self.scale = scale
        self.normalize = normalize
        self.chunk_size = chunk_size
        self.layout = layout
        self.check_indices = check_indices
        self.autotune = autotune
        from . import variant_registry

        self._key = variant_registry.register(self)
        self._sources = self._find_sources()

    MOD_ROLES = FEATURE_ROLES  # where closure_sources finds the mods

    @classmethod
    def _recurrence(cls, decay: str | None, scale: float, chunk_size: int):
        """The plain recurrence the backward's runs compile. Besides DECAYS it takes
        "token_value_dim" (g [B, H, L, Dv], the decay of the state's columns), which no call
        accepts: it is what the gradients of "token_dim" compute (attn-chunk-recurrence)."""
        run = cls(decay=None if decay == "token_value_dim" else decay, scale=scale, chunk_size=chunk_size)
        run.decay = decay
        return run

    @property
    def q_mod(self):
        return self.mods["q_mod"]

    @property
    def k_mod(self):
        return self.mods["k_mod"]

    @property
    def v_mod(self):
        return self.mods["v_mod"]

    def __getstate__(self):
        # The module texts of earlier calls are rebuilt by the copy's own calls.
        return {key: value for key, value in self.__dict__.items() if key != "_texts"}

    def __setstate__(self, state):
        # A copy is a layer of its own (see attention.__setstate__).
        from . import variant_registry

        self.__dict__.update(state)
        self.__dict__.setdefault("autotune", False)  # pickled before the option existed
        self._key = variant_registry.register(self)

    def _find_sources(self) -> list | None:
        """Where a compiled call finds each closure tensor the mods read (closure_sources); None
        when the mods cannot be traced (a call says why)."""
        from . import closure_sources

        try:
            _, caps = self._trace_mods()
        except TraceError:
            return None
        return [closure_sources.locate(self, t, "q_mod, k_mod or v_mod", i) for i, t in enumerate(caps.sources)]

    def _validate_as(self, layout, q, k, v, g, initial_state, entries=None):
        """Check the tensors in `layout`; `entries` is the initial state's first dimension when it
        is not the batch (the sequence count of a packed batch)."""
        given = g
        q, k, v, g = _as_bhld(self.decay, layout, q, k, v, g)
        checks.check_common(q, k, v, checks.FORMS[layout], float64=True)
        checks.same("q", tuple(q.shape), "k", tuple(k.shape), "shape")
        checks.same("q", tuple(q.shape[:3]), "v", tuple(v.shape[:3]), "[B, H, L]")
        b, h, l, dk = q.shape
        expected = {None: None, "head": (h,), "token": (b, h, l), "token_dim": (b, h, l, dk)}[self.decay]
        if expected is None and g is not None:
            raise ValueError("g was given but decay=None; pass decay='head', 'token' or 'token_dim'")
        if expected is not None:
            import torch

            if not isinstance(g, torch.Tensor):
                raise ValueError(f"decay={self.decay!r} needs g, a tensor of shape {expected}")
            if tuple(g.shape) != expected:
                raise ValueError(_g_shape_error(self.decay, layout, expected, tuple(given.shape)))
            if g.dtype != torch.float64:  # float64 runs on the reference backend only (`__call__`)
                checks.check_float("g", g)
            checks.same("q", q.device, "g", g.device, "device")
        if initial_state is not None:
            checks.check_tensor("initial_state", initial_state, 4, "[B, H, Dk, Dv]", float64=True)
            want = (b if entries is None else entries, h, dk, v.shape[3])
            if tuple(initial_state.shape) != want:
                raise ValueError(f"initial_state must have shape {want}, got {tuple(initial_state.shape)}")
            checks.same("q", q.device, "initial_state", initial_state.device, "device")
        return q, k, v, g

    def _validate(self, q, k, v, g, initial_state, entries=None):
        checks.with_layout_hint(self._validate_as, self.layout, q, k, v, g, initial_state, entries)
        return _as_bhld(self.decay, self.layout, q, k, v, g)

    def _packed(self, q, k, v, g, initial_state, cu_seqlens, max_seqlen):
        """q, k, v, g in [B, H, L, ...] form, the initial state and the packed batch's
        `Sequences` (None without cu_seqlens)."""
        if cu_seqlens is None:
            if max_seqlen is not None:
                raise ValueError("max_seqlen was given without cu_seqlens; pass both for a packed batch")
            return (*self._validate(q, k, v, g, initial_state), initial_state, None)
        from . import varlen

        entries = varlen.check_offsets("cu_seqlens", cu_seqlens)
        if getattr(q, "dim", lambda: 4)() == 3:
            raise ValueError(f"with cu_seqlens, q, k and v must be packed with batch size 1 "
                             f"({'[1, T, H, D]' if self.layout == 'blhd' else '[1, H, T, D]'}, as fla takes them), "
                             f"got q of shape {tuple(q.shape)}: add the batch dimension with q.unsqueeze(0)")
        q, k, v, g = self._validate(q, k, v, g, initial_state, entries)
        if q.shape[0] != 1:
            raise ValueError(f"with cu_seqlens, q, k and v must be packed with batch size 1 "
                             f"({'[1, T, H, D]' if self.layout == 'blhd' else '[1, H, T, D]'}), got batch {q.shape[0]}")
        sequences = varlen.prepare(q, q, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
                                   index_check.enabled(self.check_indices), names=("cu_seqlens", "max_seqlen"))
        padded = sequences.kv_len.shape[0]
        if initial_state is not None and padded > initial_state.shape[0]:
            import torch

            fill = initial_state.new_zeros(padded - initial_state.shape[0], *initial_state.shape[1:])
            initial_state = torch.cat([initial_state, fill])
        return q, k, v, g, initial_state, sequences

    def mlir(self, q, k, v, g=None, initial_state=None, debug_info: bool = False, cu_seqlens=None,
             max_seqlen=None) -> str:
        """The L0 `attn` module for these tensors' shapes and dtypes (generic form); with
        `debug_info`, every op ends with its location in the user's source."""
        q, k, v, g, initial_state, sequences = self._packed(q, k, v, g, initial_state, cu_seqlens, max_seqlen)
        text = self._build(q, k, v, g, initial_state, sequences=sequences)[0]
        return text if debug_info else strip_locations(text)

    def _trace_mods(self) -> tuple[dict, Captures]:
        """Each mod's expression (a float) and the closure tensors the mods read."""
        caps = Captures()
        exprs = {}
        states = TraceState("linear_attention mods")
        for role, fn in self.mods.items():
            if fn is None:
                continue
            name = mod_name(fn, role)
            states.mod_name = name
            expr, _ = trace(fn, name, [F32, INDEX, INDEX, INDEX, INDEX][: self.arities[role]], states)
            if expr.type == I1:
                raise TraceError(f"{name} must return a float, got a boolean")
            exprs[role] = expr if expr.type == F32 else as_float(expr)
        caps.add(states)
        return exprs, caps

    def _build(self, q, k, v, g, initial_state, clamp: bool = True, sequences=None,
               out_dtype=None) -> tuple[str, list]:
        text, caps = self._build_with_captures(q, k, v, g, initial_state, clamp, sequences, out_dtype)
        return text, caps.tensors

    def _build_with_captures(self, q, k, v, g, initial_state, clamp: bool = True, sequences=None,
                             out_dtype=None) -> tuple[str, Captures]:
        """The L0 module and the captures; the output is of q's dtype, or `out_dtype` (the
        backward's float32 gradients of 16-bit inputs). The mods are traced on every call; a
        call whose mods trace as an earlier call's did, with the same shapes, dtypes, options
        and calling line, takes that call's text (as `attention` does)."""
        # Rounded as the attribute holds it, so the backward's runs (which take the rounded scale)
        # print the same module as the forward where their shapes match, and share its kernels.
        scale = _as_f32(checks.default_scale(self.scale, q.shape[3]))
        call = user_location()
        exprs, caps = self._trace_mods()
        positions = list(range(len(caps.tensors)))  # the mods share one trace state
        key = (tuple(None if t is None else (t.shape, t.dtype) for t in (q, k, v, g, initial_state)),
               None if sequences is None else (sequences.cu_q.shape, sequences.kv_len.shape, sequences.longest_q),
               out_dtype, clamp, scale, call, self.decay, self.normalize, self.chunk_size, tuple(caps.types()),
               tuple((role, signature(expr, positions)) for role, expr in exprs.items()))
        return kept(self.__dict__.setdefault("_texts", {}), key,
                    lambda: linear_module(self, q, k, v, g, initial_state, clamp, sequences, out_dtype, scale, exprs,
                                          caps, loc_suffix(call)), 64), caps

    def __call__(self, q, k, v, g=None, initial_state=None, return_state: bool = False,
                 backend: str | None = None, cu_seqlens=None, max_seqlen: int | None = None):
        q, k, v, g, initial_state, sequences = self._packed(q, k, v, g, initial_state, cu_seqlens, max_seqlen)
        count = None if cu_seqlens is None else cu_seqlens.shape[0] - 1
        fixed = [t for t in (g, initial_state) if t is not None]
        if sequences is not None:
            fixed += [sequences.kv_len, sequences.cu_q]
        backend = _backend(backend, q, k, v, g, initial_state)
        if q.numel() == 0 or v.numel() == 0:
            out, state = _empty_call(q, v, initial_state, q.shape[0] if count is None else count)
            return (self._out(out), state) if return_state else self._out(out)
        if _compiling():
            from .linear_torch_op import compiled_linear

            out, state = compiled_linear(self, q, k, v, g, initial_state, backend, sequences)
            if count is not None:
                state = state[:count]
            return (self._out(out), state) if return_state else self._out(out)
        text, caps = self._build_with_captures(q, k, v, g, initial_state, sequences=sequences)
        captures = caps.tensors
        checks.check_capture_devices(captures, q.device)
        inputs = [q, k, v] + fixed + captures
        if index_check.enabled(self.check_indices) and captures:
            unclamped, _ = self._build(q, k, v, g, initial_state, clamp=False, sequences=sequences)
            mods = {("attn.linear_recurrence", i): index_check.describe(self.mods[role], role)
                    for i, role in enumerate(FEATURE_ROLES) if self.mods[role] is not None}
            packed = {} if sequences is None else dict(
                grid=(None, None, sequences.kv_len.long(), None), linear_views=_views(q, k, v, sequences))
            index_check.check_module(unclamped, inputs, 3 + len(fixed), mods, **packed)
        if wants_grad([q, k, v] + fixed + caps.sources):
            out, state = self._differentiable(text, inputs, backend, q, k, v, g, initial_state, caps.sources,
                                              sequences)
        else:
            out, state = _execute(text, inputs, backend, out_dtype=q.dtype, autotune=self.autotune)
        if count is not None:
            state = state[:count]
        return (self._out(out), state) if return_state else self._out(out)

    def _differentiable(self, text, inputs, backend, q, k, v, g, initial_state, sources, sequences=None):
        """The kernel's (out, state), recorded by autograd with the torch backward of
        `linear_backward`."""
        from .linear_backward import differentiable_call

        detached = [t.detach() for t in inputs]
        call = self._linear_call(q.shape[3], sources,
                                 None if sequences is None else (sequences.cu_q, sequences.longest_q),
                                 backend, run=lambda: _execute(text, detached, backend, out_dtype=q.dtype,
                                                                  autotune=self.autotune),
                                 current_sources=lambda: self._trace_mods()[1].sources)
        return differentiable_call(call, q, k, v, g, initial_state)

    def _linear_call(self, dk: int, sources, packing, backend: str, run=None, current_sources=None):
        """What the backward recomputes (linear_backward.LinearCall)."""
        from .linear_backward import LinearCall

        return LinearCall(mods=tuple((self.mods[role], self.arities.get(role, 1)) for role in FEATURE_ROLES),
                          decay=self.decay, scale=_as_f32(checks.default_scale(self.scale, dk)),
                          normalize=self.normalize, chunk_size=self.chunk_size, sources=tuple(sources),
                          packing=packing, backend=backend, run=run, current_sources=current_sources)

    def _out(self, out):
        """The output in the caller's layout (a view)."""
        return out.transpose(1, 2) if self.layout == "blhd" else out


def _as_bhld(decay, layout, q, k, v, g):
    """q, k, v and g as the kernel takes them ([B, H, L, ...]) from `layout`."""
    q, k, v = (checks.to_bhld(t, layout) for t in (q, k, v))
    if decay in ("token", "token_dim"):
        g = checks.to_bhld(g, layout)
        if decay == "token" and g is not None and g.dim() == 3 and g.shape[2] > 1 and g.stride(2) != 1:
            # A [B, H, T] view of [B, T, H] has stride H along T, which makes the CPU kernel load
            # every tile element-wise and the Triton one take its general variant; g is 1/Dk of
            # q's size, so copying it is the cheaper way.
            g = g.contiguous()
    return q, k, v, g


def _g_shape_error(decay, layout: str, expected: tuple, given: tuple) -> str:
    forms = checks.G_FORMS[layout]
    message = (f"g for decay={decay!r} must have shape {_in_layout(expected, layout)} "
               f"({forms.get(decay, '[H]')} with layout={layout!r}), got {given}")
    other = checks.other_layout(layout)
    if decay in forms and given == _in_layout(expected, other):
        message += (f", which looks like {checks.G_FORMS[other][decay]}: transpose it with "
                    f"g.transpose(1, 2), or pass layout={other!r} with q/k/v as {checks.FORMS[other]}")
    return message


def _backend(backend: str | None, q, k, v, g, initial_state) -> str:
    """The backend a call runs on (checks.backend_for), float64 inputs on the reference only."""
    backend = checks.backend_for(backend, [("q", q), ("k", k), ("v", v)]
                                 + [(n, t) for n, t in (("g", g), ("initial_state", initial_state)) if t is not None])
    for name, t in (("q", q), ("g", g), ("initial_state", initial_state)):
        if t is not None and backend != "reference" and str(t.dtype) == "torch.float64":
            raise ValueError(f"{name} must be float16, bfloat16 or float32 for backend={backend!r}, got "
                             "torch.float64; float64 inputs run with backend='reference' only")
    return backend


def _empty_call(q, v, initial_state, entries: int):
    """(out, state) of an empty batch, head set or sequence: no step runs, the state passes
    through."""
    import torch

    b, h, l, dk = q.shape
    out = torch.zeros(b, h, l, v.shape[3], dtype=q.dtype, device=q.device)
    state = (initial_state[:entries].to(torch.float32).clone() if initial_state is not None
             else torch.zeros(entries, h, dk, v.shape[3], dtype=torch.float32, device=q.device))
    return out, state


def _views(q, k, v, sequences) -> dict:
    """q, k, v unpacked to [S, H, L, D] as the mods see them (checked mode)."""
    from .varlen import unpacked

    return {i: unpacked(t, sequences.cu_q, sequences.longest_q) for i, t in enumerate((q, k, v))}


def _as_f32(x: float) -> float:
    """x rounded to float32, as the module's `scale = ... : f32` attribute holds it."""
    import struct

    return struct.unpack("f", struct.pack("f", x))[0]


def _in_layout(shape: tuple, layout: str) -> tuple:
    """A [B, H, T, ...] shape spelled in `layout`."""
    return (shape[0], shape[2], shape[1], *shape[3:]) if layout == "blhd" and len(shape) >= 3 else shape


def _feature_mod_arity(role: str, fn) -> int:
    """5 for a mod taking (x, b, h, t, d), 1 for one taking the feature value x alone."""
    import inspect

    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        raise ValueError(f"{role}: the signature of {fn!r} cannot be read; pass a Python function "
                         "such as `lambda x: ...`") from None
    for arity in (5, 1):
        try:
            signature.bind(*range(arity))
            return arity
        except TypeError:
            continue
    raise ValueError(f"{role} must take 1 argument (x) or 5 (x, b, h, t, d), got the signature {signature}")
