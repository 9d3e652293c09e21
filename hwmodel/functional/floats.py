"""Number formats of the functional model: fp32/fp16/bf16/int conversions with explicit rounding
modes, bf16 as uint16 bit patterns (numpy bit operations), and the 32-bit constant operands."""

from __future__ import annotations

import enum

import numpy as np

from tpuflow.isa.base import Prec


class Round(enum.IntEnum):
    """Rounding modes; the values are ArTiu cast's opd2 codes."""

    RNE = 0   # nearest, ties to even
    RNA = 1   # nearest, ties away from zero
    RTZ = 2   # toward zero
    RDN = 3   # toward -inf (floor)
    RUP = 4   # toward +inf (ceil)


FLOAT_PRECS = (Prec.FP32, Prec.FP16, Prec.BF16)
_BITS_DTYPE = {Prec.FP32: np.dtype(np.uint32), Prec.FP16: np.dtype(np.uint16), Prec.BF16: np.dtype(np.uint16)}
# 2**(emax + 1): the value an infinity stands for when deciding which neighbour is nearer
_OVERFLOW_VALUE = {Prec.FP32: 2.0 ** 128, Prec.FP16: 2.0 ** 16, Prec.BF16: 2.0 ** 128}
_INF_BITS = {Prec.FP32: 0x7F800000, Prec.FP16: 0x7C00, Prec.BF16: 0x7F80}
_INT_RANGE = {Prec.INT8: (-128, 127), Prec.INT16: (-32768, 32767), Prec.INT32: (-2 ** 31, 2 ** 31 - 1)}


# ---------------------------------------------------------------- bf16

def bf16_to_f32(bits) -> np.ndarray:
    """bf16 bit patterns (uint16) -> float32 values (exact)."""
    wide = np.asarray(bits, dtype=np.uint16).astype(np.uint32) << np.uint32(16)
    return wide.view(np.float32)


def f32_to_bf16(values) -> np.ndarray:
    """float32 -> bf16 bit patterns, round to nearest even; NaN stays a (quiet) NaN with its sign."""
    x = np.asarray(values, dtype=np.float32)
    u = x.view(np.uint32)
    rounded = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    quiet_nan = (u >> np.uint32(16)) | np.uint32(0x0040)
    return np.where(np.isnan(x), quiet_nan, rounded).astype(np.uint16)


# ---------------------------------------------------------------- float formats

def float_bits_to_f64(bits: np.ndarray, prec: Prec) -> np.ndarray:
    """Bit patterns of a float format -> float64 values (exact)."""
    if prec is Prec.BF16:
        return bf16_to_f32(bits).astype(np.float64)
    return bits.view(prec.storage_dtype).astype(np.float64)


def _nearest_even_bits(x64: np.ndarray, prec: Prec) -> np.ndarray:
    """First guess of the rounded bits (exact RNE for fp32/fp16; bf16 may round twice)."""
    if prec is Prec.BF16:
        return f32_to_bf16(x64.astype(np.float32))
    return x64.astype(prec.storage_dtype).view(_BITS_DTYPE[prec])


def _step_bits(bits: np.ndarray, up: np.ndarray, width: int) -> np.ndarray:
    """Next representable value up (where `up`) or down, on sign-magnitude float bits."""
    sign = 1 << (width - 1)
    b = bits.astype(np.int64)
    negative = (b & sign) != 0
    away_from_zero = np.where(up, ~negative, negative)
    out = np.where(away_from_zero, b + 1, b - 1)
    out = np.where(up & (b == sign), 1, out)            # -0 up -> smallest positive
    out = np.where(~up & (b == 0), sign | 1, out)       # +0 down -> smallest negative
    return out.astype(bits.dtype)


def _as_finite(values: np.ndarray, prec: Prec) -> np.ndarray:
    return np.where(np.isinf(values), np.sign(values) * _OVERFLOW_VALUE[prec], values)


def _pick_neighbour(x, cur, nb, mode: Round, nb_bits, prec: Prec) -> np.ndarray:
    """Where the neighbour `nb` (on x's side of `cur`) is the correctly rounded result. For the
    nearest modes an infinity counts as 2**(emax+1), the first value past the largest finite."""
    d_cur = np.abs(x - _as_finite(cur, prec))
    d_nb = np.abs(x - _as_finite(nb, prec))
    if mode is Round.RNE:
        return (d_nb < d_cur) | ((d_nb == d_cur) & ((nb_bits & 1) == 0))
    if mode is Round.RNA:
        return (d_nb < d_cur) | ((d_nb == d_cur) & (np.abs(nb) > np.abs(cur)))
    if mode is Round.RTZ:
        return np.abs(cur) > np.abs(x)
    if mode is Round.RDN:
        return cur > x
    return cur < x  # RUP


def round_float(values, prec: Prec, mode: Round = Round.RNE, saturate: bool = False) -> np.ndarray:
    """Round real values (any float/int array) to a float precision; returns the storage dtype
    (bf16: uint16 bits). Directed modes and ties are decided exactly in float64."""
    x = np.asarray(values)
    fast = _fast_round(x, prec, mode)
    if fast is not None and not saturate:
        return fast
    x64 = x.astype(np.float64)
    with np.errstate(over="ignore"):
        bits = _nearest_even_bits(x64, prec)
    if mode is not Round.RNE or prec is Prec.BF16:
        bits = _correct(x64, bits, prec, mode)
    if saturate:
        bits = _saturate(bits, prec)
    return bits if prec is Prec.BF16 else bits.view(prec.storage_dtype)


