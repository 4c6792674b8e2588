"""Writing the L0 module text of a call: the closure tensors its mods read (`Captures`), their
regions, the signature of a traced expression that decides whether an earlier call's text serves
(`signature`), and the pieces of the function around them. Shared by both attention APIs."""
from __future__ import annotations

from .emit import emit_region, loc_suffix, mlir_elt, tensor_type
from .locations import definition_location
from .trace import F32, TraceState


def mod_name(fn, role: str) -> str:
    return f"{role} '{getattr(fn, '__name__', type(fn).__name__)}'"


class Captures:
    """Closure tensors of all mods of one module, deduplicated by identity, in first-use order."""

    def __init__(self):
        self.tensors: list = []
        self.sources: list = []  # each tensor as the user holds it (see trace.Capture)
        # (the user's tensor it is composed from, dimension, positions) or None (relative_reads)
        self.origins: list = []

    def add(self, state: TraceState) -> list[int]:
        positions = []
        for cap in state.captures:
            for i, t in enumerate(self.tensors):
                if t is cap.tensor:
                    positions.append(i)
                    break
            else:
                self.tensors.append(cap.tensor)
                self.sources.append(cap.source)
                self.origins.append(None if cap.origin is None else (cap.origin[0].source,) + cap.origin[1:])
                positions.append(len(self.tensors) - 1)
        return positions

    def add_call_tensor(self, tensor) -> str:
        """Append a tensor the call adds after the mods' (key lengths, a block table, offsets: no
        source, no origin); returns its argument name."""
        self.tensors.append(tensor)
        self.sources.append(None)
        self.origins.append(None)
        return f"%c{len(self.tensors) - 1}"

    def plan(self, written: "Captures") -> list:
        """Per tensor here that a mod reads, (the index of the user's tensor it comes from among
        `written`'s, the module as written, the dimension gathered or None, the positions
        gathered): what relative_reads.kernel_closures takes. The tensors a call adds (key
        lengths, a block table, offsets) have no source and no plan."""
        index = {id(s): j for j, s in enumerate(written.sources) if s is not None}
        return [(index[id(s)], None, None) if o is None else (index[id(o[0])], o[1], o[2])
                for s, o in zip(self.sources, self.origins) if s is not None]

    def types(self) -> list[str]:
        return [tensor_type(t.shape, mlir_elt(t.dtype)) for t in self.tensors]


def region_text(expr, state: TraceState, args, caps: Captures, prefix: str, clamp: bool) -> str:
    """Emit a region whose closure tensors are the function arguments %c<i>."""
    positions = caps.add(state)
    all_types = caps.types()
    names = [f"%c{p}" for p in positions]
    types = [all_types[p] for p in positions]
    return emit_region(expr, args, names, types, prefix, clamp=clamp)


def signature(root, positions: list[int]) -> tuple:
    """What emitting the expression DAG `root` writes depends on, as a hashable value: its nodes
    in emission order (op, type, operand numbers, value, location), a closure read by the module's
    position of its tensor, a constant by its Python type and repr (0.0 and -0.0 differ)."""
    numbers: dict = {}
    nodes: list = []

    def visit(e) -> int:
        number = numbers.get(id(e))
        if number is None:
            args = tuple(visit(a) for a in e.args)
            value = e.value
            if e.op == "extract":
                value = positions[value.position]
            elif e.op == "const":
                value = (type(value), repr(value))
            # An argument writes no op, so where it was made (the call) is not part of the text.
            nodes.append((e.op, e.type, args, value, None if e.op == "arg" else e.loc))
            number = numbers[id(e)] = len(nodes) - 1
        return number

    visit(root)
    return tuple(nodes)


def types_text(types: list[str]) -> str:
    return "(" + ", ".join(types) + ")"


# The mask region of a call with kv_len and no mask_mod.
KEEP_ALL = """{
    ^bb0(%b: index, %h: index, %q_idx: index, %kv_idx: index):
      %m1 = arith.constant true
      "gpu.yield"(%m1) : (i1) -> ()
    }"""


def as_float(expr):
    from .trace import Expr

    return Expr("cast", F32, (expr,), loc=expr.loc)


def defined_at(fn, call: str) -> str:
    """The location suffix of the op a user function becomes: its definition, else the call."""
    loc = definition_location(fn)
    return loc_suffix(loc) if loc is not None else call


def func_text(name: str, params: list[str], ret_types: list[str], body: list[str], loc: str) -> str:
    lines = [f"func.func @{name}({', '.join(params)}) -> ({', '.join(ret_types)}) {{"]
    lines += [f"  {line}" for line in body]
    lines.append("}" + loc)
    return "module {\n" + "\n".join("  " + line for line in lines) + "\n}\n"
