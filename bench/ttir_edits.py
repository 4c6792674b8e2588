"""Experimental edits of the Triton IR ae-mlir writes, to time a code-generation idea before the
compiler learns it (bench/attention_configs.py's `+ws`/`+lazy` choices, bench/backward.py's
`--edit`). Each takes and returns a kernel's Triton IR text; none is something ae-mlir does.
"""
from __future__ import annotations

import re

# The lazy rescale's threshold on the growth of a row's max, in log2 units: probabilities up to
# 2^8 before the accumulator is rescaled (FlashAttention-4's choice).
LAZY_THRESHOLD = 8.0


def edited(bundle, edits: list):
    """A copy of a bundle (the compile cache hands out one object per config) with each edit
    applied to the Triton IR of every kernel variant, its stages' included."""
    from ae_mlir import runtime

    bundle = runtime.Bundle.from_json(bundle.to_json())
    for kernel in [bundle] + list(bundle.stages):
        for variant in kernel.variants.values():
            for edit in edits:
                variant.ttir = edit(variant.ttir)
    return bundle


def warp_specialized(ttir: str) -> str:
    """The Triton IR with every top-level scf.for (the KV loops) marked tt.warp_specialize, which
    Triton 3.6 hands to its Hopper warp-specialization pass."""
    out = []
    for line in ttir.splitlines():
        # A KV loop closes at the function body's indentation (4 spaces) with its result types.
        if re.match(r"^    \}\) : \(i32, i32, i32, ", line):
            line = line.replace("}) : (", "}) {tt.warp_specialize} : (", 1)
        out.append(line)
    return "\n".join(out) + "\n"


_DEF = re.compile(r'^\s*(%[\w.]+)(?::\d+)? = "([\w.]+)"\(([^)]*)\)')
_LOOP = re.compile(r'^    (%[\w.]+):3 = "scf.for"')
# A top-level loop's end, warp-specialized or not.
_LOOP_END = re.compile(r"^    \}\)( \{[^}]*\})? : \(i32, i32, i32, ")


def lazy_rescale(ttir: str) -> str:
    """Softmax loops that rescale the accumulator only when some row's max grew by more than
    LAZY_THRESHOLD (log2 units) since the last rescale, one decision per tile (scf.if): otherwise
    the rows keep their old max, their probabilities reach up to 2^LAZY_THRESHOLD, and the
    accumulator's multiply by alpha (exactly 1 then) is skipped. Exact: output and logsumexp are
    formed from the max every row's terms were taken against (the TTIR interpreter agrees; on
    the H200, Triton 3.6 miscompiled the raw-max loops so edited and ran the masked ones 15-19%
    slower: bench/RESULTS.md, 2026-12-05). Loops carrying (max, sum, acc) with the shape
    ae-mlir's softmax writes are edited; others are left as they are."""
    lines = ttir.splitlines()
    out: list[str] = []
    i = 0
    count = 0
    while i < len(lines):
        if _LOOP.match(lines[i]) and i + 1 < len(lines) and lines[i + 1].lstrip().startswith("^bb0("):
            end = i + 2
            while end < len(lines) and not _LOOP_END.match(lines[end]):
                end += 1
            body = _lazy_body(lines[i + 1:end], count) if end < len(lines) else None
            if body is not None:
                out.append(lines[i])
                out.extend(body)
                i = end
                count += 1
                continue
        out.append(lines[i])
        i += 1
    return "\n".join(out) + "\n"


def _lazy_body(body: list[str], n: int) -> list[str] | None:
    args = re.findall(r"(%[\w.]+): (tensor<[^>]+>)", body[0])
    if len(args) != 3:
        return None
    (m_old, row_t), (_, _), (acc, acc_t) = args
    defs = {}
    for k, line in enumerate(body):
        found = _DEF.match(line)
        if found:
            defs[found.group(1)] = (k, found.group(2), [a.strip() for a in found.group(3).split(",")])
    # alpha = exp2(m_old - m_safe), m_safe = select(m_new == -inf, 0, m_new).
    m_new = acc_line = None
    for name, (k, op, operands) in defs.items():
        if op == "arith.subf" and operands[0] == m_old and operands[1] in defs:
            safe = defs[operands[1]]
            if safe[1] == "arith.select":
                m_new = safe[2][2]
        if op == "arith.mulf" and operands[0] == acc:
            acc_line = k
    if m_new is None or acc_line is None or m_new not in defs:
        return None
    at = defs[m_new][0]
    indent = " " * (len(body[at]) - len(body[at].lstrip()))
    p = f"%lz{n}_"
    need = [
        f'{p}d = "arith.subf"({m_new}, {m_old}) <{{fastmath = #arith.fastmath<none>}}> : ({row_t}, {row_t}) -> {row_t}',
        f'{p}r = "tt.reduce"({p}d) ({{',
        f'^bb0({p}a: f32, {p}b: f32):',
        f'  {p}c = "arith.maxnumf"({p}a, {p}b) <{{fastmath = #arith.fastmath<none>}}> : (f32, f32) -> f32',
        f'  "tt.reduce.return"({p}c) : (f32) -> ()',
        f'}}) {{axis = 0 : i32}} : ({row_t}) -> f32',
        f'{p}t = "arith.constant"() <{{value = {LAZY_THRESHOLD!r} : f32}}> : () -> f32',
        f'{p}need = "arith.cmpf"({p}r, {p}t) <{{fastmath = #arith.fastmath<none>, predicate = 2 : i64}}> : (f32, f32) -> i1',
        f'{p}needs = "tt.splat"({p}need) : (i1) -> {row_t.replace("f32", "i1")}',
        f'{p}m = "arith.select"({p}needs, {m_new}, {m_old}) : ({row_t.replace("f32", "i1")}, {row_t}, {row_t}) -> {row_t}',
    ]
    uses = re.compile(re.escape(m_new) + r"(?![\w.])")
    edited = body[:at + 1] + [indent + line for line in need]
    for k in range(at + 1, len(body)):
        line = body[k]
        if k == acc_line:
            name, rest = line.strip().split(" = ", 1)
            inner = indent + "  "
            edited += [f"{indent}{name} = \"scf.if\"({p}need) ({{",
                       f"{inner}{p}x = {rest}",
                       f'{inner}"scf.yield"({p}x) : ({acc_t}) -> ()',
                       f"{indent}}}, {{",
                       f'{inner}"scf.yield"({acc}) : ({acc_t}) -> ()',
                       f"{indent}}}) : (i1) -> {acc_t}"]
            continue
        edited.append(uses.sub(f"{p}m", line))
    return edited


EDITS = {"ws": warp_specialized, "lazy": lazy_rescale}
