"""quant.rq1 / rq0 / dq0 on the functional model, bit for bit against references written from the rule in
RqDqTiu's docstring with plain Python integers and fractions (no numpy arithmetic): ties of every rounding
mode, saturation at both ends of int8 / uint8 / int16, extreme multipliers, shift 0, right and left
shifts, per-channel parameters over more channels than lanes, and a hypothesis property over random int32
inputs and parameters."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from functional_helpers import CHIP, LANES, flat, local
from tpuflow.hwmodel.functional import ExecutionError, Machine
from tpuflow.isa.base import Prec
from tpuflow.isa.tiu import (RQ_ROUND_MODES, RqDqTiu, dq0_channel_words, dq0_scalars, rq0_channel_words, rq0_scalars,
                             rq1_channel_words, rq1_scalars)

MODES = RQ_ROUND_MODES
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1


# ------------------------------------------------------------------ the reference (plain Python)

def ref_round(q: Fraction, mode: int) -> int:
    """A rational rounded to an integer by the named rule."""
    low = math.floor(q)
    frac = q - low
    if frac == 0:
        return low
    half = Fraction(1, 2)
    if mode == MODES["down"]:
        return low
    if mode == MODES["up"]:
        return low + 1
    if mode == MODES["towards_zero"]:
        return low + 1 if q < 0 else low
    if frac != half:
        return low + 1 if frac > half else low
    return {MODES["half_to_even"]: low + (low % 2), MODES["half_away_from_zero"]: low + 1 if q > 0 else low,
            MODES["half_up"]: low + 1, MODES["half_down"]: low}[mode]


def ref_rq1(x: int, multiplier: int, rshift: int, zp: int, mode: int, lo: int, hi: int) -> int:
    """saturate(zp + round((x * multiplier) / 2**rshift)); a negative rshift multiplies by 2**-rshift."""
    value = Fraction(x * multiplier) / Fraction(2) ** rshift
    return min(hi, max(lo, zp + ref_round(value, mode)))


def int_range(prec: Prec, signed: bool) -> tuple[int, int]:
    bits = 8 * prec.bytes
    return (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)


# ------------------------------------------------------------------ running one RQ / DQ

def run_rq(op: str, x: np.ndarray, params: dict | np.ndarray, *, in_prec=Prec.INT32, in_signed=True,
           out_prec=Prec.INT8, out_signed=True, mode=0, lane=0) -> np.ndarray:
    """Execute one quant.<op> over x (N, C, H, W) and return res0 as Python ints (or floats for dq0).
    `params`: the scalar fields, or (C, 2) per-channel words placed on x's start lane."""
    m = Machine(CHIP, 64)
    shape = x.shape
    src = local(flat(lane, 0x1000), shape, in_prec)
    dst = local(flat(lane, 0x20000), shape, out_prec)
    m.write_local(src, np.asarray(x).astype(np.int64).astype(
        np.dtype(f"{'int' if in_signed else 'uint'}{8 * in_prec.bytes}")).view(in_prec.storage_dtype))
    fields = {}
    if isinstance(params, dict):
        fields = params
    else:
        table = local(flat(lane, 0x30000), (1, shape[1], 1, 2), Prec.INT32, "compact")
        m.write_local(table, np.asarray(params, np.int32).reshape(table.shape))
        fields = {"opt_opd1_const": 0, "opd1_addr": table.addr}
    m.execute(RqDqTiu(op=op, res0_addr=dst.addr, res0_n=shape[0], res0_c=shape[1], res0_h=shape[2],
                      res0_w=shape[3], opd0_addr=src.addr, opt_opd0_prec=int(in_prec), opt_res0_prec=int(out_prec),
                      opt_opd0_sign=int(in_signed), opt_opd2_sign=int(out_signed), opd2_n_str=mode, **fields))
    got = m.read_local(dst)
    if out_prec.is_float:
        return got.astype(np.float64)
    return got.view(np.dtype(f"{'int' if out_signed else 'uint'}{8 * out_prec.bytes}")).astype(np.int64)


def as_nchw(values) -> np.ndarray:
    return np.asarray(values, np.int64).reshape(1, 1, 1, -1)


# ------------------------------------------------------------------ edge cases

