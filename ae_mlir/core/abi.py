"""The L1 kernel ABI: what the passes write on a kernel and the backends read back.

An L1 kernel is a `func.func` carrying `attn.grid`; after `attn-lower-to-triton` it is a `tt.func`
with the same grid plus `attn.kernel_args` and `attn.tables`. Its arguments are, in order, the
inputs (q, k, v, then closure tensors c0, c1, ...), the four call-time tile tables when it has
`attn.call_time_tables` (labelled as the next closure roles), workspaces (w0, w1, ...) and the
destinations (out, then lse or state). A kernel whose arguments do not follow the softmax layout
(the linear recurrence's kernels) names every argument's role in `attn.arg_roles`.

Every name here is part of the contract between passes/ (which write it), the backends and the
runtime (which read it); a change here is a change of that contract.
"""
from __future__ import annotations

# Attributes of an L1 kernel (func.func) and of its lowered tt.func.
GRID = "attn.grid"                          # array<i64>: programs per grid axis
BLOCK_M = "attn.block_m"                    # i64: query rows per program
BLOCK_N = "attn.block_n"                    # i64: keys per KV tile
BLOCK_V = "attn.block_v"                    # i64: V columns per program (linear recurrence)
CHUNK_SIZE = "attn.chunk_size"              # i64: tokens per chunk (linear recurrence)
CHUNK_STAGE = "attn.chunk_stage"            # string: which CHUNK_STAGES kernel it is (split recurrence)
ARG_ROLES = "attn.arg_roles"                # [string]: one role per argument
CALL_TIME_TABLES = "attn.call_time_tables"  # unit: the four tile tables follow the inputs
MASK_PROGRAM = "attn.mask_program"          # string: JSON mask program that classifies those tables
CALL_TIME_GRID = "attn.call_time_grid"      # array<i64: B, Lq, Lk>: the grid it classifies, where the
                                            # kernel's q does not show it (packed sequences)
HEAVY_BLOCKS = "attn.heavy_blocks"          # string: "first" or "last", the end of the block axis
                                            # whose programs visit the most tiles (absent: equal
                                            # or not known before the call)
# On an L1 op, not a function: the tensor.extract of a tile table's block number carries the
# range of the numbers it can hold (the index analysis bounds positions by it).
BOUNDS = "attn.bounds"                      # array<i64: lo, hi>
# Only on tt.func (attn-lower-to-triton):
KERNEL_ARGS = "attn.kernel_args"            # [string]: "q", "q.stride0", ..., "table0"
TABLES = "attn.tables"                      # [dense i32]: compile-time tile tables, "table<j>"
# A tt.func parameter of a TMA descriptor over a whole argument, made on the host per launch
# (attn-lower-to-triton{host-descriptors}), is labelled descriptor_label(role), and is followed by
# the tensor's sizes (i32, "<label>.size<d>") and strides (i64, "<label>.stride<d>"), one per
# dimension, as Triton's launcher takes a host descriptor.
DESCRIPTOR = "tma"


def descriptor_label(role: str) -> str:
    return f"{role}.{DESCRIPTOR}"


# On L0/L1 ops: the tt.dot precision the lowering chose for a contraction.
PRECISION = "attn.precision"

# Roles: the fixed inputs, closure tensors c<i>, workspaces w<i>, and the destinations.
INPUTS = ("q", "k", "v")
SOFTMAX_OUTPUTS = ("out", "lse")
LINEAR_OUTPUTS = ("out", "state")
# The backward kernels (attn-tile-backward), in launch order, and the roles each takes after q, k,
# v and the closure tensors, then writes: the forward's output and logsumexp, their gradients,
# and delta = rowsum(dO * O) - dlse per query row, which the dQ kernel writes for the dK/dV one.
BACKWARD_KERNELS = (("dq", ("out", "do", "lse", "dlse"), ("dq", "delta")),
                    ("dkdv", ("do", "lse", "delta"), ("dk", "dv")))
# The same for normalizers applied element by element (sigmoid, relu, none): no row statistic, so
# neither the forward's output nor its logsumexp enters the gradients.
ELEMENTWISE_BACKWARD_KERNELS = (("dq", ("do",), ("dq",)), ("dkdv", ("do",), ("dk", "dv")))
# The same for a user's online normalizer without a running max (RetNet's |row sum| division):
# the dQ kernel sums each row's l = rowsum(p) and rowsum(p * dP) as it goes and writes, per query
# row, rscale = finalize(1, l) and delta = d finalize(1, l) / dl * rowsum(p * dP), with which the
# dK/dV kernel forms P = rscale * p and dS = prob'(s) (rscale * dP + delta).
ONLINE_BACKWARD_KERNELS = (("dq", ("do",), ("dq", "delta", "rscale")),
                           ("dkdv", ("do", "delta", "rscale"), ("dk", "dv")))
