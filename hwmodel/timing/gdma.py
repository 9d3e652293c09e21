"""GDMA command timing: setup, read and write streams of bursts, outstanding credits, LMEM port, WDC.

One command runs at a time (the next dispatches after transfer_done), pipelined inside:

* t0 = dispatch + cmd_setup_cycles. The read side issues its bursts in order, one every
  segment_issue_cycles (+ unaligned_penalty_cycles for a burst that does not start on a bus word).
* DDR reads need a read credit (gdma.outstanding_reads, a semaphore: the (outstanding+1)-th request
  waits for the first response; see _DdrStream). Read data return over the GDMA data bus,
  bus_bytes per GDMA cycle, in arrival order; a credit is freed when its data have arrived.
* LMEM reads and writes go through the LMEM port: one burst after the other, each holding the port
  max(segment_issue_cycles, beats) cycles (+ unaligned penalty), data after lmem_access_latency_ns.
* The write side consumes the read side's byte stream in order: a write burst is ready once every
  read burst up to its stream position (scaled by src/dst bytes for broadcasts) has delivered.
  DDR writes need write credits like reads (freed by the B response) and carry their data over the
  GDMA bus at issue (max(segment_issue_cycles, beats) cycles each).
* DDR->DDR copies: the reads are served first, then the writes (they share the same UMCs, so the
  DRAM occupancy is the same; only one read->write turnaround per UMC is charged).
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
    """All DDR requests of one direction of a command, solved as one fixed point (numpy over the command).

    Credits are a semaphore: request i (i >= O = outstanding) may issue once i - O + 1 requests have been
    answered, i.e. at the (i - O + 1)-th earliest response among the requests before it. A response of a
    request at or after i comes after i's issue, so the same value is the (i - O + 1)-th earliest of ALL
    the command's responses: credit = sort(responses)[i - O]. Starting from no credits, the responses
    are recomputed until the credits no longer change; the iteration only grows and its fixed point is
    the unique causal solution, so the result is exact, not an approximation."""

    def __init__(self, dma: "GdmaModel", bursts: Bursts, write: bool):
        self.dma, self.b, self.write = dma, bursts, write
        self.window = dma.outstanding[1 if write else 0]
        p = dma.period
        gap = np.full(len(bursts), dma.issue_gap)
        if write:
            gap = np.maximum(gap, bursts.beats * p)
        self.gap = gap + bursts.unaligned * dma.unaligned
        self.done = self.issue = np.empty(0, dtype=np.int64)
        self.credit_stall = 0
        self.ideal_end = 0
        self.iterations = 0

    def run(self, ready: np.ndarray) -> np.ndarray:
        """Data in (reads) / B response (writes) per burst (issue order), for bursts ready at `ready`."""
        dma, b, n, o = self.dma, self.b, len(self.b), self.window
        wdc, clock = dma.wdc, dma.clock
        ready = clock.align_array(ready)
        plan = wdc.plan(b.addr, b.size, self.write)
        beats = b.beats[plan.order] * dma.period
        before = np.cumsum(self.gap) - self.gap
        base = ready
        while True:
            self.iterations += 1
            issue = _serial(base, before)
            arrive = wdc.arrival(plan, issue)
            done = wdc.finish(plan, arrive)                 # service order
            release, order = self._released(done + plan.response_ps, beats)
            if n <= o:
                break
            credit = np.zeros(n, dtype=np.int64)
            credit[o:] = clock.align_array(release[:n - o])
            better = np.maximum(ready, credit)
            if np.all(better <= issue):                     # the new credits cannot move any issue
                break
            if self.iterations > 4 * n + 16:
                raise AssertionError("GDMA credit fixed point did not converge")
            base = better
        wdc.commit(plan, arrive, done)
        self._account(ready, base, issue)
        resp = np.empty(n, dtype=np.int64)
        resp[plan.order[order]] = release
        self.done, self.issue = resp, issue
        return resp

    def _released(self, resp: np.ndarray, beats: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(release times sorted, their service positions): reads release a credit once their data have
        crossed the GDMA data bus (bus_bytes per cycle, arrival order); writes at the B response."""
        order = np.argsort(resp, kind="stable")           # per-UMC runs are sorted already: cheap
        r = resp[order]
        if self.write:
            return r, order
        occ = beats[order]
        r = self.dma.clock.align_array(r)
        data = _serial(r, np.cumsum(occ) - occ) + occ
        if np.any(data[1:] < data[:-1]):
            again = np.argsort(data, kind="stable")
            return data[again], order[again]
        return data, order

    def _account(self, ready: np.ndarray, base: np.ndarray, issue: np.ndarray) -> None:
        free = np.empty(len(issue), dtype=np.int64)
        free[0] = 0
        free[1:] = issue[:-1] + self.gap[:-1]
        self.credit_stall = int(np.clip(base - np.maximum(free, ready), 0, None).sum())
        self.ideal_end = int((issue + self.dma.ideal_latency(self.b.size, self.write)).max())


def _serial(ready: np.ndarray, before: np.ndarray) -> np.ndarray:
    """serial_port with the occupancy prefix sums given: start_k = max(ready_k, start_{k-1} + occ_{k-1})."""
    return np.maximum.accumulate(ready - before) + before


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
        ready = np.full(len(rb), t0, dtype=np.int64)
        if lmem:
            return self._lmem_port(0, rb, ready)
        stream = _DdrStream(self, rb, write=False)
        streams.append(stream)
        return stream.run(ready)

    def _write(self, lmem: bool, wb: Bursts, ready: np.ndarray, streams: list) -> np.ndarray:
        if lmem:
            return self._lmem_port(1, wb, ready)
        stream = _DdrStream(self, wb, write=True)
        streams.append(stream)
        return stream.run(ready)

    @staticmethod
    def _need(rb: Bursts, wb: Bursts, src_bytes: int, dst_bytes: int) -> np.ndarray:
        """Index of the read burst whose data completes each write burst's input."""
        need = wb.stream_end if src_bytes == dst_bytes else -(-wb.stream_end * src_bytes // dst_bytes)
        return np.minimum(np.searchsorted(rb.stream_end, need, side="left"), len(rb) - 1)

    def _ready(self, rb: Bursts, wb: Bursts, data: np.ndarray, src_bytes: int, dst_bytes: int) -> np.ndarray:
        return np.maximum.accumulate(data)[self._need(rb, wb, src_bytes, dst_bytes)]
