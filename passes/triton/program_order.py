"""`ProgramOrder`: which (batch, head, block) each Triton program computes, i.e. the order the GPU
starts the kernel's programs in (it starts them in grid order, x fastest).

The grid is [blocks, heads, batch] in x, y, z order, so that the programs of one head run
together and share its K/V through L2. Without `attn.heavy_blocks` the blocks are walked from the
last down (the causal forward's longest programs start first, and equal ones in any order).

With `attn.heavy_blocks` (the tiling's word that the programs at one end of the block axis visit
more tiles) the heaviest block goes first. That alone changes little when the heads follow one
another: the last head's longest program still starts near the end. With `wave_programs` (the
programs the GPU runs at once, its multiprocessors) the heads are taken in sections whose
programs fill the GPU, and within a section every head's heaviest block goes first, then every
head's next: longest first over the whole section, while the K/V the running programs read stays
that of a few heads. A section holds the least power of two of heads whose programs fill the
wave: 8.6 to 17 MB of K/V at D = 128 (132 to 264 programs of 128 rows), whatever the length. In a
greedy schedule of the tiles' counts on 132 multiprocessors, causal kernels (B * H = 16 to 512, 8
to 256 blocks a head) lose up to 64% of their time to the unequal tail in the per-head order
(3.5-15% at B * H >= 64), and at most 3% in such sections; sections of other sizes (9 heads of 16
blocks: 9%) can do worse than none. On the H200 the sections gained 3.4-6.1% over the per-head
order (bench/RESULTS.md, 2026-12-05).
"""
from __future__ import annotations

from ...core.grid_schedule import section_heads
from ..tile_tables import heavy_blocks_of


class ProgramOrder:
    """Needs `grid` ([batch, heads, blocks]), `func`, `wave_programs` and the builder's `op`,
    `const` and `em` (TensorOps)."""

    def program_coordinates(self) -> list:
        """The i32 values of the L1 program ids 0, 1 and 2 (batch, head, block)."""
        from .values import Value

        b, h, nm = self.grid
        pid = [Value(self.em(f'"tt.get_program_id"() {{axis = {axis} : i32}} : () -> i32'), (), "i32")
               for axis in range(3)]
        heavy = heavy_blocks_of(self.func)
        heads = b * h
        section = section_heads(self.wave_programs, nm, heads) if heavy else 1
        if section == 1:
            rank, head, batch = pid
        else:
            rank, head, batch = self._sectioned(pid, section, heads)
        if heavy == "first" or nm == 1:
            return [batch, head, rank]
        return [batch, head, self.op("arith.subi", self.const(nm - 1, "i32"), rank)]

    def _sectioned(self, pid: list, section: int, heads: int) -> tuple:
        """(rank along the blocks, head, batch) of the program at linear grid position
        pid.x + blocks * (pid.y + heads * pid.z), taken in sections of `section` heads, each
        section rank-major; the last section may hold fewer heads."""
        b, h, nm = self.grid
        i32 = "i32"

        def c(n):
            return self.const(n, i32)

        def op(name, x, y):
            return self.op(name, x, y)

        linear = op("arith.addi", pid[0], op("arith.muli", c(nm), op("arith.addi", pid[1], op("arith.muli", c(h), pid[2]))))
        per_section = nm * section
        number = op("arith.divsi", linear, c(per_section))
        first = op("arith.muli", number, c(section))
        count = op("arith.minsi", c(section), op("arith.subi", c(heads), first))
        within = op("arith.subi", linear, op("arith.muli", number, c(per_section)))
        rank = op("arith.divsi", within, count)
        flat = op("arith.addi", first, op("arith.subi", within, op("arith.muli", rank, count)))
        head = op("arith.remsi", flat, c(h))
        batch = op("arith.divsi", flat, c(h))
        return rank, head, batch
