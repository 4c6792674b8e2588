"""The public Python API: `attention` (softmax family) and `linear_attention` (recurrence)."""
from __future__ import annotations

import math

from .emit import emit_region, float_literal, loc_suffix, mlir_elt, strip_locations, tensor_type
from .locations import definition_location, user_location
from .trace import F32, I1, INDEX, TraceError, TraceState, trace

NORMALIZERS = ("softmax", "sigmoid", "relu", "none")
DECAYS = (None, "head", "token", "token_dim")
BACKENDS = ("cpu", "triton", "reference")
_DTYPES = ("float16", "bfloat16", "float32")


def _check_tensor(name: str, t, rank: int):
    import torch

    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != rank:
        raise ValueError(f"{name} must have rank {rank} ([B, H, L, D] layout), got shape {tuple(t.shape)}")
    if str(t.dtype).removeprefix("torch.") not in _DTYPES:
        raise ValueError(f"{name} must be float16, bfloat16 or float32, got {t.dtype}")


def _same(name_a, a, name_b, b, what: str):
    if a != b:
        raise ValueError(f"{name_a} and {name_b} must have the same {what}, got {a} and {b}")


def _check_common(q, k, v):
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_tensor(name, t, 4)
    _same("q", q.dtype, "k", k.dtype, "dtype")
    _same("q", q.dtype, "v", v.dtype, "dtype")
    _same("q", q.device, "k", k.device, "device")
    _same("q", q.device, "v", v.device, "device")
    _same("q", q.shape[0], "k", k.shape[0], "batch size")
    _same("q", q.shape[0], "v", v.shape[0], "batch size")
    _same("q", q.shape[3], "k", k.shape[3], "head dim (Dk)")
    for name, t in (("q", q), ("v", v)):
        if t.shape[3] == 0:
            raise ValueError(f"{name} has head dim 0; head dims must be positive")


def _default_scale(scale, dk: int) -> float:
    if scale is None:
        return 1.0 / math.sqrt(dk)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ValueError(f"scale must be a finite number or None, got {scale!r}")
    return float(scale)


def _mod_name(fn, role: str) -> str:
    return f"{role} '{getattr(fn, '__name__', type(fn).__name__)}'"


class _Captures:
    """Closure tensors of all mods of one module, deduplicated by identity, in first-use order."""

    def __init__(self):
        self.tensors: list = []

    def add(self, state: TraceState) -> list[int]:
        positions = []
        for cap in state.captures:
            for i, t in enumerate(self.tensors):
                if t is cap.tensor:
                    positions.append(i)
                    break
            else:
                self.tensors.append(cap.tensor)
                positions.append(len(self.tensors) - 1)
        return positions

    def types(self) -> list[str]:
        return [tensor_type(t.shape, mlir_elt(t.dtype)) for t in self.tensors]


def _region(expr, args, state: TraceState, caps: _Captures, prefix: str) -> str:
    """Emit a region whose closure tensors are the function arguments %c<i>."""
    positions = caps.add(state)
    all_types = caps.types()
    names = [f"%c{p}" for p in positions]
    types = [all_types[p] for p in positions]
    return emit_region(expr, args, names, types, prefix)


def _sig(types: list[str]) -> str:
    return "(" + ", ".join(types) + ")"


