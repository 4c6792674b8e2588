"""`attn-tile`: `attn.online_attention` becomes an L1 kernel function over (batch, head, query block).

L1 is target-neutral and made of upstream dialects plus one `attn.program_id` op:

* The function keeps the inputs, takes the outputs as destinations (`%out`, then `%lse` when
  present) and returns them updated; `attn.grid = [B, H, ceil(Lq / block_m)]` says how many
  programs run it, each reading its coordinates with `attn.program_id`.
* A program loads its Q tile once (`tensor.extract_slice` + `tensor.pad` with zeros at the ragged
  edge), then walks KV tiles in two `scf.for` loops carrying the row state (max, sum, accumulator):
  first the partial tiles, which evaluate the mask, then the full tiles, which do not. Which tiles
  are partial, full or skipped entirely is decided here at compile time for positional masks and
  recorded in per-query-block tables (`arith.constant` tensors), as FlexAttention's BlockMask does.
* Tiles are tensors: `linalg.matmul` for Q K^T and P V (f32 accumulation), `linalg.generic` for the
  elementwise work (scale, score_mod, mask, the normalizer's regions), `linalg.reduce` for row max
  and row sum.

Both backends lower exactly this form, so tiling, fusion and tile classification are shared.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from ..core.regions import float_literal
from ..core.regions import TextEmitter, emit_scalar, from_region
from . import ModulePass, option
from .tile_tables import Classification, classify_blocks, table_constants
from .l1_text import (KernelText, convert, elt, fail, kernel_function, ops_named, replace_function,
                      shape)

LOG2E = 1.0 / math.log(2.0)
NEG_INF = "0xFF800000"


class _Kernel(KernelText):
    """Builds the text of one L1 kernel function."""

    def __init__(self, op, func, block_m: int, block_n: int):
        super().__init__(op, func)
        self.bm = block_m
        self.bn = block_n
        q, k, v = op.operands[0], op.operands[1], op.operands[2]
        self.b, self.h, self.lq, self.dk = shape(q)
        _, self.hkv, self.lk, _ = shape(k)
        self.dv = shape(v)[3]
        self.elt = elt(q)
        self.with_lse = len(op.results) > 1
        self.stat = op.attributes["stat"].value
        self.log2 = bool(op.attributes["log2_domain"].value)
        self.scale = float(op.attributes["scale"].value)
        self.regions = {name: from_region(op.regions[i]) for i, name in
                        enumerate(("score_mod", "mask", "prob", "rescale", "finalize", "lse"))}
        # Softmax needs the row sum; a normalizer without a statistic needs it only if its
        # finalize reads it (RetNet's abs-sum division does, sigmoid's identity does not).
        self.tracks_sum = self.stat == "max" or self.regions["finalize"].uses_arg(1)

    def reduce_rows(self, value: str, tile_type: str, init: str, combine: str) -> str:
        return super().reduce_rows(value, tile_type, init, f"tensor<{self.bm}xf32>", combine)

    def load_tile(self, src: str, src_type: str, coords: list[str], start: str, length: int,
                  rows: int, width: int) -> str:
        """Rows [start, start + rows) of src[coords..., :, :width], zero-padded past `length`."""
        return super().load_tile(src, src_type, self.elt, coords, start, length, rows, width)

    # --- the kernel ----------------------------------------------------------------------
    def build(self, classification: Classification) -> str:
        em = self.em
        bm, bn, elt = self.bm, self.bn, self.elt
        nm = -(-self.lq // bm)
        args = self.func_args
        q_type, k_type, v_type = (str(args[i].type) for i in range(3))
        nn = -(-self.lk // bn)
        table_types = [f"tensor<{nm}xi32>", f"tensor<{nm}x{nn}xi32>"] * 2
        table_args = []
        if classification.at_call_time:
            table_args = [f"%arg{len(args) + i}" for i in range(4)]
        n_in = len(args) + len(table_args)
        out_type = str(self.op.results[0].type)
        lse_type = str(self.op.results[1].type) if self.with_lse else None
        out_arg = f"%arg{n_in}"
        lse_arg = f"%arg{n_in + 1}"

        pb = em('"attn.program_id"() {axis = 0 : i64} : () -> index')
        ph = em('"attn.program_id"() {axis = 1 : i64} : () -> index')
        pm = em('"attn.program_id"() {axis = 2 : i64} : () -> index')
        self.pb, self.ph = pb, ph
        group = self.h // self.hkv
        hk = em(f"arith.divui {ph}, {self.idx(group)} : index") if group > 1 else ph
        m0 = em(f"arith.muli {pm}, {self.idx(bm)} : index")
        self.m0 = m0
        q_tile = self.load_tile("%arg0", q_type, [pb, ph], m0, self.lq, bm, self.dk)

        row_t, acc_t = f"tensor<{bm}xf32>", f"tensor<{bm}x{self.dv}xf32>"
        zero, ninf = self.f32(0.0), self.f32(NEG_INF)
        row_empty = em(f"tensor.empty() : {row_t}")
        state = []
        if self.stat == "max":
            state.append(em(f"linalg.fill ins({ninf} : f32) outs({row_empty} : {row_t}) -> {row_t}"))
        if self.tracks_sum:
            state.append(em(f"linalg.fill ins({zero} : f32) outs({row_empty} : {row_t}) -> {row_t}"))
        acc_empty = em(f"tensor.empty() : {acc_t}")
        state.append(em(f"linalg.fill ins({zero} : f32) outs({acc_empty} : {acc_t}) -> {acc_t}"))
        state_types = [row_t] * (len(state) - 1) + [acc_t]

        for masked, lists, position in ((True, classification.partial, 0), (False, classification.full, 2)):
            if table_args:
                count_tab, index_tab = table_args[position], table_args[position + 1]
                count_t, index_t = table_types[position], table_types[position + 1]
            elif not any(lists):
                continue
            else:
                counts, indices, types = table_constants(lists)
                count_t, index_t = types.split("|")
                count_tab = em(f"arith.constant {counts}")
                index_tab = em(f"arith.constant {indices}")
            count = em(f"tensor.extract {count_tab}[{pm}] : {count_t}")
            count_idx = em(f"arith.index_cast {count} : i32 to index")
            lower, step = self.idx(0), self.idx(1)
            it = f"%it{em.count}"
            iter_names = [f"%st{em.count}_{i}" for i in range(len(state))]
            header = em.results(
                len(state),
                f"scf.for {it} = {lower} to {count_idx} step {step} iter_args("
                + ", ".join(f"{n} = {s}" for n, s in zip(iter_names, state))
                + f") -> ({', '.join(state_types)}) {{",
            )
            nb_raw = em(f"tensor.extract {index_tab}[{pm}, {it}] : {index_t}")
            nb = em(f"arith.index_cast {nb_raw} : i32 to index")
            new_state = self.kv_step(q_tile, k_type, v_type, hk, nb, iter_names, masked)
            em.raw(f"scf.yield {', '.join(new_state)} : {', '.join(state_types)}")
            em.raw("}")
            state = header

        acc = state[-1]
        l = state[-2] if self.tracks_sum else None
        out_tile_t = f"tensor<{bm}x{self.dv}x{elt}>"

        def finalize(inner, a):
            value = emit_scalar(self.regions["finalize"], a, inner, self.externals(self.regions["finalize"], inner))
            return convert(inner, value, "f32", elt)

        if l is not None:
            o = self.generic([(acc, acc_t, "(d0, d1)"), (l, row_t, "(d0)")], out_tile_t, finalize)
        else:
            o = self.generic([(acc, acc_t, "(d0, d1)")], out_tile_t,
                             lambda inner, a: finalize(inner, [a[0], inner(f"arith.constant {float_literal(0.0)} : f32")]))
        rows_left = em(f"arith.subi {self.idx(self.lq)}, {m0} : index")
        rows = em(f"arith.minsi {rows_left}, {self.idx(bm)} : index")
        o_valid = em(f"tensor.extract_slice {o}[0, 0] [{rows}, {self.dv}] [1, 1] : {out_tile_t} to tensor<?x{self.dv}x{elt}>")
        results = [em(f"tensor.insert_slice {o_valid} into {out_arg}[{pb}, {ph}, {m0}, 0] [1, 1, {rows}, {self.dv}] "
                      f"[1, 1, 1, 1] : tensor<?x{self.dv}x{elt}> into {out_type}")]
        if self.with_lse:
            m_safe = self.safe_max(state[0])
            program = self.regions["lse"]
            lse_tile = self.generic(
                [(m_safe, row_t, "(d0)"), (l, row_t, "(d0)")], row_t,
                lambda inner, a: emit_scalar(program, a, inner, self.externals(program, inner)), rank=1)
            lse_valid = em(f"tensor.extract_slice {lse_tile}[0] [{rows}] [1] : {row_t} to tensor<?xf32>")
            results.append(em(f"tensor.insert_slice {lse_valid} into {lse_arg}[{pb}, {ph}, {m0}] [1, 1, {rows}] "
                              f"[1, 1, 1] : tensor<?xf32> into {lse_type}"))
        result_types = [out_type] + ([lse_type] if self.with_lse else [])
        em.raw(f"return {', '.join(results)} : {', '.join(result_types)}")

        params = [f"%arg{i}: {a.type}" for i, a in enumerate(args)]
        params += [f"{name}: {ty}" for name, ty in zip(table_args, table_types)]
        params += [f"{out_arg}: {out_type}"] + ([f"{lse_arg}: {lse_type}"] if self.with_lse else [])
        name = self.func.attributes["sym_name"].value
        body = "\n".join(f"    {line}" for line in em.lines)
        extra = "".join(f", {key} = {value}" for key, value in classification.kernel_attributes())
        return (f"func.func @{name}({', '.join(params)}) -> ({', '.join(result_types)}) attributes "
                f"{{attn.grid = array<i64: {self.b}, {self.h}, {nm}>, attn.block_m = {bm} : i64, "
                f"attn.block_n = {bn} : i64{extra}}} {{\n{body}\n}}\n")

    def safe_max(self, m: str) -> str:
        """Row max with -inf (a row with nothing visible yet) replaced by 0."""
        row_t = f"tensor<{self.bm}xf32>"

        def body(inner, a):
            ninf = inner(f"arith.constant {NEG_INF} : f32")
            zero = inner(f"arith.constant {float_literal(0.0)} : f32")
            is_empty = inner(f"arith.cmpf oeq, {a[0]}, {ninf} : f32")
            return inner(f"arith.select {is_empty}, {zero}, {a[0]} : f32")

        return self.generic([(m, row_t, "(d0)")], row_t, body, rank=1)

    def kv_step(self, q_tile: str, k_type: str, v_type: str, hk: str, nb: str, state: list[str],
                masked: bool) -> list[str]:
        em = self.em
        bm, bn, elt = self.bm, self.bn, self.elt
        n0 = em(f"arith.muli {nb}, {self.idx(bn)} : index")
        k_tile = self.load_tile("%arg1", k_type, [self.pb, hk], n0, self.lk, bn, self.dk)
        v_tile = self.load_tile("%arg2", v_type, [self.pb, hk], n0, self.lk, bn, self.dv)
        kt_empty = em(f"tensor.empty() : tensor<{self.dk}x{bn}x{elt}>")
        k_trans = em(f"linalg.transpose ins({k_tile} : tensor<{bn}x{self.dk}x{elt}>) "
                     f"outs({kt_empty} : tensor<{self.dk}x{bn}x{elt}>) permutation = [1, 0]")
        tile_t = f"tensor<{bm}x{bn}xf32>"
        row_t, acc_t = f"tensor<{bm}xf32>", f"tensor<{bm}x{self.dv}xf32>"
        s_empty = em(f"tensor.empty() : {tile_t}")
        s_zero = em(f"linalg.fill ins({self.f32(0.0)} : f32) outs({s_empty} : {tile_t}) -> {tile_t}")
        qk = em(f"linalg.matmul ins({q_tile}, {k_trans} : tensor<{bm}x{self.dk}x{elt}>, "
                f"tensor<{self.dk}x{bn}x{elt}>) outs({s_zero} : {tile_t}) -> {tile_t}")
        score_mod = self.regions["score_mod"]
        fold = self.log2 and score_mod is None
        scale = self.scale * LOG2E if fold else self.scale
        mask = self.regions["mask"] if masked else None

        def scores(inner, a):
            x = inner(f"arith.mulf {a[0]}, {inner(f'arith.constant {float_literal(scale)} : f32')} : f32")
            needs_index = score_mod is not None or mask is not None or masked
            if needs_index:
                i = inner("linalg.index 0 : index")
                j = inner("linalg.index 1 : index")
                qi = inner(f"arith.addi {self.m0}, {i} : index")
                kj = inner(f"arith.addi {n0}, {j} : index")
                # Padded rows and columns see the last valid index, so a mod never reads a
                # closure tensor out of bounds; their results are masked or never stored.
                qc = inner(f"arith.minsi {qi}, {inner(f'arith.constant {self.lq - 1} : index')} : index")
                kc = inner(f"arith.minsi {kj}, {inner(f'arith.constant {self.lk - 1} : index')} : index")
            if score_mod is not None:
                x = emit_scalar(score_mod, [x, self.pb, self.ph, qc, kc], inner, self.externals(score_mod, inner))
                if self.log2:
                    x = inner(f"arith.mulf {x}, {inner(f'arith.constant {float_literal(LOG2E)} : f32')} : f32")
            if masked:
                keep = inner(f"arith.cmpi slt, {kj}, {inner(f'arith.constant {self.lk} : index')} : index")
                if mask is not None:
                    user = emit_scalar(mask, [self.pb, self.ph, qc, kc], inner, self.externals(mask, inner))
                    keep = inner(f"arith.andi {keep}, {user} : i1")
            if self.stat == "max":
                if masked:
                    x = inner(f"arith.select {keep}, {x}, {inner(f'arith.constant {NEG_INF} : f32')} : f32")
                return x
            zero = inner(f"arith.constant {float_literal(0.0)} : f32")
            prob = self.regions["prob"]
            p = emit_scalar(prob, [x, zero], inner, self.externals(prob, inner))
            if masked:
                p = inner(f"arith.select {keep}, {p}, {zero} : f32")
            return p

        s = self.generic([(qk, tile_t, "(d0, d1)")], tile_t, scores)
        if self.stat == "max":
            m_old, l_old, acc = state
            m_new = self.reduce_rows(s, tile_t, m_old, "arith.maximumf")
            m_safe = self.safe_max(m_new)
            prob, rescale = self.regions["prob"], self.regions["rescale"]
            p = self.generic([(s, tile_t, "(d0, d1)"), (m_safe, row_t, "(d0)")], tile_t,
                             lambda inner, a: emit_scalar(prob, a, inner, self.externals(prob, inner)))
            alpha = self.generic([(m_old, row_t, "(d0)"), (m_safe, row_t, "(d0)")], row_t,
                                 lambda inner, a: emit_scalar(rescale, a, inner, self.externals(rescale, inner)),
                                 rank=1)
            sum_empty = em(f"tensor.empty() : {row_t}")
            sum_init = em(f"linalg.fill ins({self.f32(0.0)} : f32) outs({sum_empty} : {row_t}) -> {row_t}")
            p_sum = self.reduce_rows(p, tile_t, sum_init, "arith.addf")
            l_new = self.generic(
                [(alpha, row_t, "(d0)"), (l_old, row_t, "(d0)"), (p_sum, row_t, "(d0)")], row_t,
                lambda inner, a: inner(f"arith.addf {inner(f'arith.mulf {a[0]}, {a[1]} : f32')}, {a[2]} : f32"),
                rank=1)
            acc_scaled = self.generic([(acc, acc_t, "(d0, d1)"), (alpha, row_t, "(d0)")], acc_t,
                                      lambda inner, a: inner(f"arith.mulf {a[0]}, {a[1]} : f32"))
        else:
            acc = state[-1]
            p = s
            acc_scaled = acc
            if self.tracks_sum:
                l_old = state[0]
                sum_empty = em(f"tensor.empty() : {row_t}")
                sum_init = em(f"linalg.fill ins({self.f32(0.0)} : f32) outs({sum_empty} : {row_t}) -> {row_t}")
                p_sum = self.reduce_rows(p, tile_t, sum_init, "arith.addf")
                l_new = self.generic([(l_old, row_t, "(d0)"), (p_sum, row_t, "(d0)")], row_t,
                                     lambda inner, a: inner(f"arith.addf {a[0]}, {a[1]} : f32"), rank=1)
        p_in = p
        if elt != "f32":
            p_in = self.generic([(p, tile_t, "(d0, d1)")], f"tensor<{bm}x{bn}x{elt}>",
                                lambda inner, a: convert(inner, a[0], "f32", elt))
        acc_new = em(f"linalg.matmul ins({p_in}, {v_tile} : tensor<{bm}x{bn}x{elt}>, tensor<{bn}x{self.dv}x{elt}>) "
                     f"outs({acc_scaled} : {acc_t}) -> {acc_t}")
        if self.stat == "max":
            return [m_new, l_new, acc_new]
        return [l_new, acc_new] if self.tracks_sum else [acc_new]


@dataclass(frozen=True)
class AttnTile(ModulePass):
    name: ClassVar[str] = "attn-tile"
    summary: ClassVar[str] = ("Tile attn.online_attention into an L1 kernel: a program per (batch, head, "
                              "query block), an scf.for over KV tiles carrying the row state, "
                              "compile-time tile classification of positional masks")

    block_m: int = option(64, "query rows per program")
    block_n: int = option(64, "keys per KV tile")
    call_time_tables: bool = option(False, "classify masks that read closure tensors at call time: the "
                                           "kernel takes the tile tables as four extra arguments after "
                                           "the inputs (partial count/index, full count/index) "
                                           "and carries the mask as JSON in attn.mask_program")

    def __post_init__(self):
        for opt, value in (("block-m", self.block_m), ("block-n", self.block_n)):
            if value < 1 or value & (value - 1):
                raise ValueError(f"{opt} must be a positive power of two, got {value}")

    def apply(self, module_op) -> None:
        for op in ops_named(module_op, "attn.online_attention"):
            self._tile(module_op, op)

    def _tile(self, module_op, op) -> None:
        func = kernel_function(op, "tiled")
        kernel = _Kernel(op, func, self.block_m, self.block_n)
        mask_region = op.regions[1] if list(op.regions[1].blocks) else None
        classification = classify_blocks(mask_region, kernel.lq, kernel.lk, self.block_m, self.block_n,
                                         self.call_time_tables)
        replace_function(module_op, func, kernel.build(classification), "<attn-tile>")