# The same with a running max m (the row's largest modified score, 0 for a row that sees no key):
# the dQ kernel also writes m ("rowmax"), the first key that attains it ("maxkey", a float index;
# +inf for a row that sees none) and dmax, the loss's derivative in m, which that key's score
# takes (the gradient of torch.max's first index): p = prob(s, m) and
# dS = prob'(s) (rscale * dP + delta) + [key == maxkey] dmax.
ONLINE_MAX_BACKWARD_KERNELS = (("dq", ("do",), ("dq", "delta", "rscale", "rowmax", "maxkey", "dmax")),
                               ("dkdv", ("do", "delta", "rscale", "rowmax", "maxkey", "dmax"), ("dk", "dv")))
# The dQ kernel also writes, after its own roles, one closure_grad(i) per closure tensor c<i> whose
# gradient the score_mod reaches, summed over every score that reads it (f32, c<i>'s shape).
# The normalize kinds that have backward kernels: softmax, those applied element by element, and
# "online" (a user's normalizer), with or without a running max.
BACKWARD_NORMALIZERS = ("softmax", "sigmoid", "relu", "none", "online")
# What a caller of softmax's backward gives (after q, k, v, the closure tensors and, for every
# normalizer, do) and gets back.
BACKWARD_INPUTS = ("out", "do", "lse", "dlse")
BACKWARD_OUTPUTS = ("dq", "dk", "dv")
# Per-row statistics [B, H, L]: their row stride is L, which need not be a multiple of 16.
ROW_STATS = ("lse", "dlse", "delta", "rscale", "rowmax", "maxkey", "dmax")
# Tensors the runtime binds by role (strides, alignment checks).
# The float32 sums the five-product backward adds dQ into (TMA reduce-adds), then converts.
DQ_SUMS = "dq_sums"
STREAMS = INPUTS + ("out", "lse", "state", "do") + ROW_STATS[1:] + ("dq", "dk", "dv", DQ_SUMS)
# A packed variable-length batch ([1, H, T(, D)] tensors read through cu_seqlens offsets) compiles
# for any total row count T: dimension PACKED_ROWS_DIM of these roles may be dynamic (`?`), and
# takes the rows of the packed keys (KEY_ROWS) or of the packed queries (the others).
PACKED_ROWS_DIM = 2
KEY_ROWS = ("k", "v", "dk", "dv")
# On kernel functions: {workspace role: [divisor, addend]}, the rows (PACKED_ROWS_DIM) of a packed
# batch's workspace of any rows: q's rows // divisor + addend (a chunked recurrence's workspaces
# follow the packed rows, passes/chunk/split.py).
WORKSPACE_ROWS = "attn.workspace_rows"
# The call-time tile tables, in argument order (ae_mlir.block_mask.BlockMask.tables gives them so).
CALL_TIME_TABLE_ORDER = ("partial_count", "partial_index", "full_count", "full_index")


def fits_shape(spec, shape) -> bool:
    """Whether a tensor of `shape` fits a kernel argument's `spec` shape (-1: any size)."""
    return len(spec) == len(shape) and all(n < 0 or n == m for n, m in zip(spec, shape))


def sized_shape(role: str, shape, q_rows: int, k_rows: int, rule=None) -> tuple:
    """`shape` (a kernel argument's, -1 or MLIR's dynamic size where any size goes) with its packed
    rows given: a packed batch's tensors have q's rows or k's (PACKED_ROWS_DIM), a workspace
    q_rows // divisor + addend by its `rule` (WORKSPACE_ROWS)."""
    rows = k_rows if role in KEY_ROWS else q_rows
    if rule is not None:
        rows = q_rows // rule[0] + rule[1]
    return tuple(rows if d == PACKED_ROWS_DIM and n < 0 else n for d, n in enumerate(shape))


def classification_grid(recorded, q_len: int, k_len: int) -> tuple:
    """(batch, queries, keys) a call-time mask is classified over: the grid its kernel recorded
    (CALL_TIME_GRID, a packed batch's sequences and longest lengths), else all of q's entries at
    q's and k's lengths (batch None)."""
    return tuple(recorded) if recorded else (None, q_len, k_len)


def capture(i: int) -> str:
    return f"c{i}"


def is_capture(role: str) -> bool:
    """Whether a role is a closure tensor c<i>."""
    return role.startswith("c") and role[1:].isdigit()


def mirrored(i: int) -> str:
    """The role of closure tensor c<i> reversed along its last dimension, which a kernel reads
    where its reads of c<i> step backwards along a tile's rows (passes/mirror_reads.py); the
    runtime makes it from c<i>."""
    return f"{capture(i)}_mirrored"


