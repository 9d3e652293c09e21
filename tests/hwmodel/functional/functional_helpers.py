"""Shared helpers of the functional-model tests: the chip, LMEM tensors in the layouts of
hardware.md, a brute-force (per element, straight from the formula) LMEM reader, and float64
references for convolution and pooling."""

from __future__ import annotations

import itertools

import numpy as np

from tpuflow.chip import load_chip
from tpuflow.isa.base import LocalTensor, Prec, aligned_strides
from tpuflow.isa.gdma import global_lmem_address

CHIP = load_chip("sg2260")
LANES = CHIP.lanes
LANE_BYTES = CHIP.lmem_bytes_per_lane


def flat(lane: int, offset: int) -> int:
    """Flat LMEM address of (lane, per-lane offset)."""
    return lane * LANE_BYTES + offset


def gaddr(lane: int, offset: int) -> int:
    """GDMA global address of an LMEM (lane, offset)."""
    return global_lmem_address(flat(lane, offset), CHIP)


def eu(prec: Prec) -> int:
    return CHIP.core.eu_bytes_per_lane // prec.bytes


def local(addr: int, shape, prec: Prec = Prec.FP32, layout: str = "aligned", strides=None) -> LocalTensor:
    """An LMEM tensor in the aligned or compact layout, or with explicit strides."""
    if strides is None:
        start = (addr // LANE_BYTES) % LANES
        strides = aligned_strides(tuple(shape), eu(prec), LANES, start, compact=(layout == "compact"))
    return LocalTensor(addr, tuple(shape), tuple(strides), prec)


def brute_positions(tensor: LocalTensor):
    """(n, c, h, w) -> (lane, byte offset), element by element from the hardware.md formula."""
    start, base = (tensor.addr // LANE_BYTES) % LANES, tensor.addr % LANE_BYTES
    ns, cs, hs, ws = tensor.strides
    for n, c, h, w in itertools.product(*(range(s) for s in tensor.shape)):
        lane = (start + c) % LANES
        off = base + (n * ns + ((c + start) // LANES) * cs + h * hs + w * ws) * tensor.prec.bytes
        yield (n, c, h, w), lane, off


def brute_read(lmem: np.ndarray, tensor: LocalTensor) -> np.ndarray:
    out = np.zeros(tensor.shape, tensor.prec.storage_dtype)
    size = tensor.prec.bytes
    for index, lane, off in brute_positions(tensor):
        out[index] = lmem[lane, off:off + size].view(tensor.prec.storage_dtype)[0]
    return out


def brute_write(lmem: np.ndarray, tensor: LocalTensor, values: np.ndarray) -> None:
    size = tensor.prec.bytes
    values = np.broadcast_to(values, tensor.shape)
    for index, lane, off in brute_positions(tensor):
        lmem[lane, off:off + size] = np.frombuffer(values[index].tobytes(), np.uint8)


def random_values(rng: np.random.Generator, shape, prec: Prec = Prec.FP32, scale: float = 1.0) -> np.ndarray:
    """Random stored values of a precision (floats ~ N(0, scale); bf16 as bits)."""
    from tpuflow.hwmodel.functional.floats import encode
    if prec.is_float:
        return encode((rng.standard_normal(shape) * scale).astype(np.float32), prec)
    info = np.iinfo(prec.storage_dtype)
    return rng.integers(info.min, info.max, size=shape, endpoint=True).astype(prec.storage_dtype)


def as_f64(stored: np.ndarray, prec: Prec) -> np.ndarray:
    from tpuflow.hwmodel.functional.floats import to_f32
    return to_f32(stored, prec).astype(np.float64)


def conv_ref(x, w, stride=(1, 1), dilation=(1, 1), pads=(0, 0), out_hw=None):
    """Direct float64 convolution, one kernel tap at a time: x (N,C,H,W), w (OC,C,KH,KW)."""
    n, c, h, wd = x.shape
    oc, _, kh, kw = w.shape
    (sy, sx), (dy, dx), (up, lf) = stride, dilation, pads
    oh, ow = out_hw
    out = np.zeros((n, oc, oh, ow))
    for i, j in itertools.product(range(kh), range(kw)):
        for y, xx in itertools.product(range(oh), range(ow)):
            r, q = y * sy + i * dy - up, xx * sx + j * dx - lf
            if 0 <= r < h and 0 <= q < wd:
                out[:, :, y, xx] += x[:, :, r, q] @ w[:, :, i, j].T
    return out


def window_ref(x, kernel, stride, dilation, pads, out_hw, reduce, fill):
    """Pooling reference: reduce over every window element (padding = `fill`), float64."""
    n, c, h, wd = x.shape
    (kh, kw), (sy, sx), (dy, dx), (up, lf) = kernel, stride, dilation, pads
    oh, ow = out_hw
    out = np.zeros((n, c, oh, ow))
    for y, xx in itertools.product(range(oh), range(ow)):
        vals = []
        for i, j in itertools.product(range(kh), range(kw)):
            r, q = y * sy + i * dy - up, xx * sx + j * dx - lf
            vals.append(x[:, :, r, q] if 0 <= r < h and 0 <= q < wd else np.full((n, c), fill))
        out[:, :, y, xx] = reduce(np.stack(vals), axis=0)
    return out


def f32_bits(value: float) -> int:
    """The 32-bit field of an fp32 constant operand."""
    return int(np.array(value, np.float32).view(np.uint32))
