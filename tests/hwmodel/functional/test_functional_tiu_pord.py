"""pord.depthwise / avgpooling / maxpooling / minpooling against float64 window references:
kernels, strides, dilations, pads (zero for sums, ignored for extremes), start lanes, fp16/bf16; the
integer depthwise (int8 in, int32 sums) against exact int64 sums."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from functional_helpers import CHIP, LANES, as_f64, f32_bits, flat, local, random_values, window_ref
from tpuflow.isa.base import Prec
from tpuflow.isa.tiu import PordTiu
from tpuflow.hwmodel.functional import ExecutionError, Machine

EPS = {Prec.FP32: 2.0 ** -23, Prec.FP16: 2.0 ** -10, Prec.BF16: 2.0 ** -7}

cases = st.fixed_dictionaries({
    "op": st.sampled_from(["depthwise", "avgpooling", "maxpooling", "minpooling"]),
    "n": st.integers(1, 2), "c": st.integers(1, 70), "h": st.integers(1, 8), "w": st.integers(1, 8),
    "kh": st.integers(1, 3), "kw": st.integers(1, 3), "sy": st.integers(1, 3), "sx": st.integers(1, 2),
    "dy": st.integers(1, 2), "dx": st.integers(1, 2), "pads": st.tuples(*[st.integers(0, 1)] * 4),
    "lanes": st.tuples(*[st.integers(0, LANES - 1)] * 2), "prec": st.sampled_from([Prec.FP32, Prec.FP16, Prec.BF16]),
    "relu": st.booleans(), "bias": st.booleans(),
})


def _out(size, lo, hi, k, d, s):
    return (size + lo + hi - d * (k - 1) - 1) // s + 1


def _reference(c, xf, wf, bf, oh, ow):
    up, dn, lf, rt = c["pads"]
    args = ((c["kh"], c["kw"]), (c["sy"], c["sx"]), (c["dy"], c["dx"]), (up, lf), (oh, ow))
    if c["op"] == "maxpooling":
        return window_ref(xf, *args, np.max, -np.inf), 0
    if c["op"] == "minpooling":
        return window_ref(xf, *args, np.min, np.inf), 0
    if c["op"] == "avgpooling":
        total = window_ref(xf, *args, np.sum, 0.0)
        return total * np.float32(0.3), window_ref(np.abs(xf), *args, np.sum, 0.0)
    ref = np.zeros((c["n"], c["c"], oh, ow))
    mag = np.zeros_like(ref)
    for k in range(c["kh"] * c["kw"]):   # depthwise: one tap at a time, weights per channel
        kernel = np.zeros((c["kh"] * c["kw"],))
        kernel[k] = 1
        picked = window_ref(xf, *args, lambda v, axis: np.tensordot(kernel, v, axes=(0, axis)), 0.0)
        ref += picked * wf[:, k].reshape(1, -1, 1, 1)
        mag += np.abs(picked * wf[:, k].reshape(1, -1, 1, 1))
    return ref + bf, mag


@settings(max_examples=60, deadline=None)
@given(cases)
def test_pord_matches_window_reference(c):
    up, dn, lf, rt = c["pads"]
    oh, ow = _out(c["h"], up, dn, c["kh"], c["dy"], c["sy"]), _out(c["w"], lf, rt, c["kw"], c["dx"], c["sx"])
    assume(oh >= 1 and ow >= 1)
    m = Machine(CHIP, 64)
    rng = np.random.default_rng(9)
    prec = c["prec"]
    x = local(flat(c["lanes"][0], 0), (c["n"], c["c"], c["h"], c["w"]), prec)
    wt = local(flat(c["lanes"][1], 0x10000), (1, c["c"], 1, c["kh"] * c["kw"]), prec, "compact")
    bt = local(flat(c["lanes"][1], 0x18000), (1, c["c"], 1, 1), Prec.FP32, "compact")
    r = local(flat(c["lanes"][1], 0x20000), (c["n"], c["c"], oh, ow), prec)
    xs, ws, bs = (random_values(rng, t.shape, t.prec) for t in (x, wt, bt))
    for t, v in ((x, xs), (wt, ws), (bt, bs)):
        m.write_local(t, v)
    extra = {}
    if c["op"] == "depthwise":
        extra = dict(opd1_addr=wt.addr, opt_opd1_const=0, opt_opd1_prec=prec)
        extra.update(dict(opd2_addr=bt.addr, opt_opd2_const=0) if c["bias"] else {})
    elif c["op"] == "avgpooling":
        extra = dict(opd1_addr=f32_bits(0.3))
    m.execute(PordTiu(op=c["op"], res0_addr=r.addr, res0_n=c["n"], res0_c=c["c"], res0_h=oh, res0_w=ow,
                      opd0_addr=x.addr, opd0_h=c["h"], opd0_w=c["w"], opd1_h=c["kh"], opd1_w=c["kw"],
                      opt_res0_prec=prec, opt_opd0_prec=prec, opd0_up_pad=up, opd0_dn_pad=dn, opd0_lf_pad=lf,
                      opd0_rt_pad=rt, res_op_y_str=c["sy"], res_op_x_str=c["sx"], opd1_y_ins0=c["dy"] - 1,
                      opd1_x_ins0=c["dx"] - 1, opt_relu=int(c["relu"]), **extra))
    bias = as_f64(bs, Prec.FP32).reshape(1, -1, 1, 1) if c["op"] == "depthwise" and c["bias"] else 0
    ref, mag = _reference(c, as_f64(xs, prec), as_f64(ws, prec).reshape(c["c"], -1), bias, oh, ow)
    ref = np.maximum(ref, 0) if c["relu"] else ref
    got = as_f64(m.read_local(r), prec)
    finite = np.isfinite(ref)
    assert (got[~finite] == ref[~finite]).all()   # a window of padding only
    bound = EPS[prec] * np.abs(ref[finite]) + 1e-6 * (np.asarray(mag + 1) * np.ones_like(ref))[finite]
    assert (np.abs(got[finite] - ref[finite]) <= bound).all()


def test_maxpool_ignores_padding_even_for_negative_inputs():
    m = Machine(CHIP, 64)
    x = local(flat(0, 0), (1, 1, 2, 2), Prec.FP32)
    r = local(flat(0, 4096), (1, 1, 2, 2), Prec.FP32)
    m.write_local(x, -np.arange(1, 5, dtype=np.float32).reshape(1, 1, 2, 2))
    m.execute(PordTiu(op="maxpooling", res0_addr=r.addr, res0_n=1, res0_c=1, res0_h=2, res0_w=2, opd0_addr=x.addr,
                      opd0_h=2, opd0_w=2, opd1_h=2, opd1_w=2, opd0_up_pad=1, opd0_lf_pad=1))
    assert m.read_local(r).reshape(-1).tolist() == [-1, -1, -1, -1]


def test_avgpool_needs_a_constant_scale():
    ins = PordTiu(op="avgpooling", res0_addr=4096, res0_n=1, res0_c=1, res0_h=1, res0_w=1, opd0_addr=0, opd0_h=1,
                  opd0_w=1, opd1_h=1, opd1_w=1, opt_opd1_const=0)
    with pytest.raises(ExecutionError, match="constant"):
        Machine(CHIP, 64).execute(ins, 3)


@pytest.mark.parametrize("prec, scale_bits, scale", [
    (Prec.FP16, 0xABCD2A66, float(np.float16(1 / 20))),        # fp16 in the low 16 bits (high bits ignored)
    (Prec.BF16, 0x3D4D0000, float(np.frombuffer(np.uint32(0x3D4D0000).tobytes(), np.float32)[0])),  # fp32 bits
    (Prec.FP32, f32_bits(1 / 20), float(np.float32(1 / 20)))])
def test_avgpooling_reads_its_scale_in_opd1s_precision(prec, scale_bits, scale):
    """sPorD reads the scale in opd0's precision (tpu-mlir 1.30.2 sPorD_converter): an fp16 scale is the
    field's low 16 bits; bf16 and fp32 scales are fp32 bits."""
    m = Machine(CHIP, 64)
    x = local(flat(3, 0), (1, 2, 2, 2), prec)
    values = np.arange(8, dtype=np.float32).reshape(x.shape) + 1
    m.write_local(x, values)
    r = local(flat(3, 0x1000), (1, 2, 1, 1), Prec.FP32)
    m.execute(PordTiu(op="avgpooling", res0_addr=r.addr, res0_n=1, res0_c=2, res0_h=1, res0_w=1, opd0_addr=x.addr,
                      opd0_h=2, opd0_w=2, opd1_h=2, opd1_w=2, opd1_addr=scale_bits, opt_opd1_const=1,
                      opt_opd0_prec=prec, opt_opd1_prec=prec, opt_res0_prec=Prec.FP32))
    got = m.read_local(r).reshape(-1)
    assert got.tolist() == [np.float32(10 * np.float32(scale)), np.float32(26 * np.float32(scale))]


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 2), c=st.integers(1, 70), h=st.integers(1, 8), w=st.integers(1, 8), k=st.integers(1, 3),
       s=st.integers(1, 2), d=st.integers(1, 2), pads=st.tuples(*[st.integers(0, 1)] * 4), relu=st.booleans(),
       lanes=st.tuples(*[st.integers(0, LANES - 1)] * 2))
