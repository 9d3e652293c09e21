"""TILE engine: Nz/Zn/ACC layout formulas against brute-force fractal enumeration; TPUSH,
TMATMUL / TGEMV with .BIAS and .ACC, ACCCVT NORM / NZ2ND / NZ2DN / .canon with dtype
conversion, and the errors of tiles read after release or an ACC read twice."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from functional_helpers import CHIP, as_f64, random_values
from tpuflow.isa.base import Prec
from tpuflow.isa.tile import AccCvt, TMatmul, TPush, size_code, tile_ref
from tpuflow.hwmodel.functional import ExecutionError, Machine
from tpuflow.hwmodel.functional.floats import encode
from tpuflow.hwmodel.functional.layouts import nz_offsets, round_up, zn_offsets
from tpuflow.hwmodel.functional.tile import DT_PREC

FM, FN, KB = CHIP.tile.fractal_m, CHIP.tile.fractal_n, CHIP.tile.k_fractal_bytes
SLOT = CHIP.tile.slot_bytes
Q = {"T": 0, "U": 1, "M": 2, "N": 3}


def brute_nz(rows_pad: int, cols_pad: int, fr: int, fc: int) -> np.ndarray:
    """Nz by enumeration: fractals (fr x fc) in column-major order, elements row-major inside."""
    off = np.full((rows_pad, cols_pad), -1)
    counter = itertools.count()
    for bj in range(cols_pad // fc):
        for bi in range(rows_pad // fr):
            for i in range(fr):
                for j in range(fc):
                    off[bi * fr + i, bj * fc + j] = next(counter)
    return off


def brute_zn(rows_pad: int, cols_pad: int, fr: int, fc: int) -> np.ndarray:
    """Zn by enumeration: fractals (fr x fc) in row-major order, elements column-major inside."""
    off = np.full((rows_pad, cols_pad), -1)
    counter = itertools.count()
    for bi in range(rows_pad // fr):
        for bj in range(cols_pad // fc):
            for j in range(fc):
                for i in range(fr):
                    off[bi * fr + i, bj * fc + j] = next(counter)
    return off


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 50), st.integers(1, 50), st.sampled_from([1, 2, 4]))
def test_layout_formulas_match_fractal_enumeration(rows, cols, elem_bytes):
    c0 = KB // elem_bytes
    rp, cp = round_up(rows, FM), round_up(cols, c0)
    assert (nz_offsets(rows, cols, rp, c0) == brute_nz(rp, cp, FM, c0)[:rows, :cols]).all()
    rp, cp = round_up(rows, c0), round_up(cols, FN)
    assert (zn_offsets(rows, cols, cp, c0) == brute_zn(rp, cp, c0, FN)[:rows, :cols]).all()
    rp, cp = round_up(rows, FM), round_up(cols, FN)          # the ACC: 16 x 16 fp32 fractals, Nz
    assert (nz_offsets(rows, cols, rp, FN) == brute_nz(rp, cp, FM, FN)[:rows, :cols]).all()


def _put(m: Machine, queue: str, matrix: np.ndarray, layout: str, prec: Prec) -> None:
    """Write `matrix` into the next slot of a queue (GDMA's job in a program), then TPUSH it."""
    rows, cols = matrix.shape
    c0 = KB // prec.bytes
    if layout == "nz":
        rp, cp = round_up(rows, FM), round_up(cols, c0)
        off = brute_nz(rp, cp, FM, c0)[:rows, :cols]
    elif layout == "zn":
        rp, cp = round_up(rows, c0), round_up(cols, FN)
        off = brute_zn(rp, cp, c0, FN)[:rows, :cols]
    else:
        rp, cp, off = 1, cols, np.arange(cols)[None, :]
    image = np.zeros(rp * cp, prec.storage_dtype)
    image[off] = matrix
    slot = m.tile.queues.pushes[Q[queue]] % CHIP.tile.queue_slots
    addr = CHIP.tile_slot_address(Q[queue], slot)
    lane, offset = divmod(addr, CHIP.lmem_bytes_per_lane)
    m.lmem.data[lane, offset:offset + image.nbytes] = image.view(np.uint8)
    m.execute(TPush(dst_queue=Q[queue], dst_size=size_code(image.nbytes), dt="FP32"))


def _slot_image(m: Machine, queue: str, distance: int = 1, nbytes: int = SLOT) -> np.ndarray:
    index = (m.tile.queues.pushes[Q[queue]] - distance) % CHIP.tile.queue_slots
    lane, offset = divmod(CHIP.tile_slot_address(Q[queue], index), CHIP.lmem_bytes_per_lane)
    return m.lmem.data[lane, offset:offset + nbytes]


def _acc_code(rows: int, n: int) -> int:
    return size_code(round_up(rows, FM) * round_up(n, FN) * 4)


def _drain(m: Machine, rows: int, cols: int, dst_dt: str = "FP32", queue: str = "M") -> np.ndarray:
    m.execute(AccCvt(layout="NZ2ND", row=rows, col=cols, dst_queue=Q[queue], dst_size=size_code(rows * cols * 4),
                     dst_dt=dst_dt))
    prec = DT_PREC[dst_dt]
    return _slot_image(m, queue, nbytes=rows * cols * prec.bytes).view(prec.storage_dtype).reshape(rows, cols)


tile_cases = st.fixed_dictionaries({"m": st.integers(1, 40), "n": st.integers(1, 40), "k": st.integers(1, 40),
                                    "dt": st.sampled_from(["FP32", "FP16", "BF16"])})


@settings(max_examples=40, deadline=None)
@given(tile_cases, st.sampled_from(["TMATMUL", "TGEMV"]))
def test_tmatmul_and_tgemv_with_bias_and_accumulation(c, kind):
    m = Machine(CHIP, 64)
    rng = np.random.default_rng(30)
    prec = DT_PREC[c["dt"]]
    rows = 1 if kind == "TGEMV" else c["m"]
    a1, b1, a2, b2 = (random_values(rng, s, prec) for s in [(c["m"], c["k"]), (c["k"], c["n"])] * 2)
    bias = random_values(rng, (1, c["n"]), Prec.FP32)
    for queue, mat, lay in (("T", a1, "nz"), ("U", b1, "zn"), ("T", a2, "nz"), ("U", b2, "zn"), ("N", bias, "row")):
        _put(m, queue, mat, lay, prec if lay != "row" else Prec.FP32)
    common = dict(dt=c["dt"], m=c["m"], n=c["n"], k=c["k"], acc_size=_acc_code(rows, c["n"]))
    m.execute(TMatmul(fn=f"{kind}.BIAS", src0=tile_ref("T", 2), src1=tile_ref("U", 2), bias_src=tile_ref("N", 1),
                      **common))
    m.execute(TMatmul(fn=f"{kind}.ACC", src0=tile_ref("T", 1), src1=tile_ref("U", 1), **common))
    f = lambda v: as_f64(v, prec)  # noqa: E731
    ref = f(a1)[:rows] @ f(b1) + bias + f(a2)[:rows] @ f(b2)
    got = _drain(m, rows, c["n"]).astype(np.float64)
    mag = np.abs(f(a1)[:rows]) @ np.abs(f(b1)) + np.abs(f(a2)[:rows]) @ np.abs(f(b2)) + np.abs(bias)
    assert (np.abs(got - ref) <= 1e-6 * mag + 1e-30).all()


@pytest.mark.parametrize("fn", ["TMATMUL", "TMATMUL.BIAS", "TMATMUL.ACC", "TGEMV", "TGEMV.BIAS", "TGEMV.ACC"])
def test_each_matmul_function(fn):
    m = Machine(CHIP, 64)
    rng = np.random.default_rng(33)
    a, b = rng.standard_normal((18, 10)).astype(np.float32), rng.standard_normal((10, 20)).astype(np.float32)
    bias = rng.standard_normal((1, 20)).astype(np.float32)
    rows = 1 if fn.startswith("TGEMV") else 18
    prior = rng.standard_normal((rows, 20)).astype(np.float32)
    m.tile.acc = prior.copy()
    _put(m, "T", a, "nz", Prec.FP32)
    _put(m, "U", b, "zn", Prec.FP32)
    _put(m, "N", bias, "row", Prec.FP32)
    extra = dict(bias_src=tile_ref("N", 1)) if fn.endswith(".BIAS") else {}
    m.execute(TMatmul(fn=fn, dt="FP32", m=18, n=20, k=10, src0=tile_ref("T", 1), src1=tile_ref("U", 1),
                      acc_size=_acc_code(rows, 20), **extra))
    expect = a[:rows].astype(np.float64) @ b
    expect += bias if fn.endswith(".BIAS") else prior if fn.endswith(".ACC") else 0
    assert m.tile.acc.shape == (rows, 20)
    np.testing.assert_allclose(m.tile.acc, expect, rtol=1e-5, atol=1e-5)


def test_tmatmul_plain_integer_wraps_at_32_bits():
    m = Machine(CHIP, 64)
    a = np.full((16, 32), 127, np.int8)
    b = np.full((32, 16), 127, np.int8)
    _put(m, "T", a, "nz", Prec.INT8)
    _put(m, "U", b, "zn", Prec.INT8)
    m.execute(TMatmul(fn="TMATMUL", dt="S8", m=16, n=16, k=32, src0=tile_ref("T", 1), src1=tile_ref("U", 1),
                      acc_size=_acc_code(16, 16)))
    assert (m.tile.acc == 32 * 127 * 127).all()
    m.execute(AccCvt(layout="NZ2ND", row=16, col=16, dst_queue=0, dst_size=size_code(256), src_dt="S32",
                     dst_dt="S8", saturate=1))
    assert (_slot_image(m, "T", nbytes=256).view(np.int8) == 127).all()


@pytest.mark.parametrize("layout", ["NZ2ND", "NZ2DN", "NORM", "canon"])
@pytest.mark.parametrize("dst_dt", ["FP32", "FP16", "BF16"])
def test_acccvt_layouts_and_conversion(layout, dst_dt):
    m = Machine(CHIP, 64)
    rows, cols = 20, 13
    values = (np.random.default_rng(31).standard_normal((rows, cols)) * 3).astype(np.float32)
    m.tile.acc = values
    prec = DT_PREC[dst_dt]
    canon = layout == "canon"
    m.execute(AccCvt(layout="NORM" if canon else layout, row=rows, col=cols, dst_queue=1, dst_size=size_code(SLOT),
                     dst_dt=dst_dt, canon=int(canon)))
    image = _slot_image(m, "U").view(prec.storage_dtype)
    if layout == "NZ2ND":
        off = np.arange(rows * cols).reshape(rows, cols)
    elif layout == "NZ2DN":
        off = np.arange(rows * cols).reshape(cols, rows).T
    else:
        c0 = KB // prec.bytes if canon else FN
        full = brute_nz(round_up(rows, FM), round_up(cols, c0), FM, c0)
        off = full[:rows, :cols]
        assert (np.delete(image[:full.size], off.reshape(-1)) == 0).all()   # padding written as zeros
    assert (image[off] == encode(values, prec)).all()
    assert m.tile.acc is None


def test_acccvt_canon_result_is_an_a_operand_again():
    m = Machine(CHIP, 64)
    rng = np.random.default_rng(32)
    a, b = rng.standard_normal((20, 24)).astype(np.float32), rng.standard_normal((24, 9)).astype(np.float32)
    m.tile.acc = a
    m.execute(AccCvt(layout="NORM", row=20, col=24, dst_queue=0, dst_size=size_code(SLOT), dst_dt="FP16", canon=1))
    _put(m, "U", b.astype(np.float16), "zn", Prec.FP16)
    m.execute(TMatmul(fn="TMATMUL", dt="FP16", m=20, n=9, k=24, src0=tile_ref("T", 1), src1=tile_ref("U", 1),
                      acc_size=_acc_code(20, 9)))
    ref = a.astype(np.float16).astype(np.float64) @ b.astype(np.float16).astype(np.float64)
    assert np.allclose(m.tile.acc, ref, rtol=1e-5, atol=1e-5)


def test_acccvt_round_modes_and_saturation():
    m = Machine(CHIP, 64)
    m.tile.acc = np.array([[1.0 + 2.0 ** -11, 1e6]], np.float32)
    m.execute(AccCvt(layout="NZ2ND", row=1, col=2, dst_queue=2, dst_size=1, dst_dt="FP16", round_mode="RUP",
                     saturate=1))
    assert _slot_image(m, "M", nbytes=4).view(np.float16).tolist() == [1.0 + 2.0 ** -10, 65504.0]


def test_released_tile_and_released_acc_are_errors():
    m = Machine(CHIP, 64)
    eye = np.eye(16, dtype=np.float32)
    _put(m, "T", eye[:, :8], "nz", Prec.FP32)
    _put(m, "U", eye[:8], "zn", Prec.FP32)
    mm = dict(fn="TMATMUL", dt="FP32", m=16, n=16, k=8, acc_size=_acc_code(16, 16))
    m.execute(TMatmul(src0=tile_ref("T", 1), src1=tile_ref("U", 1), reuse1=1, **mm), 3)
    with pytest.raises(ExecutionError, match="T4 TMATMUL: T#1 was released"):
        m.execute(TMatmul(src0=tile_ref("T", 1), src1=tile_ref("U", 1), **mm), 4)
    _drain(m, 16, 16)
    with pytest.raises(ExecutionError, match="ACCCVT.*holds nothing"):
        _drain(m, 16, 16)
    with pytest.raises(ExecutionError, match="TMATMUL.ACC accumulates into an ACC that holds nothing"):
        _put(m, "T", eye[:, :8], "nz", Prec.FP32)
        m.execute(TMatmul(src0=tile_ref("T", 1), src1=tile_ref("U", 1), **{**mm, "fn": "TMATMUL.ACC"}))


def test_acc_size_and_slot_capacity_are_checked():
    m = Machine(CHIP, 64)
    _put(m, "T", np.ones((16, 8), np.float32), "nz", Prec.FP32)
    _put(m, "U", np.ones((8, 64), np.float32), "zn", Prec.FP32)
    with pytest.raises(ExecutionError, match="ACC needs 4096 B"):
        m.execute(TMatmul(fn="TMATMUL", dt="FP32", m=16, n=64, k=8, src0=0, src1=16, acc_size=size_code(1024)))
    m.tile.acc = np.ones((64, 64), np.float32)
    with pytest.raises(ExecutionError, match="needs 16384 B"):
        m.execute(AccCvt(layout="NZ2ND", row=64, col=64, dst_queue=0, dst_size=size_code(SLOT)))
