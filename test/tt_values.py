"""The TTIR interpreter's value model (tt_interp.py): element types as NumPy dtypes, bf16 rounding,
addresses, and the tables of comparisons, element-wise ops and casts."""

import math
import re

import numpy as np


class OutOfBoundsError(IndexError):
    """An unmasked tt.load/tt.store lane addressed memory outside every argument array."""


_ADDR_BITS = 40
_ADDR_HALF = np.int64(1 << (_ADDR_BITS - 1))

_DTYPES = {
    "f64": np.float64, "f32": np.float32, "f16": np.float16, "bf16": np.float32,
    "i1": np.bool_, "i8": np.int8, "i16": np.int16, "i32": np.int32, "i64": np.int64,
    "index": np.int64,
}
_UNSIGNED = {np.dtype(np.bool_): np.bool_, np.dtype(np.int8): np.uint8, np.dtype(np.int16): np.uint16,
             np.dtype(np.int32): np.uint32, np.dtype(np.int64): np.uint64}


class _Type:
    """Shape and element type of an MLIR type, parsed from its text (tt types are opaque to MLIR)."""

    _cache = {}

    def __init__(self, text):
        m = re.fullmatch(r"tensor<((?:\d+x)*)(.+)>", text)
        self.shape = tuple(int(d) for d in m.group(1).split("x") if d) if m else ()
        self.elem = m.group(2) if m else text
        p = re.fullmatch(r"!tt\.ptr<([^,>]+)(?:,\s*\d+)?>", self.elem)
        self.pointee = p.group(1) if p else None
        desc = re.fullmatch(r"!tt\.tensordesc<(tensor<.+>)>", text)
        # A tensor descriptor's value is a _Descriptor; its type keeps the tile's type.
        self.block = _Type(desc.group(1)) if desc else None
        if self.block is not None:
            self.dtype = np.dtype(object)
        elif self.pointee is not None:
            self.dtype = np.dtype(np.int64)
        elif self.elem in _DTYPES:
            self.dtype = np.dtype(_DTYPES[self.elem])
        else:
            raise NotImplementedError(f"tt_interp: unsupported type {text}")

    @classmethod
    def of(cls, mlir_type):
        text = str(mlir_type)
        if text not in cls._cache:
            cls._cache[text] = cls(text)
        return cls._cache[text]