def test_integer_depthwise_is_the_exact_int32_sum(n, c, h, w, k, s, d, pads, relu, lanes):
    """pord.depthwise's integer form: int8 input and weights, the int32 bias, exact int32 sums with zero
    padding (a 3x3 window of -128 x -128 products plus a bias near 2**30 stays exact)."""
    up, dn, lf, rt = pads
    oh, ow = _out(h, up, dn, k, d, s), _out(w, lf, rt, k, d, s)
    assume(oh >= 1 and ow >= 1)
    m = Machine(CHIP, 64)
    rng = np.random.default_rng(c * 7 + h)
    x = local(flat(lanes[0], 0), (n, c, h, w), Prec.INT8)
    wt = local(flat(lanes[1], 0x10000), (1, c, 1, k * k), Prec.INT8, "compact")
    bt = local(flat(lanes[1], 0x18000), (1, c, 1, 1), Prec.INT32, "compact")
    r = local(flat(lanes[1], 0x20000), (n, c, oh, ow), Prec.INT32)
    xs, ws = random_values(rng, x.shape, Prec.INT8), random_values(rng, wt.shape, Prec.INT8)
    bs = rng.integers(-(1 << 30), 1 << 30, bt.shape).astype(np.int32)
    for t, v in ((x, xs), (wt, ws), (bt, bs)):
        m.write_local(t, v)
    m.execute(PordTiu(op="depthwise", res0_addr=r.addr, res0_n=n, res0_c=c, res0_h=oh, res0_w=ow, opd0_addr=x.addr,
                      opd0_h=h, opd0_w=w, opd1_h=k, opd1_w=k, opd1_addr=wt.addr, opt_opd1_const=0, opd2_addr=bt.addr,
                      opt_opd2_const=0, opt_res0_prec=Prec.INT32, opt_opd0_prec=Prec.INT8, opt_opd1_prec=Prec.INT8,
                      opt_opd2_prec=Prec.INT32, opd0_up_pad=up, opd0_dn_pad=dn, opd0_lf_pad=lf, opd0_rt_pad=rt,
                      res_op_y_str=s, res_op_x_str=s, opd1_y_ins0=d - 1, opd1_x_ins0=d - 1, opt_relu=int(relu)))
    xp = np.zeros((n, c, h + up + dn + d * k, w + lf + rt + d * k), np.int64)
    xp[:, :, up:up + h, lf:lf + w] = xs
    ref = np.zeros((n, c, oh, ow), np.int64) + bs.astype(np.int64).reshape(1, c, 1, 1)
    for i in range(k):
        for j in range(k):
            ref += xp[:, :, i * d:i * d + (oh - 1) * s + 1:s, j * d:j * d + (ow - 1) * s + 1:s] \
                * ws.astype(np.int64).reshape(c, k * k)[:, i * k + j].reshape(1, c, 1, 1)
    ref = np.maximum(ref, 0) if relu else ref
    assert np.array_equal(m.read_local(r).astype(np.int64), ref)
