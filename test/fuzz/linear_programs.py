"""Random linear-attention programs for differential testing (hypothesis strategies).

A program is an `ae.linear_attention`: a decay kind with its log-decays, normalize, a chunk size,
q/k/v mods drawn as the attention fuzzer's expression trees (over the value alone, or over the
value and its (b, h, t, d) position with closure tensors), an optional initial state, a ragged
length (often shorter than one chunk, rarely a multiple of it) and Dk != Dv.

Normalized programs need q . z away from zero: their q and k features are positive (a drawn mod
wrapped in exp(tanh(.)), or |q|, |k| where there is no mod).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from hypothesis import strategies as st

import ae_mlir as ae
from programs import Node, float_expr

NAMES = ("t", "d", "h", "b")
ROLES = ("q_mod", "k_mod", "v_mod")


@dataclass
class LinearProgram:
    batch: int
    heads: int
    seq: int
    dim_k: int
    dim_v: int
    dtype: torch.dtype
    decay: str | None
    normalize: bool
    chunk: int
    strength: float
    trees: dict          # role -> Node or None
    arities: dict        # role -> 1 or 5
    initial_state: bool
    seed: int
    captures: list = field(default_factory=list)

    def mod(self, role: str):
        tree = self.trees[role]
        if tree is None:
            return None
        if self.arities[role] == 1:
            return lambda x: tree.eval({"x": x})
        return lambda x, b, h, t, d: tree.eval({"x": x, "b": b, "h": h, "t": t, "d": d})

    def attention(self):
        return ae.linear_attention(**{role: self.mod(role) for role in ROLES}, decay=self.decay,
                                   normalize=self.normalize, chunk_size=self.chunk)

    def inputs(self, lengths: list | None = None):
        """q, k, v, then g and the initial state where the program has them; with `lengths`, for
        a packed batch of those sequences (q, k, v [1, H, T, D], the state [S, H, Dk, Dv])."""
        gen = torch.Generator().manual_seed(self.seed)
        b, h, l = (self.batch, self.heads, self.seq) if lengths is None else (1, self.heads, sum(lengths))
        entries = b if lengths is None else len(lengths)
        q, k = (torch.randn(b, h, l, self.dim_k, generator=gen) for _ in range(2))
        v = torch.randn(b, h, l, self.dim_v, generator=gen)
        if self.normalize:
            q = q if self.trees["q_mod"] else q.abs()
            k = k if self.trees["k_mod"] else k.abs()
        shape = {None: None, "head": (h,), "token": (b, h, l), "token_dim": (b, h, l, self.dim_k)}[self.decay]
        # log(sigmoid(x)), the gate GLA and Mamba-2 use, scaled to the drawn strength.
        g = None if shape is None else self.strength * torch.nn.functional.logsigmoid(torch.randn(*shape, generator=gen) + 2.0)
        s0 = torch.randn(entries, h, self.dim_k, self.dim_v, generator=gen) if self.initial_state else None
        return [t.to(self.dtype) for t in (q, k, v)] + [None if t is None else t.to(self.dtype) for t in (g, s0)]

    def __str__(self):
        mods = "\n".join(f"  {role}({'x' if self.arities[role] == 1 else 'x, b, h, t, d'}): {self.trees[role]}"
                         for role in ROLES if self.trees[role] is not None)
        return (f"B={self.batch} H={self.heads} L={self.seq} Dk={self.dim_k} Dv={self.dim_v} {self.dtype} "
                f"decay={self.decay} (strength {self.strength}) normalize={self.normalize} chunk={self.chunk} "
                f"initial_state={self.initial_state}\n{mods}")


@st.composite
def linear_programs(draw, max_seq: int = 200, dtypes=(torch.float32, torch.bfloat16)):
    batch, heads = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    chunk = draw(st.sampled_from([16, 32, 64]))
    # Half the lengths within one chunk (L < chunk included), the rest up to max_seq.
    seq = draw(st.one_of(st.integers(1, chunk), st.integers(1, max_seq)))
    # Past 64 (the GPUs' default V and state-row block), the per-row output form and its loop
    # over V blocks, with a ragged last block.
    dim_k = draw(st.sampled_from([16, 24, 32, 64, 96]))
    dim_v = draw(st.sampled_from([dim_k, 16, 24, 48, 80]))
    normalize = draw(st.booleans())
    seed = draw(st.integers(0, 2**16))
    gen = torch.Generator().manual_seed(seed)
    captures = [torch.randn(heads, generator=gen), torch.randn(batch, heads, seq, generator=gen).sigmoid(),
                torch.randn(dim_v, generator=gen)]
    trees, arities = {}, {}
    for role in ROLES:
        arities[role] = draw(st.sampled_from([1, 5]))
        if not draw(st.booleans()):
            trees[role] = None
            continue
        x = Node("var", value="x")
        if arities[role] == 1:
            tree = float_expr(draw, draw(st.integers(1, 3)), [x], [], symbolic=True, names=())
        else:
            tree = float_expr(draw, draw(st.integers(1, 3)), [x], captures, symbolic=True, names=NAMES)
        trees[role] = Node("exp_tanh", (tree,)) if normalize and role != "v_mod" else tree
    return LinearProgram(
        batch=batch, heads=heads, seq=seq, dim_k=dim_k, dim_v=dim_v, dtype=draw(st.sampled_from(dtypes)),
        decay=draw(st.sampled_from([None, "head", "token", "token_dim"])), normalize=normalize, chunk=chunk,
        strength=draw(st.sampled_from([0.1, 1.0, 4.0])), trees=trees, arities=arities,
        initial_state=draw(st.booleans()), seed=seed, captures=captures)
