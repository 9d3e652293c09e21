"""The integer form of conv.normal and mm2.nn / nt / tt: int8 and uint8 operands (opt_X_sign), exact int32
accumulation with an INT32 bias, opt_res_add wrapping in two's complement, relu, conv padding with a value
(an input's zero point); against int64 references written with Python loops / numpy int64 einsum (no float
arithmetic)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from functional_helpers import CHIP, LANES, flat, local
from tpuflow.hwmodel.functional import ExecutionError, Machine
from tpuflow.isa.base import Prec
from tpuflow.isa.tiu import ConvTiu, Mm2Tiu
from tpuflow.lowering.weights import pack_conv_weights

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1


def wrap32(v: np.ndarray) -> np.ndarray:
    return ((np.asarray(v, np.int64) + (1 << 31)) % (1 << 32)) - (1 << 31)


def int8_values(rng, shape, signed: bool) -> np.ndarray:
    lo, hi = (-128, 127) if signed else (0, 255)
    return rng.integers(lo, hi, size=shape, endpoint=True)


def stored_int8(values: np.ndarray) -> np.ndarray:
    """int8 bit patterns of values in [-128, 255] (uint8 values keep their bits)."""
    return np.asarray(values, np.int64).astype(np.uint8).view(np.int8)


def conv_reference(x, w, stride, dil, pads, out_hw, fill: int = 0) -> np.ndarray:
    """int64 direct convolution, padding with `fill`."""
    n, ic, h, wd = x.shape
    oc, _, kh, kw = w.shape
    up, lf = pads
    oh, ow = out_hw
    out = np.zeros((n, oc, oh, ow), np.int64)
    for i in range(kh):
        for j in range(kw):
            for y in range(oh):
                for z in range(ow):
                    r, c = y * stride[0] + i * dil[0] - up, z * stride[1] + j * dil[1] - lf
                    inside = 0 <= r < h and 0 <= c < wd
                    taps = x[:, :, r, c] if inside else np.full(x.shape[:2], fill, np.int64)
                    out[:, :, y, z] += np.einsum("ni,oi->no", taps, w[:, :, i, j])
    return out


conv_cases = st.fixed_dictionaries({
    "n": st.integers(1, 2), "ic": st.one_of(st.integers(1, 9), st.integers(60, 70)), "oc": st.integers(1, 70),
    "block": st.sampled_from([1, 64]), "h": st.integers(1, 6), "w": st.integers(1, 6), "kh": st.integers(1, 3),
    "kw": st.integers(1, 3), "sy": st.integers(1, 2), "sx": st.integers(1, 2), "dy": st.integers(1, 2),
    "pads": st.tuples(*[st.integers(0, 2)] * 4), "lanes": st.tuples(*[st.integers(0, LANES - 1)] * 3),
    "signs": st.tuples(st.booleans(), st.booleans()), "bias": st.sampled_from(["tensor", "const", "none"]),
    "relu": st.booleans(), "res_add": st.booleans(), "pad_value": st.integers(0, 255),
})


def _out(size, lo, hi, k, d, s):
    return (size + lo + hi - d * (k - 1) - 1) // s + 1


def run_int8_conv(c, old_values=None):
    m = Machine(CHIP, 64)
    rng = np.random.default_rng(11)
    up, dn, lf, rt = c["pads"]
    oh, ow = _out(c["h"], up, dn, c["kh"], c["dy"], c["sy"]), _out(c["w"], lf, rt, c["kw"], 1, c["sx"])
    x_signed, w_signed = c["signs"]
    pad_value = c.get("pad_value", 0) - (128 if x_signed else 0)      # anywhere in the input's range
    xs = int8_values(rng, (c["n"], c["ic"], c["h"], c["w"]), x_signed)
    ws = int8_values(rng, (c["oc"], c["ic"], c["kh"], c["kw"]), w_signed)
    bs = rng.integers(-(1 << 20), 1 << 20, size=c["oc"])
    x = local(flat(c["lanes"][0], 0), xs.shape, Prec.INT8)
    packed = pack_conv_weights(stored_int8(ws), c["block"])
    w = local(flat(c["lanes"][1], 0x10000), (1, c["oc"], 1, packed.shape[1]), Prec.INT8, "compact")
    b = local(flat(c["lanes"][1], 0x20000), (1, c["oc"], 1, 1), Prec.INT32, "compact")
    r = local(flat(c["lanes"][2], 0x30000), (c["n"], c["oc"], oh, ow), Prec.INT32)
    old = rng.integers(INT32_MIN, INT32_MAX, size=r.shape) if old_values is None else old_values
    for t, v in ((x, stored_int8(xs)), (w, packed.reshape(w.shape)), (b, bs.astype(np.int32).reshape(b.shape)),
                 (r, np.asarray(old).astype(np.int32))):
        m.write_local(t, v)
    bias_fields = {"tensor": dict(opd2_addr=b.addr, opt_opd2_const=0), "const": dict(opd2_addr=-77), "none": {}}
    m.execute(ConvTiu(res0_addr=r.addr, res0_n=c["n"], res0_c=c["oc"], res0_h=oh, res0_w=ow, opd0_addr=x.addr,
                      opd0_c=c["ic"], opd0_h=c["h"], opd0_w=c["w"], opd1_addr=w.addr, opd1_h=c["kh"], opd1_w=c["kw"],
                      opt_res0_prec=Prec.INT32, opt_opd0_prec=Prec.INT8, opt_opd1_prec=Prec.INT8,
                      opt_opd2_prec=Prec.INT32, opt_opd0_sign=int(x_signed), opt_opd1_sign=int(w_signed),
                      opd0_up_pad=up, opd0_dn_pad=dn, opd0_lf_pad=lf, opd0_rt_pad=rt, res_op_y_str=c["sy"],
                      res_op_x_str=c["sx"], opd1_y_ins0=c["dy"] - 1, opt_relu=int(c["relu"]),
                      opt_res_add=int(c["res_add"]), weight_ic_block=c["block"], opd3_addr=pad_value,
                      **bias_fields[c["bias"]]), 1)
    ref = conv_reference(xs, ws, (c["sy"], c["sx"]), (c["dy"], 1), (up, lf), (oh, ow), pad_value)
    ref = ref + {"tensor": bs.reshape(1, -1, 1, 1), "const": -77, "none": 0}[c["bias"]]
    if c["res_add"]:
        ref = wrap32(ref) + np.asarray(old, np.int64)
    ref = wrap32(ref)
    if c["relu"]:
        ref = np.maximum(ref, 0)
    return m.read_local(r).astype(np.int64), ref


@settings(max_examples=40, deadline=None)
@given(conv_cases)
def test_int8_conv_equals_the_integer_convolution(case):
    up, dn, lf, rt = case["pads"]
    assume(_out(case["h"], up, dn, case["kh"], case["dy"], case["sy"]) >= 1)
    assume(_out(case["w"], lf, rt, case["kw"], 1, case["sx"]) >= 1)
    got, ref = run_int8_conv(case)
    assert (got == ref).all()


def test_partial_sums_wrap_in_int32():
    """opt_res_add onto INT32_MAX: the sum wraps to the negative end (INT32_ACCUMULATION_WRAPS)."""
    case = {"n": 1, "ic": 64, "oc": 2, "block": 64, "h": 1, "w": 1, "kh": 1, "kw": 1, "sy": 1, "sx": 1, "dy": 1,
            "pads": (0, 0, 0, 0), "lanes": (0, 0, 0), "signs": (False, False), "bias": "none", "relu": False,
            "res_add": True}
    got, ref = run_int8_conv(case, old_values=np.full((1, 2, 1, 1), INT32_MAX))
    assert (got == ref).all() and (got < 0).all()     # 64 uint8 x uint8 products pushed it past the top


mm_cases = st.fixed_dictionaries({
    "op": st.sampled_from(["nn", "nt", "tt"]), "m": st.integers(1, 70), "k": st.integers(1, 80),
    "n": st.integers(1, 40), "lanes": st.tuples(*[st.integers(0, LANES - 1)] * 3),
    "signs": st.tuples(st.booleans(), st.booleans()), "bias": st.sampled_from(["tensor", "const", "none"]),
    "res_add": st.booleans(), "relu": st.booleans(),
})


@settings(max_examples=40, deadline=None)
@given(mm_cases)
def test_int8_mm2_equals_the_integer_matmul(c):
    m = Machine(CHIP, 64)
    rng = np.random.default_rng(12)
    mm, k, n = c["m"], c["k"], c["n"]
    l_shape = (k, mm) if c["op"] == "tt" else (mm, k)
    r_shape = (k, n) if c["op"] == "nn" else (n, k)
    ls, rs = int8_values(rng, l_shape, c["signs"][0]), int8_values(rng, r_shape, c["signs"][1])
    left = local(flat(c["lanes"][0], 0), (1, l_shape[0], 1, l_shape[1]), Prec.INT8)
    right = local(flat(c["lanes"][1], 0x10000), (1, r_shape[0], 1, r_shape[1]), Prec.INT8)
    res = local(flat(c["lanes"][2], 0x20000), (1, mm, 1, n), Prec.INT32)
    old = rng.integers(INT32_MIN, INT32_MAX, size=(mm, n))
    bias_rows = rng.integers(-(1 << 30), 1 << 30, size=(LANES, n))
    for t, v in ((left, stored_int8(ls)), (right, stored_int8(rs)), (res, old.astype(np.int32))):
        m.write_local(t, v.reshape(t.shape))
    for lane in range(LANES):
        m.write_local(local(flat(lane, 0x30000), (1, 1, 1, n), Prec.INT32), bias_rows[lane].astype(np.int32).reshape(1, 1, 1, n))
    bias = {"tensor": dict(opd2_addr=flat(0, 0x30000), opt_opd2_const=0), "const": dict(opd2_addr=-5), "none": {}}
    m.execute(Mm2Tiu(op=c["op"], res0_addr=res.addr, res0_c=mm, res0_w=n, opd0_addr=left.addr, opd0_c=l_shape[0],
                     opd0_w=l_shape[1], opd1_addr=right.addr, opd1_c=r_shape[0], opd1_w=r_shape[1],
                     opt_opd0_prec=Prec.INT8, opt_opd1_prec=Prec.INT8, opt_opd2_prec=Prec.INT32,
                     opt_res0_prec=Prec.INT32, opt_opd0_sign=int(c["signs"][0]), opt_opd1_sign=int(c["signs"][1]),
                     opt_res_add=int(c["res_add"]), opt_relu=int(c["relu"]), **bias[c["bias"]]))
    lhs = ls.T if c["op"] == "tt" else ls
    rhs = rs if c["op"] == "nn" else rs.T
    ref = np.einsum("mk,kn->mn", lhs.astype(np.int64), rhs.astype(np.int64))
    ref = ref + {"tensor": bias_rows[(c["lanes"][2] + np.arange(mm)) % LANES], "const": -5, "none": 0}[c["bias"]]
    ref = wrap32(wrap32(ref) + (old if c["res_add"] else 0))
    ref = np.maximum(ref, 0) if c["relu"] else ref
    assert (m.read_local(res).reshape(mm, n).astype(np.int64) == ref).all()


def test_pad_value_outside_the_input_range_is_refused():
    conv = ConvTiu(res0_addr=0x30000, res0_n=1, res0_c=1, res0_h=1, res0_w=1, opd0_addr=0, opd0_c=1, opd0_h=1,
                   opd0_w=1, opd1_addr=0x10000, opd1_h=1, opd1_w=1, opt_opd0_prec=Prec.INT8, opt_opd1_prec=Prec.INT8,
                   opt_opd2_prec=Prec.INT32, opt_res0_prec=Prec.INT32, opd3_addr=200)        # signed int8 input
    with pytest.raises(ExecutionError, match=r"pad value 200 is outside opd0's range \[-128, 127\]"):
        Machine(CHIP, 64).execute(conv, 2)
    assert ConvTiu(**{**conv.field_values(), "opd3_addr": -128}).pad_value == -128


@pytest.mark.parametrize("res_prec, bias_prec", [(Prec.INT8, Prec.INT32), (Prec.FP32, Prec.INT32),
                                                 (Prec.INT32, Prec.FP32)])
def test_integer_cube_forms_other_than_int32_results_are_refused(res_prec, bias_prec):
    ins = Mm2Tiu(op="nn", res0_addr=0x20000, res0_c=2, res0_w=2, opd0_addr=0, opd0_c=2, opd0_w=2, opd1_addr=0x10000,
                 opd1_c=2, opd1_w=2, opt_opd0_prec=Prec.INT8, opt_opd1_prec=Prec.INT8, opt_res0_prec=res_prec,
                 opt_opd2_prec=bias_prec)
    with pytest.raises(ExecutionError, match="B4 mm2.nn.*INT32 res0.*opt_rq"):
        Machine(CHIP, 64).execute(ins, 4)
