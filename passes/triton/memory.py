"""`Memory`: the kernel's arguments (a pointer and strides per tensor) and the pointer arithmetic of
tile loads, stores and gathers (the closure gradients' atomic adds: `scatter.ClosureAdds`)."""
from __future__ import annotations

from dataclasses import replace

from ...core import abi
from .builder import TileBuilder
from .values import Arg, Slice, Value, element_type, fail, padded_size, tensor_type

# The largest tile dimension a TMA tensor descriptor loads (its box dimensions).
DESCRIPTOR_BLOCK = 256


class Memory(TileBuilder):
    """Needs `func` (the L1 function), `aligned` and `params` (name, type, arg attrs, label) from
    the kernel."""

    def add_param(self, hint: str, ty: str, label: str, attrs: str = "") -> Value:
        name = f"%{hint}"
        self.params.append((name, ty, attrs, label))
        return Value(name, (), ty)

    def setup_args(self):
        from mlir import ir

        args = list(self.func.regions[0].blocks[0].arguments)
        n_out = len(self.func.attributes["function_type"].value.results)
        n_cap = len(args) - 3 - n_out
        if n_cap < 0:
            raise fail(self.func, "is not an L1 kernel: it needs q, k, v, captures and destination arguments")
        labels = ["q", "k", "v"] + [f"c{i}" for i in range(n_cap)] + ["out", "lse"][:n_out]
        if abi.ARG_ROLES in self.func.attributes:
            labels = [ir.StringAttr(r).value for r in self.func.attributes[abi.ARG_ROLES]]
            if len(labels) != len(args):
                raise fail(self.func, f"names {len(labels)} argument roles for {len(args)} arguments")
        for i, (arg, label) in enumerate(zip(args, labels)):
            ty = arg.type
            if not hasattr(ty, "shape"):
                raise fail(self.func, f"argument {i} ({label}) must be a ranked tensor, got {ty}")
            shape = tuple(ty.shape)
            dynamic = [d for d, n in enumerate(shape) if ir.ShapedType.is_dynamic_size(n)]
            if dynamic and dynamic != [abi.PACKED_ROWS_DIM]:
                raise fail(self.func, f"argument {i} ({label}) must be a statically shaped tensor, got {ty} "
                                      f"(only a packed batch's rows, dimension {abi.PACKED_ROWS_DIM}, may take any size)")
            elt = element_type(ty)
            assumed = abi.aligned_assumption(label, shape) if self.aligned else None
            aligned, unit_last = assumed == abi.ALIGNED, assumed is not None
            stored = "i8" if elt == "i1" else elt
            ptr_attrs = "tt.divisibility = 16 : i32" if aligned else ""
            ptr = self.add_param(label, f"!tt.ptr<{stored}>", label, ptr_attrs)
            strides = []
            for d in range(len(shape)):
                if unit_last and d == len(shape) - 1:
                    strides.append(1)
                    continue
                hint = "tt.divisibility = 16 : i32" if aligned and label not in abi.ROW_STATS else ""
                strides.append(self.add_param(f"{label}_stride{d}", "i32" if aligned else "i64",
                                              f"{label}.stride{d}", hint))
            sizes = {d: self.add_param(f"{label}_size{d}", "i32", f"{label}.size{d}") for d in dynamic}
            self.values[arg] = Arg(label, shape, stored, ptr, strides, "i32" if aligned else "i64", elt == "i1",
                                   aligned, sizes)
        self.dests = args[len(args) - n_out:]
        self.dest_labels = labels[len(args) - n_out:]

    def origin(self, arg: Arg, offsets: list) -> Value:
        """Scalar pointer to arg[offsets...]; the offset is computed in i64."""
        total = None
        for d, o in enumerate(offsets):
            if isinstance(o, int) and o == 0:
                continue
            o64 = self.const(o, "i64") if isinstance(o, int) else self.cast_int(o, "i64")
            stride = arg.strides[d]
            term = o64 if stride == 1 else self.op("arith.muli", o64, self.cast_int(stride, "i64"))
            total = term if total is None else self.op("arith.addi", total, term)
        return arg.ptr if total is None else self.addptr(arg.ptr, total)

    def tile_pointers(self, arg: Arg, origin: Value, padded: tuple, extents: list):
        """Pointers to a tile over the last len(padded) dims of `arg`, with the mask of lanes
        inside `extents` (ints or scalar Values per tile dimension)."""
        rank, t = len(arg.shape), len(padded)
        offs, mask = None, None
        off_elt = arg.offset_elt
        for k in range(t):
            r = self.arange(padded[k], k, t)
            stride = arg.strides[rank - t + k]
            term = self.cast_int(r, off_elt)
            if stride != 1:
                term = self.op("arith.muli", term, self.cast_int(stride, off_elt))
            offs = term if offs is None else self.op("arith.addi", offs, term)
            ext = extents[k]
            if isinstance(ext, int) and ext >= padded[k]:
                continue
            bound = self.const(ext, "i32") if isinstance(ext, int) else ext
            inside = self.cmpi("slt", r, bound)
            mask = inside if mask is None else self.op("arith.andi", mask, inside)
        offs = self.to_shape(offs, padded)
        return self.addptr(self.to_shape(origin, padded), offs), mask

    def load_slice(self, sl: Slice, shape: tuple, user, padded: tuple | None = None) -> Value:
        arg, rank, t = sl.arg, len(sl.arg.shape), len(shape)
        if t == 0 or t > 3:
            raise fail(user, f"loads tiles of rank 1 to 3 only, not {t}")
        lead = sl.sizes[: rank - t]
        if any(s != 1 for s in lead):
            raise fail(user, "must slice a tile out of the trailing dimensions (leading sizes must be 1)")
        padded = padded or tuple(padded_size(n) for n in shape)
        if self._fits_descriptor(sl, padded):
            return replace(self._descriptor_load(sl, padded), logical=shape, zero_pad=True)
        extents = [s if isinstance(s, Value) else min(s, n) for s, n in zip(sl.sizes[rank - t:], shape)]
        ptrs, mask = self.tile_pointers(arg, self.origin(arg, sl.offsets), padded, extents)
        value = self.load(ptrs, mask, arg.elt)
        return replace(value, logical=shape, zero_pad=True)

    def _fits_descriptor(self, sl: Slice, padded: tuple) -> bool:
        """Whether a 2-D tile can load through a TMA tensor descriptor: the option is on, the
        argument is a float tensor in the aligned layout (16-byte aligned base and row stride),
        the slice's leading offsets are fixed for the program, and the padded tile read from its
        offsets, cut at the tensor's end (the descriptor fills zeros past it), is the slice
        padded with zeros. Rows of one element are left to pointers: the aligned variant does not
        check the stride of a dimension of size 1, which a descriptor needs."""
        arg = sl.arg
        if not (self.descriptors and arg.aligned and sl.spans is not None and len(padded) == 2):
            return False
        if arg.elt not in ("bf16", "f16", "f32") or arg.strides[-1] != 1 or arg.sizes or min(arg.shape[-2:]) < 2:
            return False  # (a packed tensor of any rows: its tiles end at a sequence's end, not the tensor's)
        return all(span in (None, size) and size <= DESCRIPTOR_BLOCK for span, size in zip(sl.spans, padded))

    def _descriptor_load(self, sl: Slice, padded: tuple) -> Value:
        """tt.descriptor_load of the tile at the slice's trailing offsets, from a descriptor over
        the argument's trailing two dimensions at its leading offsets, made once per program at
        function level (so Triton's pipeliner sees one descriptor in the loop)."""
        if self.host_descriptors:
            return self._host_descriptor_load(sl, padded)
        arg, rank = sl.arg, len(sl.arg.shape)
        lead = sl.offsets[: rank - 2]
        desc_type = f"!tt.tensordesc<{tensor_type(padded, arg.elt)}>"
        key = ("descriptor", arg.label, tuple(o if isinstance(o, int) else o.name for o in lead), padded)
        if key not in self.cache:
            with self.em.at_function_level():
                base = self.origin(arg, list(lead) + [0, 0])
                operands = [base, self.const(arg.shape[-2], "i32"), self.const(arg.shape[-1], "i32"),
                            self.cast_int(arg.strides[-2], "i64"), self.const(1, "i64")]
                types = ", ".join(o.type for o in operands)
                name = self.em(f'"tt.make_tensor_descriptor"({", ".join(o.name for o in operands)}) : '
                               f"({types}) -> {desc_type}")
            self.cache[key] = Value(name, (), desc_type)
        desc = self.cache[key]
        offsets = [self.const(o, "i32") if isinstance(o, int) else self.cast_int(o, "i32")
                   for o in sl.offsets[rank - 2:]]
        name = self.em(f'"tt.descriptor_load"({desc.name}, {offsets[0].name}, {offsets[1].name}) : '
                       f"({desc_type}, i32, i32) -> {tensor_type(padded, arg.elt)}")
        return Value(name, padded, arg.elt)

    def _host_descriptor_load(self, sl: Slice, padded: tuple) -> Value:
        """tt.descriptor_load of the tile at the slice's offsets from a descriptor over the whole
        argument, a kernel parameter the runtime makes on the host at each launch (abi.descriptor_label),
        one element deep in the leading dimensions; the block reshaped to the tile (a view).
        Made on the device, a descriptor costs every program a global write and fences before
        its first tile."""
        arg, rank = sl.arg, len(sl.arg.shape)
        block = (1,) * (rank - 2) + padded
        desc_type = f"!tt.tensordesc<{tensor_type(block, arg.elt)}>"
        key = ("host descriptor", arg.label, padded)
        if key not in self.cache:
            label = abi.descriptor_label(arg.label)
            hint = f"{arg.label}_tma{sum(1 for k in self.cache if k[0] == 'host descriptor')}"
            self.cache[key] = self.add_param(hint, desc_type, label)
            for kind, ty in (("size", "i32"), ("stride", "i64")):
                for d in range(rank):
                    self.add_param(f"{hint}_{kind}{d}", ty, f"{label}.{kind}{d}")
        desc = self.cache[key]
        coords = [self.const(o, "i32") if isinstance(o, int) else self.cast_int(o, "i32") for o in sl.offsets]
        name = self.em(f'"tt.descriptor_load"({desc.name}, {", ".join(c.name for c in coords)}) : '
                       f"({desc_type}, {', '.join(['i32'] * rank)}) -> {tensor_type(block, arg.elt)}")
        tile = Value(name, block, arg.elt)
        return tile if rank == 2 else self.generic("tt.reshape", [tile], padded, arg.elt)

    def gather(self, arg: Arg, indices: list[Value], user, inside: list[bool] | None = None) -> Value:
        """arg[indices...] for index values of any (lazily broadcast) shape; out of range reads 0.
        A dimension whose index is known `inside` it needs no bounds mask. The indices the whole
        tile shares (scalars) offset the base pointer once; the tile's own index along a dimension
        of unit stride is its 32-bit offset as it is (a closure tensor's dimension holds fewer
        than 2^31 elements), which spares a 64-bit add and a widening per element."""
        if len(indices) != len(arg.shape):
            raise fail(user, f"indexes a rank-{len(arg.shape)} tensor with {len(indices)} indices")
        inside = inside or [False] * len(indices)
        uniform = [d for d, idx in enumerate(indices) if not idx.shape]
        varying = [d for d, idx in enumerate(indices) if idx.shape]
        # A 0-d closure tensor (e.g. `bias[0]` taken in Python) is one scalar at offset 0.
        offset, mask = self._terms(arg, indices, uniform, inside)
        ptr = arg.ptr if offset is None else self.addptr(arg.ptr, offset)
        narrow = len(varying) == 1 and arg.strides[varying[0]] == 1 and indices[varying[0]].elt == "i32"
        offset, tile_mask = self._terms(arg, indices, varying, inside, "i32" if narrow else "i64")
        mask = tile_mask if mask is None else (mask if tile_mask is None else self.op("arith.andi", mask, tile_mask))
        shape = self.join([v for v in (offset, mask) if v is not None])
        if shape:
            ptr = self.to_shape(ptr, shape)
        if offset is not None:
            ptr = self.addptr(ptr, self.to_shape(offset, shape))
        value = self.load(ptr, mask, arg.elt)
        if arg.bool_bytes:
            value = self.cmpi("ne", value, self.const(0, "i8"))
        return value

    def _offset(self, arg: Arg, indices: list, dims) -> tuple[Value, Value]:
        """(i64 offset, in-bounds mask) of arg[indices...] over the dimensions `dims` (0 and
        true over none)."""
        offset, mask = self._terms(arg, indices, dims, [False] * len(indices))
        return (self.const(0, "i64") if offset is None else offset,
                self.const(1, "i1") if mask is None else mask)

    def extent(self, arg: Arg, d: int, elt: str) -> Value:
        """The size of `arg`'s dimension `d` in `elt`: its size argument where it takes any size."""
        size = arg.sizes.get(d)
        return self.const(arg.shape[d], elt) if size is None else self.cast_int(size, elt)

    def _terms(self, arg: Arg, indices: list, dims, inside: list[bool], elt: str = "i64") -> tuple:
        """(offset in `elt`, in-bounds mask) of arg[indices...] over the dimensions `dims`; None
        for an offset over no dimension and for a mask that every index is known to pass."""
        offset, mask = None, None
        for d in dims:
            idx = indices[d]
            term = self.cast_int(idx, elt)
            if arg.strides[d] != 1:
                term = self.op("arith.muli", term, self.cast_int(arg.strides[d], elt))
            offset = term if offset is None else self.op("arith.addi", offset, term)
            if inside[d]:
                continue
            ok = self.op("arith.andi", self.cmpi("sge", idx, self.const(0, idx.elt)),
                         self.cmpi("slt", idx, self.extent(arg, d, idx.elt)))
            mask = ok if mask is None else self.op("arith.andi", mask, ok)
        return offset, mask
