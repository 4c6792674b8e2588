"""The one-kernel form (the CPU pipeline's, and the only form with `normalize`):
`attn.grid = [B, H, Dv / BV]`, a program owns one (batch, head) and a BV-wide column slice of V,
of the state and of the output, and carries S (and z) through one `scf.for` over the ceil(L / C)
chunks. On a CPU the programs run one after another anyway, and this form reads every input once
and writes nothing but the outputs."""
from __future__ import annotations

from ..l1_builders import index, zeros
from .step import ChunkStep


class SequentialKernel(ChunkStep):
    def build(self) -> None:
        extra = [("out", self.out_type), ("state", self.state_type)]
        self.define(extra, [self.out_type, self.state_type], [self.b, self.h, self.nv], self.body)

    def body(self) -> list:
        from mlir.dialects import arith

        dk, bv = self.dk, self.bv
        pv = self.program_ids()
        self.v0 = arith.muli(pv, index(bv)) if self.nv > 1 else None
        carried = [self.initial_state(None, self.v0)]
        if self.normalize:
            carried.append(zeros([dk]))
        carried.append(self.dests["out"])

        def step(it, t0, values):
            state, out = values[0], values[-1]
            z = values[1] if self.normalize else None
            q, k, v = self.load("q", t0, None, dk), self.load("k", t0, None, dk), self.load("v", t0, self.v0, bv)
            decay = self.decays(t0, None, dk)
            out = self.store_output(t0, q, k, v, decay, self.operand(state), z, out)
            new = [self.next_state(state, k, v, decay, dk)]
            if self.normalize:
                new.append(self.next_key_sum(z, k, decay))
            return new + [out]

        results = self.chunk_loop(carried, step)
        final = self.store_state(results[0], self.dests["state"], None, self.v0)
        return [results[-1], final]
