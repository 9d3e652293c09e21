"""GDMA: dma.tensor (plain / reshape, transpose, broadcast, fill) between DDR and LMEM in every
direction with arbitrary strides and the lane mask, dma.matrix, dma.general and dma.sys; checked
against numpy strided views and the element-by-element LMEM formula."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.lib.stride_tricks import as_strided

from functional_helpers import CHIP, LANES, brute_read, flat, gaddr, local, random_values
from tpuflow.isa.base import LocalTensor, Prec
from tpuflow.isa.gdma import GeneralDma, MatrixDma, SysDma, TensorDma, lmem_address
from tpuflow.hwmodel.functional import ExecutionError, Machine

DDR_BYTES = 1 << 16
PRECS = [Prec.INT8, Prec.FP16, Prec.FP32]


def _machine(seed: int) -> Machine:
    m = Machine(CHIP, DDR_BYTES)
    m.ddr.data[:DDR_BYTES] = np.random.default_rng(seed).integers(0, 256, DDR_BYTES, dtype=np.uint8)
    m.lmem.data[:] = np.random.default_rng(seed + 1).integers(0, 256, m.lmem.data.shape, dtype=np.uint8)
    return m


def ddr_view(m: Machine, addr: int, shape, strides, prec: Prec) -> np.ndarray:
    """numpy's own strided view of DDR (independent of the model's index maps)."""
    size = prec.bytes
    base = m.ddr.data[addr:]
    return as_strided(base, tuple(shape) + (size,), tuple(s * size for s in strides) + (1,)).copy()


def lmem_view(m: Machine, addr: int, shape, strides, prec: Prec) -> np.ndarray:
    tensor = LocalTensor(lmem_address(addr, CHIP), tuple(shape), tuple(strides), prec)
    return brute_read(m.lmem.data, tensor).view(np.uint8).reshape(tuple(shape) + (prec.bytes,))


def endpoint(m, addr, shape, strides, prec):
    return lmem_view(m, addr, shape, strides, prec) if addr >= CHIP.core.gdma_lmem_base_address else \
        ddr_view(m, addr, shape, strides, prec)


sizes = st.tuples(st.integers(1, 2), st.integers(1, 70), st.integers(1, 4), st.integers(1, 6))
ddr_strides = st.tuples(st.integers(0, 900), st.integers(0, 60), st.integers(0, 12), st.integers(1, 2))
lmem_strides = st.tuples(st.integers(0, 500), st.integers(0, 200), st.integers(0, 12), st.integers(1, 2))


def _address(kind: str, lane: int, offset: int) -> int:
    return gaddr(lane, offset) if kind == "lmem" else offset


@settings(max_examples=80, deadline=None)
@given(st.sampled_from(["ddr", "lmem"]), st.sampled_from(["ddr", "lmem"]), sizes, ddr_strides, lmem_strides,
       st.integers(0, LANES - 1), st.integers(0, LANES - 1), st.sampled_from(PRECS), st.booleans())
def test_tensor_copy_any_direction(src_kind, dst_kind, shape, s_ddr, s_lmem, src_lane, dst_lane, prec, reshape):
    m = _machine(20)
    src_strides = s_lmem if src_kind == "lmem" else s_ddr
    dst_strides = (s_lmem if dst_kind == "lmem" else s_ddr)[:3] + (1,)
    src = _address(src_kind, src_lane, 0x100)
    dst = _address(dst_kind, dst_lane, 0x8000)
    n, c, h, w = shape
    dst_shape = (n, c, w, h) if reshape else shape     # same element count, elements in src order
    if dst_kind == "ddr":   # DDR writes must not overlap: row-major dst
        dst_strides = (c * h * w, h * w, dst_shape[3], 1)
    ins = TensorDma(src_start_addr=src, dst_start_addr=dst, src_nsize=n, src_csize=c, src_hsize=h, src_wsize=w,
                    src_nstride=src_strides[0], src_cstride=src_strides[1], src_hstride=src_strides[2],
                    src_wstride=src_strides[3], dst_nsize=dst_shape[0], dst_csize=dst_shape[1],
                    dst_hsize=dst_shape[2], dst_wsize=dst_shape[3], dst_nstride=dst_strides[0],
                    dst_cstride=dst_strides[1], dst_hstride=dst_strides[2], dst_wstride=dst_strides[3],
                    src_data_format=prec)
    if dst_kind == "lmem":    # free dst strides may alias: compare against the last-writer semantics
        dst_strides = _compact_lmem_strides(dst_shape)
        ins = _with(ins, dst_nstride=dst_strides[0], dst_cstride=dst_strides[1], dst_hstride=dst_strides[2],
                    dst_wstride=dst_strides[3])
    expect = endpoint(m, src, shape, src_strides, prec).reshape(dst_shape + (prec.bytes,))
    m.execute(ins, 1)
    assert (endpoint(m, dst, dst_shape, dst_strides, prec) == expect).all()


def _compact_lmem_strides(shape):
    n, c, h, w = shape
    groups = -(-(c + LANES) // LANES)
    return (groups * h * w + 3, h * w + 1, w, 1)   # padded but non-overlapping


def _with(ins, **changes):
    from dataclasses import replace
    return replace(ins, **changes)


def _tensor(src, dst, src_shape, src_strides, dst_shape, dst_strides, **extra):
    return TensorDma(src_start_addr=src, dst_start_addr=dst,
                     **{f"src_{k}size": v for k, v in zip("nchw", src_shape)},
                     **{f"src_{k}stride": v for k, v in zip("nchw", src_strides)},
                     **{f"dst_{k}size": v for k, v in zip("nchw", dst_shape)},
                     **{f"dst_{k}stride": v for k, v in zip("nchw", dst_strides)}, **extra)


def test_tensor_transpose_ddr_to_lmem():
    m = _machine(21)
    values = random_values(np.random.default_rng(0), (2, 5, 3, 70), Prec.FP32)
    m.load_ddr(0, values)
    dst = local(flat(10, 0x100), (2, 70, 3, 5), Prec.FP32)
    m.execute(_tensor(0, gaddr(10, 0x100), (2, 5, 3, 70), (1050, 210, 70, 1), dst.shape, dst.strides,
                      op="transpose"))
    assert (m.read_local(dst) == values.transpose(0, 3, 2, 1)).all()


@pytest.mark.parametrize("src_kind,dst_kind", [("lmem", "ddr"), ("lmem", "lmem"), ("ddr", "ddr")])
def test_tensor_transpose_other_endpoints(src_kind, dst_kind):
    m = _machine(27)
    shape, dst_shape = (1, 7, 2, 66), (1, 66, 2, 7)
    src = gaddr(3, 0x100) if src_kind == "lmem" else 0x100
    src_strides = local(flat(3, 0x100), shape).strides if src_kind == "lmem" else _row_major(shape)
    dst = gaddr(50, 0x4000) if dst_kind == "lmem" else 0x8000
    dst_strides = local(flat(50, 0x4000), dst_shape).strides if dst_kind == "lmem" else _row_major(dst_shape)
    before = endpoint(m, src, shape, src_strides, Prec.FP32)
    m.execute(_tensor(src, dst, shape, src_strides, dst_shape, dst_strides, op="transpose"))
    assert (endpoint(m, dst, dst_shape, dst_strides, Prec.FP32) == before.transpose(0, 3, 2, 1, 4)).all()


def _row_major(shape):
    n, c, h, w = shape
    return (c * h * w, h * w, w, 1)


def test_tensor_broadcast_to_lanes():
    m = _machine(22)
    values = random_values(np.random.default_rng(1), (1, 1, 2, 8), Prec.FP16)
    m.load_ddr(64, values)
    dst = local(flat(40, 0), (1, 30, 2, 8), Prec.FP16)
    m.execute(_tensor(64, gaddr(40, 0), (1, 1, 2, 8), (16, 16, 8, 1), dst.shape, dst.strides, op="broadcast",
                      src_data_format=Prec.FP16))
    assert (m.read_local(dst) == np.broadcast_to(values, dst.shape)).all()


def test_tensor_fill_constant_respects_the_lane_mask():
    m = Machine(CHIP, 64)
    dst = local(flat(0, 0x40), (1, 64, 1, 4), Prec.FP16)
    mask = (1 << 3) | (1 << 63)
    m.execute(_tensor(0, gaddr(0, 0x40), (1, 1, 1, 1), (1, 1, 1, 1), dst.shape, dst.strides, fill_constant_en=1,
                      constant_value=0xABCD3C00, src_data_format=Prec.FP16, localmem_mask=mask))
    got = m.read_local(dst).reshape(64, 4)
    assert (got[[3, 63]] == 1.0).all() and (got[[0, 4, 62]] == 0).all()


def test_tensor_fill_ddr():
    m = Machine(CHIP, 256)
    m.execute(_tensor(0, 16, (1, 1, 1, 1), (1, 1, 1, 1), (1, 2, 2, 3), (0, 12, 6, 2), fill_constant_en=1,
                      constant_value=0x40490FDB))
    words = m.read_ddr(16, 96).view(np.float32)
    assert (words[[0, 2, 4, 6, 8, 10, 12, 14, 16]] == np.float32(3.1415927)).all() and words[1] == 0


def test_tensor_element_counts_must_match():
    ins = _tensor(0, 64, (1, 1, 2, 3), (6, 6, 3, 1), (1, 1, 1, 5), (5, 5, 5, 1))
    with pytest.raises(ExecutionError, match="D4 dma.tensor.*element count"):
        Machine(CHIP, 256).execute(ins, 4)


@pytest.mark.parametrize("start_lane", [0, 37])
def test_matrix_ddr_to_lmem_and_back(start_lane):
    m = _machine(23)
    rows, cols, row_stride = 70, 9, 12
    data = random_values(np.random.default_rng(2), (rows, row_stride), Prec.FP32)
    m.load_ddr(0, data)
    lmem = gaddr(start_lane, 0x200)
    m.execute(MatrixDma(src_start_addr=0, dst_start_addr=lmem, src_hsize=rows, src_wsize=cols, src_hstride=row_stride,
                        dst_cstride=16))
    tensor = LocalTensor(lmem_address(lmem, CHIP), (1, rows, 1, cols), (32, 16, cols, 1), Prec.FP32)
    assert (m.read_local(tensor).reshape(rows, cols) == data[:, :cols]).all()
    m.execute(MatrixDma(src_start_addr=lmem, dst_start_addr=0x4000, src_hsize=rows, src_wsize=cols,
                        src_hstride=cols, dst_cstride=16))
    assert (m.read_ddr(0x4000, rows * cols * 4).view(np.float32).reshape(rows, cols) == data[:, :cols]).all()


def test_matrix_transpose_stores_columns_across_lanes():
    m = _machine(24)
    data = random_values(np.random.default_rng(3), (5, 66), Prec.FP16)
    m.load_ddr(0, data)
    lmem = gaddr(2, 0x200)
    m.execute(MatrixDma(op="transpose", src_start_addr=0, dst_start_addr=lmem, src_hsize=5, src_wsize=66,
                        src_hstride=66, dst_cstride=32, src_data_format=Prec.FP16))
    tensor = LocalTensor(lmem_address(lmem, CHIP), (1, 66, 1, 5), (64, 32, 5, 1), Prec.FP16)
    assert (m.read_local(tensor).reshape(66, 5) == data.T).all()
    with pytest.raises(ExecutionError, match="DDR -> LMEM only"):
        m.execute(MatrixDma(op="transpose", src_start_addr=lmem, dst_start_addr=0, src_hsize=5, src_wsize=66,
                            src_hstride=66, dst_cstride=32))


def test_general_copies_between_any_endpoints_and_broadcasts():
    m = _machine(25)
    expect = m.read_ddr(100, 40)
    m.execute(GeneralDma(src_start_addr=100, dst_start_addr=gaddr(5, 0x300), src_cstride=10))   # DDR -> LMEM
    assert (m.lmem.data[5, 0x300:0x300 + 40] == expect).all()
    m.execute(GeneralDma(src_start_addr=gaddr(5, 0x300), dst_start_addr=gaddr(9, 0x10), src_cstride=20,
                         src_data_format=Prec.FP16))                                             # LMEM -> LMEM
    assert (m.lmem.data[9, 0x10:0x10 + 40] == expect).all()
    m.execute(GeneralDma(src_start_addr=gaddr(9, 0x10), dst_start_addr=0x2000, src_cstride=40,
                         src_data_format=Prec.INT8))                                             # LMEM -> DDR
    m.execute(GeneralDma(src_start_addr=0x2000, dst_start_addr=0x3001, src_cstride=40, src_data_format=Prec.INT8))
    assert (m.read_ddr(0x3001, 40) == expect).all()                                              # DDR -> DDR
    m.execute(GeneralDma(op="broadcast", src_start_addr=100, dst_start_addr=gaddr(60, 0x500), src_cstride=10,
                         dst_csize=4))
    assert (m.lmem.data[60:64, 0x500:0x500 + 40] == expect).all()
    with pytest.raises(ExecutionError, match="passes lane 63"):
        m.execute(GeneralDma(op="broadcast", src_start_addr=100, dst_start_addr=gaddr(62, 0), src_cstride=1,
                             dst_csize=3))
    with pytest.raises(ExecutionError, match="crosses the end of lane"):
        m.execute(GeneralDma(src_start_addr=100, dst_start_addr=gaddr(0, CHIP.lmem_bytes_per_lane - 4),
                             src_cstride=2))


def test_sys_dma_changes_nothing():
    m = _machine(26)
    before = (m.ddr.data.copy(), m.lmem.data.copy())
    for op in ("chain_end", "nop", "sys_send", "sys_wait"):
        m.execute(SysDma(op=op))
    assert (m.ddr.data == before[0]).all() and (m.lmem.data == before[1]).all()
