"""The one-kernel form (the CPU pipeline's, and the only form with `normalize`):
`attn.grid = [B, H, Dv / BV]`, a program owns one (batch, head) and a BV-wide column slice of V,
of the state and of the output, and carries S (and z) through one `scf.for` over the ceil(L / C)
chunks. On a CPU the programs run one after another anyway, and this form reads every input once
and writes nothing but the outputs."""
from __future__ import annotations

from .step import ChunkStep


class SequentialKernel(ChunkStep):
    def build(self) -> str:
        em = self.em
        dk, bv = self.dk, self.bv
        out_arg, state_arg = self.dest(0), self.dest(1)
        pv = self.program_ids()
        self.v0 = em(f"arith.muli {pv}, {self.idx(bv)} : index") if self.nv > 1 else None
        carried = [(self.initial_state(None, self.v0), self.tile_type(dk, bv))]
        if self.normalize:
            carried.append((self.zeros(f"tensor<{dk}xf32>"), f"tensor<{dk}xf32>"))
        carried.append((out_arg, self.out_type))

        def step(it, t0, names):
            state, out = names[0], names[-1]
            z = names[1] if self.normalize else None
            q, k, v = self.load("q", t0, None, dk), self.load("k", t0, None, dk), self.load("v", t0, self.v0, bv)
            decay = self.decays(t0, None, dk)
            out = self.store_output(t0, q, k, v, decay, self.operand(state, dk, bv), z, out)
            new = [self.next_state(state, k, v, decay, dk)]
            if self.normalize:
                new.append(self.next_key_sum(z, k, decay))
            return new + [out]

        results = self.chunk_loop(carried, step)
        final = self.store_state(results[0], state_arg, None, self.v0)
        return self.function(self.name, [("out", self.out_type), ("state", self.state_type)],
                             [(results[-1], self.out_type), (final, self.state_type)], [self.b, self.h, self.nv])
