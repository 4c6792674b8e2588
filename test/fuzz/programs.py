"""Random attention programs for differential testing (hypothesis strategies).

A program is a score_mod and a mask_mod built from random expression trees over the allowed
operations, a normalizer, shapes (ragged, GQA, Dk != Dv, Lq != Lk), a dtype and a memory layout.
Trees are evaluated with plain Python operators and torch functions, so the same tree traces
through ae-mlir's frontend (symbolic values) and could run eagerly on tensors.

Magnitudes stay bounded (exp only of tanh, division only by constants in [0.5, 2]) so that a
disagreement between backends is a miscompile, not float overflow.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from hypothesis import strategies as st


@dataclass(frozen=True)
class Node:
    op: str
    args: tuple = ()
    value: object = None

    def eval(self, env, clamped: bool = False):
        """The value on `env`; `clamped` clamps a closure tensor's indices into range, as the
        frontend does, for evaluating on whole index grids outside a trace."""
        a = [x.eval(env, clamped) for x in self.args]
        op = self.op
        if op == "var":
            return env[self.value]
        if op == "const":
            return self.value
        if op == "capture":
            tensor, index_nodes = self.value
            index = [n.eval(env, clamped) for n in index_nodes]
            if clamped:
                index = [torch.as_tensor(i).clamp(0, n - 1) for i, n in zip(index, tensor.shape)]
            return tensor[tuple(index)]
        binary = {"add": lambda x, y: x + y, "sub": lambda x, y: x - y, "mul": lambda x, y: x * y,
                  "div": lambda x, y: x / y, "floordiv": lambda x, y: x // y, "mod": lambda x, y: x % y,
                  "max": torch.maximum, "min": torch.minimum, "lt": lambda x, y: x < y,
                  "le": lambda x, y: x <= y, "ge": lambda x, y: x >= y, "eq": lambda x, y: x == y,
                  "ne": lambda x, y: x != y, "and": lambda x, y: x & y, "or": lambda x, y: x | y}
        if op in binary:
            return binary[op](*a)
        unary = {"tanh": torch.tanh, "sigmoid": torch.sigmoid, "abs": torch.abs, "neg": lambda x: -x,
                 "exp_tanh": lambda x: torch.exp(torch.tanh(x)), "not": lambda x: ~x,
                 "float": lambda x: x * 1.0}
        if op in unary:
            return unary[op](*a)
        if op == "where":
            return torch.where(*a)
        if op == "clamp":
            return torch.clamp(a[0], min=-self.value, max=self.value)
        raise ValueError(op)

    def kink_distance(self, env):
        """How far each element is from a point where the expression's derivative jumps (the
        ties of min and max, abs at 0, a clamp's ends): inf where it has none. Rounding moves a
        score across such a point in one evaluation and not in another, and the two gradients
        then differ by O(1) however exact both are."""
        values = [x.eval(env, clamped=True) for x in self.args]
        distances = [x.kink_distance(env) for x in self.args]
        own = None
        if self.op in ("min", "max"):
            own = (values[0] - values[1]).abs()
        elif self.op == "abs":
            own = values[0].abs()
        elif self.op == "clamp":
            own = torch.minimum((values[0] - self.value).abs(), (values[0] + self.value).abs())
        found = torch.tensor(float("inf"), dtype=torch.float64)
        for d in distances + ([own] if own is not None else []):
            if isinstance(d, torch.Tensor) and d.is_floating_point():
                found = torch.minimum(found, d)
        return found

    def __str__(self):
        if self.op == "var":
            return self.value
        if self.op == "const":
            return repr(self.value)
        if self.op == "capture":
            return f"T{tuple(self.value[0].shape)}[{', '.join(map(str, self.value[1]))}]"
        return f"{self.op}({', '.join(map(str, self.args))}{', ' + str(self.value) if self.value else ''})"


# The index arguments of an attention mod; linear-attention mods pass their own (b, h, t, d).
ATTENTION_NAMES = ("q_idx", "kv_idx", "h", "b")


# Factors that take a product of positions past i32 at any length (2^40 is no i32 itself).
HASH_FACTORS = (268435459, 1000000007, 2 ** 40 + 3)


def index_expr(draw, depth: int, names=ATTENTION_NAMES, hashes: bool = True) -> Node:
    """A non-negative-leaning integer expression of the positions. `hashes`: it may hold
    (e * factor) % c with a factor that takes e's product past i32, which the Triton lowering
    computes in 64 bits (the Gluon kernels' 32-bit positions take none)."""
    if depth <= 0 or draw(st.booleans()):
        if draw(st.integers(0, 3)) == 0:
            return Node("const", value=draw(st.integers(0, 7)))
        return Node("var", value=draw(st.sampled_from(names)))
    op = draw(st.sampled_from(["add", "sub", "mul", "floordiv", "mod", "max", "min"] + (["hash"] if hashes else [])))
    left = index_expr(draw, depth - 1, names, hashes)
    if op == "hash":
        product = Node("mul", (left, Node("const", value=draw(st.sampled_from(HASH_FACTORS)))))
        return Node("mod", (product, Node("const", value=draw(st.integers(2, 7)))))
    if op in ("max", "min"):
        # torch.maximum takes tensors (or symbolic values) on both sides, never Python ints.
        return Node(op, (Node("var", value=draw(st.sampled_from(names))),
                         Node("var", value=draw(st.sampled_from(names)))))
    if op in ("floordiv", "mod"):
        return Node(op, (left, Node("const", value=draw(st.integers(1, 5)))))
    return Node(op, (left, index_expr(draw, depth - 1, names, hashes)))


def _index_or_distance(draw, names, hashes: bool = True) -> Node:
    """An index expression (`hashes` as index_expr's), or (one time in three, for attention mods) a
    function of the distance kv_idx - q_idx alone (|d| // c or d // c), which the frontend
    composes per call (T5's form)."""
    if "kv_idx" not in names or draw(st.integers(0, 2)) != 0:
        return index_expr(draw, 1, names, hashes)
    ends = (Node("var", value="kv_idx"), Node("var", value="q_idx"))
    distance = Node("sub", ends if draw(st.booleans()) else ends[::-1])
    if draw(st.booleans()):
        distance = Node("abs", (distance,))
    return Node("floordiv", (distance, Node("const", value=draw(st.integers(1, 5)))))


def _shifted_distance(draw, size: int) -> Node:
    """kv_idx - q_idx or q_idx - kv_idx plus a constant in [0, size), unwrapped: out of range where
    the distance is large, which the frontend's clamp into [0, size) then decides."""
    ends = (Node("var", value="kv_idx"), Node("var", value="q_idx"))
    distance = Node("sub", ends if draw(st.booleans()) else ends[::-1])
    return Node("add", (distance, Node("const", value=draw(st.integers(0, size - 1)))))


def bounded_index(node: Node, size: int) -> Node:
    """Map any integer expression into [0, size): ((e % size) + size) % size."""
    wrapped = Node("mod", (node, Node("const", value=size)))
    return Node("mod", (Node("add", (wrapped, Node("const", value=size))), Node("const", value=size)))


def float_expr(draw, depth: int, leaves: list[Node], captures: list, symbolic: bool = False,
               names: tuple = ATTENTION_NAMES, hashes: bool = True) -> Node:
    """`symbolic`: the result must depend on an argument, as torch functions need a tensor.
    `names`: the index arguments in scope; none for a feature map of the value alone. `hashes`:
    as index_expr's."""
    if depth <= 0 or draw(st.integers(0, 4)) == 0:
        kind = draw(st.integers(0, 3))
        if kind == 0 and not symbolic:
            return Node("const", value=draw(st.floats(-2.0, 2.0, allow_nan=False).map(lambda x: round(x, 3))))
        if kind == 1 and captures and names:
            tensor = draw(st.sampled_from(captures))
            idx = tuple(bounded_index(_index_or_distance(draw, names, hashes), n) for n in tensor.shape)
            if "kv_idx" in names and draw(st.integers(0, 3)) == 0:
                # A relative-position read left to the frontend's clamp: the Triton backward's dK/dV
                # kernel reads one that steps back along the queries mirrored (passes/mirror_reads.py).
                idx = idx[:-1] + (_shifted_distance(draw, tensor.shape[-1]),)
            return Node("capture", value=(tensor, idx))
        if kind == 2 and not symbolic and names:
            return Node("mul", (index_expr(draw, 1, names, hashes), Node("const", value=0.05)))
        return draw(st.sampled_from(leaves))
    ops = ["add", "sub", "mul", "div", "max", "min", "tanh", "sigmoid", "abs", "neg", "exp_tanh", "clamp"]
    op = draw(st.sampled_from(ops + ["where"] if names else ops))

    def sub(symbolic):
        return float_expr(draw, depth - 1, leaves, captures, symbolic, names, hashes)

    if op in ("tanh", "sigmoid", "abs", "exp_tanh"):
        return Node(op, (sub(True),))
    if op == "neg":
        return Node(op, (sub(symbolic),))
    if op == "div":
        return Node("div", (sub(symbolic), Node("const", value=draw(st.sampled_from([0.5, 0.75, 1.5, 2.0])))))
    if op == "clamp":
        return Node("clamp", (sub(True),), value=draw(st.sampled_from([1.0, 3.0])))
    if op == "where":
        return Node("where", (bool_expr(draw, 1, names=names, hashes=hashes), sub(True), sub(False)))
    if op == "mul":
        # Keep products bounded: one side squashed by tanh.
        return Node("mul", (sub(symbolic), Node("tanh", (sub(True),))))
    if op in ("max", "min"):
        return Node(op, (sub(True), sub(True)))
    return Node(op, (sub(symbolic), sub(False)))


def bool_expr(draw, depth: int, doc=None, names: tuple = ATTENTION_NAMES, hashes: bool = True) -> Node:
    if depth <= 0 or draw(st.booleans()):
        kind = draw(st.integers(0, 3))
        if kind == 0 and doc is not None:
            # Document ids shared by the batch [L], or per batch row [2, L] (read at b): the tables
            # a call classifies are then per batch entry.
            n = doc.shape[-1]
            lead = (bounded_index(Node("var", value="b"), doc.shape[0]),) if doc.dim() == 2 else ()
            return Node("eq", tuple(Node("capture", value=(doc, lead + (bounded_index(Node("var", value=name), n),)))
                                    for name in ("q_idx", "kv_idx")))
        cmp = draw(st.sampled_from(["lt", "le", "ge", "eq", "ne"]))
        left = Node("add", (Node("var", value=draw(st.sampled_from(names[:3]))), index_expr(draw, 1, names, hashes)))
        right = Node("add", (index_expr(draw, 1, names, hashes), Node("const", value=draw(st.integers(-8, 8)))))
        return Node(cmp, (left, right))
    op = draw(st.sampled_from(["and", "or", "not"]))
    if op == "not":
        return Node("not", (bool_expr(draw, depth - 1, doc, names, hashes),))
    return Node(op, (bool_expr(draw, depth - 1, doc, names, hashes), bool_expr(draw, depth - 1, doc, names, hashes)))


@dataclass
class Program:
    batch: int
    heads: int
    heads_kv: int
    seq_q: int
    seq_k: int
    dim_qk: int
    dim_v: int
    dtype: torch.dtype
    normalize: str
    score_tree: Node | None
    mask_tree: Node | None
    transposed: bool
    seed: int
    captures: list = field(default_factory=list)

    def score_mod(self):
        if self.score_tree is None:
            return None
        tree = self.score_tree

        def score_mod(score, b, h, q_idx, kv_idx):
            return tree.eval({"score": score, "b": b, "h": h, "q_idx": q_idx, "kv_idx": kv_idx})

        return score_mod

    def mask_mod(self):
        if self.mask_tree is None:
            return None
        tree = self.mask_tree

        def mask_mod(b, h, q_idx, kv_idx):
            return tree.eval({"b": b, "h": h, "q_idx": q_idx, "kv_idx": kv_idx})

        return mask_mod

    def inputs(self, device="cpu"):
        gen = torch.Generator().manual_seed(self.seed)

        def make(heads, length, dim):
            if self.transposed:
                t = torch.randn(self.batch, length, heads, dim, generator=gen).to(self.dtype)
                return t.to(device).transpose(1, 2)
            return torch.randn(self.batch, heads, length, dim, generator=gen).to(self.dtype).to(device)

        return (make(self.heads, self.seq_q, self.dim_qk), make(self.heads_kv, self.seq_k, self.dim_qk),
                make(self.heads_kv, self.seq_k, self.dim_v))

    def __str__(self):
        return (f"B={self.batch} H={self.heads}/{self.heads_kv} Lq={self.seq_q} Lk={self.seq_k} "
                f"Dk={self.dim_qk} Dv={self.dim_v} {self.dtype} {self.normalize} transposed={self.transposed}\n"
                f"  score_mod: {self.score_tree}\n  mask_mod: {self.mask_tree}")


@st.composite
def programs(draw, max_seq: int = 80, dtypes=(torch.float32, torch.bfloat16, torch.float16), seq_k_range=None,
             groups=(1, 2, 3)):
    """Random programs; `seq_k_range` (lowest, highest) draws the keys apart from the queries
    (decoding: a few queries, many keys) and `groups` are the query heads per KV head drawn from."""
    heads_kv = draw(st.integers(1, 2))
    heads = heads_kv * draw(st.sampled_from(list(groups)))
    seq_q = draw(st.integers(1, max_seq))
    if seq_k_range is None:
        seq_k = draw(st.sampled_from([seq_q, draw(st.integers(1, max_seq))]))
    else:
        seq_k = draw(st.integers(*seq_k_range))
    # Past 128 (MLA's 192, 256) the GPU defaults take tiles of their own (launch_defaults).
    dim_qk = draw(st.sampled_from([16, 24, 32, 64, 128, 192, 256]))
    dim_v = draw(st.sampled_from([dim_qk, 16, 32] + ([128] if dim_qk == 192 else [])))
    seed = draw(st.integers(0, 2**16))
    gen = torch.Generator().manual_seed(seed)
    bias = torch.randn(heads, generator=gen)
    table = torch.randn(heads, 7, generator=gen)
    doc = torch.sort(torch.randint(0, 4, (max(seq_q, seq_k),), generator=gen)).values
    doc_rows = torch.sort(torch.randint(0, 4, (2, max(seq_q, seq_k)), generator=gen), dim=-1).values
    leaves = [Node("var", value="score")]
    score_tree = float_expr(draw, draw(st.integers(1, 3)), leaves, [bias, table]) if draw(st.booleans()) else None
    ids = draw(st.sampled_from([None, doc, doc_rows]))
    mask_tree = bool_expr(draw, draw(st.integers(0, 2)), ids) if draw(st.booleans()) else None
    return Program(
        batch=draw(st.integers(1, 2)), heads=heads, heads_kv=heads_kv, seq_q=seq_q, seq_k=seq_k,
        dim_qk=dim_qk, dim_v=dim_v, dtype=draw(st.sampled_from(dtypes)),
        normalize=draw(st.sampled_from(["softmax", "softmax", "sigmoid", "relu", "none", "retnet", "plus_one"])),
        score_tree=score_tree, mask_tree=mask_tree, transposed=draw(st.booleans()), seed=seed,
        captures=[bias, table, doc, doc_rows],
    )


@st.composite
def gluon_programs(draw, max_seq: int = 400, score_mods: bool = False):
    """Programs attn-lower-to-gluon takes: softmax with no score_mod (with `score_mods`, the
    backward's: half of them take one, which may read a bias [H] or table [H, 7]), no mask or the causal one
    (as many queries as keys), 16-bit inputs, Dk = Dv of 64 or 128; lengths past one 128-row
    program so the kernel's K/V ring wraps."""
    heads_kv = draw(st.integers(1, 2))
    causal = draw(st.booleans())
    seq_q = draw(st.integers(1, max_seq))
    seq_k = seq_q if causal else draw(st.integers(1, max_seq))
    dim = draw(st.sampled_from([64, 128]))
    mask_tree = Node("ge", (Node("var", value="q_idx"), Node("var", value="kv_idx"))) if causal else None
    heads = heads_kv * draw(st.sampled_from([1, 2, 4]))
    seed = draw(st.integers(0, 2**16))
    gen = torch.Generator().manual_seed(seed)
    captures = [torch.randn(heads, generator=gen), torch.randn(heads, 7, generator=gen)]
    score_tree = None
    if score_mods and draw(st.booleans()):
        score_tree = float_expr(draw, draw(st.integers(1, 3)), [Node("var", value="score")], captures, hashes=False)
    return Program(
        batch=draw(st.integers(1, 2)), heads=heads, heads_kv=heads_kv,
        seq_q=seq_q, seq_k=seq_k, dim_qk=dim, dim_v=dim, dtype=draw(st.sampled_from([torch.bfloat16, torch.float16])),
        normalize="softmax", score_tree=score_tree, mask_tree=mask_tree, transposed=draw(st.booleans()),
        seed=seed, captures=captures)
