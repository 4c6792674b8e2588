"""The parts of `attn-lower-to-triton` (passes/lower_to_triton.py): `Kernel` writes one L1 kernel
function as a tt.func.

values      what an L1 value lowers to (tiles, arguments, slices, tables) and the text emitter
builder     emission of tt/arith ops on tiles: constants, broadcasts, loads, stores, reductions
memory      kernel arguments and the addressing of tiles and gathers
tables      block tables: folded into arithmetic, or read from an extra argument
ops         handlers of constants, slices, pads, stores and scf.for
elementwise the handler of elementwise arith/math ops (64-bit index arithmetic where needed)
linalg      handlers of linalg fill, transpose, matmul, generic and reduce
expansions  math ops Triton does not lower on every target, written with ones it does
kernel      the kernel: op dispatch and the tt.func text
"""
from .kernel import Kernel

__all__ = ["Kernel"]
