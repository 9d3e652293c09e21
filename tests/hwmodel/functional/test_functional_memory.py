"""LMEM and DDR index maps against the hardware.md formula evaluated element by element: aligned,
compact and free strides, start lanes != 0, channels wrapping past the last lane, stride-0
broadcasts, element sizes 1/2/4 and unaligned bases; out-of-range accesses are errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from functional_helpers import CHIP, LANE_BYTES, LANES, brute_read, brute_write, flat, local, random_values
from tpuflow.isa.base import LocalTensor, Prec
from tpuflow.hwmodel.functional import ExecutionError, Machine

PRECS = [Prec.INT8, Prec.FP16, Prec.BF16, Prec.FP32, Prec.INT32]


def _machine() -> Machine:
    return Machine(CHIP, 4096)


def _random_lmem(m: Machine, seed: int) -> None:
    m.lmem.data[:] = np.random.default_rng(seed).integers(0, 256, m.lmem.data.shape, dtype=np.uint8)


shapes = st.tuples(st.integers(1, 2), st.integers(1, 70), st.integers(1, 5), st.integers(1, 6))


@settings(max_examples=60, deadline=None)
@given(shapes, st.integers(0, LANES - 1), st.sampled_from(PRECS), st.sampled_from(["aligned", "compact"]),
       st.integers(0, 64))
def test_read_matches_formula_for_eu_layouts(shape, lane, prec, layout, offset_units):
    m = _machine()
    _random_lmem(m, 3)
    tensor = local(flat(lane, offset_units * 32), shape, prec, layout)
    assert (m.read_local(tensor).view(np.uint8) == brute_read(m.lmem.data, tensor).view(np.uint8)).all()


free_strides = st.tuples(st.integers(0, 300), st.integers(0, 120), st.integers(0, 12), st.integers(0, 3))


@settings(max_examples=60, deadline=None)
@given(shapes, st.integers(0, LANES - 1), st.sampled_from(PRECS), free_strides, st.integers(0, 9))
def test_read_matches_formula_for_free_strides_and_odd_bases(shape, lane, prec, strides, base):
    m = _machine()
    _random_lmem(m, 4)
    tensor = LocalTensor(flat(lane, 1000 + base), shape, strides, prec)   # base may be unaligned
    assert (m.read_local(tensor).view(np.uint8) == brute_read(m.lmem.data, tensor).view(np.uint8)).all()


@settings(max_examples=40, deadline=None)
@given(shapes, st.integers(0, LANES - 1), st.sampled_from(PRECS), st.integers(0, 3))
def test_write_matches_formula(shape, lane, prec, base):
    values = random_values(np.random.default_rng(5), shape, prec)
    tensor = local(flat(lane, 64 + base * prec.bytes), shape, prec, "compact")
    ours, ref = _machine(), _machine()
    ours.lmem.write(tensor, values)
    brute_write(ref.lmem.data, tensor, values)
    assert (ours.lmem.data == ref.lmem.data).all()


def test_channels_wrap_to_the_next_group():
    m = _machine()
    tensor = local(flat(62, 0), (1, 4, 1, 3), Prec.FP32, "compact")
    m.lmem.write(tensor, np.arange(12, dtype=np.float32).reshape(1, 4, 1, 3))
    rows = m.lmem.data.view(np.float32)
    assert rows[62, :3].tolist() == [0, 1, 2] and rows[63, :3].tolist() == [3, 4, 5]
    assert rows[0, 3:6].tolist() == [6, 7, 8] and rows[1, 3:6].tolist() == [9, 10, 11]  # group 1: + c_stride


def test_stride_zero_reads_broadcast():
    m = _machine()
    m.lmem.data.view(np.float32)[5, 10] = 7.5
    tensor = LocalTensor(flat(5, 40), (2, 1, 3, 4), (0, 0, 0, 0), Prec.FP32)
    assert (m.read_local(tensor) == 7.5).all()


def test_lane_mask_leaves_disabled_lanes_alone():
    m = _machine()
    tensor = local(flat(0, 0), (1, 8, 1, 4), Prec.FP32)
    enable = np.zeros(LANES, bool)
    enable[[1, 6]] = True
    m.lmem.write(tensor, np.ones((1, 8, 1, 4), np.float32), enable)
    touched = np.nonzero(m.lmem.data.any(axis=1))[0].tolist()
    assert touched == [1, 6]


@pytest.mark.parametrize("tensor", [
    LocalTensor(flat(0, LANE_BYTES - 8), (1, 1, 1, 3), (3, 3, 3, 1), Prec.FP32),
    LocalTensor(flat(3, 16), (1, 1, 2, 2), (0, 0, -10, 1), Prec.FP32),
    LocalTensor(LANES * LANE_BYTES, (1, 1, 1, 1), (1, 1, 1, 1), Prec.FP32),
])
def test_out_of_lane_access_is_an_error(tensor):
    with pytest.raises(ExecutionError, match="LMEM"):
        _machine().read_local(tensor)


def test_ddr_strided_read_and_write():
    m = Machine(CHIP, 1024)
    data = np.arange(60, dtype=np.float32)
    m.load_ddr(0, data)
    got = m.ddr.read(8, (2, 3, 1, 2), (20, 6, 0, 2), np.float32)
    expect = np.array([[[[2 + 20 * n + 6 * c + 2 * w for w in range(2)]] for c in range(3)] for n in range(2)])
    assert (got == expect).all()
    m.ddr.write(3, (1, 1, 2, 2), (0, 0, 4, 1), np.array([1, 2, 3, 4], np.int16).reshape(1, 1, 2, 2))
    assert m.read_ddr(3, 12).view(np.uint8)[[0, 1, 8, 9]].tolist() == [1, 0, 3, 0]
    with pytest.raises(ExecutionError, match="outside DDR"):
        m.ddr.read(1000, (1, 1, 1, 8), (0, 0, 0, 1), np.float32)
