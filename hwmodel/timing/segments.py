"""GDMA read/write segmentation: a transfer side -> contiguous segments -> bus bursts (numpy arrays).

Segments by contiguity of the side's (n, c, h, w) walk (a dimension of size 1 never breaks
contiguity): c, h, w contiguous -> one segment per n; h, w contiguous -> one per (n, c); w
contiguous -> one per row (n, c, h); otherwise one per element. On the LMEM side channels sit on
different lanes, so a segment never spans channels. Segments are cut into bursts at multiples
of burst_bytes = min(bus_bytes * max_burst_beats, DDR interleave granule, DRAM page): a burst never
crosses a UMC granule or a page. A burst's bus beats = bus words it touches; it is unaligned when
it does not start on a bus word. Every burst knows the stream position (bytes of the element walk,
in order) it ends at: the write side of a command consumes the read side's stream in that order.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from tpuflow.chip import ChipConfig
from tpuflow.isa import GatherDma, GeneralDma, Instruction, MatrixDma, Prec, TensorDma, is_lmem


class Side(NamedTuple):
    """One endpoint of a transfer: DDR (global byte address) or LMEM (flat address)."""

    lmem: bool
    addr: int
    shape: tuple[int, int, int, int]
    strides: tuple[int, int, int, int]
    esize: int
    lanes_copy: int = 1   # GeneralDma broadcast: the same bytes in this many consecutive lanes

    @property
    def nbytes(self) -> int:
        n, c, h, w = self.shape
        return n * c * h * w * self.esize * self.lanes_copy


@dataclass
class Bursts:
    """Bus bursts of one side, in issue order (numpy int64 arrays)."""

    addr: np.ndarray
    size: np.ndarray
    beats: np.ndarray
    unaligned: np.ndarray     # bool
    stream_end: np.ndarray    # stream bytes consumed/produced once this burst is done (non-decreasing)

    def __len__(self) -> int:
        return len(self.addr)


def _contiguous_dims(shape, strides) -> int:
    """How many trailing dims (w, h, c) form one contiguous run."""
    inner, count = 1, 0
    for size, stride in zip(reversed(shape[1:]), reversed(strides[1:])):
        if size != 1 and stride != inner:
            break
        inner *= size
        count += 1
    return count


def _segments(side: Side, lanes: int, lane_bytes: int) -> tuple[np.ndarray, np.ndarray]:
    """(start addresses, lengths in bytes) of the side's contiguous segments, in walk order."""
    n, c, h, w = side.shape
    ns, cs, hs, ws = side.strides
    k = _contiguous_dims(side.shape, side.strides)
    if side.lmem and c > 1:
        k = min(k, 2)
    dims = [(n, ns), (c, cs), (h, hs), (w, ws)][: 4 - k]
    run = {3: c * h * w, 2: h * w, 1: w, 0: 1}[k]
    idx = [a.ravel() for a in np.meshgrid(*[np.arange(d, dtype=np.int64) for d, _ in dims], indexing="ij")]
    if not side.lmem:
        el = sum(i * s for i, (_, s) in zip(idx, dims))
        return side.addr + el * side.esize, np.full(len(el), run * side.esize, dtype=np.int64)
    start_lane = (side.addr // lane_bytes) % lanes
    base = side.addr % lane_bytes
    ci = idx[1] if len(idx) > 1 else np.zeros_like(idx[0])
    lane = (start_lane + ci) % lanes
    group = (start_lane + ci) // lanes
    el = idx[0] * ns + group * cs + sum(i * s for i, (_, s) in zip(idx[2:], dims[2:]))
    starts = lane * lane_bytes + base + el * side.esize
    lengths = np.full(len(starts), run * side.esize)
    if side.lanes_copy > 1:
        starts = (starts[:, None] + np.arange(side.lanes_copy) * lane_bytes).ravel()
        lengths = np.full(len(starts), run * side.esize)
    return starts.astype(np.int64), lengths.astype(np.int64)


def split_bursts(starts: np.ndarray, lengths: np.ndarray, burst_bytes: int, bus_bytes: int) -> Bursts:
    """Cut segments into bursts at multiples of burst_bytes."""
    first = starts // burst_bytes
    count = (starts + lengths - 1) // burst_bytes - first + 1
    seg = np.repeat(np.arange(len(starts)), count)
    k = np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count)
    block = first[seg] + k
    lo = np.maximum(starts[seg], block * burst_bytes)
    hi = np.minimum(starts[seg] + lengths[seg], (block + 1) * burst_bytes)
    seg_stream = np.cumsum(lengths) - lengths
    stream_end = seg_stream[seg] + (hi - starts[seg])
    beats = -(-hi // bus_bytes) - lo // bus_bytes
    return Bursts(lo, hi - lo, beats, lo % bus_bytes != 0, stream_end)


@lru_cache(maxsize=4096)
def _relative_bursts(lmem: bool, offset_key: int, shape, strides, esize: int, lanes_copy: int,
                     burst_bytes: int, bus_bytes: int, lanes: int, lane_bytes: int) -> Bursts:
    side = Side(lmem, offset_key, shape, strides, esize, lanes_copy)
    starts, lengths = _segments(side, lanes, lane_bytes)
    return split_bursts(starts, lengths, burst_bytes, bus_bytes)


def side_bursts(side: Side, chip: ChipConfig, burst_bytes: int) -> Bursts:
    """Bursts of a side; cached on everything but the part of the address that only shifts them."""
    rel, shift = relative_bursts(side, chip, burst_bytes)
    if shift == 0:
        return rel
    return Bursts(rel.addr + shift, rel.size, rel.beats, rel.unaligned, rel.stream_end)


def relative_bursts(side: Side, chip: ChipConfig, burst_bytes: int) -> tuple[Bursts, int]:
    """(cached bursts, shift): the side's bursts are the cached ones moved by `shift` bytes (a multiple of
    burst_bytes, so beats, alignment and burst boundaries do not change)."""
    lmem, addr, shape, strides, esize, copies = side
    key, shift = burst_position(lmem, addr, chip, burst_bytes)
    if key >= TILE_BUFFER_KEY:                    # burst_position found it in the tile buffer
        return _tile_buffer_bursts(key - TILE_BUFFER_KEY, side.nbytes, chip.tile.buffer_chunk_bytes,
                                   chip.gdma.bus_bytes), shift
    rel = _relative_bursts(lmem, key, shape, strides, esize, copies, burst_bytes, chip.gdma.bus_bytes,
                           chip.core.lanes, chip.core.lmem_bytes_per_lane)
    return rel, shift


def burst_position(lmem: bool, addr: int, chip: ChipConfig, burst_bytes: int) -> tuple[int, int]:
    """(key, shift) of a side's address: sides equal but for their addresses have the same relative bursts
    when their keys are equal, moved by their shifts (relative_bursts). Sides in the tile buffer get keys
    of their own (TILE_BUFFER_KEY and up)."""
    if lmem:
        # keep the start lane and the offset within a burst; the rest of the offset shifts every burst
        lane_bytes = chip.core.lmem_bytes_per_lane
        offset = addr % lane_bytes
        key = (addr // lane_bytes % chip.core.lanes) * lane_bytes + offset % burst_bytes
        if chip.in_tile_buffer(addr):
            key = TILE_BUFFER_KEY + offset % burst_bytes
        return key, offset - offset % burst_bytes
    return addr % burst_bytes, addr - addr % burst_bytes


TILE_BUFFER_KEY = 1 << 62     # burst_position keys of sides in the tile buffer start here


@lru_cache(maxsize=1024)
def _tile_buffer_bursts(offset: int, nbytes: int, chunk_bytes: int, bus_bytes: int) -> Bursts:
    """A side in the tile buffer (tile.buffer_chunk_bytes > 0): the buffer's DMA port takes the side's
    bytes as one stream of chunk_bytes chunks and converts ND <-> Nz / Zn in flight, so its element
    order (a scatter into Nz / Zn fractals) costs nothing; only its byte count does. The chunks
    start at the side's offset within a burst (`offset`) and the stream is in the other side's order."""
    return split_bursts(np.asarray([offset], dtype=np.int64), np.asarray([nbytes], dtype=np.int64),
                        chunk_bytes, bus_bytes)


_PREC_BYTES = {int(p): p.bytes for p in Prec}       # Prec(code).bytes without the enum call


def _side(addr: int, shape, strides, esize: int, chip: ChipConfig, lanes_copy: int = 1) -> Side:
    base = chip.core.gdma_lmem_base_address
    if addr >= base:      # is_lmem
        return Side(True, addr - base, tuple(shape), tuple(strides), esize, lanes_copy)
    return Side(False, addr, tuple(shape), tuple(strides), esize, lanes_copy)


def transfer_sides(instr: Instruction, chip: ChipConfig) -> tuple[Side | None, Side]:
    """(source side or None for a constant fill, destination side) of a GDMA data command."""
    if type(instr) is TensorDma:      # the common command: its fields read directly
        es = _PREC_BYTES[instr.src_data_format]
        i = instr
        dst = _side(i.dst_start_addr, (i.dst_nsize, i.dst_csize, i.dst_hsize, i.dst_wsize),
                    (i.dst_nstride, i.dst_cstride, i.dst_hstride, i.dst_wstride), es, chip)
        if i.fill_constant_en:
            return None, dst
        return _side(i.src_start_addr, (i.src_nsize, i.src_csize, i.src_hsize, i.src_wsize),
                     (i.src_nstride, i.src_cstride, i.src_hstride, i.src_wstride), es, chip), dst
    if isinstance(instr, TensorDma):
        es = Prec(instr.src_data_format).bytes
        dst = _side(instr.dst_start_addr, instr.dst_shape, instr.dst_strides, es, chip)
        if instr.fill_constant_en:
            return None, dst
        return _side(instr.src_start_addr, instr.src_shape, instr.src_strides, es, chip), dst
    if isinstance(instr, MatrixDma):
        es = Prec(instr.src_data_format).bytes
        ddr_side, lmem_side = instr.endpoints(chip)
        if is_lmem(instr.dst_start_addr, chip):
            return (_side(instr.src_start_addr, *ddr_side, es, chip), _side(instr.dst_start_addr, *lmem_side, es, chip))
        return (_side(instr.src_start_addr, *lmem_side, es, chip), _side(instr.dst_start_addr, *ddr_side, es, chip))
    if isinstance(instr, GeneralDma):
        es = Prec(instr.src_data_format).bytes
        flat = (1, 1, 1, instr.src_cstride)
        unit = (instr.src_cstride, instr.src_cstride, instr.src_cstride, 1)
        copies = instr.dst_csize if instr.op == "broadcast" else 1
        src = _side(instr.src_start_addr, flat, unit, es, chip)
        dst = _side(instr.dst_start_addr, flat, unit, es, chip, lanes_copy=copies if is_lmem(instr.dst_start_addr, chip) else 1)
        return src, dst
    if isinstance(instr, GatherDma):
        return _gather_sides(instr, chip)
    raise TypeError(f"not a GDMA data command: {type(instr).__name__}")


def ddr_bytes(instr: Instruction, chip: ChipConfig) -> int:
    """DDR bytes a GDMA instruction reads plus writes: the bytes of its transfer sides outside LMEM
    (transfer_sides: a broadcast reads its source once, a gather its rows, a DDR -> DDR copy counts
    both sides, a constant fill only its destination); 0 for a SYS command. The one rule for the
    timing model, the estimate and its report, the scheduler's bounds and the lowering."""
    if not isinstance(instr, (TensorDma, MatrixDma, GeneralDma, GatherDma)):
        return 0
    return sides_ddr_bytes(*transfer_sides(instr, chip))


def sides_ddr_bytes(*sides: Side | None) -> int:
    """Bytes of the given transfer sides that lie outside LMEM."""
    return sum(side.nbytes for side in sides if side is not None and not side.lmem)


def _gather_sides(instr: GatherDma, chip: ChipConfig) -> tuple[Side, Side]:
    """gdma.gather reads one src row per index; which rows is data dependent, so the read side is
    modelled as index_hsize rows spread evenly over the table (each its own segment, as random
    rows are). The index reads (4 B per row) are not modelled."""
    es = Prec(instr.src_data_format).bytes
    spread = max(1, instr.src_hsize // max(1, instr.index_hsize))
    rows = (1, instr.src_csize, instr.index_hsize, instr.src_wsize)
    src = _side(instr.src_start_addr, rows, (0, instr.src_cstride, instr.src_hstride * spread, 1), es, chip)
    return src, _side(instr.dst_start_addr, instr.dst_shape, instr.dst_strides, es, chip)
