// The subset of Triton's `tt` dialect (triton 3.6) that `attn-lower-to-triton` emits (level L2),
// declared in IRDL so that the lowered module parses and verifies with ae-mlir's dialects loaded
// (`ae_mlir.context.load_dialects`, or `mlir-opt --irdl-file=dialects/tt.irdl.mlir`).
//
// IRDL checks names, operand/result/region counts and the presence and kind of each attribute;
// Triton's own verifiers (shapes, element types, encodings) run when `triton.compile` parses the
// printed module. Three things Triton needs are beyond IRDL, and each has a fixed workaround:
//
// * Properties. Extensible dialects reject `<{...}>`, so every inherent attribute (tt.func's
//   function_type/sym_name/sym_visibility/arg_attrs, tt.load's operandSegmentSizes, ...) sits in
//   the attribute dictionary. Triton's parser moves inherent attributes found there into the
//   op's properties, so the printed module still parses in Triton unchanged.
// * Terminators. IRDL cannot give an op the IsTerminator trait, so a registered `tt.return` or
//   `tt.reduce.return` at the end of a block fails MLIR's verifier ("block with no terminator").
//   Inside ae-mlir the kernel body and each reduce combiner therefore end with the upstream
//   `gpu.yield` (a terminator with no parent constraint, as in the attn dialect's regions):
//   operand-less in a tt.func body, carrying the combined values in a tt.reduce region.
//   `ae_mlir.passes.lower_to_triton.triton_text` prints the module in generic form and renames
//   exactly those ops to `tt.return` / `tt.reduce.return`; that text is what Triton compiles.
//   Neither terminator is declared here: a declared `tt.return` could never end a block, and
//   IRDL op names cannot contain a dot (`reduce.return`). The consequence: Triton's own text
//   (with tt.return) does not parse with these dialects loaded; only the lowering's output does.
// * Pointer address spaces. `!tt.ptr` is declared with its pointee type only; Triton prints
//   the default address space (1, global) implicitly, which is the only one the lowering uses.
irdl.dialect @tt {
  // !tt.ptr<pointee>: a global-memory pointer to one element.
  irdl.type @ptr {
    %pointee = irdl.any
    irdl.parameters(pointee: %pointee)
  }

  // !tt.tensordesc<tensor<...>>: a TMA tensor descriptor loading tiles of the given type.
  irdl.type @tensordesc {
    %block = irdl.any
    irdl.parameters(block: %block)
  }

  // The kernel. Attributes: function_type, sym_name, sym_visibility ("public"), noinline and,
  // optionally, arg_attrs (tt.divisibility hints per argument).
  irdl.operation @func {
    %fty = irdl.base "!builtin.function"
    %name = irdl.base "#builtin.string"
    %vis = irdl.base "#builtin.string"
    %noinline = irdl.base "#builtin.integer"
    irdl.attributes {"function_type" = %fty, "sym_name" = %name, "sym_visibility" = %vis,
                     "noinline" = %noinline}
    %body = irdl.region
    irdl.regions(body: %body)
  }

  // Program coordinate along `axis` (0 = x, 1 = y, 2 = z), an i32.
  irdl.operation @get_program_id {
    %axis = irdl.base "#builtin.integer"
    %i32 = irdl.is i32
    irdl.attributes {"axis" = %axis}
    irdl.results(result: %i32)
  }

  // tensor<N x i32> holding start, start + 1, ..., end - 1.
  irdl.operation @make_range {
    %start = irdl.base "#builtin.integer"
    %end = irdl.base "#builtin.integer"
    %t = irdl.base "!builtin.tensor"
    irdl.attributes {"start" = %start, "end" = %end}
    irdl.results(result: %t)
  }

  // A scalar (or pointer) copied into every element of a tensor.
  irdl.operation @splat {
    %src = irdl.any
    %t = irdl.base "!builtin.tensor"
    irdl.operands(src: %src)
    irdl.results(result: %t)
  }

  // Inserts a dimension of size 1 at `axis`.
  irdl.operation @expand_dims {
    %src = irdl.base "!builtin.tensor"
    %t = irdl.base "!builtin.tensor"
    %axis = irdl.base "#builtin.integer"
    irdl.operands(src: %src)
    irdl.results(result: %t)
    irdl.attributes {"axis" = %axis}
  }

  // Stretches dimensions of size 1.
  irdl.operation @broadcast {
    %src = irdl.base "!builtin.tensor"
    %t = irdl.base "!builtin.tensor"
    irdl.operands(src: %src)
    irdl.results(result: %t)
  }

  // Pointer (or tensor of pointers) plus an element offset of any integer width.
  irdl.operation @addptr {
    %ptr = irdl.any
    %offset = irdl.any
    irdl.operands(ptr: %ptr, offset: %offset)
    irdl.results(result: %ptr)
  }

  // Masked load; masked-off lanes read `other`. operandSegmentSizes says which of mask/other
  // are present; cache and evict are Triton's enums (1 = none / normal).
  irdl.operation @load {
    %ptr = irdl.any
    %mask = irdl.any
    %other = irdl.any
    %result = irdl.any
    %seg = irdl.base "#builtin.dense_array"
    %cache = irdl.base "#builtin.integer"
    %evict = irdl.base "#builtin.integer"
    %volatile = irdl.base "#builtin.integer"
    irdl.operands(ptr: %ptr, mask: optional %mask, other: optional %other)
    irdl.results(result: %result)
    irdl.attributes {"operandSegmentSizes" = %seg, "cache" = %cache, "evict" = %evict,
                     "isVolatile" = %volatile}
  }

  // Masked store.
  // A 2-D descriptor (the only rank the lowering makes) over a tensor of base, sizes (i32) and
  // strides (i64).
  irdl.operation @make_tensor_descriptor {
    %base = irdl.any
    %i32 = irdl.is i32
    %i64 = irdl.is i64
    %desc = irdl.any
    irdl.operands(base: %base, rows: %i32, columns: %i32, row_stride: %i64, column_stride: %i64)
    irdl.results(result: %desc)
  }

  // The tile of a descriptor at i32 offsets, one per dimension; zeros past the tensor's end.
  irdl.operation @descriptor_load {
    %desc = irdl.any
    %offset = irdl.any
    %result = irdl.any
    irdl.operands(desc: %desc, offsets: variadic %offset)
    irdl.results(result: %result)
  }

  irdl.operation @store {
    %ptr = irdl.any
    %value = irdl.any
    %mask = irdl.any
    %cache = irdl.base "#builtin.integer"
    %evict = irdl.base "#builtin.integer"
    irdl.operands(ptr: %ptr, value: %value, mask: optional %mask)
    irdl.attributes {"cache" = %cache, "evict" = %evict}
  }

  // An atomic read-modify-write of each (unmasked) lane's element; returns the old values.
  // atomic_rmw_op 5 = fadd; sem 1 = relaxed; scope 1 = gpu.
  irdl.operation @atomic_rmw {
    %ptr = irdl.any
    %value = irdl.any
    %mask = irdl.any
    %old = irdl.any
    %rmw = irdl.base "#builtin.integer"
    %sem = irdl.base "#builtin.integer"
    %scope = irdl.base "#builtin.integer"
    irdl.operands(ptr: %ptr, value: %value, mask: optional %mask)
    irdl.results(old: %old)
    irdl.attributes {"atomic_rmw_op" = %rmw, "sem" = %sem, "scope" = %scope}
  }

  // Inline PTX applied element by element (the lowering's fast tanh: "tanh.approx.f32 $0, $1;").
  irdl.operation @elementwise_inline_asm {
    %arg = irdl.any
    %result = irdl.any
    %asm = irdl.base "#builtin.string"
    %constraints = irdl.base "#builtin.string"
    %packed = irdl.base "#builtin.integer"
    %pure = irdl.base "#builtin.integer"
    irdl.operands(args: variadic %arg)
    irdl.results(result: variadic %result)
    irdl.attributes {"asm_string" = %asm, "constraints" = %constraints, "packed_element" = %packed,
                     "pure" = %pure}
  }

  // d = a @ b + c. inputPrecision (for f32 inputs): 0 = tf32, 1 = tf32x3, 2 = ieee.
  irdl.operation @dot {
    %a = irdl.base "!builtin.tensor"
    %b = irdl.base "!builtin.tensor"
    %c = irdl.base "!builtin.tensor"
    %precision = irdl.base "#builtin.integer"
    %imprecise = irdl.base "#builtin.integer"
    irdl.operands(a: %a, b: %b, c: %c)
    irdl.results(d: %c)
    irdl.attributes {"inputPrecision" = %precision, "maxNumImpreciseAcc" = %imprecise}
  }

  // Permutes dimensions by `order`.
  irdl.operation @trans {
    %src = irdl.base "!builtin.tensor"
    %t = irdl.base "!builtin.tensor"
    %order = irdl.base "#builtin.dense_array"
    irdl.operands(src: %src)
    irdl.results(result: %t)
    irdl.attributes {"order" = %order}
  }

  // The same elements in another shape, row-major (merges or splits dimensions).
  irdl.operation @reshape {
    %src = irdl.base "!builtin.tensor"
    %t = irdl.base "!builtin.tensor"
    irdl.operands(src: %src)
    irdl.results(result: %t)
  }

  // Reduces `srcs` along `axis` with the combine region (two scalars per source in, one out).
  irdl.operation @reduce {
    %src = irdl.base "!builtin.tensor"
    %result = irdl.any
    %axis = irdl.base "#builtin.integer"
    irdl.operands(srcs: variadic %src)
    irdl.results(result: variadic %result)
    irdl.attributes {"axis" = %axis}
    %combine = irdl.region
    irdl.regions(combine_op: %combine)
  }
}
