"""WDC memory path and DRAM timing: fabrics, interleave, AuxCam, X2x and one DramUnit per UMC (numpy).

Path of a DDR request (sg2260 numbers; every one comes from chip.wdc / chip.dram / chip.clocks):

  GDMA -> fab1t2 (clk2G) -> ItlvDemux (clk800M) -> private fab  (or shared fab1 -> shared fab2)
       -> Fab2t1 -> AuxCam -> X2x (800 MHz/1024 bit -> 400 MHz/256 bit) -> DramUnit (clk400M)

* Interleave: granule = 2**interleave_bits bytes; granule g goes to UMC g % U (U = channels *
  umcs_per_channel), channel = UMC // umcs_per_channel; the UMC-local address drops the UMC bits.
  DRAM page = local // page_bytes, bank = page % banks_per_umc, row = page // banks_per_umc.
* Request latency: fabric_hop_cycles at each level (fab1t2 at clk2G; ItlvDemux, each fab level,
  Fab2t1 and AuxCam at clk800M), then X2x's ar_process: one UMC cycle. Write data follow the
  address over the fabric: + ceil(bytes / fabric width) clk800M cycles. The DramUnit starts a
  request on a UMC clock edge, never before the previous request on that UMC has finished
  (strictly in order). The fabrics' bandwidth (>= 100 GB/s per channel) exceeds the DRAM's and is
  not a separate queue.
* Outstanding limits: a Fab2t1 admits at most fab2t1_outstanding requests per UMC (shared path:
  shared_fab2_outstanding per fab2, shared_fab1_outstanding per channel). A request over the
  limit waits at that level until the request `limit` places before it in the same group has
  finished, and holds every later request of its stream on its channel (in-order fabric).
* AuxCam (page-aware reordering): a UMC's requests of one stream are served in windows of
  cam_table_entries that never mix requests more than gdma outstanding apart in issue order (those
  cannot sit in the table together); inside a window, requests to the same DRAM page are served
  together, pages in the order they first appear, arrival order within a page.
* DramUnit service (beat period = U * data_width_bytes / peak_gbps, so the UMCs together deliver
  dram.peak_gbps; beats = ceil(len / data_width_bytes)):
    page hit, same direction as the UMC's previous request: beats * period
    page hit after a direction switch: min_write_to_read / min_read_to_write + beats * period
    bank closed (first use):  open_page + beats * period
    page miss (other row open): read/write_close_page (by this request's direction) + open_page
                                + beats * period
* Response: reads add min_read_ns (controller + PHY latency, pipelined), then X2x's r_process
  (one clk800M cycle) and the same hops back; writes return their B response the same way.

Which request finds which page open, which switches direction, and in which order a UMC serves a
stream's requests does not depend on time (one GDMA command runs at a time, in queue order), so
DramPlan computes all of it once, vectorised over a whole program; only the in-order FIFO
recurrence of the UMCs depends on arrival times (DramPlan.finish).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tpuflow.chip import ChipConfig
from tpuflow.hwmodel.timing.clocks import Clock, Clocks, ns_to_ps

BIG = 1 << 40   # > any time span inside one command (1.1 s): keeps segmented scans' groups apart


def runs(sorted_keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(starts, lengths) of the runs of equal values of an array."""
    n = len(sorted_keys)
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    change = np.empty(n, dtype=bool)
    change[0] = True
    np.not_equal(sorted_keys[1:], sorted_keys[:-1], out=change[1:])
    starts = np.flatnonzero(change)
    return starts, np.diff(np.append(starts, n))


def group_rank(counts: np.ndarray) -> np.ndarray:
    """0, 0, .., 1, 1, .. : the run number of every element, for runs of the given lengths."""
    return np.repeat(np.arange(len(counts), dtype=np.int64), counts)