class attention:
    """Softmax-family attention: `o = attn(q, k, v)`, `o, lse = attn(q, k, v, return_lse=True)`.

    score_mod(score, b, h, q_idx, kv_idx) and mask_mod(b, h, q_idx, kv_idx) have FlexAttention's
    signatures; `normalize` is "softmax", "sigmoid", "relu", "none" or an
    `ae_mlir.OnlineNormalizer` (a user-defined online normalizer).
    """

    def __init__(self, score_mod=None, mask_mod=None, normalize="softmax", scale=None):
        if score_mod is not None and not callable(score_mod):
            raise TypeError(f"score_mod must be callable or None, got {type(score_mod).__name__}")
        if mask_mod is not None and not callable(mask_mod):
            raise TypeError(f"mask_mod must be callable or None, got {type(mask_mod).__name__}")
        from ..normalizers import OnlineNormalizer

        if not isinstance(normalize, OnlineNormalizer) and normalize not in NORMALIZERS:
            raise ValueError(f"normalize must be one of {', '.join(map(repr, NORMALIZERS))} or an "
                             f"OnlineNormalizer, got {normalize!r}")
        if scale is not None:
            _default_scale(scale, 1)
        self.score_mod = score_mod
        self.mask_mod = mask_mod
        self.normalize = normalize
        self.scale = scale

    def _validate(self, q, k, v):
        _check_common(q, k, v)
        _same("k", k.shape[1], "v", v.shape[1], "number of heads")
        _same("k", k.shape[2], "v", v.shape[2], "sequence length")
        h, hkv = q.shape[1], k.shape[1]
        if hkv == 0 or h % hkv:
            raise ValueError(f"q heads ({h}) must be a multiple of k/v heads ({hkv}) for GQA")

    def mlir(self, q, k, v, debug_info: bool = False) -> str:
        """The L0 `attn` module for these tensors' shapes and dtypes (generic form); with
        `debug_info`, every op ends with its location in the user's source, as compiling sees it."""
        self._validate(q, k, v)
        text, _ = self._build(q, k, v)
        return text if debug_info else strip_locations(text)

    def _build(self, q, k, v) -> tuple[str, list]:
        """The L0 module with locations: ops a mod produced point at its lines, the mod ops at its
        definition, the rest at the user's call."""
        b, h, lq, dk = q.shape
        _, hkv, lk, dv = v.shape
        scale = _default_scale(self.scale, dk)
        elt = mlir_elt(q.dtype)
        tq, tk, tv = (tensor_type(t.shape, elt) for t in (q, k, v))
        ts = tensor_type((b, h, lq, lk), "f32")
        tm = tensor_type((b, h, lq, lk), "i1")
        to = tensor_type((b, h, lq, dv), elt)
        tl = tensor_type((b, h, lq), "f32")
        call = loc_suffix(user_location())
        caps = _Captures()
        body = []
        scores = "%scores"
        body.append(f'%scores = "attn.score"(%q, %k) {{scale = {float_literal(scale)} : f32}} : ({tq}, {tk}) -> {ts}'
                    + call)
        if self.score_mod is not None:
            name = _mod_name(self.score_mod, "score_mod")
            expr, state = trace(self.score_mod, name, [F32, INDEX, INDEX, INDEX, INDEX])
            if expr.type == I1:
                raise TraceError(f"{name} must return a float score, got a boolean")
            if expr.type == INDEX:
                expr = _as_float(expr)
            args = [("%s", "f32"), ("%b", "index"), ("%h", "index"), ("%q_idx", "index"), ("%kv_idx", "index")]
            region = _region(expr, args, state, caps, "s")
            body.append(f'%modded = "attn.score_mod"({scores}) ({region}) : ({ts}) -> {ts}'
                        + _defined_at(self.score_mod, call))
            scores = "%modded"
        keep = None
        if self.mask_mod is not None:
            name = _mod_name(self.mask_mod, "mask_mod")
            expr, state = trace(self.mask_mod, name, [INDEX, INDEX, INDEX, INDEX])
            if expr.type != I1:
                raise TraceError(f"{name} must return a boolean (True keeps the pair), got a {expr.type} value")
            args = [("%b", "index"), ("%h", "index"), ("%q_idx", "index"), ("%kv_idx", "index")]
            region = _region(expr, args, state, caps, "m")
            body.append(f'%keep = "attn.mask"() ({region}) : () -> {tm}' + _defined_at(self.mask_mod, call))
            keep = "%keep"
        with_lse = self.normalize == "softmax"
        results = "%probs, %lse" if with_lse else "%probs"
        operands = [scores] + ([keep] if keep else [])
        in_types = [ts] + ([tm] if keep else [])
        out_types = [ts] + ([tl] if with_lse else [])
        kind, regions, norm_loc = self.normalize, "{}, {}, {}", call
        if not isinstance(kind, str):
            norm_loc = _defined_at(self.normalize.prob, call)
            from ..normalizers import region_texts

            texts = region_texts(self.normalize)
            kind, regions = "online", ", ".join(texts.get(r, "{}") for r in ("prob", "rescale", "finalize"))
        body.append(
            f'{results} = "attn.normalize"({", ".join(operands)}) ({regions}) '
            f'{{kind = "{kind}", operandSegmentSizes = array<i32: 1, {1 if keep else 0}>, '
            f'resultSegmentSizes = array<i32: 1, {1 if with_lse else 0}>}} : {_sig(in_types)} -> {_sig(out_types)}'
            + norm_loc
        )
        body.append(f'%out = "attn.aggregate"(%probs, %v) : ({ts}, {tv}) -> {to}' + call)
        ret_vals = ["%out"] + (["%lse"] if with_lse else [])
        ret_types = [to] + ([tl] if with_lse else [])
        body.append(f"return {', '.join(ret_vals)} : {', '.join(ret_types)}" + call)
        params = [f"%q: {tq}", f"%k: {tk}", f"%v: {tv}"] + [
            f"%c{i}: {t}" for i, t in enumerate(caps.types())]
        text = _func("attention", params, ret_types, body, call)
        return text, caps.tensors

    def __call__(self, q, k, v, return_lse: bool = False, backend: str | None = None):
        self._validate(q, k, v)
        if return_lse and self.normalize != "softmax":
            name = self.normalize if isinstance(self.normalize, str) else self.normalize.name
            raise ValueError(f"return_lse=True needs normalize='softmax', not {name!r}")
        backend = _backend(backend, q)
        if q.shape[0] * q.shape[1] * q.shape[2] == 0 or k.shape[2] == 0:
            # Nothing to compute: no queries, or no keys (every row is empty: o = 0, lse = -inf).
            import torch

            b, h, lq = q.shape[:3]
            out = torch.zeros(b, h, lq, v.shape[3], dtype=q.dtype, device=q.device)
            lse = torch.full((b, h, lq), -math.inf, dtype=torch.float32, device=q.device)
            return (out, lse) if return_lse else out
        text, captures = self._build(q, k, v)
        results = _execute(text, [q, k, v] + captures, backend, out_dtype=q.dtype)
        return (results[0], results[1]) if return_lse else results[0]


