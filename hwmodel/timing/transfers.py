"""What each GDMA command asks of the memory system (closed form, vectorised over a queue): fixed latency,
the core's own rate limits, and DRAM occupancy per UMC; the rate model (memory.py) runs them as flows.

A command is one transfer: its read side feeds its write side through the GDMA. Alone on the chip it
takes (ps, t = dispatch)

    end = align_gdma(t + latency + max(port, dram))

* latency = cmd_setup + head + tail: the pipeline fill and drain of one burst, not a rate
    head (read side)  DDR:  request path + dram.min_read + response path + the burst's GDMA bus beats
                      LMEM: the burst's beats + gdma.lmem_access_latency
    tail (write side) LMEM: the burst's beats + gdma.lmem_access_latency
                      DDR:  request path with the data over the fabric + the B response path
  (paths: wdc.WdcParams request_ps / response_ps, the same hops as the per-burst model).
* port = the core's own limits, each the time its busiest stage needs for the whole command:
    read issue      sum(segment_issue + unaligned penalty) over DDR read bursts
    GDMA data bus   sum(bus words x gdma period) over DDR read bursts
    DDR write issue sum(max(segment_issue, beats) + unaligned) over DDR write bursts (data at issue)
    LMEM ports      sum(max(segment_issue, beats) + unaligned) over the LMEM bursts of each side
    credits         sum(round trip of each DDR request, unloaded) / gdma.outstanding_reads (writes):
                    at most O requests in flight, so O per round trip (Little's law)
    direction floor charged DDR bytes / (direction rate x efficiency) - head - tail (gdma.py; bm1684x):
                    a command never ends before setup + floor, as in the per-burst model
* dram = max over UMCs of the UMC's occupancy (+ reorder, below): sum over the command's requests on that UMC of
    beats x beat_ps + (page hit: a direction turnaround if the UMC's previous request went the other
    way; bank closed: open_page; page miss: close + open), requests served per UMC in the AuxCam
    order of the per-burst model (wdc._service_order) with the open rows carried from command to
    command in queue order. beat_ps = U x data_width / dram.peak_gbps: one core sees each of the U
    UMCs at 1/U of its port rate, exactly as in the per-burst model.

* reorder: the write side consumes the read stream in order, but each UMC serves its granule's
  bursts one after the other, so the data of the last interleave round (U granules) all arrive at
  the end of the DRAM phase and are written after it: + write-side time x (min(DDR bytes read,
  U x granule) - granule) / DDR bytes read (the round's first granule trickles in during the phase).

`occupancy[u]` (ps of UMC u) is what the command takes from the shared DRAM; memory.SharedMemory
divides the UMCs between concurrent commands. A command without DDR side only has port and latency.
Not modelled at this level: the fabrics' per-UMC outstanding limits (the UMC is the bottleneck where
they would bind) and the queueing of one request behind another's page miss inside a UMC beyond its
occupancy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tpuflow.chip import ChipConfig
from tpuflow.hwmodel.timing.clocks import Clocks, ns_to_ps
from tpuflow.hwmodel.timing.gdma import DDR, LMEM, NONE, CommandModel, _Side, direction_floor_ps
from tpuflow.hwmodel.timing.wdc import (DramState, WdcParams, _count, _direction_switch, _page_state, _service_order,
                                        runs)
from tpuflow.isa import Instruction


@dataclass
class TransferCosts:
    """Per GDMA command (queue order), in ps: fixed latency, the port limits but the credits (`port`), the
    credit term, the busiest UMC's occupancy, and the UMC occupancies (`occupancy_of(i)`)."""

    latency: list[int]
    port: list[int]
    credit: list[int]
    dram: list[int]
    occupancy: np.ndarray         # (commands, UMCs) ps
    ddr_bytes: list[int]
    state: DramState

    def occupancy_of(self, index: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(UMCs, their occupancy ps) of command `index`."""
        row = self.occupancy[index]
        used = np.flatnonzero(row)
        return tuple(used.tolist()), tuple(row[used].tolist())

    def solo_ps(self, index: int) -> int:
        """Bandwidth phase of command `index` alone on the chip."""
        return max(self.port[index], self.credit[index], self.dram[index])


class TransferModel:
    """Computes the TransferCosts of a GDMA queue (see the module docstring)."""

    def __init__(self, chip: ChipConfig, clocks: Clocks):
        g = chip.gdma
        self.chip, self.commands = chip, CommandModel(chip, clocks)
        self.p = WdcParams.of(chip, clocks)
        self.period = clocks.gdma.period
        self.setup = g.cmd_setup_cycles * self.period
        self.issue_gap = g.segment_issue_cycles * self.period
        self.unaligned = g.unaligned_penalty_cycles * self.period
        self.lmem_latency = ns_to_ps(g.lmem_access_latency_ns)
        self.outstanding = (g.outstanding_reads, g.outstanding_writes)

    def costs(self, instrs: list[Instruction], same: list[int] | None = None) -> TransferCosts:
        sides: list = []
        for i, instr in enumerate(instrs):
            first = same[i] if same is not None else i
            sides.append(sides[first] if first < i else self.commands._sides(instr))
        n = len(instrs)
        reads, writes, rk, wk, src_bytes, dst_bytes, charged = (list(c) for c in zip(*sides)) if sides else ([],) * 7
        rs, ws = _Side(reads, rk), _Side(writes, wk)
        state = DramState(self.p)
        occ, service_rt = self._dram(rs, ws, state, n)
        base, credit = self._port(rs, ws, service_rt, n)
        fill = self._head(rs, n) + self._tail(ws, n)
        floor = direction_floor_ps(self.chip, rk, wk, charged, charged)
        base = np.maximum(base, floor - fill)          # the floor counts from setup, as in the per-burst model
        latency = self.setup + fill
        busiest = (occ.max(axis=1) + self.reorder) if n else np.zeros(0, dtype=np.int64)
        ddr = np.bincount(rs.cmd[rs.select(DDR)], weights=rs.size[rs.select(DDR)], minlength=n) + \
            np.bincount(ws.cmd[ws.select(DDR)], weights=ws.size[ws.select(DDR)], minlength=n)
        return TransferCosts(latency.tolist(), base.tolist(), credit.tolist(), busiest.tolist(), occ,
                             ddr.astype(np.int64).tolist(), state)

    # ---- DRAM occupancy
    def _dram(self, rs: _Side, ws: _Side, state: DramState, n: int) -> tuple[np.ndarray, tuple]:
        """(occupancy ps per command and UMC, (per DDR burst in side order: service ps) for reads, writes)."""
        p = self.p
        r, w = rs.select(DDR), ws.select(DDR)
        occ = np.zeros((n, p.umcs), dtype=np.int64)
        if not len(r) and not len(w):
            return occ, (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
        cmd = np.concatenate([rs.cmd[r], ws.cmd[w]])
        write = np.concatenate([np.zeros(len(r), dtype=bool), np.ones(len(w), dtype=bool)])
        stream = cmd * 2 + write
        order = np.argsort(stream, kind="stable")          # reads of a command before its writes
        addr = np.concatenate([rs.addr[r], ws.addr[w]])[order]
        size = np.concatenate([rs.size[r], ws.size[w]])[order]
        write, stream = write[order], stream[order]
        umc, bank_key, row = p.decode(addr)
        served = _service_order(p, umc, stream, bank_key, row)
        u, wr = umc[served], write[served]
        hit, closed = _page_state(bank_key[served], row[served], state)
        switch = _direction_switch(u, wr, state)
        beats = -(-size[served] // p.beat_bytes)
        close = np.where(wr, p.close_ps[1], p.close_ps[0])
        turn = np.where(wr, p.turn_ps[1], p.turn_ps[0])
        service = beats * p.beat_ps + np.where(hit, switch * turn, np.where(closed, p.open_ps, close + p.open_ps))
        _count(state, u, hit, closed, size, write)
        starts, _ = runs(stream[served] * p.umcs + u)     # served order is grouped by (stream, UMC)
        sums = np.add.reduceat(service, starts)
        np.add.at(occ.reshape(-1), (stream[served][starts] // 2) * p.umcs + u[starts], sums)
        per_request = np.empty(len(served), dtype=np.int64)     # back to side order: reads then writes
        per_request[served] = service
        by_side = np.empty(len(order), dtype=np.int64)
        by_side[order] = per_request
        return occ, (by_side[:len(r)], by_side[len(r):])

    # ---- the core's own limits
    def _port(self, rs: _Side, ws: _Side, service: tuple, n: int) -> tuple[np.ndarray, np.ndarray]:
        p, period = self.p, self.period
        terms = []

        def total(side: _Side, sel: np.ndarray, per: np.ndarray) -> np.ndarray:
            return np.bincount(side.cmd[sel], weights=per, minlength=n).astype(np.int64)

        def hold(side: _Side, sel: np.ndarray) -> np.ndarray:
            return np.maximum(self.issue_gap, side.beats[sel] * period) + side.unaligned[sel] * self.unaligned

        r = rs.select(DDR)
        bus = -(-rs.size[r] // self.chip.gdma.bus_bytes) * period
        terms.append(total(rs, r, self.issue_gap + rs.unaligned[r] * self.unaligned))
        terms.append(total(rs, r, bus))
        trip_r = p.request_ps + service[0] + p.min_read_ps + p.response_ps + bus
        credit_r = -(-total(rs, r, trip_r) // self.outstanding[0])
        w = ws.select(DDR)
        terms.append(total(ws, w, hold(ws, w)))
        trip_w = p.request_latency(ws.size[w], True) + service[1] + p.response_ps
        credit_w = -(-total(ws, w, trip_w) // self.outstanding[1])
        for side in (rs, ws):
            lm = side.select(LMEM)
            terms.append(total(side, lm, hold(side, lm)))
        credit = np.maximum(credit_r, credit_w)
        # in-order write side behind per-UMC reads: the last interleave round arrives together
        writes = np.maximum(terms[2], terms[4])
        ddr_read = total(rs, r, rs.size[r])
        round_bytes, granule = p.umcs << p.granule_bits, 1 << p.granule_bits
        late = np.maximum(0, np.minimum(ddr_read, round_bytes) - granule)
        self.reorder = np.where(ddr_read > 0, writes * late // np.maximum(ddr_read, 1), 0)
        return np.max(terms, axis=0), credit

    # ---- pipeline fill and drain
    def _head(self, rs: _Side, n: int) -> np.ndarray:
        """Fill: the read side's first data (per command, by its kind and its last burst's size)."""
        p, period = self.p, self.period
        head = np.zeros(n, dtype=np.int64)
        last = self._last_burst(rs, n)
        kind = rs.kind
        has = last >= 0
        beats = np.where(has, rs.beats[np.maximum(last, 0)] if len(rs.beats) else 0, 0)
        size = np.where(has, rs.size[np.maximum(last, 0)] if len(rs.size) else 0, 0)
        ddr = has & (kind == DDR)
        lmem = has & (kind == LMEM)
        head[ddr] = p.request_ps + p.min_read_ps + p.response_ps + (-(-size[ddr] // self.chip.gdma.bus_bytes)) * period
        head[lmem] = beats[lmem] * period + self.lmem_latency
        return head

    def _tail(self, ws: _Side, n: int) -> np.ndarray:
        """Drain: the write side's last burst done (LMEM write, or DDR write acknowledged)."""
        p, period = self.p, self.period
        tail = np.zeros(n, dtype=np.int64)
        last = self._last_burst(ws, n)
        has = last >= 0
        beats = np.where(has, ws.beats[np.maximum(last, 0)] if len(ws.beats) else 0, 0)
        size = np.where(has, ws.size[np.maximum(last, 0)] if len(ws.size) else 0, 0)
        ddr = has & (ws.kind == DDR)
        lmem = has & (ws.kind == LMEM)
        tail[lmem] = beats[lmem] * period + self.lmem_latency
        tail[ddr] = p.request_latency(size[ddr], True) + p.response_ps
        return tail

    @staticmethod
    def _last_burst(side: _Side, n: int) -> np.ndarray:
        """Index of each command's last burst on this side (-1: none)."""
        return np.where(side.counts > 0, side.start + side.counts - 1, -1) if n else np.zeros(0, dtype=np.int64)


__all__ = ["TransferCosts", "TransferModel", "NONE", "LMEM", "DDR"]