def seg_cummax(x: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """Running maximum that restarts at every run (rank = run number, non-decreasing)."""
    offset = rank * BIG
    return np.maximum.accumulate(x + offset) - offset


def seg_serial(ready: np.ndarray, occupancy: np.ndarray, rank: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Start times of one server per run: start_k = max(ready_k, start_{k-1} + occupancy_{k-1}), the
    first item of each run (indices `first`) starting at its ready time."""
    total = np.cumsum(occupancy)
    before = total - occupancy
    before = before - np.repeat(before[first], np.diff(np.append(first, len(ready))))
    return seg_cummax(ready - before, rank) + before


@dataclass(frozen=True)
class WdcParams:
    """Every constant of the memory path, in ps and bytes, from the chip."""

    umcs: int
    umcs_per_channel: int
    granule_bits: int
    page_bytes: int
    banks: int
    beat_bytes: int
    beat_ps: int
    open_ps: int
    close_ps: tuple[int, int]        # read, write
    turn_ps: tuple[int, int]         # switch into read (w->r), into write (r->w)
    min_read_ps: int
    request_ps: int
    response_ps: int
    fabric_bytes: int
    fabric_ps: int
    cam_entries: int
    limits: tuple[tuple[int, int], ...]   # (UMCs per group, outstanding limit) per limited level
    outstanding: int
    umc_clock: Clock

    @classmethod
    def of(cls, chip: ChipConfig, clocks: Clocks) -> "WdcParams":
        w, d = chip.wdc, chip.dram
        umcs = chip.umc_count
        fab, fast = clocks.fabric.period, clocks.fabric_fast.period
        levels = 4 + (1 if w.shared_region else 0)   # ItlvDemux, fab level(s), Fab2t1, AuxCam
        hops = w.fabric_hop_cycles * (fast + levels * fab)
        limits = [(1, w.fab2t1_outstanding)]
        if w.shared_region:
            limits += [(w.shared_fab2_fanout, w.shared_fab2_outstanding), (w.umcs_per_channel, w.shared_fab1_outstanding)]
        return cls(umcs=umcs, umcs_per_channel=w.umcs_per_channel, granule_bits=w.interleave_bits,
                   page_bytes=d.page_bytes, banks=d.banks_per_umc, beat_bytes=d.data_width_bytes,
                   beat_ps=round(umcs * d.data_width_bytes * 1000 / d.peak_gbps), open_ps=ns_to_ps(d.open_page_ns),
                   close_ps=(ns_to_ps(d.read_close_page_ns), ns_to_ps(d.write_close_page_ns)),
                   turn_ps=(ns_to_ps(d.min_write_to_read_ns), ns_to_ps(d.min_read_to_write_ns)),
                   min_read_ps=ns_to_ps(d.min_read_ns), request_ps=hops + clocks.umc.period,
                   response_ps=fab + hops, fabric_bytes=w.fabric_width_bits // 8, fabric_ps=fab,
                   cam_entries=w.cam_table_entries, limits=tuple(limits),
                   outstanding=max(chip.gdma.outstanding_reads, chip.gdma.outstanding_writes), umc_clock=clocks.umc)

    def decode(self, addr: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(umc, bank key = umc * banks + bank, row) of DDR byte addresses."""
        umc, page = self.umc_page(addr)
        if self.banks & (self.banks - 1) == 0:
            bb = self.banks.bit_length() - 1
            return umc, (umc << bb) | (page & (self.banks - 1)), page >> bb
        return umc, umc * self.banks + page % self.banks, page // self.banks

    def umc_page(self, addr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(umc, UMC-local page = row * banks + bank) of DDR byte addresses."""
        g = addr >> self.granule_bits
        if all(v & (v - 1) == 0 for v in (self.umcs, self.page_bytes)):   # shifts and masks
            ub, pb = (v.bit_length() - 1 for v in (self.umcs, self.page_bytes))
            umc = g & (self.umcs - 1)
            return umc, (((g >> ub) << self.granule_bits) | (addr & ((1 << self.granule_bits) - 1))) >> pb
        local = ((g // self.umcs) << self.granule_bits) | (addr & ((1 << self.granule_bits) - 1))
        return g % self.umcs, local // self.page_bytes

    def unloaded_read_ps(self, nbytes: int, miss: bool = False) -> int:
        """Issue-to-response time of one read reaching an idle UMC on a clock edge (page hit, or a
        miss that closes another row first)."""
        beats = -(-nbytes // self.beat_bytes)
        extra = self.close_ps[0] + self.open_ps if miss else 0
        return self.request_ps + extra + beats * self.beat_ps + self.min_read_ps + self.response_ps

    def request_latency(self, size: np.ndarray, write: bool) -> np.ndarray | int:
        if write:
            return self.request_ps + -(-size // self.fabric_bytes) * self.fabric_ps
        return self.request_ps

    def response_latency(self, write: bool) -> int:
        return self.response_ps if write else self.min_read_ps + self.response_ps


class DramState:
    """What a DRAM remembers between plans: open row per bank, last direction per UMC, counters."""

    def __init__(self, p: WdcParams):
        self.open_row = np.full(p.umcs * p.banks, -1, dtype=np.int64)
        self.last_dir = np.full(p.umcs, -1, dtype=np.int64)
        self.page_hits = np.zeros(p.umcs, dtype=np.int64)
        self.page_misses = np.zeros(p.umcs, dtype=np.int64)
        self.page_opens = np.zeros(p.umcs, dtype=np.int64)
        self.bytes_read = 0
        self.bytes_written = 0
        self.bursts = 0


class Direction:
    """One direction (reads or writes) of a DramPlan: its requests in service order."""

    def __init__(self, p: WdcParams, pos: np.ndarray, index: np.ndarray, stream: np.ndarray, umc: np.ndarray,
                 service: np.ndarray, size: np.ndarray, write: bool):
        self.p, self.write = p, write
        self.index = index            # issue-order index (into this direction's arrays) per served request
        self.stream = stream          # stream id per served request
        self.umc = umc
        self.service = service
        self.size = size              # per served request
        self.starts, self.counts = runs(stream * p.umcs + umc)
        rank = group_rank(self.counts)
        total = np.cumsum(service)
        base = np.repeat(total[self.starts] - service[self.starts], self.counts)
        self.incl = total - base
        self.excl = self.incl - service
        self.offset = rank * BIG
        self.run_key = (stream * p.umcs + umc)[self.starts]
        self.response_ps = p.response_latency(write)
        self.limits: FabricLimits | None = None

    def finish(self, arrive_served: np.ndarray, init_free: np.ndarray | None = None) -> np.ndarray:
        """DramUnit completion times (service order) for arrival times given in service order; each
        (stream, UMC) run starts idle, or at init_free[run]."""
        x = self.p.umc_clock.align_array(arrive_served) - self.excl
        if init_free is not None:
            x[self.starts] = np.maximum(x[self.starts], init_free)
        return np.maximum.accumulate(x + self.offset) - self.offset + self.incl


class DramPlan:
    """The time-independent part of serving a sequence of request streams (a stream = the DDR reads or
    the DDR writes of one command; streams in execution order, requests of a stream in issue order)."""

    def __init__(self, p: WdcParams, addr: np.ndarray, size: np.ndarray, write: np.ndarray, stream: np.ndarray,
                 state: DramState):
        self.p = p
        n = len(addr)
        umc, bank_key, row = p.decode(addr)
        order = _service_order(p, umc, stream, bank_key, row)
        u, bk, r, w = umc[order], bank_key[order], row[order], write[order]
        hit, closed = _page_state(bk, r, state)
        switch = _direction_switch(u, w, state)
        beats = -(-size[order] // p.beat_bytes)
        close = np.where(w, p.close_ps[1], p.close_ps[0])
        turn = np.where(w, p.turn_ps[1], p.turn_ps[0])
        miss_cost = np.where(closed, p.open_ps, close + p.open_ps)
        service = beats * p.beat_ps + np.where(hit, switch * turn, miss_cost)
        _count(state, u, hit, closed, size, write)
        # per-direction issue index: position of each request among the requests of its direction
        dir_index = np.empty(n, dtype=np.int64)
        for flag in (False, True):
            sel = np.flatnonzero(write == flag)
            dir_index[sel] = np.arange(len(sel))
        self.directions = {}
        for flag in (False, True):
            pos = np.flatnonzero(w == flag)
            if len(pos):
                self.directions[flag] = Direction(p, pos, dir_index[order[pos]], stream[order[pos]], u[pos],
                                                  service[pos], size[order[pos]], flag)
        for flag, d in self.directions.items():
            d.limits = fabric_limits(p, umc[write == flag], stream[write == flag])


class FabricLimits:
    """Outstanding limits that can bind, in issue order of one direction: refs[level][i] = the request
    `limit` places before i in its group (-1: none, or so far back it is surely done), and the
    per-(stream, channel) order the in-order fabric keeps."""

    def __init__(self, refs: list[np.ndarray], order: np.ndarray, rank: np.ndarray):
        self.refs, self.order, self.rank = refs, order, rank

    def admit(self, arrive: np.ndarray, done_by_issue: np.ndarray) -> np.ndarray:
        """Arrivals held until each ref is done, then never passing an earlier request of their channel."""
        admit = arrive.copy()
        for ref in self.refs:
            has = ref >= 0
            admit[has] = np.maximum(admit[has], done_by_issue[ref[has]])
        admit[self.order] = seg_cummax(admit[self.order], self.rank)
        return admit

    def subset(self, keep: np.ndarray, inverse: np.ndarray) -> "FabricLimits":
        refs = []
        for ref in self.refs:
            r = ref[keep]
            refs.append(np.where(r >= 0, inverse[np.maximum(r, 0)], -1))
        order = inverse[self.order]
        order = order[order >= 0]
        return FabricLimits(refs, order, self.rank[np.isin(self.order, keep)])


def _narrow(keys: np.ndarray) -> np.ndarray:
    """16-bit keys when they fit (numpy sorts those with a stable radix sort)."""
    return keys.astype(np.int16) if len(keys) == 0 or int(keys.max()) < (1 << 15) else keys


def _may_exceed(group: np.ndarray, limit: int, window: int) -> bool:
    """Whether some `window` consecutive requests may hold more than `limit` of one group: any such window
    lies within two consecutive blocks of `window` requests."""
    groups = int(group.max()) + 1
    blocks = -(-len(group) // window)
    counts = np.bincount((np.arange(len(group)) // window) * groups + group, minlength=blocks * groups)
    counts = counts.reshape(blocks, groups)
    pairs = counts if blocks == 1 else counts[1:] + counts[:-1]
    return bool(pairs.max() > limit)


def fabric_limits(p: WdcParams, umc: np.ndarray, stream: np.ndarray) -> FabricLimits | None:
    """The FabricLimits of one direction's requests (issue order), or None when no limit can bind: at
    most `outstanding` requests are in flight, so a limit binds only if more than `limit` requests of one
    group fall within `outstanding` consecutive requests of a stream."""
    refs = []
    n = len(umc)
    index = first = None
    for per_group, limit in p.limits:
        if n <= limit or not _may_exceed(umc // per_group, limit, p.outstanding):
            continue
        if first is None:
            index, first = np.arange(n), np.searchsorted(stream, stream, side="left")
        group = stream * p.umcs + umc // per_group
        order = np.argsort((umc // per_group).astype(np.int16), kind="stable")
        order = order[np.argsort(_narrow(stream[order]), kind="stable")]
        g = group[order]
        starts, counts = runs(g)
        rank = index - np.repeat(starts, counts)
        back = np.full(n, -1, dtype=np.int64)
        has = rank >= limit
        back[has] = order[index[has] - limit]
        ref = np.empty(n, dtype=np.int64)
        ref[order] = back
        ref[(ref >= 0) & ((index - ref >= p.outstanding) | (ref < first))] = -1
        if np.any(ref >= 0):
            refs.append(ref)
    if not refs:
        return None
    channel = stream * p.umcs + umc // p.umcs_per_channel
    order = np.argsort((umc // p.umcs_per_channel).astype(np.int16), kind="stable")
    order = order[np.argsort(_narrow(stream[order]), kind="stable")]
    _, counts = runs(channel[order])
    return FabricLimits(refs, order, group_rank(counts))


def _service_order(p: WdcParams, umc, stream, bank_key, row, local_page=None) -> np.ndarray:
    """Issue indices in service order: by stream, then UMC (stable), then AuxCam page grouping. `local_page`
    (row * banks + bank, WdcParams.umc_page) may be given instead of bank_key and row."""
    if len(stream) and bool(np.all(stream[1:] >= stream[:-1])):
        # streams already in order (one command's or pattern's requests, reads then writes): one adaptive
        # stable sort of (stream, UMC) is the same order as the two radix passes below, faster
        order = np.argsort(stream * p.umcs + umc, kind="stable")
    else:
        order = np.argsort(umc.astype(np.int16), kind="stable")          # radix sorts (16-bit keys)
        order = order[np.argsort(_narrow(stream[order]), kind="stable")]
    key = stream[order] * p.umcs + umc[order]
    if local_page is not None:
        page = local_page[order]
    else:
        page = (bank_key[order] % p.banks) + row[order] * p.banks     # the UMC-local page number
    back = (key[1:] == key[:-1]) & (page[1:] < page[:-1])
    if not np.any(back):
        return order             # pages never go back within a (stream, UMC): already grouped
    starts, counts = runs(key)
    affected = np.zeros(len(starts), dtype=bool)           # only (stream, UMC) runs whose pages go back
    affected[np.searchsorted(starts, np.flatnonzero(back) + 1, side="right") - 1] = True
    sel = np.repeat(affected, counts)
    sub = _cam_reorder(p, order[sel], key[sel], page[sel], stream)
    order = order.copy()
    order[sel] = sub
    return order


def _cam_reorder(p: WdcParams, order, key, page, stream) -> np.ndarray:
    """AuxCam page grouping of whole (stream, UMC) runs (see the module docstring)."""
    starts, counts = runs(key)
    pos = np.arange(len(order)) - np.repeat(starts, counts)           # position among the UMC's requests
    stream_first = np.searchsorted(stream, stream[order], side="left")
    in_stream = order - stream_first                                   # issue position within the stream
    window = (group_rank(counts) * (1 << 20) + pos // p.cam_entries) * (1 << 20) + in_stream // p.outstanding
    by_page = np.lexsort((page, window))
    change = np.ones(len(order), dtype=bool)
    change[1:] = (window[by_page][1:] != window[by_page][:-1]) | (page[by_page][1:] != page[by_page][:-1])
    run_starts = np.flatnonzero(change)
    first = np.empty(len(order), dtype=np.int64)                       # where each page first appears
    first[by_page] = np.repeat(by_page[run_starts], np.diff(np.append(run_starts, len(order))))
    return order[np.lexsort((np.arange(len(order)), first))]


def _page_state(bank_key: np.ndarray, row: np.ndarray, state: DramState) -> tuple[np.ndarray, np.ndarray]:
    """(hit, bank closed) per request in service order; updates the open rows."""
    o2 = np.argsort(bank_key.astype(np.int16 if len(state.open_row) < (1 << 15) else np.int64), kind="stable")
    k2, r2 = bank_key[o2], row[o2]
    first = np.empty(len(k2), dtype=bool)
    first[0] = True
    np.not_equal(k2[1:], k2[:-1], out=first[1:])
    prev = np.empty_like(r2)
    prev[1:] = r2[:-1]
    prev[first] = state.open_row[k2[first]]
    last = np.append(first[1:], True)
    state.open_row[k2[last]] = r2[last]
    hit, closed = np.empty(len(k2), dtype=bool), np.empty(len(k2), dtype=bool)
    hit[o2] = prev == r2
    closed[o2] = prev < 0
    return hit, closed


def _direction_switch(u: np.ndarray, write: np.ndarray, state: DramState) -> np.ndarray:
    """Whether each request (service order) goes the other way than its UMC's previous one."""
    o = np.argsort(u.astype(np.int16), kind="stable")
    uu, ww = u[o], write[o].astype(np.int64)
    first = np.empty(len(uu), dtype=bool)
    first[0] = True
    np.not_equal(uu[1:], uu[:-1], out=first[1:])
    prev = np.empty_like(ww)
    prev[1:] = ww[:-1]
    prev[first] = state.last_dir[uu[first]]
    last = np.append(first[1:], True)
    state.last_dir[uu[last]] = ww[last]
    out = np.empty(len(uu), dtype=bool)
    out[o] = (prev >= 0) & (prev != ww)
    return out


def _count(state: DramState, u, hit, closed, size, write) -> None:
    n = len(state.page_hits)
    state.page_hits += np.bincount(u[hit], minlength=n)
    state.page_opens += np.bincount(u[closed], minlength=n)
    state.page_misses += np.bincount(u[~hit & ~closed], minlength=n)
    state.bytes_written += int(size[write].sum())
    state.bytes_read += int(size[~write].sum())
    state.bursts += len(u)


class Wdc:
    """A stateful memory path for direct experiments: serve(addr, size, write, issue) with absolute issue
    times, remembering open rows, directions and when each UMC is free (the simulator uses DramPlan
    over whole programs instead; both run the same code)."""

    def __init__(self, chip: ChipConfig, clocks: Clocks | None = None):
        self.p = WdcParams.of(chip, clocks or Clocks.of(chip))
        self.state = DramState(self.p)
        self.umc_free = np.zeros(self.p.umcs, dtype=np.int64)

    @property
    def stats(self) -> DramState:
        return self.state

    def service(self, addr: np.ndarray, size: np.ndarray, write: bool, issue: np.ndarray) -> np.ndarray:
        """Responses at the GDMA port (issue order) of one stream of requests issued at `issue`."""
        n = len(addr)
        plan = DramPlan(self.p, addr, size, np.full(n, write), np.zeros(n, dtype=np.int64), self.state)
        d = plan.directions[write]
        arrive = issue + self.p.request_latency(size, write)
        held = np.zeros(n, dtype=np.int64)
        while True:   # fabric admissions against the previous pass's done times, to their fixed point
            admitted = d.limits.admit(arrive, held) if d.limits is not None else arrive
            done = d.finish(admitted[d.index], self.umc_free[d.umc[d.starts]])
            if d.limits is None:
                break
            by_issue = np.empty(n, dtype=np.int64)
            by_issue[d.index] = done
            if np.array_equal(by_issue, held):
                break
            held = by_issue
        ends = d.starts + d.counts - 1
        self.umc_free[d.umc[ends]] = done[ends]
        out = np.empty(n, dtype=np.int64)
        out[d.index] = done + d.response_ps
        return out