def _as_float(expr):
    from .trace import Expr

    return Expr("cast", F32, (expr,), loc=expr.loc)


def _defined_at(fn, call: str) -> str:
    """The location suffix of the op a user function becomes: its definition, else the call."""
    loc = definition_location(fn)
    return loc_suffix(loc) if loc is not None else call


def _func(name: str, params: list[str], ret_types: list[str], body: list[str], loc: str) -> str:
    lines = [f"func.func @{name}({', '.join(params)}) -> ({', '.join(ret_types)}) {{"]
    lines += [f"  {line}" for line in body]
    lines.append("}" + loc)
    return "module {\n" + "\n".join("  " + line for line in lines) + "\n}\n"


class linear_attention:
    """Linear attention as a chunked recurrence (DESIGN.md section 3).

    q_mod/k_mod/v_mod(x, b, h, t, d) map each element, or q_mod(x) maps the value alone (a feature
    map such as `lambda x: F.elu(x) + 1`); `decay` is None, "head", "token" or "token_dim" and `g`
    passed at call time is the log-decay of that shape.
    """

    def __init__(self, q_mod=None, k_mod=None, v_mod=None, decay=None, scale=None, normalize=False,
                 chunk_size=64):
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
            _default_scale(scale, 1)
        self.mods = {"q_mod": q_mod, "k_mod": k_mod, "v_mod": v_mod}
        self.arities = {role: _feature_mod_arity(role, fn) for role, fn in self.mods.items() if fn is not None}
        self.decay = decay
        self.scale = scale
        self.normalize = normalize
        self.chunk_size = chunk_size

    def _validate(self, q, k, v, g, initial_state):
        _check_common(q, k, v)
        _same("q", tuple(q.shape), "k", tuple(k.shape), "shape")
        _same("q", tuple(q.shape[:3]), "v", tuple(v.shape[:3]), "[B, H, L]")
        b, h, l, dk = q.shape
        expected = {None: None, "head": (h,), "token": (b, h, l), "token_dim": (b, h, l, dk)}[self.decay]
        if expected is None and g is not None:
            raise ValueError("g was given but decay=None; pass decay='head', 'token' or 'token_dim'")
        if expected is not None:
            import torch

            if not isinstance(g, torch.Tensor):
                raise ValueError(f"decay={self.decay!r} needs g, a tensor of shape {expected}")
            if tuple(g.shape) != expected:
                raise ValueError(f"g for decay={self.decay!r} must have shape {expected}, got {tuple(g.shape)}")
            if not g.dtype.is_floating_point or str(g.dtype).removeprefix("torch.") not in _DTYPES:
                raise ValueError(f"g must be float16, bfloat16 or float32, got {g.dtype}")
            _same("q", q.device, "g", g.device, "device")
        if initial_state is not None:
            _check_tensor("initial_state", initial_state, 4)
            want = (b, h, dk, v.shape[3])
            if tuple(initial_state.shape) != want:
                raise ValueError(f"initial_state must have shape {want}, got {tuple(initial_state.shape)}")
            _same("q", q.device, "initial_state", initial_state.device, "device")

    def mlir(self, q, k, v, g=None, initial_state=None, debug_info: bool = False) -> str:
        """The L0 `attn` module for these tensors' shapes and dtypes (generic form); with
        `debug_info`, every op ends with its location in the user's source."""
        self._validate(q, k, v, g, initial_state)
        text = self._build(q, k, v, g, initial_state)[0]
        return text if debug_info else strip_locations(text)

    def _build(self, q, k, v, g, initial_state) -> tuple[str, list]:
        b, h, l, dk = q.shape
        dv = v.shape[3]
        scale = _default_scale(self.scale, dk)
        call = loc_suffix(user_location())
        elt = mlir_elt(q.dtype)
        tq, tk, tv = (tensor_type(t.shape, elt) for t in (q, k, v))
        params = [f"%q: {tq}", f"%k: {tk}", f"%v: {tv}"]
        operands = ["%q", "%k", "%v"]
        types = [tq, tk, tv]
        if g is not None:
            tg = tensor_type(g.shape, mlir_elt(g.dtype))
            params.append(f"%g: {tg}")
            operands.append("%g")
            types.append(tg)
        if initial_state is not None:
            ts0 = tensor_type(initial_state.shape, mlir_elt(initial_state.dtype))
            params.append(f"%s0: {ts0}")
            operands.append("%s0")
            types.append(ts0)
        caps = _Captures()
        exprs = {}
        states = TraceState("linear_attention mods")
        for role, fn in self.mods.items():
            if fn is None:
                continue
            name = _mod_name(fn, role)
            states.mod_name = name
            expr, _ = trace(fn, name, [F32, INDEX, INDEX, INDEX, INDEX][: self.arities[role]], states)
            if expr.type == I1:
                raise TraceError(f"{name} must return a float, got a boolean")
            exprs[role] = expr if expr.type == F32 else _as_float(expr)
        caps.add(states)
        cap_types = caps.types()
        cap_names = [f"%c{i}" for i in range(len(cap_types))]
        regions = []
        args = [("%x", "f32"), ("%b", "index"), ("%h", "index"), ("%t", "index"), ("%d", "index")]
        for role in ("q_mod", "k_mod", "v_mod"):
            if role in exprs:
                regions.append(emit_region(exprs[role], args, cap_names, cap_types, role[0]))
            else:
                regions.append("{}")
        params += [f"%c{i}: {t}" for i, t in enumerate(cap_types)]
        to = tensor_type((b, h, l, dv), elt)
        tst = tensor_type((b, h, dk, dv), "f32")
        seg = f"1, 1, 1, {int(g is not None)}, {int(initial_state is not None)}"
        body = [
            f'%out, %state = "attn.linear_recurrence"({", ".join(operands)}) ({", ".join(regions)}) '
            f'{{decay = "{self.decay or "none"}", scale = {float_literal(scale)} : f32, '
            f'normalize = {str(self.normalize).lower()}, chunk_size = {self.chunk_size} : i64, '
            f'operandSegmentSizes = array<i32: {seg}>}} : {_sig(types)} -> ({to}, {tst}){call}',
            f"return %out, %state : {to}, {tst}{call}",
        ]
        return _func("linear_attention", params, [to, tst], body, call), caps.tensors

    def __call__(self, q, k, v, g=None, initial_state=None, return_state: bool = False,
                 backend: str | None = None):
        self._validate(q, k, v, g, initial_state)
        backend = _backend(backend, q)
        if q.numel() == 0 or v.numel() == 0:
            # An empty batch, head set or sequence: no step runs, the state passes through.
            import torch

            b, h, l, dk = q.shape
            out = torch.zeros(b, h, l, v.shape[3], dtype=q.dtype, device=q.device)
            state = (initial_state.to(torch.float32).clone() if initial_state is not None
                     else torch.zeros(b, h, dk, v.shape[3], dtype=torch.float32, device=q.device))
            return (out, state) if return_state else out
        text, captures = self._build(q, k, v, g, initial_state)
        inputs = [q, k, v] + [t for t in (g, initial_state) if t is not None] + captures
        out, state = _execute(text, inputs, backend, out_dtype=q.dtype)
        return (out, state) if return_state else out


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


def _backend(backend: str | None, q) -> str:
    if backend is not None:
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(map(repr, BACKENDS))} or None, got {backend!r}")
        return backend
    if q.device.type == "cpu":
        return "cpu"
    if q.device.type == "cuda":  # ROCm builds of torch report their GPUs as "cuda" too
        return "triton"
    raise ValueError(f"no ae-mlir backend runs on device '{q.device}'; use CPU or CUDA/ROCm tensors")


def _execute(text: str, inputs: list, backend: str, out_dtype):
    from .. import backends

    return backends.run(text, inputs, backend, out_dtype)