def _fast_round(x: np.ndarray, prec: Prec, mode: Round):
    if mode is not Round.RNE or x.dtype not in (np.float32, np.float16):
        return None
    with np.errstate(over="ignore"):
        if prec is Prec.FP32:
            return x.astype(np.float32)
        if prec is Prec.FP16:
            return x.astype(np.float16)
        return f32_to_bf16(x.astype(np.float32))


def _correct(x64: np.ndarray, bits: np.ndarray, prec: Prec, mode: Round) -> np.ndarray:
    width = 8 * _BITS_DTYPE[prec].itemsize
    cur = float_bits_to_f64(bits, prec)
    nb_bits = _step_bits(bits, x64 > cur, width)
    nb = float_bits_to_f64(nb_bits, prec)
    with np.errstate(invalid="ignore"):
        take = _pick_neighbour(x64, cur, nb, mode, nb_bits, prec)
    take &= np.isfinite(x64) & (x64 != cur)
    return np.where(take, nb_bits, bits)


def _saturate(bits: np.ndarray, prec: Prec) -> np.ndarray:
    values = float_bits_to_f64(bits, prec)
    width = 8 * _BITS_DTYPE[prec].itemsize
    max_bits = np.array(_INF_BITS[prec] - 1, dtype=bits.dtype)
    sign = np.array(1 << (width - 1), dtype=bits.dtype)
    clamped = np.where(values < 0, max_bits | sign, max_bits)
    return np.where(np.isinf(values), clamped, bits).astype(bits.dtype)


# ---------------------------------------------------------------- integers

def round_to_int(values, prec: Prec, mode: Round = Round.RNE) -> np.ndarray:
    """Float values -> integer precision, rounded by `mode`, saturated to the range (NaN -> 0)."""
    x = np.asarray(values, dtype=np.float64)
    if mode is Round.RNE:
        r = np.rint(x)
    elif mode is Round.RNA:
        r = np.sign(x) * np.floor(np.abs(x) + 0.5)
    elif mode is Round.RTZ:
        r = np.trunc(x)
    elif mode is Round.RDN:
        r = np.floor(x)
    else:
        r = np.ceil(x)
    lo, hi = _INT_RANGE[prec]
    return np.clip(np.nan_to_num(r, nan=0.0), lo, hi).astype(prec.storage_dtype)


def int_to_int(values, prec: Prec, saturate: bool) -> np.ndarray:
    """Integer values -> integer precision: two's-complement wrap, or clamp when `saturate`."""
    x = np.asarray(values, dtype=np.int64)
    if saturate:
        lo, hi = _INT_RANGE[prec]
        x = np.clip(x, lo, hi)
    return x.astype(prec.storage_dtype)


# ---------------------------------------------------------------- generic

def to_f32(raw, prec: Prec) -> np.ndarray:
    """Stored values of any precision -> float32 values (bf16 from its bits)."""
    prec = Prec(prec)
    if prec is Prec.BF16:
        return bf16_to_f32(raw)
    return np.asarray(raw).astype(np.float32, copy=False)


def encode(values, prec: Prec, mode: Round = Round.RNE, saturate: bool = False) -> np.ndarray:
    """Real or integer values -> the storage dtype of `prec`. Floats round by `mode` (`saturate`
    clamps infinities to the largest finite value); float -> int rounds by `mode` and saturates;
    int -> int wraps unless `saturate`."""
    prec = Prec(prec)
    x = np.asarray(values)
    if prec.is_float:
        return round_float(x, prec, mode, saturate)
    if x.dtype.kind == "f":
        return round_to_int(x, prec, mode)
    return int_to_int(x, prec, saturate)


def const_value(field: int, prec: Prec):
    """A 32-bit constant operand: fp32 bits for float precisions, a signed int32 otherwise."""
    bits = np.array(field & 0xFFFFFFFF, dtype=np.uint32)
    if Prec(prec).is_float:
        return bits.view(np.float32)[()]
    return np.int64(bits.view(np.int32)[()])


def narrow_const_value(field: int, prec: Prec) -> float:
    """A float constant held in its own precision (how pord.avgpooling's scale is written, PordTiu): an
    fp16 value in the field's low 16 bits; fp32 and bf16 as fp32 bits (a bf16 value's low 16 bits are 0)."""
    if Prec(prec) == Prec.FP16:
        return float(np.array(field & 0xFFFF, np.uint16).view(np.float16)[()])
    return float(const_value(field, prec))


def bits_of(raw: np.ndarray) -> np.ndarray:
    """Stored values -> their bit patterns as int64 (integers sign-extended, floats unsigned)."""
    raw = np.asarray(raw)
    if raw.dtype.kind == "f":
        raw = raw.view(np.dtype(f"uint{8 * raw.dtype.itemsize}"))
    return raw.astype(np.int64)


def from_bits(bits: np.ndarray, prec: Prec) -> np.ndarray:
    """int64 bit patterns -> stored values of `prec` (truncated to its width)."""
    prec = Prec(prec)
    unsigned = np.asarray(bits, dtype=np.int64).astype(np.dtype(f"uint{8 * prec.bytes}"))
    return unsigned.view(prec.storage_dtype)
