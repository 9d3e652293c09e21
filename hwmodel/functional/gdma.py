"""GDMA instructions: tensor (plain, transpose, broadcast, fill), matrix, general and sys DMAs
between any two of DDR and LMEM, with arbitrary element strides and the local memory lane mask."""

from __future__ import annotations

import functools

import numpy as np

from tpuflow.isa.base import LocalTensor, Prec
from tpuflow.isa.gdma import GatherDma, GeneralDma, MatrixDma, SysDma, TensorDma, is_lmem, lmem_address

from tpuflow.hwmodel.functional.errors import ExecutionError


def read_endpoint(m, addr: int, shape, strides, prec: Prec) -> np.ndarray:
    """Stored values of a DMA endpoint tensor, DDR or LMEM by address."""
    if is_lmem(addr, m.chip):
        return m.lmem.read(LocalTensor(lmem_address(addr, m.chip), tuple(shape), tuple(strides), prec))
    return m.ddr.read(addr, shape, strides, prec.storage_dtype)


def write_endpoint(m, addr: int, shape, strides, prec: Prec, values: np.ndarray,
                   lane_enable: np.ndarray | None = None) -> None:
    if is_lmem(addr, m.chip):
        tensor = LocalTensor(lmem_address(addr, m.chip), tuple(shape), tuple(strides), prec)
        m.lmem.write(tensor, values, lane_enable)
    else:
        m.ddr.write(addr, shape, strides, values)


@functools.lru_cache(maxsize=64)
def lane_enable(mask: int, lanes: int) -> np.ndarray:
    """localmem_mask as a bool per lane (bit l enables lane l); read-only, shared."""
    out = np.array([(mask >> lane) & 1 for lane in range(lanes)], dtype=bool)
    out.flags.writeable = False
    return out


def fill_value(constant: int, prec: Prec) -> np.ndarray:
    """constant_value's low bits, reinterpreted in the data format."""
    width = 8 * prec.bytes
    return np.array(constant & ((1 << width) - 1), dtype=np.dtype(f"uint{width}")).view(prec.storage_dtype)


def _tensor_data(m, ins: TensorDma, prec: Prec) -> np.ndarray:
    """The values to store into dst, in dst's (n, c, h, w) order."""
    if ins.fill_constant_en:
        return fill_value(ins.constant_value, prec)
    src = read_endpoint(m, ins.src_start_addr, ins.src_shape, ins.src_strides, prec)
    n, c, h, w = ins.src_shape
    if ins.op == "transpose":
        if ins.dst_shape != (n, w, h, c):
            raise ExecutionError(f"dma.tensor.transpose: dst {ins.dst_shape} is not src {ins.src_shape} with C/W swapped")
        return src.transpose(0, 3, 2, 1)
    if ins.op == "broadcast":
        dn, dc, dh, dw = ins.dst_shape
        if c != 1 or (dn, dh, dw) != (n, h, w):
            raise ExecutionError(f"dma.tensor.broadcast: src {ins.src_shape} must be dst {ins.dst_shape} with C = 1")
        return np.broadcast_to(src, ins.dst_shape)
    if src.size != int(np.prod(ins.dst_shape)):
        raise ExecutionError(f"dma.tensor: src {ins.src_shape} and dst {ins.dst_shape} differ in element count")
    return src.reshape(ins.dst_shape)


def execute_tensor(m, ins: TensorDma) -> None:
    prec = Prec(ins.src_data_format)
    data = _tensor_data(m, ins, prec)
    enable = lane_enable(ins.localmem_mask, m.chip.lanes)
    write_endpoint(m, ins.dst_start_addr, ins.dst_shape, ins.dst_strides, prec, data, enable)


