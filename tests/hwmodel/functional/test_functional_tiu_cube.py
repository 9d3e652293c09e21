"""conv.normal and mm2.nn/nt/tt against float64 references: shapes, pads, strides, dilations,
start lanes (channels wrapping past the last lane), conv weights packed by the lowering in every
weight_ic_block layout (compact, and the 32 / 64-channel cube-aligned one sCONV means), fp16/bf16 inputs with fp32 accumulation,
bias tensor or constant, partial-sum accumulation (opt_res_add) and relu."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from functional_helpers import CHIP, LANES, as_f64, conv_ref, f32_bits, flat, local, random_values
from tpuflow.isa.base import Prec
from tpuflow.isa.tiu import ConvTiu, Mm2Tiu
from tpuflow.hwmodel.functional import ExecutionError, Machine
from tpuflow.lowering.weights import pack_conv_weights

EPS = {Prec.FP32: 2.0 ** -23, Prec.FP16: 2.0 ** -10, Prec.BF16: 2.0 ** -7}


def _close(got, ref, magnitude, prec):
    """Within the result's rounding plus fp32 accumulation error."""
    bound = EPS[prec] * np.abs(ref) + 1e-6 * magnitude + 1e-30
    assert (np.abs(got - ref) <= bound).all(), np.max(np.abs(got - ref) - bound)


conv_cases = st.fixed_dictionaries({
    "n": st.integers(1, 2), "ic": st.one_of(st.integers(1, 12), st.integers(30, 70)), "oc": st.integers(1, 70),
    "block": st.sampled_from([1, 32, 64]),
    "h": st.integers(1, 7), "w": st.integers(1, 7), "kh": st.integers(1, 3), "kw": st.integers(1, 3),
    "sy": st.integers(1, 2), "sx": st.integers(1, 3), "dy": st.integers(1, 2), "dx": st.integers(1, 2),
    "pads": st.tuples(*[st.integers(0, 2)] * 4), "lanes": st.tuples(*[st.integers(0, LANES - 1)] * 3),
    "prec": st.sampled_from([Prec.FP32, Prec.FP16, Prec.BF16]), "res_fp32": st.booleans(),
    "bias": st.sampled_from(["tensor", "const", "none"]), "relu": st.booleans(),
})


def _out(size, lo, hi, k, d, s):
    return (size + lo + hi - d * (k - 1) - 1) // s + 1