@pytest.mark.parametrize("mode_name", sorted(MODES))
def test_ties_and_near_ties_in_every_mode(mode_name):
    """x * m / 2**3 at +-k.5 (ties), +-k.375 and +-k.625 for small k, multiplier 1, rshift 3."""
    mode = MODES[mode_name]
    xs = [s * (8 * k + e) for k in range(3) for e in (3, 4, 5) for s in (1, -1)]
    got = run_rq("rq1", as_nchw(xs), rq1_scalars(1, 3, 0), mode=mode)
    assert got.ravel().tolist() == [ref_rq1(x, 1, 3, 0, mode, -128, 127) for x in xs]


def test_half_to_even_and_half_away_from_zero_by_hand():
    xs = [4, -4, 12, -12, 20, -20]     # 0.5, -0.5, 1.5, -1.5, 2.5, -2.5 after rshift 3
    assert run_rq("rq1", as_nchw(xs), rq1_scalars(1, 3, 0), mode=0).ravel().tolist() == [0, 0, 2, -2, 2, -2]
    assert run_rq("rq1", as_nchw(xs), rq1_scalars(1, 3, 0), mode=1).ravel().tolist() == [1, -1, 2, -2, 3, -3]
    assert run_rq("rq1", as_nchw(xs), rq1_scalars(1, 3, 0), mode=5).ravel().tolist() == [1, 0, 2, -1, 3, -2]
    assert run_rq("rq1", as_nchw(xs), rq1_scalars(1, 3, 0), mode=6).ravel().tolist() == [0, -1, 1, -2, 2, -3]


@pytest.mark.parametrize("prec, signed", [(Prec.INT8, True), (Prec.INT8, False), (Prec.INT16, True),
                                          (Prec.INT16, False)])
def test_saturation_at_both_ends(prec, signed):
    lo, hi = int_range(prec, signed)
    xs = [INT32_MIN, -100000, lo - 1, lo, lo + 1, -1, 0, 1, hi - 1, hi, hi + 1, 100000, INT32_MAX]
    got = run_rq("rq1", as_nchw(xs), rq1_scalars(1, 0, 0), out_prec=prec, out_signed=signed)
    assert got.ravel().tolist() == [min(hi, max(lo, x)) for x in xs]
    # the zero point is added before saturating
    got = run_rq("rq1", as_nchw([hi - 3, lo + 3]), rq1_scalars(1, 0, 5), out_prec=prec, out_signed=signed)
    assert got.ravel().tolist() == [hi, lo + 8 if lo + 8 <= hi else hi]


def test_large_multipliers_use_the_exact_64_bit_product():
    xs = [INT32_MAX, INT32_MIN, 123456789, -987654321, 1, -1]
    for multiplier in (INT32_MAX, INT32_MIN, 1518500250, -1073741824):
        got = run_rq("rq1", as_nchw(xs), rq1_scalars(multiplier, 40, 3), out_prec=Prec.INT32, mode=0)
        assert got.ravel().tolist() == [ref_rq1(x, multiplier, 40, 3, 0, INT32_MIN, INT32_MAX) for x in xs]
    # (-2**31) * (-2**31) = 2**62: the largest product, exactly half of 2**63
    got = run_rq("rq1", as_nchw([INT32_MIN]), rq1_scalars(INT32_MIN, 63, 0), out_prec=Prec.INT32, mode=1)
    assert got.ravel().tolist() == [1]


def test_shift_zero_right_and_left_shifts():
    xs = [-300, -7, -1, 0, 1, 7, 300]
    assert run_rq("rq1", as_nchw(xs), rq1_scalars(3, 0, 0), out_prec=Prec.INT16).ravel().tolist() == \
        [3 * x for x in xs]
    # negative rshift = left shift (stored shift +2)
    assert run_rq("rq1", as_nchw(xs), rq1_scalars(3, -2, 1), out_prec=Prec.INT16).ravel().tolist() == \
        [12 * x + 1 for x in xs]
    # a left shift far past int64 saturates by sign, zero stays zero
    got = run_rq("rq1", as_nchw([-1, 0, 1]), rq1_scalars(INT32_MAX, -127, 0), out_prec=Prec.INT32)
    assert got.ravel().tolist() == [INT32_MIN, 0, INT32_MAX]
    # rshift 128 (stored -128): |x * m| < 2**63 is below half of 2**128
    got = run_rq("rq1", as_nchw([-5, 5]), rq1_scalars(INT32_MAX, 128, 0), out_prec=Prec.INT8, mode=MODES["down"])
    assert got.ravel().tolist() == [-1, 0]


