"""Exact integer arithmetic of the int8 forms: signed / unsigned operand values, RightShiftRound with the
seven rounding modes of RQ / DQ, saturation to a result range, two's-complement int32 wrap.

The rule (tpu-mlir lib/Support/MathUtils.cpp RightShiftRound, the reference of tpuflow.isa.tiu.RqDqTiu):
v / 2**r rounded by mode, for an int64 v and r >= 1, decided on floor(v / 2**r) and how the
remainder rem = v - floor * 2**r compares with half = 2**(r - 1):

  half_to_even (0)         floor + 1 if rem > half, or rem == half and floor is odd
  half_away_from_zero (1)  floor + 1 if rem > half, or rem == half and v >= 0
  towards_zero (2)         floor + 1 if v < 0 and rem != 0
  down (3)                 floor
  up (4)                   floor + 1 if rem != 0
  half_up (5)              floor + 1 if rem >= half
  half_down (6)            floor + 1 if rem > half

Exact for |v| <= 2**62 (every int32 x int32 product) and any r >= 1; r <= 0 shifts left exactly (a
shift past int64 is replaced by a value that saturates the same way).
"""

from __future__ import annotations

import numpy as np

from tpuflow.isa.base import Prec

from tpuflow.hwmodel.functional.errors import ExecutionError

ROUND_MODES = range(7)              # tpuflow.isa.tiu.RQ_ROUND_MODES values
_WIDE = np.int64(1) << np.int64(62)   # |v| bound of the int64 path; a left shift past it saturates anyway


def values_of(stored: np.ndarray, signed: bool) -> np.ndarray:
    """Stored integers (storage dtype) as int64, read as unsigned when not `signed`."""
    stored = np.asarray(stored)
    if signed:
        return stored.astype(np.int64)
    return stored.view(np.dtype(f"uint{8 * stored.dtype.itemsize}")).astype(np.int64)


def value_range(prec: Prec, signed: bool) -> tuple[int, int]:
    """(lo, hi) of an integer precision, signed or unsigned."""
    bits = 8 * Prec(prec).bytes
    return (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)


def saturate(values: np.ndarray, prec: Prec, signed: bool) -> np.ndarray:
    """int64 values clamped to the precision's range, as its storage dtype (unsigned: the same bits)."""
    lo, hi = value_range(prec, signed)
    clamped = np.clip(values, lo, hi)
    return clamped.astype(np.dtype(f"uint{8 * Prec(prec).bytes}") if not signed else Prec(prec).storage_dtype) \
        .view(Prec(prec).storage_dtype)


def wrap_int32(values: np.ndarray) -> np.ndarray:
    """int64 values reduced to int32 two's complement (INT32_ACCUMULATION_WRAPS)."""
    return np.asarray(values, dtype=np.int64).astype(np.uint32).view(np.int32)


def _apply_mode(floor, cmp, exact, negative, mode: int):
    """floor + the rounding increment; cmp: -1 / 0 / +1 as rem is below / at / above half."""
    if mode == 0:
        up = (cmp > 0) | ((cmp == 0) & (floor % 2 != 0))
    elif mode == 1:
        up = (cmp > 0) | ((cmp == 0) & ~negative)
    elif mode == 2:
        up = negative & ~exact
    elif mode == 3:
        up = np.zeros_like(exact)
    elif mode == 4:
        up = ~exact
    elif mode == 5:
        up = cmp >= 0
    elif mode == 6:
        up = cmp > 0
    else:
        raise ExecutionError(f"rounding mode {mode} is not one of 0-6")
    return floor + up.astype(np.int64)


def right_shift_round(v, rshift, mode: int) -> np.ndarray:
    """RightShiftRound(v, rshift, mode) elementwise (v int64 with |v| <= 2**62, rshift any int)."""
    v, rshift = np.broadcast_arrays(np.asarray(v, np.int64), np.asarray(rshift, np.int64))
    out = _left_shift(v, np.maximum(-rshift, 0))
    right = rshift > 0
    if right.any():
        r = np.clip(rshift, 1, 63)
        floor = v >> r
        rem = v - (floor << r)        # in [0, 2**r) (r = 63: floor is 0 or -1, the sum fits int64)
        half = np.int64(1) << (r - 1)
        cmp = np.sign(rem - half)
        beyond = rshift > 63          # |v| < half: v >= 0 sits below half, v < 0 above it
        cmp = np.where(beyond, np.where(v < 0, 1, -1), cmp)
        rounded = _apply_mode(floor, cmp, rem == 0, v < 0, mode)
        out = np.where(right, rounded, out)
    return out


def _left_shift(v: np.ndarray, lshift: np.ndarray) -> np.ndarray:
    """v * 2**lshift, or +-2**62 where that leaves int64 (those values saturate every result range)."""
    s = np.minimum(lshift, 62)
    fits = (np.abs(v) <= (_WIDE >> s)) & (lshift <= 62)
    return np.where(fits, v << s, np.sign(v) * _WIDE)


def round_real(x, mode: int) -> np.ndarray:
    """Real values (float) rounded to integers by `mode` (the same table, rem measured in units);
    returns float64 integers (NaN stays NaN)."""
    x = np.asarray(x, dtype=np.float64)
    floor = np.floor(x)
    frac = x - floor                  # exact: x has at most 53 significant bits
    cmp = np.sign(frac - 0.5)
    return _apply_mode(floor, cmp, frac == 0, x < 0, mode).astype(np.float64)
