"""GDMA command timing: setup, read and write streams of bursts, outstanding credits, LMEM port, WDC.

One command runs at a time (the next dispatches after transfer_done), pipelined inside:

* t0 = dispatch + cmd_setup_cycles. The read side issues its bursts in order, one every
  segment_issue_cycles (+ unaligned_penalty_cycles for a burst that does not start on a bus word).
* DDR reads need a read credit (gdma.outstanding_reads): requests go in windows of that many; the
  k-th request of a window takes the credit the k-th earliest response of the previous window
  returns (a semaphore; the (outstanding+1)-th request waits for the first response). Read data
  return over the GDMA data bus, bus_bytes per GDMA cycle, in arrival order; a credit is freed when
  its data have arrived.
* LMEM reads and writes go through the LMEM port: one burst after the other, each holding the port
  max(segment_issue_cycles, beats) cycles (+ unaligned penalty), data after lmem_access_latency_ns.
* The write side consumes the read side's byte stream in order: a write burst is ready once every
  read burst up to its stream position (scaled by src/dst bytes for broadcasts) has delivered.
  DDR writes need write credits like reads (freed by the B response) and carry their data over the
  GDMA bus at issue (max(segment_issue_cycles, beats) cycles each).
* DDR->DDR copies alternate read and write windows so both directions reach the UMCs in time order.
* Completion (in order): the last write acknowledgement, on a GDMA clock edge; tdma_sync_id follows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tpuflow.chip import ChipConfig
from tpuflow.hwmodel.timing.clocks import Clocks, ns_to_ps
from tpuflow.hwmodel.timing.segments import Bursts, side_bursts, transfer_sides
from tpuflow.hwmodel.timing.wdc import Wdc, serial_port
from tpuflow.isa import Instruction, SysDma


@dataclass
class DmaTiming:
    end: int               # ps
    credit_stall: int      # ps the issue threads waited for credits
    dram_stall: int        # ps the last DDR response came after an ideal memory's
    ddr_bursts: int
    nbytes: int


class _DdrStream:
    """One direction of DDR traffic of a command, processed window by window (window = credits).

    Credits are a semaphore: request i (i >= O outstanding) may issue once i - O + 1 requests have
    been answered, i.e. at the (i - O + 1)-th earliest response of the requests before it. Within a
    window that depends on the window's own early responses, so the window is iterated to its fixed
    point: credit_i = the (i - O + 1)-th smallest of all responses so far (a response of a request
    at or after i comes after i's issue and cannot change it)."""

    MAX_ITERATIONS = 64

    def __init__(self, dma: "GdmaModel", bursts: Bursts, write: bool):
        self.dma, self.b, self.write = dma, bursts, write
        self.window = dma.outstanding[1 if write else 0]
        self.pos = 0
        self.issue_free = 0
        self.released = np.empty(0, dtype=np.int64)   # sorted responses not yet taken as credits
        self.taken = 0                                 # credits taken so far
        self.credit_stall = 0
        self.iterations = 0
        p = dma.period
        gap = np.full(len(bursts), dma.issue_gap)
        if write:
            gap = np.maximum(gap, bursts.beats * p)
        self.gap = gap + bursts.unaligned * dma.unaligned
        self.done = np.empty(len(bursts), dtype=np.int64)
        self.ideal_end = 0

    @property
    def finished(self) -> bool:
        return self.pos >= len(self.b)

    def step(self, ready: np.ndarray) -> None:
        """Issue the next len(ready) (<= window) bursts, ready at the given times."""
        dma, n, i = self.dma, len(ready), self.pos
        need = np.arange(i, i + n) - self.window - self.taken     # index into the released pool
        has = need >= 0
        ready = dma.clock.align_array(ready)
        credit = np.where(has, self.released[np.maximum(need, 0)] if len(self.released) else 0, 0)
        snap = dma.wdc.snapshot() if has.any() else None
        while True:
            self.iterations += 1
            base = dma.clock.align_array(np.maximum(ready, credit))
            issue, resp = self._serve(i, n, base)
            if snap is None:
                pool = np.sort(np.concatenate([self.released, resp]))
                break
            pool = np.sort(np.concatenate([self.released, resp]))
            better = np.where(has, pool[np.maximum(need, 0)], 0)
            if np.array_equal(better, credit) or self.iterations > self.MAX_ITERATIONS * (1 + i // self.window):
                break
            credit = better
            dma.wdc.restore(snap)
        self._account(i, n, ready, base, issue)
        self.done[i:i + n] = resp
        used = int(has.sum())
        self.released = pool[used:]
        self.taken += used
        self.pos += n

    def _serve(self, i: int, n: int, base: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        gap = self.gap[i:i + n]
        issue = serial_port(base, gap, self.issue_free)
        resp = self.dma.wdc.service(self.b.addr[i:i + n], self.b.size[i:i + n], self.write, issue)
        if not self.write:
            resp = self._receive(resp, self.b.beats[i:i + n])
        return issue, resp

    def _account(self, i: int, n: int, ready: np.ndarray, base: np.ndarray, issue: np.ndarray) -> None:
        gap = self.gap[i:i + n]
        free = np.empty(n, dtype=np.int64)
        free[0] = self.issue_free
        free[1:] = issue[:-1] + gap[:-1]
        self.credit_stall += int(np.clip(base - np.maximum(free, ready), 0, None).sum())
        self.issue_free = int(issue[-1] + gap[-1])
        size = self.b.size[i:i + n]
        self.ideal_end = max(self.ideal_end, int((issue + self.dma.ideal_latency(size, self.write)).max()))

    def _receive(self, resp: np.ndarray, beats: np.ndarray) -> np.ndarray:
        """Read data cross the GDMA data bus in arrival order; returns when each burst's data is in.
        (The bus is shared in arrival order within a window; across windows arrivals interleave in
        time and the bus, faster than the DRAM, is not a queue.)"""
        p = self.dma.period
        order = np.argsort(resp, kind="stable")
        occ = beats[order] * p
        start = serial_port(self.dma.clock.align_array(resp[order]), occ, 0)
        out = np.empty_like(resp)
        out[order] = start + occ
        return out


class GdmaModel:
    """Timing of GDMA commands on one core, sharing the core's WDC state."""

    def __init__(self, chip: ChipConfig, clocks: Clocks, wdc: Wdc):
        g = chip.gdma
        self.chip, self.wdc = chip, wdc
        self.clock = clocks.gdma
        self.period = clocks.gdma.period
        self.burst_bytes = min(g.bus_bytes * g.max_burst_beats, 1 << chip.wdc.interleave_bits, chip.dram.page_bytes)
        self.setup = g.cmd_setup_cycles * self.period
        self.issue_gap = g.segment_issue_cycles * self.period
        self.unaligned = g.unaligned_penalty_cycles * self.period
        self.lmem_latency = ns_to_ps(g.lmem_access_latency_ns)
        self.outstanding = (g.outstanding_reads, g.outstanding_writes)
        self.lmem_free = [0, 0]   # LMEM port: read side, write side

    def ideal_latency(self, size: np.ndarray, write: bool) -> np.ndarray:
        """Issue-to-done of a DDR request with an idle, page-hit DRAM."""
        w = self.wdc
        beats = -(-size // w.beat_bytes)
        if write:
            return w.request_ps + -(-size // w.fabric_bytes) * w.fabric_ps + beats * w.beat_ps + w.response_ps
        return w.request_ps + beats * w.beat_ps + w.min_read_ps + w.response_ps + -(-size // self.chip.gdma.bus_bytes) * self.period

    def run(self, instr: Instruction, start: int) -> DmaTiming:
        """Timeline of one command dispatched at `start` (ps)."""
        if isinstance(instr, SysDma):
            return DmaTiming(start + self.setup, 0, 0, 0, 0)
        src, dst = transfer_sides(instr, self.chip)
        t0 = start + self.setup
        wb = side_bursts(dst, self.chip, self.burst_bytes)
        rb = side_bursts(src, self.chip, self.burst_bytes) if src is not None else None
        streams: list[_DdrStream] = []
        if rb is None:
            done = self._write(dst.lmem, wb, np.full(len(wb), t0, dtype=np.int64), streams)
        elif not src.lmem and not dst.lmem:
            done = self._ddr_copy(rb, wb, t0, src.nbytes, dst.nbytes, streams)
        else:
            data = self._read(src.lmem, rb, t0, streams)
            ready = self._ready(rb, wb, data, src.nbytes, dst.nbytes)
            done = self._write(dst.lmem, wb, ready, streams)
        end = self.clock.align(int(done.max()))
        credit = sum(s.credit_stall for s in streams)
        ideal = max((s.ideal_end for s in streams), default=0)
        last = max((int(s.done.max()) for s in streams if len(s.done)), default=0)
        return DmaTiming(end, credit, max(0, last - ideal), sum(len(s.b) for s in streams), dst.nbytes)

    # ------------------------------------------------------------------ sides
    def _lmem_port(self, which: int, bursts: Bursts, ready: np.ndarray) -> np.ndarray:
        """Completion times of LMEM accesses through the port (read side 0, write side 1)."""
        occ = np.maximum(self.issue_gap, bursts.beats * self.period) + bursts.unaligned * self.unaligned
        start = serial_port(ready, occ, self.lmem_free[which])
        self.lmem_free[which] = int(start[-1] + occ[-1])
        return start + bursts.beats * self.period + self.lmem_latency

    def _read(self, lmem: bool, rb: Bursts, t0: int, streams: list) -> np.ndarray:
        if lmem:
            return self._lmem_port(0, rb, np.full(len(rb), t0, dtype=np.int64))
        stream = _DdrStream(self, rb, write=False)
        streams.append(stream)
        while not stream.finished:
            n = min(stream.window, len(rb) - stream.pos)
            stream.step(np.full(n, t0, dtype=np.int64))
        return stream.done

    def _write(self, lmem: bool, wb: Bursts, ready: np.ndarray, streams: list) -> np.ndarray:
        if lmem:
            return self._lmem_port(1, wb, ready)
        stream = _DdrStream(self, wb, write=True)
        streams.append(stream)
        while not stream.finished:
            n = min(stream.window, len(wb) - stream.pos)
            stream.step(ready[stream.pos:stream.pos + n])
        return stream.done

    @staticmethod
    def _need(rb: Bursts, wb: Bursts, src_bytes: int, dst_bytes: int) -> np.ndarray:
        """Index of the read burst whose data completes each write burst's input."""
        need = wb.stream_end if src_bytes == dst_bytes else -(-wb.stream_end * src_bytes // dst_bytes)
        return np.minimum(np.searchsorted(rb.stream_end, need, side="left"), len(rb) - 1)

    def _ready(self, rb: Bursts, wb: Bursts, data: np.ndarray, src_bytes: int, dst_bytes: int) -> np.ndarray:
        return np.maximum.accumulate(data)[self._need(rb, wb, src_bytes, dst_bytes)]

    def _ddr_copy(self, rb: Bursts, wb: Bursts, t0: int, src_bytes: int, dst_bytes: int,
                  streams: list) -> np.ndarray:
        reads, writes = _DdrStream(self, rb, write=False), _DdrStream(self, wb, write=True)
        streams += [reads, writes]
        need = self._need(rb, wb, src_bytes, dst_bytes)
        while not writes.finished:
            if not reads.finished and need[writes.pos] >= reads.pos:
                n = min(reads.window, len(rb) - reads.pos)
                reads.step(np.full(n, t0, dtype=np.int64))
                continue
            available = int(np.searchsorted(need, reads.pos, side="left"))
            n = min(writes.window, available - writes.pos)
            data = np.maximum.accumulate(reads.done[:reads.pos])
            writes.step(data[need[writes.pos:writes.pos + n]])
        return writes.done
