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
  finished, and holds every later request on its channel (in-order fabric, head-of-line).
* AuxCam (page-aware reordering): a UMC's requests are served in windows of cam_table_entries that
  also never mix requests more than gdma outstanding apart in issue order (those cannot sit in the
  table together); inside a window, requests to the same DRAM page are served together, pages in
  the order they first appear, arrival order within a page.
* DramUnit service (beat period = U * data_width_bytes / peak_gbps, so the UMCs together deliver
  dram.peak_gbps; beats = ceil(len / data_width_bytes)):
    page hit, same direction as the UMC's previous request: beats * period
    page hit after a direction switch: min_write_to_read / min_read_to_write + beats * period
    bank closed (first use):  open_page + beats * period
    page miss (other row open): read/write_close_page (by this request's direction) + open_page
                                + beats * period
* Response: reads add min_read_ns (controller + PHY latency, pipelined), then X2x's r_process
  (one clk800M cycle) and the same hops back; writes return their B response the same way.
"""

from __future__ import annotations

import numpy as np

from tpuflow.chip import ChipConfig
from tpuflow.hwmodel.timing.clocks import Clocks, ns_to_ps

_BIG = 1 << 46   # > any time span of one call (70 s), keeps segmented cummax groups apart


def segmented_fifo(starts: np.ndarray, counts: np.ndarray, arrive: np.ndarray, service: np.ndarray,
                   init_free: np.ndarray) -> np.ndarray:
    """Finish times of in-order single servers: groups are contiguous runs (starts, counts); in each,
    done_k = max(arrive_k, done_{k-1}) + service_k with done_{-1} = init_free[group]."""
    total = np.cumsum(service)
    before = total - service
    base = np.repeat(before[starts], counts)
    x = arrive - (before - base)
    x[starts] = np.maximum(x[starts], init_free)
    offset = np.repeat(np.arange(len(starts), dtype=np.int64) * _BIG, counts)
    return np.maximum.accumulate(x + offset) - offset + (total - base)


def serial_port(ready: np.ndarray, occupancy: np.ndarray, free: int) -> np.ndarray:
    """Start times of items taken in array order by one server: start_k = max(ready_k, start_{k-1}
    + occupancy_{k-1}), start_0 >= free."""
    before = np.cumsum(occupancy) - occupancy
    x = ready - before
    x[0] = max(x[0], free)
    return np.maximum.accumulate(x) + before


def _runs(sorted_keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    n = len(sorted_keys)
    change = np.empty(n, dtype=bool)
    change[0] = True
    np.not_equal(sorted_keys[1:], sorted_keys[:-1], out=change[1:])
    starts = np.flatnonzero(change)
    return starts, np.diff(np.append(starts, n))


class DramStats:
    """Counters of the DRAM side (per UMC arrays)."""

    def __init__(self, umcs: int):
        self.page_hits = np.zeros(umcs, dtype=np.int64)
        self.page_misses = np.zeros(umcs, dtype=np.int64)
        self.page_opens = np.zeros(umcs, dtype=np.int64)
        self.bytes_read = 0
        self.bytes_written = 0
        self.bursts = 0
        self.first_ps = -1
        self.last_ps = 0


class Wdc:
    """State of the memory path of one core (UMC free times, open rows, last direction)."""

    def __init__(self, chip: ChipConfig, clocks: Clocks):
        w, d = chip.wdc, chip.dram
        self.umcs = chip.umc_count
        self.umcs_per_channel = w.umcs_per_channel
        self.granule_bits = w.interleave_bits
        self.page_bytes, self.banks = d.page_bytes, d.banks_per_umc
        self.beat_bytes = d.data_width_bytes
        self.beat_ps = round(self.umcs * d.data_width_bytes * 1000 / d.peak_gbps)
        self.open_ps = ns_to_ps(d.open_page_ns)
        self.close_ps = (ns_to_ps(d.read_close_page_ns), ns_to_ps(d.write_close_page_ns))
        self.turn_ps = (ns_to_ps(d.min_write_to_read_ns), ns_to_ps(d.min_read_to_write_ns))  # into read / write
        self.min_read_ps = ns_to_ps(d.min_read_ns)
        self.umc_clock = clocks.umc
        fab, fast = clocks.fabric.period, clocks.fabric_fast.period
        levels = 4 + (1 if w.shared_region else 0)   # ItlvDemux, fab level(s), Fab2t1, AuxCam
        hops = w.fabric_hop_cycles * (fast + levels * fab)
        self.request_ps = hops + clocks.umc.period
        self.response_ps = fab + hops
        self.fabric_bytes = w.fabric_width_bits // 8
        self.fabric_ps = fab
        self.cam_entries = w.cam_table_entries
        self.limits = self._limit_levels(chip)
        pow2 = lambda v: v > 0 and v & (v - 1) == 0
        self._pow2 = pow2(self.umcs) and pow2(self.page_bytes) and pow2(self.banks)
        self._umc_bits = self.umcs.bit_length() - 1
        self._page_bits = self.page_bytes.bit_length() - 1
        self._bank_bits = self.banks.bit_length() - 1
        self.gdma_outstanding = max(chip.gdma.outstanding_reads, chip.gdma.outstanding_writes)
        self.umc_free = np.zeros(self.umcs, dtype=np.int64)
        self.open_row = np.full(self.umcs * self.banks, -1, dtype=np.int64)
        self.last_dir = np.full(self.umcs, -1, dtype=np.int64)
        self.stats = DramStats(self.umcs)

    def _limit_levels(self, chip: ChipConfig) -> list[tuple[int, int]]:
        """(UMCs per group, limit) of each outstanding-limited fabric level on the path: Fab2t1 per UMC;
        on the shared path also shared fab2 (shared_fab2_fanout UMCs) and shared fab1 (a channel)."""
        w = chip.wdc
        levels = [(1, w.fab2t1_outstanding)]
        if w.shared_region:
            levels += [(w.shared_fab2_fanout, w.shared_fab2_outstanding), (w.umcs_per_channel, w.shared_fab1_outstanding)]
        return levels

    # ------------------------------------------------------------------ addressing
    def decode(self, addr: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(umc, bank key = umc * banks + bank, row) of DDR byte addresses."""
        g = addr >> self.granule_bits
        if self._pow2:
            umc = g & (self.umcs - 1)
            local = ((g >> self._umc_bits) << self.granule_bits) | (addr & ((1 << self.granule_bits) - 1))
            page = local >> self._page_bits
            return umc, (umc << self._bank_bits) | (page & (self.banks - 1)), page >> self._bank_bits
        umc = g % self.umcs
        local = ((g // self.umcs) << self.granule_bits) | (addr & ((1 << self.granule_bits) - 1))
        page = local // self.page_bytes
        return umc, umc * self.banks + page % self.banks, page // self.banks

    def unloaded_read_ps(self, nbytes: int, miss: bool = False) -> int:
        """Issue-to-response time of one read reaching an idle UMC on a clock edge (page hit, or a
        miss that closes another row first)."""
        beats = -(-nbytes // self.beat_bytes)
        extra = self.close_ps[0] + self.open_ps if miss else 0
        return self.request_ps + extra + beats * self.beat_ps + self.min_read_ps + self.response_ps

    # ------------------------------------------------------------------ service
    def service(self, addr: np.ndarray, size: np.ndarray, write: bool, issue: np.ndarray) -> np.ndarray:
        """Serve requests issued (in array order) at `issue` ps and commit them; returns each request's
        response time back at the GDMA port (read data / write B response), in issue order."""
        plan = self.plan(addr, size, write)
        arrive = self.arrival(plan, issue)
        done = self.finish(plan, arrive)
        self.commit(plan, arrive, done)
        out = np.empty_like(done)
        out[plan.order] = done + plan.response_ps
        return out

    def arrival(self, plan: "Plan", issue: np.ndarray) -> np.ndarray:
        """When requests issued at `issue` reach their Fab2t1 (before outstanding limits), issue order."""
        return issue + plan.request_ps

    def plan(self, addr: np.ndarray, size: np.ndarray, write: bool) -> "Plan":
        """Everything about serving these requests that does not depend on time: the AuxCam service
        order, page hits / misses, service times. Commits the open rows, directions and counters."""
        umc, bank_key, row = self.decode(addr)
        order = np.argsort(umc.astype(np.int16), kind="stable")
        u = umc[order]
        starts, counts = _runs(u)
        order = self._cam_order(order, u, starts, bank_key[order], row[order])
        u = umc[order]
        hit, closed = self._page_state(bank_key[order], row[order])
        direction = 1 if write else 0
        switch = np.zeros(len(u), dtype=bool)
        switch[starts] = self.last_dir[u[starts]] == 1 - direction
        self.last_dir[u[starts]] = direction
        size_s = size[order]
        beats = -(-size_s // self.beat_bytes)
        miss_cost = np.where(closed, self.open_ps, self.close_ps[direction] + self.open_ps)
        service = beats * self.beat_ps + np.where(hit, switch * self.turn_ps[direction], miss_cost)
        self._count(u, hit, closed, size, write)
        request = self.request_ps + (-(-size // self.fabric_bytes) * self.fabric_ps if write else 0)
        response = self.response_ps if write else self.min_read_ps + self.response_ps
        return Plan(order, starts, counts, u, service, request, response, self._limit_backrefs(umc))

    def finish(self, plan: "Plan", arrive: np.ndarray) -> np.ndarray:
        """DramUnit completion times, in SERVICE order (plan.order), for requests reaching the fabric at
        `arrive` (issue order); pure."""
        done = self._finish_once(plan, arrive)
        if plan.backrefs is None:
            return done
        for _ in range(len(arrive)):
            by_issue = np.empty_like(done)
            by_issue[plan.order] = done
            again = self._finish_once(plan, self._admit(plan, arrive, by_issue))
            if np.array_equal(again, done):
                return done
            done = again
        return done

    def _finish_once(self, plan: "Plan", arrive: np.ndarray) -> np.ndarray:
        """segmented_fifo with the plan's precomputed sums: done = cummax per UMC of (a - excl) + incl."""
        x = self.umc_clock.align_array(arrive[plan.order]) - plan.excl
        x[plan.starts] = np.maximum(x[plan.starts], self.umc_free[plan.u[plan.starts]])
        return np.maximum.accumulate(x + plan.offset) - plan.offset + plan.incl

    def commit(self, plan: "Plan", arrive: np.ndarray, done: np.ndarray) -> None:
        """Make the UMCs busy until these requests (done: service order) are done."""
        ends = plan.starts + plan.counts - 1
        self.umc_free[plan.u[ends]] = done[ends]
        st = self.stats
        first = int(arrive.min())
        st.first_ps = first if st.first_ps < 0 else min(st.first_ps, first)
        st.last_ps = max(st.last_ps, int(done.max()))

    def _cam_order(self, order, u, starts, bank_key, row) -> np.ndarray:
        """Service order after AuxCam's page grouping (unchanged when pages already come grouped)."""
        page = bank_key * (1 << 32) + row
        step = np.diff(page)
        same_umc = u[1:] == u[:-1]
        if not np.any(same_umc & (step < 0)):
            return order     # non-decreasing pages per UMC: already grouped
        counts = np.diff(np.append(starts, len(u)))
        pos = np.arange(len(u)) - np.repeat(starts, counts)
        chunk = order // self.gdma_outstanding      # requests that can be in flight together
        window = (np.repeat(starts, counts) + pos // self.cam_entries) * (1 << 32) + chunk
        o3 = np.lexsort((page, window))
        key3 = np.stack([window[o3], page[o3]])
        change = np.ones(len(u), dtype=bool)
        change[1:] = np.any(key3[:, 1:] != key3[:, :-1], axis=0)
        run_starts = np.flatnonzero(change)
        first = np.empty(len(u), dtype=np.int64)
        first[o3] = np.repeat(o3[run_starts], np.diff(np.append(run_starts, len(u))))
        return order[np.lexsort((np.arange(len(u)), first))]

    def _page_state(self, bank_key: np.ndarray, row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(hit, bank closed) per request in service order; updates the open rows."""
        o2 = np.argsort(bank_key.astype(np.int32), kind="stable")
        k2, r2 = bank_key[o2], row[o2]
        first = np.empty(len(k2), dtype=bool)
        first[0] = True
        np.not_equal(k2[1:], k2[:-1], out=first[1:])
        prev = np.empty_like(r2)
        prev[1:] = r2[:-1]
        prev[first] = self.open_row[k2[first]]
        last = np.append(first[1:], True)
        self.open_row[k2[last]] = r2[last]
        hit, closed = np.empty(len(k2), dtype=bool), np.empty(len(k2), dtype=bool)
        hit[o2] = prev == r2
        closed[o2] = prev < 0
        return hit, closed

    def _count(self, u, hit, closed, size, write: bool) -> None:
        st = self.stats
        n = self.umcs
        st.page_hits += np.bincount(u[hit], minlength=n)
        st.page_opens += np.bincount(u[closed], minlength=n)
        st.page_misses += np.bincount(u[~hit & ~closed], minlength=n)
        nbytes = int(size.sum())
        if write:
            st.bytes_written += nbytes
        else:
            st.bytes_read += nbytes
        st.bursts += len(u)

    # ------------------------------------------------------------------ outstanding limits
    def _limit_backrefs(self, umc: np.ndarray):
        """Per limited level: for each request the index of the request `limit` places earlier in its group
        (-1 if none). None when no level can bind: in flight are at most the GDMA's outstanding requests,
        so a reference further back than that is always done already."""
        refs = []
        window = self.gdma_outstanding
        for per_group, limit in self.limits:
            group = umc // per_group
            if not self._may_exceed(group, limit, window):
                continue
            order = np.argsort(group, kind="stable")
            g = group[order]
            starts, counts = _runs(g)
            rank = np.arange(len(g)) - np.repeat(starts, counts)
            back = np.full(len(g), -1, dtype=np.int64)
            has = rank >= limit
            back[has] = order[np.flatnonzero(has) - limit]
            ref = np.empty(len(g), dtype=np.int64)
            ref[order] = back
            idx = np.arange(len(g))
            ref[(ref >= 0) & (idx - ref >= window)] = -1
            if np.any(ref >= 0):
                refs.append(ref)
        if not refs:
            return None
        channel = umc // self.umcs_per_channel
        corder = np.argsort(channel, kind="stable")
        cstarts, ccounts = _runs(channel[corder])
        return refs, corder, cstarts, ccounts

    @staticmethod
    def _may_exceed(group: np.ndarray, limit: int, window: int) -> bool:
        """Whether some `window` consecutive requests hold more than `limit` of one group (any such window
        lies within two consecutive blocks of `window` requests)."""
        if len(group) <= limit:
            return False
        groups = int(group.max()) + 1
        counts = np.bincount((np.arange(len(group)) // window) * groups + group).reshape(-1)
        counts = np.pad(counts, (0, -len(counts) % groups)).reshape(-1, groups)
        pairs = counts if len(counts) == 1 else counts[1:] + counts[:-1]
        return bool(pairs.max() > limit)

    def _admit(self, plan: "Plan", arrive: np.ndarray, done: np.ndarray) -> np.ndarray:
        """Arrival held until the request `limit` earlier in each limited group is done, then in order per
        channel (a held request blocks the ones behind it on its channel)."""
        refs, corder, cstarts, ccounts = plan.backrefs
        admit = arrive.copy()
        for ref in refs:
            has = ref >= 0
            admit[has] = np.maximum(admit[has], done[ref[has]])
        a = admit[corder]
        offset = np.repeat(np.arange(len(cstarts), dtype=np.int64) * _BIG, ccounts)
        held = np.maximum.accumulate(a + offset) - offset
        out = np.empty_like(held)
        out[corder] = held
        return out


class Plan:
    """Timing-independent part of one batch of requests. Arrays are in service order (grouped by UMC,
    AuxCam order inside a UMC) unless noted; `order[k]` = issue index of the k-th served request."""

    __slots__ = ("order", "starts", "counts", "u", "service", "request_ps", "response_ps", "backrefs",
                 "excl", "incl", "offset")

    def __init__(self, order, starts, counts, u, service, request_ps, response_ps, backrefs):
        self.order, self.starts, self.counts, self.u = order, starts, counts, u
        self.service = service
        self.request_ps = request_ps      # scalar or per request (issue order): issue -> fabric arrival
        self.response_ps = response_ps    # DramUnit done -> response at the GDMA port
        self.backrefs = backrefs
        total = np.cumsum(service)
        base = np.repeat(total[starts] - service[starts], counts)
        self.incl = total - base                  # service time up to and including k, within its UMC
        self.excl = self.incl - service
        self.offset = np.repeat(np.arange(len(starts), dtype=np.int64) * _BIG, counts)
