"""Number formats: bf16 bit helpers, rounding of real values to fp32/fp16/bf16 in every mode,
float -> int rounding and saturation, constant operands."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpuflow.isa.base import Prec
from tpuflow.hwmodel.functional.floats import (Round, bf16_to_f32, const_value, encode, f32_to_bf16, round_float,
                                               round_to_int)

# every positive finite value of a 16-bit format, then "infinity" standing for 2**(emax+1)
def _positive_table(prec: Prec) -> tuple[np.ndarray, np.ndarray]:
    inf_bits = {Prec.FP16: 0x7C00, Prec.BF16: 0x7F80}[prec]
    bits = np.arange(inf_bits + 1, dtype=np.uint16)
    values = (bf16_to_f32(bits) if prec is Prec.BF16 else bits.view(np.float16)).astype(np.float64)
    values[-1] = 2.0 ** (16 if prec is Prec.FP16 else 128)
    return bits, values


TABLES = {p: _positive_table(p) for p in (Prec.FP16, Prec.BF16)}


def reference_bits(x: np.ndarray, prec: Prec, mode: Round) -> np.ndarray:
    """Correct rounding by table search: the two neighbours of |x|, picked by the mode."""
    bits, values = TABLES[prec]
    if mode in (Round.RTZ, Round.RUP, Round.RDN):
        values = values.copy()
        values[-1] = np.inf   # only the nearest modes treat infinity as 2**(emax+1)
    a = np.abs(x)
    lo = np.clip(np.searchsorted(values, a, side="right") - 1, 0, len(values) - 1)
    hi = np.where(values[lo] == a, lo, np.minimum(lo + 1, len(values) - 1))
    d_lo, d_hi = a - values[lo], values[hi] - a
    negative = np.signbit(x)
    if mode is Round.RNE:
        up = (d_hi < d_lo) | ((d_hi == d_lo) & (bits[hi] % 2 == 0))
    elif mode is Round.RNA:
        up = d_hi <= d_lo
    elif mode is Round.RTZ:
        up = np.zeros_like(negative)
    elif mode is Round.RUP:
        up = ~negative
    else:
        up = negative.copy()
    up &= values[lo] != a
    magnitude = np.where(up, bits[hi], bits[lo]).astype(np.uint16)
    return magnitude | np.where(negative, np.uint16(0x8000), np.uint16(0))


def test_bf16_round_trips_every_pattern():
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    back = f32_to_bf16(bf16_to_f32(bits))
    nan = np.isnan(bf16_to_f32(bits))
    assert (back[~nan] == bits[~nan]).all()
    assert np.isnan(bf16_to_f32(back[nan])).all()
    assert (np.signbit(bf16_to_f32(back[nan])) == np.signbit(bf16_to_f32(bits[nan]))).all()


def test_bf16_from_f32_is_nearest_even_on_random_patterns():
    rng = np.random.default_rng(1)
    pattern = rng.integers(0, 1 << 32, size=200_000, dtype=np.uint64).astype(np.uint32)
    x = pattern.view(np.float32)
    x = x[np.isfinite(x)]
    assert (f32_to_bf16(x) == reference_bits(x.astype(np.float64), Prec.BF16, Round.RNE)).all()


def test_bf16_known_values():
    cases = [(1.0, 0x3F80), (-2.0, 0xC000), (1.00390625, 0x3F80),   # tie, even below: down
             (1.01171875, 0x3F82),                                  # tie, odd below: up
             (3.4e38, 0x7F80), (float("inf"), 0x7F80), (0.0, 0x0000), (-0.0, 0x8000)]
    for value, bits in cases:
        assert int(f32_to_bf16(np.float32(value))) == bits, value


@pytest.mark.parametrize("prec", [Prec.FP16, Prec.BF16])
@pytest.mark.parametrize("mode", list(Round))
@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(allow_nan=False, allow_infinity=False, width=64,
                          min_value=-1e39, max_value=1e39), min_size=1, max_size=40),
       st.integers(-30, 30))
def test_round_float_matches_table_reference(prec, mode, values, exponent):
    x = np.array(values, np.float64) * 2.0 ** exponent
    x = x[np.isfinite(x)]
    got = round_float(x, prec, mode)
    assert (got.view(np.uint16) == reference_bits(x, prec, mode)).all()


@pytest.mark.parametrize("mode", list(Round))
@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(-2 ** 31, 2 ** 31 - 1), min_size=1, max_size=30))
def test_round_int32_to_fp32_by_mode(mode, values):
    x = np.array(values, np.int64)
    got = round_float(x, Prec.FP32, mode).astype(np.float64)
    for v, g in zip(values, got):
        near = float(np.float32(v))
        lo = near if near <= v else float(np.nextafter(np.float32(near), np.float32(-np.inf)))
        hi = near if near >= v else float(np.nextafter(np.float32(near), np.float32(np.inf)))
        expect = {Round.RDN: lo, Round.RUP: hi, Round.RTZ: lo if v >= 0 else hi,
                  Round.RNE: near,
                  Round.RNA: (hi if abs(hi - v) <= abs(v - lo) and v >= 0 else
                              lo if abs(v - lo) <= abs(hi - v) and v < 0 else near)}[mode]
        assert g == expect, (v, mode)


def test_fp16_fast_path_equals_exact_path():
    rng = np.random.default_rng(2)
    x = (rng.standard_normal(10_000) * 1e3).astype(np.float32)
    assert (round_float(x, Prec.FP16).view(np.uint16) == reference_bits(x.astype(np.float64), Prec.FP16,
                                                                        Round.RNE)).all()


def test_saturate_clamps_overflow_to_largest_finite():
    got = round_float(np.array([1e6, -1e6, 5.0], np.float32), Prec.FP16, saturate=True)
    assert got.tolist() == [65504.0, -65504.0, 5.0]
    bf = round_float(np.array([np.inf], np.float32), Prec.BF16, saturate=True)
    assert int(bf[0]) == 0x7F7F


@pytest.mark.parametrize("mode,expect", [
    (Round.RNE, [2, -2, 2, 3, -3, 0]), (Round.RNA, [3, -3, 2, 3, -3, 0]),
    (Round.RTZ, [2, -2, 1, 2, -3, 0]), (Round.RDN, [2, -3, 1, 2, -4, 0]),
    (Round.RUP, [3, -2, 2, 3, -3, 0])])
def test_round_to_int_modes(mode, expect):
    x = np.array([2.5, -2.5, 1.5, 2.7, -3.2, 0.0], np.float32)
    assert round_to_int(x, Prec.INT32, mode).tolist() == expect


def test_round_to_int_saturates_and_maps_nan_to_zero():
    x = np.array([300.0, -300.0, np.nan, 1e12, -np.inf], np.float32)
    assert round_to_int(x, Prec.INT8).tolist() == [127, -128, 0, 127, -128]
    assert round_to_int(x, Prec.INT32).tolist()[3] == 2 ** 31 - 1


@settings(max_examples=100, deadline=None)
@given(st.floats(-1e6, 1e6), st.sampled_from(list(Round)))
def test_round_to_int_matches_python(value, mode):
    x = float(np.float32(value))
    expect = {Round.RNE: round(x), Round.RTZ: math.trunc(x), Round.RDN: math.floor(x), Round.RUP: math.ceil(x),
              Round.RNA: int(math.copysign(math.floor(abs(x) + 0.5), x))}[mode]
    assert int(round_to_int(np.array([x], np.float32), Prec.INT32, mode)[0]) == expect


def test_int_encode_wraps_or_saturates():
    x = np.array([200, -129, 5], np.int64)
    assert encode(x, Prec.INT8).tolist() == [-56, 127, 5]
    assert encode(x, Prec.INT8, saturate=True).tolist() == [127, -128, 5]


def test_constant_operands():
    assert const_value(0x3FC00000, Prec.FP16) == np.float32(1.5)
    assert const_value(0xFFFFFFFF, Prec.INT32) == -1
    assert const_value(7, Prec.INT8) == 7
