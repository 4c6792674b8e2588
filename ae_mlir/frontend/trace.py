"""Tracing of user mods into a small typed expression DAG.

A mod is called once with `Sym` stand-ins for its arguments. `Sym` overloads Python's operators
and implements `__torch_function__`, so `torch.where`, `torch.exp`, indexing a closure tensor with
symbolic indices, and the Tensor-method forms all record `Expr` nodes instead of computing; the
functions and methods a mod may call are the table of `torch_functions` (`SUPPORTED` lists them).
Values are typed like torch's: "index" (integers), "f32" (floats) and "i1" (booleans).
"""
from __future__ import annotations

from dataclasses import dataclass

from .locations import SourceLoc, user_location


def __getattr__(name):
    # The table of torch functions lives with its handlers, which build on this module.
    if name == "SUPPORTED":
        from .torch_functions import SUPPORTED

        return SUPPORTED
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class TraceError(ValueError):
    """A mod used something the compiler cannot capture; the message names it and the mod."""


INDEX, F32, I1 = "index", "f32", "i1"


@dataclass(eq=False)
class Expr:
    op: str
    type: str
    args: tuple = ()
    value: object = None  # constant value, argument position, or capture
    # The user's source line that built this node (set when a Sym first wraps it); the ops
    # emitted for it carry this location.
    loc: SourceLoc | None = None


@dataclass(eq=False)
class Capture:
    """A closure tensor a mod reads; it becomes an operand of the op and of the kernel."""

    tensor: object
    position: int  # order of first use within its trace
    # The tensor as the user holds it: a 0-d tensor travels as a 1-element `tensor`.
    source: object = None
    # A tensor composed per call from another capture's (relative_reads): (that Capture, the
    # dimension gathered, the positions gathered), else None.
    origin: tuple | None = None


class TraceState:
    def __init__(self, mod_name: str):
        self.mod_name = mod_name
        self.captures: list[Capture] = []

    def capture(self, tensor, source=None) -> Capture:
        for cap in self.captures:
            if cap.tensor is tensor:
                return cap
        cap = Capture(tensor, len(self.captures), tensor if source is None else source)
        self.captures.append(cap)
        return cap

    def fail(self, what: str):
        raise TraceError(f"{self.mod_name}: {what}")


_PROMOTE = {INDEX: 0, I1: 0, F32: 1}


def _const(value, state: TraceState) -> "Sym":
    if isinstance(value, bool):
        return Sym(Expr("const", I1, value=value), state)
    if isinstance(value, int):
        return Sym(Expr("const", INDEX, value=value), state)
    if isinstance(value, float):
        return Sym(Expr("const", F32, value=value), state)
    import torch

    if isinstance(value, torch.Tensor):
        if value.dim() != 0:
            state.fail(
                f"a closure tensor of shape {tuple(value.shape)} is used without indexing; "
                "index it with symbolic indices (e.g. bias[h, q_idx])"
            )
        return _extract(value, (), state)
    state.fail(f"unsupported value of type {type(value).__name__} in a mod")


def lift(value, state: TraceState) -> "Sym":
    return value if isinstance(value, Sym) else _const(value, state)


def _to(sym: "Sym", ty: str) -> "Sym":
    if sym.expr.type == ty:
        return sym
    if sym.expr.op == "const":
        v = sym.expr.value
        conv = {F32: float, INDEX: int, I1: bool}[ty]
        return Sym(Expr("const", ty, value=conv(v)), sym.state)
    return Sym(Expr("cast", ty, (sym.expr,)), sym.state)


def _unify(a: "Sym", b: "Sym", allow_bool: bool = False) -> tuple["Sym", "Sym", str]:
    ta, tb = a.expr.type, b.expr.type
    if ta == tb and (ta != I1 or allow_bool):
        return a, b, ta
    target = F32 if F32 in (ta, tb) else INDEX
    return _to(a, target), _to(b, target), target


def _extract(tensor, index_syms, state: TraceState) -> "Sym":
    import torch

    source = tensor
    if tensor.dim() == 0 and not index_syms:
        # A scalar tensor travels as a one-element vector, so backends handle rank >= 1 only.
        tensor, index_syms = tensor.reshape(1), (0,)

    if tensor.dim() != len(index_syms):
        state.fail(
            f"closure tensor of shape {tuple(tensor.shape)} indexed with {len(index_syms)} "
            f"index(es); it needs exactly {tensor.dim()}"
        )
    if tensor.numel() == 0:
        state.fail(f"closure tensor of shape {tuple(tensor.shape)} is empty; a mod cannot read from it")
    if tensor.dtype.is_floating_point:
        ty = F32
    elif tensor.dtype == torch.bool:
        ty = I1
    elif tensor.dtype in (torch.int8, torch.int16, torch.int32, torch.int64):
        ty = INDEX
    else:
        state.fail(f"closure tensor dtype {tensor.dtype} is not supported")
    idx = []
    for s in index_syms:
        s = lift(s, state)
        if s.expr.type != INDEX:
            state.fail(f"closure tensors must be indexed with integer expressions, got a {s.expr.type} value")
        idx.append(s.expr)
    cap = state.capture(tensor, source)
    return Sym(Expr("extract", ty, tuple(idx), value=cap), state)