def _run_conv(c, res_add=False, start=None):
    m = Machine(CHIP, 64)
    rng = np.random.default_rng(7)
    up, dn, lf, rt = c["pads"]
    oh, ow = _out(c["h"], up, dn, c["kh"], c["dy"], c["sy"]), _out(c["w"], lf, rt, c["kw"], c["dx"], c["sx"])
    prec, res_prec = c["prec"], Prec.FP32 if c["res_fp32"] else c["prec"]
    x = local(flat(c["lanes"][0], 0), (c["n"], c["ic"], c["h"], c["w"]), prec)
    padded_ic = -(-c["ic"] // c["block"]) * c["block"]
    w = local(flat(c["lanes"][1], 0x10000), (1, c["oc"], 1, padded_ic * c["kh"] * c["kw"]), prec, "compact")
    b = local(flat(c["lanes"][1], 0x20000), (1, c["oc"], 1, 1), Prec.FP32, "compact")
    r = local(flat(c["lanes"][2], 0x30000), (c["n"], c["oc"], oh, ow), res_prec)
    xs, bs = (random_values(rng, t.shape, t.prec) for t in (x, b))
    ws = random_values(rng, (c["oc"], c["ic"], c["kh"], c["kw"]), prec)   # the lowering packs them
    for t, v in ((x, xs), (w, pack_conv_weights(ws, c["block"]).reshape(w.shape)), (b, bs)):
        m.write_local(t, v)
    old = random_values(rng, r.shape, res_prec)
    m.write_local(r, old)
    bias_fields = {"tensor": dict(opd2_addr=b.addr, opt_opd2_const=0),
                   "const": dict(opd2_addr=f32_bits(0.75)), "none": {}}[c["bias"]]
    ins = ConvTiu(res0_addr=r.addr, res0_n=c["n"], res0_c=c["oc"], res0_h=oh, res0_w=ow, opd0_addr=x.addr,
                  opd0_c=c["ic"], opd0_h=c["h"], opd0_w=c["w"], opd1_addr=w.addr, opd1_h=c["kh"], opd1_w=c["kw"],
                  opt_res0_prec=res_prec, opt_opd0_prec=prec, opt_opd1_prec=prec,
                  opd0_up_pad=up, opd0_dn_pad=dn, opd0_lf_pad=lf, opd0_rt_pad=rt, res_op_y_str=c["sy"],
                  res_op_x_str=c["sx"], opd1_y_ins0=c["dy"] - 1, opd1_x_ins0=c["dx"] - 1, opt_relu=int(c["relu"]),
                  opt_res_add=int(res_add), weight_ic_block=c["block"], **bias_fields)
    m.execute(ins, 1)
    xf, wf = as_f64(xs, prec), as_f64(ws, prec).reshape(c["oc"], c["ic"], c["kh"], c["kw"])
    ref = conv_ref(xf, wf, (c["sy"], c["sx"]), (c["dy"], c["dx"]), (up, lf), (oh, ow))
    magnitude = conv_ref(np.abs(xf), np.abs(wf), (c["sy"], c["sx"]), (c["dy"], c["dx"]), (up, lf), (oh, ow))
    ref += {"tensor": as_f64(bs, Prec.FP32).reshape(1, -1, 1, 1), "const": 0.75, "none": 0.0}[c["bias"]]
    if res_add:
        ref += as_f64(old, res_prec)
    if c["relu"]:
        ref = np.maximum(ref, 0)
    return as_f64(m.read_local(r), res_prec), ref, magnitude + 1, res_prec


@settings(max_examples=50, deadline=None)
@given(conv_cases, st.booleans())
def test_conv_matches_direct_convolution(case, res_add):
    up, dn, lf, rt = case["pads"]
    assume(_out(case["h"], up, dn, case["kh"], case["dy"], case["sy"]) >= 1)
    assume(_out(case["w"], lf, rt, case["kw"], case["dx"], case["sx"]) >= 1)
    got, ref, magnitude, prec = _run_conv(case, res_add)
    _close(got, ref, magnitude, prec)


def test_conv_fp16_rounds_the_fp32_sum_once():
    """fp16 inputs, fp16 result: exactly the fp32 sum rounded to nearest even (no fp16 partials)."""
    m = Machine(CHIP, 64)
    x = local(flat(0, 0), (1, 64, 1, 1), Prec.FP16)
    w = local(flat(0, 4096), (1, 1, 1, 64), Prec.FP16, "compact")
    r = local(flat(0, 8192), (1, 1, 1, 1), Prec.FP16)
    m.write_local(x, np.full((1, 64, 1, 1), 1.0, np.float16))
    vals = np.full(64, 2.0 ** -11, np.float16)
    vals[0] = 1.0
    m.write_local(w, vals.reshape(1, 1, 1, 64))  # 1 + 63 * 2**-11: fp16 partials would stay at 1.0
    m.execute(ConvTiu(res0_addr=r.addr, res0_n=1, res0_c=1, res0_h=1, res0_w=1, opd0_addr=x.addr, opd0_c=64,
                      opd0_h=1, opd0_w=1, opd1_addr=w.addr, opd1_h=1, opd1_w=1, opt_res0_prec=Prec.FP16,
                      opt_opd0_prec=Prec.FP16, opt_opd1_prec=Prec.FP16))
    assert m.read_local(r).item() == np.float16(1.0 + 63 * 2.0 ** -11)


mm_cases = st.fixed_dictionaries({
    "op": st.sampled_from(["nn", "nt", "tt"]), "m": st.integers(1, 70), "k": st.integers(1, 40),
    "n": st.integers(1, 40), "lanes": st.tuples(*[st.integers(0, LANES - 1)] * 4),
    "prec": st.sampled_from([Prec.FP32, Prec.FP16, Prec.BF16]), "bias": st.sampled_from(["tensor", "const", "none"]),
    "res_add": st.booleans(), "relu": st.booleans(),
})


def _mm2(c):
    m = Machine(CHIP, 64)
    rng = np.random.default_rng(8)
    mm, k, n, prec = c["m"], c["k"], c["n"], c["prec"]
    l_shape = (k, mm) if c["op"] == "tt" else (mm, k)
    r_shape = (k, n) if c["op"] == "nn" else (n, k)
    left = local(flat(c["lanes"][0], 0), (1, *l_shape[:1], 1, l_shape[1]), prec)
    right = local(flat(c["lanes"][1], 0x10000), (1, r_shape[0], 1, r_shape[1]), prec)
    res = local(flat(c["lanes"][2], 0x20000), (1, mm, 1, n), Prec.FP32)
    ls, rs, old = (random_values(rng, t.shape, t.prec) for t in (left, right, res))
    bias_rows = random_values(rng, (LANES, n), Prec.FP32)
    for t, v in ((left, ls), (right, rs), (res, old)):
        m.write_local(t, v)
    for lane in range(LANES):  # every lane holds its own bias row (the lowering broadcasts one)
        m.write_local(local(flat(lane, 0x30000), (1, 1, 1, n)), bias_rows[lane].reshape(1, 1, 1, n))
    row_bias = bias_rows[(c["lanes"][2] + np.arange(mm)) % LANES]
    bias = {"tensor": dict(opd2_addr=flat(c["lanes"][3], 0x30000), opt_opd2_const=0),
            "const": dict(opd2_addr=f32_bits(-1.25)), "none": {}}[c["bias"]]
    m.execute(Mm2Tiu(op=c["op"], res0_addr=res.addr, res0_c=mm, res0_w=n, opd0_addr=left.addr, opd0_c=l_shape[0],
                     opd0_w=l_shape[1], opd1_addr=right.addr, opd1_c=r_shape[0], opd1_w=r_shape[1],
                     opt_opd0_prec=prec, opt_opd1_prec=prec, opt_res_add=int(c["res_add"]), opt_relu=int(c["relu"]),
                     **bias))
    lf, rf = as_f64(ls, prec).reshape(l_shape), as_f64(rs, prec).reshape(r_shape)
    lf, rf = (lf.T if c["op"] == "tt" else lf), (rf if c["op"] == "nn" else rf.T)
    ref = lf @ rf + {"tensor": row_bias, "const": -1.25, "none": 0}[c["bias"]]
    ref = ref + (old.reshape(mm, n) if c["res_add"] else 0)
    ref = np.maximum(ref, 0) if c["relu"] else ref
    return m.read_local(res).reshape(mm, n), ref, np.abs(lf) @ np.abs(rf) + 2


@settings(max_examples=50, deadline=None)
@given(mm_cases)
def test_mm2_matches_matmul(case):
    got, ref, magnitude = _mm2(case)
    _close(got.astype(np.float64), ref, magnitude, Prec.FP32)


def test_mm2_rejects_inconsistent_shapes():
    ins = Mm2Tiu(op="nn", res0_addr=0x20000, res0_c=4, res0_w=4, opd0_addr=0, opd0_c=4, opd0_w=3,
                 opd1_addr=0x10000, opd1_c=5, opd1_w=4)
    with pytest.raises(ExecutionError, match="B1 mm2.nn.*needs opd0 4x3 and opd1 3x4"):
        Machine(CHIP, 64).execute(ins, 1)
