"""`Kernel`: one L1 kernel function lowered op by op, and the tt.func text that results."""
from __future__ import annotations

from ...core import abi
from ..index_bounds import IndexBounds
from .elementwise import ELEMENTWISE
from .linalg import LinalgOps
from .ops import TensorOps
from .program_order import ProgramOrder
from .values import PRECISION, Dest, Table, fail, padded_size


class Kernel(TensorOps, LinalgOps, ProgramOrder):
    def __init__(self, func, aligned: bool, precision: str, descriptors: bool = False, fast_tanh: bool = False,
                 host_descriptors: bool = False, wave_programs: int = 0):
        super().__init__()
        self.wave_programs = wave_programs
        self.coordinates = None  # the program ids' values, made at the first (ProgramOrder)
        self.func = func
        self.aligned = aligned
        self.descriptors = descriptors
        self.host_descriptors = host_descriptors
        self.fast_tanh = fast_tanh
        self.precision = PRECISION[precision]
        self.params: list[tuple[str, str, str, str]] = []  # name, type, arg attrs, label
        self.tables: list[Table] = []
        self.dest_of: dict[str, Dest] = {}
        # Static slices of arguments loaded where they are sliced, by their L1 value.
        self.loaded_slices: dict = {}
        self.grid = [int(x) for x in func.attributes[abi.GRID]]
        self.index_bounds = IndexBounds(padded_size)
        self.wide_bounds = IndexBounds(padded_size, bits=64)  # which index ops need 64 bits (TensorOps)

    def lower_op(self, op) -> None:
        name = op.name
        handler = _HANDLERS.get(name)
        if handler is not None:
            handler(self, op)
        elif ELEMENTWISE.fullmatch(name):
            self.elementwise(op)
        else:
            raise fail(op, "is not supported by the Triton lowering (expected L1 from attn-tile or "
                           "attn-chunk-recurrence)")

    def build(self) -> str:
        """The tt.func of the kernel, in generic form."""
        self.setup_args()
        terminator = self.lower_block(self.func.regions[0].blocks[0])
        if terminator.name != "func.return":
            raise fail(terminator, "must end the kernel function")
        self.func_return(terminator)
        b, h, nm = self.grid
        params = ", ".join(f"{n}: {t}" for n, t, _, _ in self.params)
        types = ", ".join(t for _, t, _, _ in self.params)
        arg_attrs = ", ".join(f"{{{a}}}" for _, _, a, _ in self.params)
        labels = ", ".join(f'"{label}"' for _, _, _, label in self.params)
        tables = ", ".join(t.attr for t in self.tables)
        name = self.func.attributes["sym_name"].value
        attrs = [f"function_type = ({types}) -> ()", f'sym_name = "{name}"', 'sym_visibility = "public"',
                 "noinline = false", f"arg_attrs = [{arg_attrs}]", f"{abi.GRID} = array<i64: {nm}, {h}, {b}>",
                 f"{abi.KERNEL_ARGS} = [{labels}]", f"{abi.TABLES} = [{tables}]",
                 f"attn.assume_aligned = {str(self.aligned).lower()}"]
        for key in (abi.BLOCK_M, abi.BLOCK_N, abi.CHUNK_STAGE):
            if key in self.func.attributes:
                attrs.append(f"{key} = {self.func.attributes[key]}")
        body = "\n".join(self.em.prologue + self.em.lines)
        return (f'"tt.func"() ({{\n^bb0({params}):\n{body}\n"gpu.yield"() : () -> ()\n}}) '
                f"{{{', '.join(attrs)}}} : () -> ()\n")


_HANDLERS = {
    "arith.constant": Kernel.constant,
    "attn.program_id": Kernel.program_id,
    "attn.scatter_add": Kernel.scatter_add,
    "tensor.empty": Kernel.empty,
    "tensor.extract_slice": Kernel.extract_slice,
    "tensor.pad": Kernel.pad,
    "tensor.insert_slice": Kernel.insert_slice,
    "tensor.extract": Kernel.extract,
    "tensor.dim": Kernel.dim,
    "tensor.collapse_shape": Kernel.reshape,
    "tensor.expand_shape": Kernel.reshape,
    "linalg.fill": Kernel.fill,
    "linalg.transpose": Kernel.transpose,
    "linalg.matmul": Kernel.matmul,
    "linalg.generic": Kernel.linalg_generic,
    "linalg.index": Kernel.linalg_index,
    "linalg.reduce": Kernel.reduce,
    "scf.for": Kernel.scf_for,
}