class Sym:
    """A symbolic scalar (broadcast over the attention grid) seen by a traced mod."""

    __slots__ = ("expr", "state")

    def __init__(self, expr: Expr, state: TraceState):
        if expr.loc is None:
            expr.loc = user_location()
        self.expr = expr
        self.state = state

    # --- data-dependent Python control flow cannot be captured ------------------------------
    def __bool__(self):
        self.state.fail(
            "a symbolic value was used in a Python `if`, `and`, `or`, `not` or `bool()`; "
            "data-dependent Python control flow cannot be compiled: use torch.where(cond, a, b) "
            "and the operators & | ~ instead"
        )

    def __index__(self):
        self.state.fail("a symbolic value was used where Python needs a concrete integer")

    __int__ = __index__

    def __float__(self):
        self.state.fail("a symbolic value was used where Python needs a concrete float")

    def __len__(self):
        self.state.fail("len() of a symbolic value")

    def __iter__(self):
        self.state.fail("iteration over a symbolic value")

    # --- arithmetic ------------------------------------------------------------------------
    def _bin(self, other, op, reverse=False):
        other = lift(other, self.state)
        a, b = (other, self) if reverse else (self, other)
        if op == "truediv":
            a, b = _to(a, F32), _to(b, F32)
            return Sym(Expr("div", F32, (a.expr, b.expr)), self.state)
        if op == "pow":
            a, b = _to(a, F32), _to(b, F32)
            return Sym(Expr("pow", F32, (a.expr, b.expr)), self.state)
        if op == "mod" and F32 in (a.expr.type, b.expr.type):
            self.state.fail("% on float values is not supported; use it on integer indices")
        a, b, ty = _unify(a, b)
        return Sym(Expr(op, ty, (a.expr, b.expr)), self.state)

    def __add__(self, o): return self._bin(o, "add")
    def __radd__(self, o): return self._bin(o, "add", True)
    def __sub__(self, o): return self._bin(o, "sub")
    def __rsub__(self, o): return self._bin(o, "sub", True)
    def __mul__(self, o): return self._bin(o, "mul")
    def __rmul__(self, o): return self._bin(o, "mul", True)
    def __truediv__(self, o): return self._bin(o, "truediv")
    def __rtruediv__(self, o): return self._bin(o, "truediv", True)
    def __floordiv__(self, o): return self._bin(o, "floordiv")
    def __rfloordiv__(self, o): return self._bin(o, "floordiv", True)
    def __mod__(self, o): return self._bin(o, "mod")
    def __rmod__(self, o): return self._bin(o, "mod", True)
    def __pow__(self, o): return self._bin(o, "pow")
    def __rpow__(self, o): return self._bin(o, "pow", True)

    def __neg__(self):
        a = _to(self, INDEX) if self.expr.type == I1 else self
        return Sym(Expr("neg", a.expr.type, (a.expr,)), self.state)

    def __pos__(self):
        return self

    def __abs__(self):
        a = _to(self, INDEX) if self.expr.type == I1 else self
        return Sym(Expr("abs", a.expr.type, (a.expr,)), self.state)

    # --- comparisons -----------------------------------------------------------------------
    def _cmp(self, other, pred):
        a, b, _ = _unify(self, lift(other, self.state), allow_bool=True)
        return Sym(Expr("cmp", I1, (a.expr, b.expr), value=pred), self.state)

    def __lt__(self, o): return self._cmp(o, "lt")
    def __le__(self, o): return self._cmp(o, "le")
    def __gt__(self, o): return self._cmp(o, "gt")
    def __ge__(self, o): return self._cmp(o, "ge")
    def __eq__(self, o): return self._cmp(o, "eq")
    def __ne__(self, o): return self._cmp(o, "ne")
    __hash__ = object.__hash__

    # --- logic -----------------------------------------------------------------------------
    def _logic(self, other, op, reverse=False):
        other = lift(other, self.state)
        a, b = (other, self) if reverse else (self, other)
        if F32 in (a.expr.type, b.expr.type):
            self.state.fail(f"bitwise {op} on a float value")
        a, b, ty = _unify(a, b, allow_bool=True)
        return Sym(Expr(op, ty, (a.expr, b.expr)), self.state)

    def __and__(self, o): return self._logic(o, "and")
    def __rand__(self, o): return self._logic(o, "and", True)
    def __or__(self, o): return self._logic(o, "or")
    def __ror__(self, o): return self._logic(o, "or", True)
    def __xor__(self, o): return self._logic(o, "xor")
    def __rxor__(self, o): return self._logic(o, "xor", True)

    def __invert__(self):
        if self.expr.type != I1:
            self.state.fail("~ is supported on boolean values only")
        return Sym(Expr("not", I1, (self.expr,)), self.state)

    # --- tensor-like surface used by torch helpers (and_masks, noop_mask, ...) --------------
    @property
    def device(self):
        return None

    @property
    def dtype(self):
        import torch

        return {INDEX: torch.int64, F32: torch.float32, I1: torch.bool}[self.expr.type]

    @property
    def shape(self):
        return ()

    def dim(self):
        return 0

    def _filled(self, value, dtype):
        import torch

        if dtype is None:
            dtype = self.dtype
        if dtype == torch.bool:
            return _const(bool(value), self.state)
        if dtype.is_floating_point:
            return _const(float(value), self.state)
        return _const(int(value), self.state)

    def new_ones(self, size=(), dtype=None, device=None, **_):
        self._scalar_size(size, "new_ones")
        return self._filled(1, dtype)

    def new_zeros(self, size=(), dtype=None, device=None, **_):
        self._scalar_size(size, "new_zeros")
        return self._filled(0, dtype)

    def new_full(self, size, fill_value, dtype=None, device=None, **_):
        self._scalar_size(size, "new_full")
        return self._filled(fill_value, dtype)

    def new_tensor(self, data, dtype=None, device=None, **_):
        return self._filled(data, dtype)

    def _scalar_size(self, size, fn):
        if tuple(size) not in ((), (1,)):
            self.state.fail(f"{fn} with size {tuple(size)}: mods work on scalars, use size ()")

    def to(self, dtype=None, *args, **kwargs):
        import torch

        if isinstance(dtype, torch.dtype):
            return self._as_dtype(dtype)
        return self

    def _as_dtype(self, dtype):
        import torch

        if dtype == torch.bool:
            return self != self._filled(0, None)
        if dtype.is_floating_point:
            return _to(self, F32)
        return Sym(Expr("trunc", INDEX, (self.expr,)), self.state) if self.expr.type == F32 else _to(self, INDEX)

    def float(self):
        return _to(self, F32)

    def bool(self):
        import torch

        return self._as_dtype(torch.bool)

    def long(self):
        import torch

        return self._as_dtype(torch.int64)

    int = long

    def __getitem__(self, item):
        self.state.fail("indexing a symbolic value; only closure tensors can be indexed")

    def where(self, condition, other):
        # Tensor.where(cond, y) is torch.where(cond, self, y): self is not the first operand.
        from .torch_functions import where

        return where(self.state, condition, self, other)

    def __getattr__(self, name):
        # Tensor-method forms (x.abs(), x.clamp(lo, hi), x.exp(), ...) reuse the torch handlers.
        # Only reached for names not found normally; dunders and unset slots stay AttributeErrors.
        from .torch_functions import HANDLERS

        handler = None if name.startswith("_") or name in Sym.__slots__ else HANDLERS.get(name)
        if handler is None:
            raise AttributeError(f"'Sym' object has no attribute {name!r} (Tensor.{name} is not supported in mods)")
        return lambda *args, **kwargs: handler(self.state, self, *args, **kwargs)

    def __repr__(self):
        return f"Sym({self.expr.type})"

    # --- torch functions -------------------------------------------------------------------
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        # Most calls have a Sym among their direct arguments (an index tuple nests them).
        state = next((a.state for a in args if isinstance(a, Sym)), None) or next(
            a.state for a in _flatten((args, kwargs)) if isinstance(a, Sym))
        name = getattr(func, "__name__", str(func))
        from .torch_functions import HANDLERS

        handler = HANDLERS.get(name)
        if handler is None:
            state.fail(f"torch function '{_qualname(func)}' is not supported in mods")
        return handler(state, *args, **kwargs)


