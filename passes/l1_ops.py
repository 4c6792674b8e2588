"""What the passes that write L1 kernels ask of the ops they rewrite: finding them, the function a
kernel replaces, their shapes and constants, and errors located at them."""
from __future__ import annotations

from ..core.context import CompileError, Diagnostic, location_parts


def fail(op, message: str) -> CompileError:
    filename, line, col = location_parts(op.location)
    return CompileError(message, [Diagnostic("error", f"'{op.name}' op {message}", filename, line, col)])


def ops_named(module_op, name: str) -> list:
    """Every op called `name` in the module, collected before any is rewritten."""
    from mlir import ir

    found = []

    def collect(op):
        if op.name == name:
            found.append(op)
        return ir.WalkResult.ADVANCE

    module_op.walk(collect)
    return found


def kernel_function(op, verb: str, views: tuple = ()):
    """The func.func that `op` becomes the kernel of: it must return exactly the op's results
    and hold nothing else but constants, since the whole function turns into the kernel. It may
    also hold the `views` (op names) the kernel reads in place (attn.gather_pages,
    attn.unpack_sequences) and return the op's results through attn.pack_sequences when that is
    one of them."""
    func = op.parent
    while func is not None and func.operation.name != "func.func":
        func = func.parent
    if func is None:
        raise fail(op, f"must be inside a func.func to be {verb}")
    block = func.regions[0].blocks[0]
    ret = list(block.operations)[-1].operation
    packs = "attn.pack_sequences" in views
    returned = [_unpacked(v) for v in ret.operands] if packs else list(ret.operands)
    if returned != list(op.results):
        raise fail(op, f"{verb} turns the whole function into a kernel: the function must return "
                       "exactly this op's results, in order")
    for other in block.operations:
        if other.operation not in (op, ret) and other.operation.name not in views + ("arith.constant",):
            also = (f", constants and the views it reads or writes ({', '.join(views)})" if views
                    else " and constants")
            raise fail(other.operation, f"a function to be {verb} must hold only '{op.name}'{also}")
    return func


# Views a kernel's function may hold beside the op it tiles: the kernel reads (or, packing its
# results, writes) them in place.
TILE_VIEWS = ("attn.gather_pages", "attn.unpack_sequences", "attn.pack_sequences")
SEQUENCE_VIEWS = ("attn.unpack_sequences", "attn.pack_sequences")


def _unpacked(value):
    """The value an attn.pack_sequences packs, else `value` itself."""
    owner = getattr(value.owner, "operation", None)
    return owner.operands[0] if owner is not None and owner.name == "attn.pack_sequences" else value


def shape(value) -> list[int]:
    return list(value.type.shape)


def constant_op(value):
    owner = getattr(value.owner, "operation", None)
    if owner is not None and owner.name == "arith.constant":
        return owner
    return None