def _round_bf16(x):
    bits = np.asarray(x, np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return np.where(np.isnan(x), np.float32(np.nan), rounded.view(np.float32))


def _finisher(ty):
    """Cast a computed value to `ty`'s storage dtype, rounding to bf16 where `ty` is bf16."""
    dtype = ty.dtype
    if ty.elem == "bf16":
        return lambda x: np.asarray(_round_bf16(np.asarray(x, np.float32)))
    return lambda x: np.asarray(x, dtype)


def _unsigned(x):
    x = np.asarray(x)
    return x.view(_UNSIGNED[x.dtype])


def _divsi(a, b):
    q = np.floor_divide(a, b)
    return np.where((q < 0) & (q * b != a), q + 1, q)


def _ceildivsi(a, b):
    q = np.floor_divide(a, b)
    return np.where(q * b != a, q + 1, q)


_CMPI = {
    0: np.equal, 1: np.not_equal, 2: np.less, 3: np.less_equal, 4: np.greater, 5: np.greater_equal,
    6: lambda a, b: _unsigned(a) < _unsigned(b), 7: lambda a, b: _unsigned(a) <= _unsigned(b),
    8: lambda a, b: _unsigned(a) > _unsigned(b), 9: lambda a, b: _unsigned(a) >= _unsigned(b),
}


def _unordered(a, b):
    return np.isnan(a) | np.isnan(b)


# arith.cmpf predicates by their enum value: ordered ones are false and unordered ones true where
# an operand is NaN. NumPy's comparisons are already false on NaN, except != which is true.
_CMPF = {
    0: lambda a, b: np.zeros(np.broadcast(a, b).shape, bool),
    1: np.equal, 2: np.greater, 3: np.greater_equal, 4: np.less, 5: np.less_equal,
    6: lambda a, b: (a != b) & ~_unordered(a, b),
    7: lambda a, b: ~_unordered(a, b),
    8: lambda a, b: (a == b) | _unordered(a, b),
    9: lambda a, b: ~(a <= b), 10: lambda a, b: ~(a < b),
    11: lambda a, b: ~(a >= b), 12: lambda a, b: ~(a > b),
    13: np.not_equal, 14: _unordered,
    15: lambda a, b: np.ones(np.broadcast(a, b).shape, bool),
}

_erf = np.vectorize(math.erf, otypes=[np.float64])

# Ops whose result is a pure elementwise function of the operands, computed in the operands' dtype
# and cast to the result type.
_ELEMENTWISE = {
    "arith.addf": np.add, "arith.subf": np.subtract, "arith.mulf": np.multiply,
    "arith.divf": np.divide, "arith.remf": np.fmod, "arith.negf": np.negative,
    "arith.maximumf": np.maximum, "arith.minimumf": np.minimum,
    "arith.maxnumf": np.fmax, "arith.minnumf": np.fmin,
    "arith.addi": np.add, "arith.subi": np.subtract, "arith.muli": np.multiply,
    "arith.divsi": _divsi, "arith.remsi": np.fmod, "arith.floordivsi": np.floor_divide,
    "arith.ceildivsi": _ceildivsi,
    "arith.divui": lambda a, b: _unsigned(a) // _unsigned(b),
    "arith.remui": lambda a, b: _unsigned(a) % _unsigned(b),
    "arith.maxsi": np.maximum, "arith.minsi": np.minimum,
    "arith.maxui": lambda a, b: np.maximum(_unsigned(a), _unsigned(b)),
    "arith.minui": lambda a, b: np.minimum(_unsigned(a), _unsigned(b)),
    "arith.andi": np.bitwise_and, "arith.ori": np.bitwise_or, "arith.xori": np.bitwise_xor,
    "arith.shli": np.left_shift, "arith.shrsi": np.right_shift,
    "arith.shrui": lambda a, b: _unsigned(a) >> _unsigned(b),
    "arith.select": np.where,
    "math.exp": np.exp, "math.exp2": np.exp2, "math.log": np.log, "math.log2": np.log2,
    "math.log1p": np.log1p, "math.expm1": np.expm1,
    "math.sqrt": np.sqrt, "math.rsqrt": lambda x: 1 / np.sqrt(x), "math.tanh": np.tanh,
    "math.sin": np.sin, "math.cos": np.cos, "math.absf": np.abs, "math.absi": np.abs,
    "math.floor": np.floor, "math.ceil": np.ceil, "math.trunc": np.trunc,
    "math.roundeven": np.rint,  # half to even in the current (default) rounding mode
    "math.erf": lambda x: _erf(x).astype(x.dtype),
    # float64 products of f32/f16 inputs are exact, so this rounds like a fused multiply-add.
    "math.fma": lambda a, b, c: (a.astype(np.float64) * b + c).astype(a.dtype),
    "tt.precise_sqrt": np.sqrt, "tt.precise_divf": np.divide,
}


def _bits_dtype(elem, dtype):
    return np.dtype(np.int16) if elem == "bf16" else dtype


def _bitcast(x, src, dst):
    if src.elem == "bf16":
        x = (np.asarray(x, np.float32).view(np.uint32) >> np.uint32(16)).astype(np.uint16)
    x = np.ascontiguousarray(x).view(_bits_dtype(dst.elem, dst.dtype))
    if dst.elem == "bf16":
        x = (x.view(np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)
    return x


def _signed_i1(x):
    return -x.astype(np.int8) if x.dtype == np.bool_ else x


_CASTS = {
    "arith.extf": lambda x, s, d: x.astype(d.dtype),
    "arith.truncf": lambda x, s, d: x.astype(d.dtype),
    "arith.sitofp": lambda x, s, d: _signed_i1(x).astype(d.dtype),
    "arith.uitofp": lambda x, s, d: _unsigned(x).astype(d.dtype),
    "arith.fptosi": lambda x, s, d: x.astype(d.dtype),
    "arith.fptoui": lambda x, s, d: x.astype(_UNSIGNED[d.dtype]).view(d.dtype),
    "arith.extsi": lambda x, s, d: _signed_i1(x).astype(d.dtype),
    "arith.extui": lambda x, s, d: _unsigned(x).astype(d.dtype),
    "arith.trunci": lambda x, s, d: (x & 1) != 0 if d.elem == "i1" else x.astype(d.dtype),
    "arith.index_cast": lambda x, s, d: _signed_i1(x).astype(d.dtype),
    "arith.index_castui": lambda x, s, d: _unsigned(x).astype(d.dtype),
    "arith.bitcast": _bitcast,
    "tt.bitcast": _bitcast,
}


def _fp_to_fp(x, src, dst, rounding):
    """tt.fp_to_fp between f64/f32/f16/bf16; `rounding` 1 is nearest-even, 0 toward zero."""
    y = x.astype(dst.dtype) if dst.elem != "bf16" else _round_bf16(x.astype(np.float32))
    if rounding == 0:
        if dst.elem == "bf16":
            y = (np.asarray(x, np.float32).view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
        else:
            too_far = np.abs(y.astype(np.float64)) > np.abs(x.astype(np.float64))
            y = np.where(too_far, np.nextafter(y, np.zeros_like(y)), y)
    return y