def execute_matrix(m, ins: MatrixDma) -> None:
    prec = Prec(ins.src_data_format)
    (ddr_shape, ddr_strides), (lmem_shape, lmem_strides) = ins.endpoints(m.chip)
    to_lmem = is_lmem(ins.dst_start_addr, m.chip)
    if to_lmem == is_lmem(ins.src_start_addr, m.chip):
        raise ExecutionError("dma.matrix needs exactly one DDR and one LMEM endpoint")
    if to_lmem:
        data = m.ddr.read(ins.src_start_addr, ddr_shape, ddr_strides, prec.storage_dtype)
        if ins.op == "transpose":
            data = data.transpose(0, 3, 2, 1)
        write_endpoint(m, ins.dst_start_addr, lmem_shape, lmem_strides, prec, data)
        return
    if ins.op == "transpose":
        raise ExecutionError("dma.matrix.transpose runs DDR -> LMEM only")
    data = read_endpoint(m, ins.src_start_addr, lmem_shape, lmem_strides, prec)
    m.ddr.write(ins.dst_start_addr, ddr_shape, ddr_strides, data)


def _flat_read(m, addr: int, nbytes: int) -> np.ndarray:
    if is_lmem(addr, m.chip):
        lane, span = m.lmem.lane_bytes(lmem_address(addr, m.chip), nbytes)
        return m.lmem.data[lane, span].copy()
    return m.ddr.dump(addr, nbytes)


def execute_general(m, ins: GeneralDma) -> None:
    nbytes = ins.src_cstride * Prec(ins.src_data_format).bytes
    data = _flat_read(m, ins.src_start_addr, nbytes)
    lanes = ins.dst_csize if ins.op == "broadcast" else 1
    if not is_lmem(ins.dst_start_addr, m.chip):
        if lanes != 1:
            raise ExecutionError("dma.general.broadcast needs an LMEM destination")
        m.ddr.load(ins.dst_start_addr, data)
        return
    lane, span = m.lmem.lane_bytes(lmem_address(ins.dst_start_addr, m.chip), nbytes)
    if lane + lanes > m.chip.lanes:
        raise ExecutionError(f"dma.general.broadcast to {lanes} lanes from lane {lane} passes lane {m.chip.lanes - 1}")
    m.lmem.data[lane:lane + lanes, span] = data


def execute_gather(m, ins: GatherDma) -> None:
    """dst[c, h, :] = src[c, index[c, h] - start_pos, :], constant_value where out of range."""
    prec = Prec(ins.src_data_format)
    if (ins.dst_csize, ins.dst_hsize, ins.dst_wsize) != (ins.src_csize, ins.index_hsize, ins.src_wsize) \
            or ins.index_csize not in (1, ins.src_csize):
        raise ExecutionError(f"gdma.gather: dst {ins.dst_shape} is not (src_c, index_h, src_w) of src "
                             f"{ins.src_shape} / index {ins.index_shape}")
    src = read_endpoint(m, ins.src_start_addr, ins.src_shape, ins.src_strides, prec)
    index = read_endpoint(m, ins.index_start_addr, ins.index_shape, ins.index_strides, Prec.INT32)
    rows = index.view(np.uint32).astype(np.int64)[0, :, :, 0] - ins.start_pos      # (index_csize, H)
    rows = np.broadcast_to(rows, (ins.dst_csize, ins.index_hsize))
    valid = (rows >= 0) & (rows < ins.src_hsize)
    picked = np.take_along_axis(src[0], np.where(valid, rows, 0)[:, :, None], axis=1)
    fill = fill_value(ins.constant_value, prec)
    data = np.where(valid[:, :, None], picked, fill)[None].astype(prec.storage_dtype)
    write_endpoint(m, ins.dst_start_addr, ins.dst_shape, ins.dst_strides, prec, data)


def execute_sys(m, ins: SysDma) -> None:
    """chain_end, nop, send and wait change no data; waits are the engines' business."""


HANDLERS = {TensorDma: execute_tensor, MatrixDma: execute_matrix, GeneralDma: execute_general,
            GatherDma: execute_gather, SysDma: execute_sys}
