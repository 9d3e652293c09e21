"""AR (every op, casts with every rounding mode, int wrap, bitwise, shifts), LIN, CMP, SFU, CW/BC
and SYS against numpy: operands in aligned/compact/free layouts with stride-0 broadcasts and
start lanes != 0 (inputs read back element by element from the hardware.md formula)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from functional_helpers import CHIP, LANE_BYTES, LANES, brute_read, f32_bits, flat, local, random_values
from tpuflow.isa.base import LocalTensor, Prec, StrideMode
from tpuflow.isa.tiu import ArTiu, CmpTiu, CwBcTiu, LinTiu, SfuTiu, SysTiu
from tpuflow.hwmodel.functional import Machine
from tpuflow.hwmodel.functional.floats import encode, to_f32

REGION = 0x4000
OFFSETS = {"opd0": 0x0000, "opd1": 0x8000, "opd2": 0x10000, "opd3": 0x18000, "res0": 0x20000}


def _fill(m: Machine, rng, prefix: str, prec: Prec) -> None:
    """Random values of `prec` over a region of every lane, so any strides read valid data."""
    values = random_values(rng, (LANES, REGION // prec.bytes), prec, scale=4.0)
    off = OFFSETS[prefix]
    m.lmem.data[:, off:off + REGION] = np.ascontiguousarray(values).view(np.uint8).reshape(LANES, -1)


layouts = st.one_of(st.sampled_from([StrideMode.ALIGNED, StrideMode.COMPACT]),
                    st.tuples(st.integers(0, 400), st.integers(0, 300), st.integers(0, 40), st.integers(0, 4)))
shapes = st.tuples(st.integers(1, 2), st.integers(1, 70), st.integers(1, 4), st.integers(1, 8))


def _fields(prefix: str, layout, lane: int) -> dict:
    out = {f"{prefix}_addr": flat(lane, OFFSETS[prefix])}
    if isinstance(layout, tuple):
        out[f"short_{prefix}_str"] = StrideMode.FREE
        out.update({f"{prefix}_{d}_str": s for d, s in zip("nchw", layout)})
    else:
        out[f"short_{prefix}_str"] = int(layout)
    return out


def _operand(ins, prefix: str, shape) -> LocalTensor:
    return ins.local(prefix, shape, CHIP)


def _expect_stored(m: Machine, ins, result) -> None:
    res = _operand(ins, "res0", ins.res0_shape)
    expect = encode(np.broadcast_to(result, res.shape), res.prec)
    got = m.read_local(res)
    assert (got.view(np.uint8) == expect.view(np.uint8)).all()


FLOAT_OPS = {"mul": np.multiply, "add": np.add, "sub": np.subtract, "max": np.maximum, "min": np.minimum,
             "div": np.divide}
FLOATS = [Prec.FP32, Prec.FP16, Prec.BF16]


@settings(max_examples=80, deadline=None)
@given(st.sampled_from(sorted(FLOAT_OPS)), shapes, st.tuples(*[st.sampled_from(FLOATS)] * 3),
       st.tuples(*[st.integers(0, LANES - 1)] * 3), layouts, layouts, st.sampled_from([StrideMode.ALIGNED,
                                                                                        StrideMode.COMPACT]),
       st.booleans())
def test_ar_float_ops(op, shape, precs, lanes, lay0, lay1, lay_res, const1):
    m = Machine(CHIP, 64)
    rng = np.random.default_rng(10)
    p_res, p0, p1 = precs
    _fill(m, rng, "opd0", p0)
    _fill(m, rng, "opd1", p1)
    fields = {**_fields("opd0", lay0, lanes[0]), **_fields("opd1", lay1, lanes[1]), **_fields("res0", lay_res, lanes[2])}
    if const1:
        fields.update(opd1_addr=f32_bits(-1.5), opt_opd1_const=1)
    ins = ArTiu(op=op, res0_n=shape[0], res0_c=shape[1], res0_h=shape[2], res0_w=shape[3], opt_res0_prec=p_res,
                opt_opd0_prec=p0, opt_opd1_prec=p1, **fields)
    m.execute(ins, 1)
    a = to_f32(brute_read(m.lmem.data, _operand(ins, "opd0", shape)), p0)
    b = np.float32(-1.5) if const1 else to_f32(brute_read(m.lmem.data, _operand(ins, "opd1", shape)), p1)
    with np.errstate(divide="ignore", invalid="ignore"):
        _expect_stored(m, ins, FLOAT_OPS[op](a, b).astype(np.float32))


def _ar(m: Machine, op: str, a: np.ndarray, b, p_in: Prec, p_res: Prec, **extra) -> np.ndarray:
    """Run arith.op on (1, 1, 1, len) operands at lane 3; b may be a tensor or an int constant field."""
    a = np.asarray(a).astype(p_in.storage_dtype)
    x = local(flat(3, OFFSETS["opd0"]), (1, 1, 1, a.size), p_in)
    m.write_local(x, a.reshape(x.shape))
    fields = dict(opd0_addr=x.addr, opt_opd0_prec=p_in, opt_opd1_prec=p_in)
    if isinstance(b, np.ndarray):
        y = local(flat(3, OFFSETS["opd1"]), x.shape, p_in)
        m.write_local(y, b.astype(p_in.storage_dtype).reshape(x.shape))
        fields["opd1_addr"] = y.addr
    elif b is not None:
        fields.update(opd1_addr=b & 0xFFFFFFFF, opt_opd1_const=1)
    fields.update(extra)
    r = local(flat(3, OFFSETS["res0"]), x.shape, p_res)
    m.execute(ArTiu(op=op, res0_addr=r.addr, res0_n=1, res0_c=1, res0_h=1, res0_w=a.size, opt_res0_prec=p_res,
                    **fields))
    return m.read_local(r).reshape(-1)


def test_ar_integer_arithmetic_wraps_and_divides_toward_zero():
    m = Machine(CHIP, 64)
    a = np.array([2 ** 31 - 1, -7, 7, -2 ** 31, 100, 5])
    b = np.array([1, 2, -2, -1, 0, 3])
    assert _ar(m, "add", a, b, Prec.INT32, Prec.INT32).tolist() == [-2 ** 31, -5, 5, 2 ** 31 - 1, 100, 8]
    assert _ar(m, "div", a, b, Prec.INT32, Prec.INT32).tolist() == [2 ** 31 - 1, -3, -3, -2 ** 31, 0, 1]
    assert _ar(m, "mul", np.array([100, -100]), np.array([3, 3]), Prec.INT8, Prec.INT8).tolist() == [44, -44]
    assert _ar(m, "sub", np.array([5]), np.array([9]), Prec.INT16, Prec.INT16).tolist() == [-4]
    assert _ar(m, "max", np.array([-3, 4]), -1, Prec.INT32, Prec.INT32).tolist() == [-1, 4]
    assert _ar(m, "abs", np.array([-128, -3, 5]), None, Prec.INT8, Prec.INT8).tolist() == [-128, 3, 5]


def test_ar_bitwise_on_stored_bits():
    m = Machine(CHIP, 64)
    a = np.array([0x0F0F0F0F, -1, 0x12345678], np.int32)
    b = np.array([0x00FF00FF, 0x7FFFFFFF, 0], np.int32)
    assert _ar(m, "and", a, b, Prec.INT32, Prec.INT32).tolist() == [0x000F000F, 0x7FFFFFFF, 0]
    assert _ar(m, "or", a, b, Prec.INT32, Prec.INT32).tolist() == [0x0FFF0FFF, -1, 0x12345678]
    assert _ar(m, "xor", a, b, Prec.INT32, Prec.INT32).tolist() == [0x0FF00FF0, -2 ** 31, 0x12345678]
    assert _ar(m, "not", a, None, Prec.INT32, Prec.INT32).tolist() == [~0x0F0F0F0F, 0, ~0x12345678]
    negated = _ar(m, "xor", np.array([1.5, -2.0], np.float32), f32_bits(-0.0), Prec.FP32, Prec.FP32)
    assert negated.tolist() == [-1.5, 2.0]   # flipping the sign bit of fp32 values
    absolute = _ar(m, "and", np.array([-3.25], np.float32), 0x7FFFFFFF, Prec.FP32, Prec.FP32)
    assert absolute.tolist() == [3.25]


def test_ar_shifts():
    m = Machine(CHIP, 64)
    a = np.array([-16, -16, 1, 0x40000000, -1, 5], np.int32)
    s = np.array([2, -2, 31, 2, -40, 40], np.int32)
    assert _ar(m, "logic_shift", a, s, Prec.INT32, Prec.INT32).tolist() == [-64, 0x3FFFFFFC, -2 ** 31, 0, 0, 0]
    assert _ar(m, "arith_shift", a, s, Prec.INT32, Prec.INT32).tolist() == [-64, -4, -2 ** 31, 0, -1, 0]
    assert _ar(m, "logic_shift", np.array([-128], np.int8), -1, Prec.INT8, Prec.INT8).tolist() == [64]
    assert _ar(m, "arith_shift", np.array([-128], np.int8), -1, Prec.INT8, Prec.INT8).tolist() == [-64]


@pytest.mark.parametrize("mode,expect", [(0, [2, -2, 4, 127, -128, 0]), (1, [3, -3, 4, 127, -128, 0]),
                                         (2, [2, -2, 3, 127, -128, 0]), (3, [2, -3, 3, 127, -128, 0]),
                                         (4, [3, -2, 4, 127, -128, 0])])
def test_ar_cast_float_to_int_by_mode(mode, expect):
    x = np.array([2.5, -2.5, 3.6, 1000.0, -1e9, np.nan], np.float32)
    assert _ar(Machine(CHIP, 64), "cast", x, None, Prec.FP32, Prec.INT8, opd2_addr=mode).tolist() == expect


def test_ar_cast_between_floats_and_ints():
    m = Machine(CHIP, 64)
    x = np.array([1.0 + 2.0 ** -11, -(1.0 + 2.0 ** -11), 70000.0], np.float32)
    assert _ar(m, "cast", x, None, Prec.FP32, Prec.FP16).tolist() == [1.0, -1.0, np.inf]         # RNE: tie to even
    assert _ar(m, "cast", x, None, Prec.FP32, Prec.FP16, opd2_addr=4).tolist()[:2] == [1.0 + 2 ** -10, -1.0]
    assert _ar(m, "cast", np.array([16777217, -3], np.int32), None, Prec.INT32, Prec.FP32).tolist() == [16777216, -3]
    assert _ar(m, "cast", np.array([300, -300, 7], np.int32), None, Prec.INT32, Prec.INT8).tolist() == [127, -128, 7]
    assert _ar(m, "cast", np.array([1.5, -2.25], np.float16), None, Prec.FP16, Prec.FP32).tolist() == [1.5, -2.25]
    bf = _ar(m, "cast", np.array([1.0 + 2.0 ** -8, 3.0], np.float32), None, Prec.FP32, Prec.BF16)
    assert bf.tolist() == [0x3F80, 0x4040]


def test_ar_copy_is_bit_exact_and_converts_across_precisions():
    m = Machine(CHIP, 64)
    nan_payload = np.array([0x7FC01234, 0xFF800001], np.uint32).view(np.float32)
    assert (_ar(m, "copy", nan_payload, None, Prec.FP32, Prec.FP32).view(np.uint32) ==
            nan_payload.view(np.uint32)).all()
    assert _ar(m, "copy", np.array([0.1], np.float32), None, Prec.FP32, Prec.FP16).tolist() == [np.float16(0.1)]


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["mac", "square_sum", "square_diff"]), shapes, st.tuples(*[st.integers(0, LANES - 1)] * 4),
       layouts, layouts, layouts, st.sampled_from(FLOATS))
def test_lin(op, shape, lanes, lay0, lay1, lay2, prec):
    m = Machine(CHIP, 64)
    rng = np.random.default_rng(11)
    for prefix in ("opd0", "opd1", "opd2"):
        _fill(m, rng, prefix, prec)
    fields = {**_fields("opd0", lay0, lanes[0]), **_fields("opd1", lay1, lanes[1]), **_fields("opd2", lay2, lanes[2]),
              **_fields("res0", StrideMode.ALIGNED, lanes[3])}
    ins = LinTiu(op=op, res0_n=shape[0], res0_c=shape[1], res0_h=shape[2], res0_w=shape[3], opt_res0_prec=prec,
                 opt_opd0_prec=prec, opt_opd1_prec=prec, opt_opd2_prec=prec, **fields)
    m.execute(ins, 1)
    a, b, c = (to_f32(brute_read(m.lmem.data, _operand(ins, p, shape)), prec) for p in ("opd0", "opd1", "opd2"))
    expect = {"mac": a * b + c, "square_sum": (a + b) * (a + b), "square_diff": (a - b) * (a - b)}[op]
    _expect_stored(m, ins, expect)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["sel_gt", "sel_eq", "sel_lt"]), shapes, st.tuples(*[st.integers(0, LANES - 1)] * 5),
       layouts, layouts, st.sampled_from([StrideMode.ALIGNED, StrideMode.COMPACT]), st.booleans(),
       st.sampled_from(FLOATS))
def test_cmp_select(op, shape, lanes, lay0, lay1, lay2, const3, prec):
    m = Machine(CHIP, 64)
    rng = np.random.default_rng(12)
    for prefix in ("opd0", "opd1", "opd2", "opd3"):
        _fill(m, rng, prefix, prec)
    fields = {**_fields("opd0", lay0, lanes[0]), **_fields("opd1", lay1, lanes[1]), **_fields("opd2", lay2, lanes[2]),
              **_fields("res0", StrideMode.ALIGNED, lanes[4]),
              "opd3_addr": f32_bits(9.0) if const3 else flat(lanes[3], OFFSETS["opd3"]), "opt_opd3_const": int(const3)}
    ins = CmpTiu(op=op, res0_n=shape[0], res0_c=shape[1], res0_h=shape[2], res0_w=shape[3], opt_res0_prec=prec,
                 opt_opd0_prec=prec, opt_opd1_prec=prec, opt_opd2_prec=prec, **fields)
    m.execute(ins, 1)
    a, b, c = (to_f32(brute_read(m.lmem.data, _operand(ins, p, shape)), prec) for p in ("opd0", "opd1", "opd2"))
    d = np.float32(9.0) if const3 else to_f32(brute_read(m.lmem.data, ins.opd3(CHIP)), prec)
    cond = {"sel_gt": a > b, "sel_eq": a == b, "sel_lt": a < b}[op]
    _expect_stored(m, ins, np.where(cond, c, d))


def test_cmp_eq_with_equal_operands_and_integer_constants():
    m = Machine(CHIP, 64)
    x = local(flat(2, 0), (1, 1, 1, 4), Prec.INT32)
    m.write_local(x, np.array([1, 2, 3, 2], np.int32).reshape(x.shape))
    r = local(flat(2, 0x1000), x.shape, Prec.INT32)
    m.execute(CmpTiu(op="sel_eq", res0_addr=r.addr, res0_n=1, res0_c=1, res0_h=1, res0_w=4, opd0_addr=x.addr,
                     opd1_addr=2, opd2_addr=-5 & 0xFFFFFFFF, opd3_addr=7, opt_opd1_const=1, opt_opd2_const=1,
                     opt_opd3_const=1, opt_res0_prec=Prec.INT32, opt_opd0_prec=Prec.INT32, opt_opd1_prec=Prec.INT32,
                     opt_opd2_prec=Prec.INT32))
    assert m.read_local(r).reshape(-1).tolist() == [7, -5, 7, -5]


def _sfu(m, op, values, prec=Prec.FP32, lane=5, **extra):
    c = values.shape[1]
    x = local(flat(lane, 0), values.shape, prec)
    r = local(flat(lane, 0x8000), values.shape, prec)
    m.write_local(x, values)
    m.execute(SfuTiu(op=op, res0_addr=r.addr, res0_n=values.shape[0], res0_c=c, res0_h=values.shape[2],
                     res0_w=values.shape[3], opd0_addr=x.addr, opt_res0_prec=prec, opt_opd0_prec=prec, **extra))
    return r


@pytest.mark.parametrize("op", ["taylor", "taylor_4x"])
def test_sfu_taylor_uses_each_lanes_own_table(op):
    m = Machine(CHIP, 64)
    rng = np.random.default_rng(13)
    coef = rng.standard_normal((LANES, 5)).astype(np.float32)
    m.lmem.data[:, 0x10000:0x10000 + 20] = coef.view(np.uint8)
    x = rng.standard_normal((2, 70, 2, 3)).astype(np.float32)
    r = _sfu(m, op, x, opd1_addr=flat(9, 0x10000), opd1_n=5)   # the address's lane does not matter
    lane = (5 + np.arange(70)) % LANES
    expect = np.zeros_like(x)
    for k in range(4, -1, -1):
        expect = expect * x + coef[lane, k].reshape(1, -1, 1, 1)
    assert np.array_equal(m.read_local(r), expect)


def test_sfu_normalize_splits_mantissa_and_exponent():
    m = Machine(CHIP, 64)
    x = np.array([12.0, -0.375, 0.0, 1.0, 3.0e-39], np.float32).reshape(1, 1, 1, 5)
    r = _sfu(m, "normalize", x, res1_addr=flat(5, 0x9000))
    e = local(flat(5, 0x9000), x.shape, Prec.FP32)
    assert m.read_local(r).reshape(-1).tolist() == [1.5, -1.5, 0.0, 1.0, float(np.float32(3.0e-39)) * 2.0 ** 128]
    assert m.read_local(e).reshape(-1).tolist() == [3, -2, 0, 0, -128]


@pytest.mark.parametrize("prec", FLOATS)
def test_sfu_rsqrt(prec):
    m = Machine(CHIP, 64)
    x = encode(np.array([4.0, 0.25, 2.0, 0.0], np.float32).reshape(1, 4, 1, 1), prec)
    r = _sfu(m, "rsqrt", x, prec)
    with np.errstate(divide="ignore"):
        expect = encode(np.float32(1) / np.sqrt(to_f32(x, prec)), prec)
    assert (m.read_local(r) == expect).all()


@pytest.mark.parametrize("op", ["cw_ts", "wc_ts"])
def test_cwbc_transposes_channels_and_width(op):
    m = Machine(CHIP, 64)
    x = local(flat(60, 0), (2, 6, 3, 70), Prec.FP16)
    values = random_values(np.random.default_rng(14), x.shape, Prec.FP16)
    m.write_local(x, values)
    r = local(flat(1, 0x8000), (2, 70, 3, 6), Prec.FP16)
    m.execute(CwBcTiu(op=op, res0_addr=r.addr, res0_n=2, res0_c=70, res0_h=3, res0_w=6, opd0_addr=x.addr, opd0_c=6,
                      opd0_w=70, opt_res0_prec=Prec.FP16))
    assert (m.read_local(r) == values.transpose(0, 3, 2, 1)).all()


@pytest.mark.parametrize("op", ["l_bc", "s_bc"])
def test_cwbc_broadcasts_one_channel_to_many_lanes(op):
    m = Machine(CHIP, 64)
    x = local(flat(7, 0), (1, 1, 2, 5), Prec.INT8)
    values = random_values(np.random.default_rng(15), x.shape, Prec.INT8)
    m.write_local(x, values)
    r = local(flat(0, 0x1000), (1, 66, 2, 5), Prec.INT8)
    m.execute(CwBcTiu(op=op, res0_addr=r.addr, res0_n=1, res0_c=66, res0_h=2, res0_w=5, opd0_addr=x.addr, opd0_c=1,
                      opd0_w=5, opt_res0_prec=Prec.INT8))
    assert (m.read_local(r) == np.broadcast_to(values, r.shape)).all()


def test_cwbc_lane_copy_moves_to_other_lanes_and_layouts():
    m = Machine(CHIP, 64)
    x = local(flat(0, 0), (1, 10, 2, 3), Prec.FP32)
    values = random_values(np.random.default_rng(16), x.shape, Prec.FP32)
    m.write_local(x, values)
    r = local(flat(33, 0x1000), x.shape, Prec.FP32, "compact")
    m.execute(CwBcTiu(op="l_copy", res0_addr=r.addr, res0_n=1, res0_c=10, res0_h=2, res0_w=3, opd0_addr=x.addr,
                      opd0_c=10, opd0_w=3, short_res0_str=StrideMode.COMPACT))
    assert (m.read_local(r) == values).all()


def test_sys_changes_nothing():
    m = Machine(CHIP, 64)
    m.lmem.data[:] = 3
    for op in ("nop", "end", "intr_barrier", "data_barrier", "send_msg", "wait_msg"):
        m.execute(SysTiu(op=op), 1)
    assert (m.lmem.data == 3).all() and LANE_BYTES == m.lmem.data.shape[1]


def test_cmp_reads_an_fp16_constant_from_the_low_16_bits():
    """sCMP reads opd1 in opd0's precision (tpu-mlir 1.30.2 sCMP_converter): an fp16 constant is the low
    16 bits of its field; an fp32 one stays fp32 bits."""
    m = Machine(CHIP, 64)
    x = local(flat(1, 0), (1, 2, 1, 3), Prec.FP16)
    m.write_local(x, np.array([0.25, 0.5, 0.75, 1.0, 0.4, 0.6], np.float32).reshape(x.shape))
    r = local(flat(1, 0x1000), x.shape, Prec.FP32)
    for prec, bits in ((Prec.FP16, 0x12343800), (Prec.FP32, f32_bits(0.5))):   # 0x3800 = fp16 0.5
        m.execute(CmpTiu(op="sel_gt", res0_addr=r.addr, res0_n=1, res0_c=2, res0_h=1, res0_w=3, opd0_addr=x.addr,
                         opd1_addr=bits, opd2_addr=f32_bits(1.0), opd3_addr=0, opt_opd1_const=1, opt_opd2_const=1,
                         opt_opd3_const=1, opt_opd0_prec=Prec.FP16, opt_opd1_prec=prec))
        assert m.read_local(r).reshape(-1).tolist() == [0, 0, 1, 1, 0, 1]
