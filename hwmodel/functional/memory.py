"""DDR (flat bytes) and LMEM (bytes per lane) as numpy arrays. A strided tensor is read or
written as affine numpy views (one per run of channels on consecutive lanes) when its base is
element aligned, otherwise with index maps (lane array x byte-offset array) in one fancy-index
operation; both follow the hardware.md address formula."""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided

from tpuflow.isa.base import LocalTensor

from tpuflow.hwmodel.functional.errors import ExecutionError


def _extent(shape, strides) -> tuple[int, int]:
    """Lowest and highest element offset a strided tensor reaches."""
    lo = sum(min(0, (s - 1) * st) for s, st in zip(shape, strides))
    hi = sum(max(0, (s - 1) * st) for s, st in zip(shape, strides))
    return lo, hi


def _grid(shape, strides) -> np.ndarray:
    """Element offsets n*ns + c*cs + h*hs + w*ws as an int64 array of `shape`."""
    out = np.zeros((1,) * len(shape), dtype=np.int64)
    for axis, (size, stride) in enumerate(zip(shape, strides)):
        dims = [1] * len(shape)
        dims[axis] = size
        out = out + (np.arange(size, dtype=np.int64) * stride).reshape(dims)
    return np.broadcast_to(out, tuple(shape))


def gather(buf: np.ndarray, rows, byte_offsets: np.ndarray, dtype) -> np.ndarray:
    """Elements of `dtype` at (row, byte offset) of a 2-D byte buffer (offsets already checked)."""
    dtype = np.dtype(dtype)
    size = dtype.itemsize
    if size == 1 or _aligned(byte_offsets, size):
        return buf.view(dtype)[rows, byte_offsets // size]
    index = byte_offsets[..., None] + np.arange(size)
    rows = np.asarray(rows)[..., None]
    return np.ascontiguousarray(buf[rows, index]).view(dtype)[..., 0]


def scatter(buf: np.ndarray, rows, byte_offsets: np.ndarray, values: np.ndarray) -> None:
    """Store `values` (already of the element dtype, shape of byte_offsets) at (row, offset)."""
    size = values.dtype.itemsize
    if size == 1 or _aligned(byte_offsets, size):
        buf.view(values.dtype)[rows, byte_offsets // size] = values
        return
    index = byte_offsets[..., None] + np.arange(size)
    raw = np.ascontiguousarray(values).view(np.uint8).reshape(values.shape + (size,))
    buf[np.asarray(rows)[..., None], index] = raw


def _aligned(byte_offsets: np.ndarray, size: int) -> bool:
    """All offsets a multiple of the element size (they share one base, so testing one is enough
    when strides are whole elements)."""
    return byte_offsets.size == 0 or int(byte_offsets.flat[0]) % size == 0


class LocalMemory:
    """The LMEM of one core: uint8 [lanes, lmem_bytes_per_lane]; flat address = lane*bytes+off."""

    def __init__(self, lanes: int, bytes_per_lane: int, fill: int = 0):
        self.lanes = lanes
        self.bytes_per_lane = bytes_per_lane
        self.data = np.full((lanes, bytes_per_lane), fill, dtype=np.uint8)

    def index_map(self, tensor: LocalTensor) -> tuple[np.ndarray, np.ndarray]:
        """(lane of each channel as (1,C,1,1), byte offset of every element as (N,C,H,W))."""
        n, c, h, w = tensor.shape
        ns, cs, hs, ws = tensor.strides
        size = tensor.prec.bytes
        start, base = self._split(tensor.addr)
        channel = start + np.arange(c, dtype=np.int64)
        self.index_bounds(tensor)
        elem = _grid((n, 1, h, w), (ns, 0, hs, ws)) + ((channel // self.lanes) * cs).reshape(1, c, 1, 1)
        return (channel % self.lanes).reshape(1, c, 1, 1), base + elem * size

    def _split(self, addr: int) -> tuple[int, int]:
        lane, off = divmod(addr, self.bytes_per_lane)
        if not 0 <= lane < self.lanes:
            raise ExecutionError(f"LMEM address {addr:#x} is outside the {self.lanes} lanes")
        return lane, off

    def _check(self, lo: int, hi: int, tensor) -> None:
        if lo < 0 or hi > self.bytes_per_lane:
            raise ExecutionError(f"LMEM tensor at {tensor.addr:#x} shape {tensor.shape} strides {tensor.strides} "
                                 f"reaches per-lane bytes [{lo:#x}, {hi:#x}) outside [0, {self.bytes_per_lane:#x})")

    def _chunks(self, tensor: LocalTensor):
        """(first channel, channels, flat byte origin) of each run of channels on consecutive
        lanes within one channel group: each run is an affine view of the LMEM bytes."""
        start, base = self._split(tensor.addr)
        channels, c_bytes = tensor.shape[1], tensor.strides[1] * tensor.prec.bytes
        first = 0
        while first < channels:
            group, lane = divmod(start + first, self.lanes)
            count = min(channels - first, self.lanes - lane)
            yield first, count, lane * self.bytes_per_lane + base + group * c_bytes
            first += count

    def _views(self, tensor: LocalTensor):
        """(first channel, channels, strided view) per run, or None when the base is not element
        aligned (then the fancy-index path handles it)."""
        dtype = tensor.prec.storage_dtype
        size = dtype.itemsize
        if tensor.addr % size:
            return None
        self.index_bounds(tensor)
        flat = self.data.reshape(-1).view(dtype)
        n_str, _, h_str, w_str = (s * size for s in tensor.strides)
        n, _, h, w = tensor.shape
        return [(first, count, as_strided(flat[origin // size:], (n, count, h, w),
                                          (n_str, self.bytes_per_lane, h_str, w_str)))
                for first, count, origin in self._chunks(tensor)]

    def index_bounds(self, tensor: LocalTensor) -> None:
        """Check that every element of the tensor lies inside its lane."""
        n, c, h, w = tensor.shape
        size = tensor.prec.bytes
        start, base = self._split(tensor.addr)
        groups = (start + c - 1) // self.lanes + 1
        lo, hi = _extent((n, groups, h, w), tensor.strides)
        self._check(base + lo * size, base + (hi + 1) * size, tensor)

    def read(self, tensor: LocalTensor) -> np.ndarray:
        """The tensor's stored values, shape (N, C, H, W), in its precision's storage dtype."""
        if 0 in tensor.shape:
            return np.zeros(tensor.shape, tensor.prec.storage_dtype)
        views = self._views(tensor)
        if views is None:
            lanes, offsets = self.index_map(tensor)
            return gather(self.data, lanes, offsets, tensor.prec.storage_dtype)
        if len(views) == 1:
            return views[0][2].copy()
        return np.ascontiguousarray(np.concatenate([view for _, _, view in views], axis=1))

    def write(self, tensor: LocalTensor, values, lane_enable: np.ndarray | None = None) -> None:
        """Store values (the tensor's storage dtype, broadcast to its shape) into LMEM;
        lanes with lane_enable[lane] False are left untouched."""
        if 0 in tensor.shape:
            return
        values = np.asarray(values)
        if values.dtype != tensor.prec.storage_dtype:
            raise TypeError(f"LMEM write of {values.dtype} values into a {tensor.prec.dtype_name} tensor")
        values = np.broadcast_to(values, tensor.shape)
        masked = lane_enable is not None and not lane_enable.all()
        views = None if masked else self._views(tensor)
        if views is None:
            self._scatter(tensor, values, lane_enable if masked else None)
            return
        for first, count, view in views:
            view[...] = values[:, first:first + count]

    def _scatter(self, tensor: LocalTensor, values: np.ndarray, lane_enable: np.ndarray | None) -> None:
        lanes, offsets = self.index_map(tensor)
        if lane_enable is not None:
            keep = np.broadcast_to(lane_enable[lanes], tensor.shape)
            lanes, offsets, values = np.broadcast_to(lanes, tensor.shape)[keep], offsets[keep], values[keep]
        scatter(self.data, lanes, offsets, values)

    def gather_rows(self, lanes, byte_offsets: np.ndarray, dtype) -> np.ndarray:
        """Elements at explicit (lane, byte offset) pairs (the caller checked the bounds)."""
        return gather(self.data, lanes, byte_offsets, dtype)

    def lane_bytes(self, addr: int, nbytes: int) -> tuple[int, slice]:
        """(lane, byte slice) of `nbytes` contiguous bytes at a flat address, inside one lane."""
        lane, off = self._split(addr)
        if off + nbytes > self.bytes_per_lane:
            raise ExecutionError(f"LMEM range {addr:#x} + {nbytes} B crosses the end of lane {lane}")
        return lane, slice(off, off + nbytes)


class DdrMemory:
    """DDR as flat bytes [0, size); tensors are strided element grids from a byte address."""

    def __init__(self, size: int):
        self.size = size
        self.data = np.zeros(-(-max(size, 1) // 8) * 8, dtype=np.uint8)
        self._rows = self.data.reshape(1, -1)

    def check(self, lo: int, hi: int, what: str = "DDR access") -> None:
        if lo < 0 or hi > self.size:
            raise ExecutionError(f"{what} [{lo:#x}, {hi:#x}) is outside DDR [0, {self.size:#x})")

    def _offsets(self, addr: int, shape, strides, size: int) -> np.ndarray:
        lo, hi = _extent(shape, strides)
        self.check(addr + lo * size, addr + (hi + 1) * size, f"DDR tensor at {addr:#x} shape {tuple(shape)}")
        return addr + _grid(shape, strides) * size

    def _view(self, addr: int, shape, strides, dtype: np.dtype) -> np.ndarray | None:
        """Affine view of an element-aligned DDR tensor (bounds checked), else None."""
        size = dtype.itemsize
        lo, hi = _extent(shape, strides)
        self.check(addr + lo * size, addr + (hi + 1) * size, f"DDR tensor at {addr:#x} shape {tuple(shape)}")
        if addr % size:
            return None
        return as_strided(self.data.view(dtype)[addr // size:], tuple(shape), tuple(s * size for s in strides))

    def read(self, addr: int, shape, strides, dtype) -> np.ndarray:
        dtype = np.dtype(dtype)
        if 0 in tuple(shape):
            return np.zeros(tuple(shape), dtype)
        view = self._view(addr, shape, strides, dtype)
        if view is not None:
            return view.copy()
        return gather(self._rows, 0, self._offsets(addr, shape, strides, dtype.itemsize), dtype)

    def write(self, addr: int, shape, strides, values) -> None:
        values = np.asarray(values)
        if 0 in tuple(shape):
            return
        view = self._view(addr, shape, strides, values.dtype)
        if view is not None:
            view[...] = values
            return
        offsets = self._offsets(addr, shape, strides, values.dtype.itemsize)
        scatter(self._rows, 0, offsets, np.broadcast_to(values, tuple(shape)))

    def load(self, addr: int, data: bytes | np.ndarray) -> None:
        raw = np.frombuffer(bytes(data), dtype=np.uint8) if isinstance(data, (bytes, bytearray)) else \
            np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        self.check(addr, addr + raw.size, "DDR load")
        self.data[addr:addr + raw.size] = raw

    def dump(self, addr: int, nbytes: int) -> np.ndarray:
        self.check(addr, addr + nbytes, "DDR read")
        return self.data[addr:addr + nbytes].copy()