def mirrored_capture(role: str) -> str | None:
    """The closure role c<i> that a `mirrored` role reverses; None for any other role."""
    head, _, tail = role.partition("_")
    return head if tail == "mirrored" and is_capture(head) else None


# What the aligned Triton variant assumes of a tensor argument (`aligned_assumption`).
ALIGNED = "aligned"  # a unit last stride, a 16-byte aligned pointer, the other strides i32 multiples of 16
UNIT_LAST = "unit last stride"  # a unit last stride alone


def aligned_assumption(role: str, shape) -> str | None:
    """What the aligned Triton variant assumes of the tensor of `role` and `shape` (ALIGNED,
    UNIT_LAST or nothing), which its lowering specializes for and the runtime checks a call
    against. The streams and workspaces (the caller or the runtime lays them out) are ALIGNED, and
    so are closure tensors of rows of a multiple of 16 elements (GLA's g [B, H, L, Dk]), whose
    tiles then load as vectors (a runtime last stride read g one f32 at a time). Any other
    closure (a bias table with rows of L = 1000, say) is UNIT_LAST, so that such a table does
    not send the whole call to the general variant."""
    if role in STREAMS or is_workspace(role):
        return ALIGNED
    if is_capture(role) or mirrored_capture(role):
        return ALIGNED if len(shape) >= 2 and shape[-1] % 16 == 0 else UNIT_LAST
    return None


def closure_grad(i: int) -> str:
    """The role of the gradient of closure tensor c<i>, which the dQ backward kernel writes."""
    return f"d{capture(i)}"


def is_closure_grad(role: str) -> bool:
    """Whether a destination is a closure tensor's gradient: the kernel adds into it
    (attn.scatter_add), so it must start at zero and programs may add to one element together."""
    return role.startswith("dc") and role[2:].isdigit()


def workspace(i: int) -> str:
    return f"w{i}"


def is_workspace(role: str) -> bool:
    return role.startswith("w")


def backward_kernels(kind: str = "softmax", stat: str = "none") -> tuple:
    """(part, reads, writes) of the backward kernels of normalize `kind` in launch order:
    softmax's, which read the forward's logsumexp, the online normalizers' (with `stat` "max",
    those of a running max), or the element-wise normalizers'."""
    if kind == "online" and stat == "max":
        return ONLINE_MAX_BACKWARD_KERNELS
    return {"softmax": BACKWARD_KERNELS, "online": ONLINE_BACKWARD_KERNELS}.get(kind, ELEMENTWISE_BACKWARD_KERNELS)


def backward_roles(part: str, kind: str = "softmax", stat: str = "none") -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the roles it reads, the roles it writes) of backward kernel `part` ("dq" or "dkdv")."""
    for name, reads, writes in backward_kernels(kind, stat):
        if name == part:
            return reads, writes
    raise KeyError(part)


def backward_kernel_name(forward: str, part: str) -> str:
    """The name of the backward kernel `part` ("dkdv" or "dq") of the forward function `forward`."""
    return f"{forward}_bwd_{part}"


def backward_part(kernel_name: str) -> str | None:
    """The backward kernel part ("dq" or "dkdv") a kernel named by `backward_kernel_name` is, else None."""
    for part, _, _ in BACKWARD_KERNELS:
        if kernel_name.endswith(backward_kernel_name("", part)):
            return part
    return None


def claiming_entry_name(kernel: str) -> str:
    """The CPU kernel's entry through which threads claim its programs from a shared counter
    (`attn-cpu-claim-programs`)."""
    return f"{kernel}_claiming"


# A CPU module's functions whose names start with this multiply tiles on AMX units
# (`attn-cpu-amx-tile-products`): its kernels run only in a process Linux lets use the tiles.
AMX_PRODUCT_PREFIX = "ae_amx_product_"


def amx_product_name(m: int, n: int, k: int, accumulates: bool) -> str:
    return f"{AMX_PRODUCT_PREFIX}{m}x{n}x{k}{'_acc' if accumulates else ''}"


# The kernels the split chunked recurrence launches before its output kernel, in order (those it
# needs: passes/chunk), each named `chunk_stage_name(forward, stage)` and marked with CHUNK_STAGE:
# the name alone cannot tell, since the output kernel keeps the user's function name.
CHUNK_STAGES = ("decays", "states", "scores")


def chunk_stage_name(forward: str, stage: str) -> str:
    return f"{forward}_{stage}"


def chunk_stage(func) -> str | None:
    """The CHUNK_STAGES entry a kernel (L1 func.func or tt.func) is, else None."""
    from mlir import ir

    return ir.StringAttr(func.attributes[CHUNK_STAGE]).value if CHUNK_STAGE in func.attributes else None


def input_roles(n_inputs: int) -> list[str]:
    """q, k, v and the closure tensors of an L0 function with `n_inputs` arguments."""
    return list(INPUTS) + [capture(i) for i in range(n_inputs - len(INPUTS))]


def output_roles(linear: bool) -> tuple[str, ...]:
    return LINEAR_OUTPUTS if linear else SOFTMAX_OUTPUTS


def backward_table_roles(part: str) -> tuple[str, ...]:
    """The roles of the four call-time tile tables (CALL_TIME_TABLE_ORDER) of the backward kernel
    `part` ("dq": per query block, over KV blocks; "dkdv": per KV block, over query blocks), which
    the runtime classifies from the bundle's mask program at each call."""
    return tuple(f"{part}_{name}" for name in CALL_TIME_TABLE_ORDER)