def _qualname(func) -> str:
    mod = getattr(func, "__module__", None) or "torch"
    return f"{mod}.{getattr(func, '__name__', func)}".replace("torch._C._TensorBase", "Tensor").replace(
        "torch._C.TensorBase", "Tensor")


def _flatten(obj):
    if isinstance(obj, (list, tuple)):
        for x in obj:
            yield from _flatten(x)
    elif isinstance(obj, dict):
        for x in obj.values():
            yield from _flatten(x)
    else:
        yield obj


def trace(fn, mod_name: str, arg_types: list[str], state: TraceState | None = None) -> tuple[Expr, TraceState]:
    """Run `fn` once on symbolic arguments; return its result expression and the trace state."""
    state = state or TraceState(mod_name)
    loc = user_location()  # the arguments' (the call's), found once rather than per argument
    args = [Sym(Expr("arg", ty, value=i, loc=loc), state) for i, ty in enumerate(arg_types)]
    try:
        out = fn(*args)
    except TraceError:
        raise
    except Exception as err:  # the user's mod raised: name it and keep the cause
        raise TraceError(f"{mod_name} raised {type(err).__name__}: {err}") from err
    if isinstance(out, (bool, int, float)) and not isinstance(out, Sym):
        out = _const(out, state)
    import torch

    if isinstance(out, torch.Tensor):
        out = _const(out, state)
    if not isinstance(out, Sym):
        raise TraceError(f"{mod_name} must return a scalar expression, got {type(out).__name__}")
    return out.expr, state