def test_rq1_constant_shift_and_zero_point_packing_is_what_the_model_reads():
    """A wrong packing (zp in bits 16-31 as in the per-channel word) would read zp 0 here."""
    fields = rq1_scalars(1, 0, 100)
    assert (fields["opd2_addr"] >> 8) == 100
    assert run_rq("rq1", as_nchw([1]), fields).ravel().tolist() == [101]


def test_per_channel_parameters_over_more_channels_than_lanes():
    """70 channels from lane 5: channels 59.. wrap to a second channel group on lanes 0..; each channel
    has its own multiplier, rshift and zero point (word 2 = s | zp << 16)."""
    rng = np.random.default_rng(3)
    c = 70
    x = rng.integers(-(1 << 20), 1 << 20, size=(2, c, 2, 3))
    mults = rng.integers(1 << 29, 1 << 31, size=c)
    rshifts = rng.integers(20, 40, size=c)
    zps = rng.integers(-20, 20, size=c)
    got = run_rq("rq1", x, rq1_channel_words(mults, rshifts, zps), mode=MODES["half_away_from_zero"], lane=5)
    want = np.array([[[[ref_rq1(int(x[n, ch, h, w]), int(mults[ch]), int(rshifts[ch]), int(zps[ch]), 1, -128, 127)
                        for w in range(3)] for h in range(2)] for ch in range(c)] for n in range(2)])
    assert (got == want).all()


def test_per_channel_parameters_must_start_on_the_result_lane():
    m = Machine(CHIP, 64)
    instr = RqDqTiu(op="rq1", res0_addr=flat(0, 0), res0_n=1, res0_c=4, res0_h=1, res0_w=1, opd0_addr=flat(0, 0x1000),
                    opt_opd1_const=0, opd1_addr=flat(1, 0x2000))
    with pytest.raises(ExecutionError, match="lane 1, res0 on lane 0"):
        m.execute(instr)


def test_uint8_and_int8_inputs_are_read_with_their_sign():
    xs = [0, 1, 127, 128, 200, 255]
    got = run_rq("rq1", as_nchw(xs), rq1_scalars(1, 0, -128), in_prec=Prec.INT8, in_signed=False)
    assert got.ravel().tolist() == [x - 128 for x in xs]          # uint8 -> int8 with the zero point moved
    got = run_rq("rq1", as_nchw([-128, -1, 5]), rq1_scalars(1, 0, 128), in_prec=Prec.INT8, out_signed=False)
    assert got.ravel().tolist() == [0, 127, 133]


@st.composite
def rq1_cases(draw):
    c = draw(st.integers(1, 3))
    x = draw(st.lists(st.integers(INT32_MIN, INT32_MAX), min_size=c * 4, max_size=c * 4))
    params = [(draw(st.integers(INT32_MIN, INT32_MAX)), draw(st.integers(-127, 128)),
               draw(st.integers(-(1 << 15), (1 << 15) - 1))) for _ in range(c)]
    out = draw(st.sampled_from([(Prec.INT8, True), (Prec.INT8, False), (Prec.INT16, True), (Prec.INT32, True)]))
    return c, x, params, out, draw(st.sampled_from(sorted(MODES.values()))), draw(st.booleans())


@settings(max_examples=150, deadline=None)
@given(rq1_cases())
def test_rq1_equals_the_reference_for_random_int32_inputs_and_parameters(case):
    c, xs, params, (prec, signed), mode, per_channel = case
    x = np.array(xs, np.int64).reshape(1, c, 1, 4)
    if per_channel:
        table = rq1_channel_words(*zip(*params))
    else:
        params = [params[0]] * c
        table = rq1_scalars(*params[0])
    got = run_rq("rq1", x, table, out_prec=prec, out_signed=signed, mode=mode)
    lo, hi = int_range(prec, signed)
    want = [[ref_rq1(int(v), params[ch][0], params[ch][1], params[ch][2], mode, lo, hi) for v in x[0, ch, 0]]
            for ch in range(c)]
    assert got.reshape(c, 4).tolist() == want


# ------------------------------------------------------------------ rq0 and dq0