def backward_blocks(part: str, config: dict) -> tuple[int, int]:
    """(block_m, block_n) of backward kernel `part` under a launch `config`: the dK/dV kernel's
    own where the config sets them (dkdv_block_m/n, 0 or absent: none), else the shared ones."""
    if part == "dkdv":
        return config.get("dkdv_block_m") or config["block_m"], config.get("dkdv_block_n") or config["block_n"]
    return config["block_m"], config["block_n"]


def backward_table_part(role: str) -> str | None:
    """The backward kernel ("dq" or "dkdv") whose call-time table `role` is, else None."""
    for part in ("dq", "dkdv"):
        if role in backward_table_roles(part):
            return part
    return None


def call_time_table_roles(n_captures: int) -> list[str]:
    """The roles of the four call-time tables: the closure roles after the kernel's own."""
    return [capture(n_captures + i) for i in range(len(CALL_TIME_TABLE_ORDER))]


# --- reading a kernel op (mlir.ir Operation) --------------------------------------------------------


def functions(module) -> list:
    """The func.func ops at the top of a module, in order."""
    op = getattr(module, "operation", module)
    return [f.operation for f in op.regions[0].blocks[0].operations if f.operation.name == "func.func"]


def is_kernel(func) -> bool:
    return GRID in func.attributes


def kernels(module) -> list:
    """The L1 kernels of a module (func.func with `attn.grid`), in launch order."""
    return [f for f in functions(module) if is_kernel(f)]


def input_types(func) -> list:
    return list(func.attributes["function_type"].value.inputs)


def result_types(func) -> list:
    return list(func.attributes["function_type"].value.results)


def name(func) -> str:
    from mlir import ir

    return ir.StringAttr(func.attributes["sym_name"]).value


def grid(func) -> list[int]:
    return [int(x) for x in func.attributes[GRID]]


def int_attr(func, attr: str) -> int | None:
    from mlir import ir

    return ir.IntegerAttr(func.attributes[attr]).value if attr in func.attributes else None


def _strings(func, attr: str) -> list[str] | None:
    from mlir import ir

    if attr not in func.attributes:
        return None
    return [ir.StringAttr(s).value for s in func.attributes[attr]]


def arg_roles(func) -> list[str] | None:
    """The kernel's `attn.arg_roles`, or None where its arguments follow the softmax layout."""
    return _strings(func, ARG_ROLES)


def workspace_rows(func) -> dict:
    """The kernel's WORKSPACE_ROWS: {role: [divisor, addend]} (empty where none takes any rows)."""
    if WORKSPACE_ROWS not in func.attributes:
        return {}
    from mlir import ir

    return {named.name: list(ir.DenseI64ArrayAttr(named.attr)) for named in ir.DictAttr(func.attributes[WORKSPACE_ROWS])}


def kernel_args(func) -> list[str]:
    """The labels of a lowered tt.func's arguments (the runtime binds them by these)."""
    return _strings(func, KERNEL_ARGS) or []


def takes_call_time_tables(func) -> bool:
    return CALL_TIME_TABLES in func.attributes


def mask_program(func) -> str | None:
    """The JSON mask program of a kernel that takes call-time tables, else None."""
    from mlir import ir

    return ir.StringAttr(func.attributes[MASK_PROGRAM]).value if MASK_PROGRAM in func.attributes else None


def call_time_grid(func) -> list[int] | None:
    """The CALL_TIME_GRID (batch, query and key lengths) a kernel's call-time tables are
    classified over, where its q's shape does not give it; else None."""
    from mlir import ir

    return list(ir.DenseI64ArrayAttr(func.attributes[CALL_TIME_GRID])) if CALL_TIME_GRID in func.attributes else None


def call_time_table_types(func, n_inputs: int) -> list:
    """The types of the four call-time tables, which follow the kernel's `n_inputs` inputs."""
    if not takes_call_time_tables(func):
        return []
    return input_types(func)[n_inputs:n_inputs + len(CALL_TIME_TABLE_ORDER)]