def _f32(v) -> Fraction:
    return Fraction(float(np.float32(v)))


def _f32_round(q: Fraction) -> Fraction:
    return Fraction(float(np.float32(float(q)))) if abs(q) < 2 ** 100 else q   # q is exact in float64 here


def test_rq0_rounds_the_fp32_value_by_the_mode_and_saturates():
    xs = [-1000, -3, -1, 0, 1, 3, 5, 1000, 16777217]
    scale, offset = 0.5, 0.0
    for mode in MODES.values():
        got = run_rq("rq0", as_nchw(xs), rq0_scalars(scale, offset), mode=mode)
        want = [min(127, max(-128, ref_round(_f32_round(_f32(float(np.float32(x))) * _f32(scale)) + _f32(offset), mode)))
                for x in xs]
        assert got.ravel().tolist() == want, mode
    got = run_rq("rq0", as_nchw([7, -7]), rq0_channel_words([0.25], [-0.5]), mode=0)
    assert got.ravel().tolist() == [ref_round(Fraction(7, 4) - Fraction(1, 2), 0), ref_round(Fraction(-7, 4) - Fraction(1, 2), 0)]


@pytest.mark.parametrize("out_prec", [Prec.FP32, Prec.FP16])
def test_dq0_is_x_minus_zero_point_times_scale(out_prec):
    xs = [0, 1, 127, 128, 255]
    scale = 0.0123
    got = run_rq("dq0", as_nchw(xs), dq0_scalars(128, scale), in_prec=Prec.INT8, in_signed=False, out_prec=out_prec)
    want = [float(np.float32(np.float32(x - 128) * np.float32(scale)).astype(out_prec.storage_dtype)) for x in xs]
    assert got.ravel().tolist() == want
    per = run_rq("dq0", np.array([[[[-3]], [[4]]]]), dq0_channel_words([-1, 2], [0.5, 0.25]), in_prec=Prec.INT8,
                 out_prec=Prec.FP32)
    assert per.ravel().tolist() == [-1.0, 0.5]


def test_wrong_precisions_name_the_instruction():
    m = Machine(CHIP, 64)
    for op, fields in (("rq1", dict(opt_res0_prec=int(Prec.FP16))), ("dq0", dict(opt_res0_prec=int(Prec.INT8))),
                       ("rq1", dict(opt_opd0_prec=int(Prec.FP32)))):
        instr = RqDqTiu(op=op, res0_addr=0, res0_n=1, res0_c=1, res0_h=1, res0_w=1, opd0_addr=0x1000, **fields)
        with pytest.raises(ExecutionError, match=f"quant.{op}"):
            m.execute(instr, 3)
    assert LANES == 64


@settings(max_examples=200, deadline=None)
@given(st.floats(2.0 ** -90, 2.0 ** 90), st.booleans())
def test_rq1_multiplier_shift_is_the_nearest_31_bit_fixed_point_scale(scale, negative):
    from tpuflow.isa.tiu import rq1_multiplier_shift
    scale = -scale if negative else scale
    multiplier, rshift = rq1_multiplier_shift(scale)
    assert (1 << 30) <= abs(multiplier) < (1 << 31) and (multiplier < 0) == negative
    exact = Fraction(scale) * 2 ** rshift
    assert abs(exact - multiplier) <= Fraction(1, 2)          # nearest multiplier at this shift
    assert rq1_multiplier_shift(0.0) == (0, 0)


def test_rq0_of_float_input_nan_and_infinities():
    from tpuflow.isa.tiu import RQ0_NAN_RESULT
    m = Machine(CHIP, 64)
    src, dst = local(flat(0, 0x1000), (1, 1, 1, 4), Prec.FP32), local(flat(0, 0x2000), (1, 1, 1, 4), Prec.INT8)
    m.write_local(src, np.array([np.nan, np.inf, -np.inf, 2.5], np.float32).reshape(src.shape))
    m.execute(RqDqTiu(op="rq0", res0_addr=dst.addr, res0_n=1, res0_c=1, res0_h=1, res0_w=4, opd0_addr=src.addr,
                      opt_opd0_prec=int(Prec.FP32), **rq0_scalars(1.0, 0.0), opd2_n_str=MODES["half_to_even"]))
    assert m.read_local(dst).ravel().tolist() == [RQ0_NAN_RESULT, 127, -128, 2]
