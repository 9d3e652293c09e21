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
* AuxCam (page-aware reordering): the requests one call hands a UMC are served in windows of
  cam_table_entries; inside a window, requests to the same DRAM page are served together, pages
  in the order they first appear, arrival order within a page.
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

    def snapshot(self) -> tuple:
        st = self.stats
        return (self.umc_free.copy(), self.open_row.copy(), self.last_dir.copy(), st.page_hits.copy(),
                st.page_misses.copy(), st.page_opens.copy(), st.bytes_read, st.bytes_written, st.bursts,
                st.first_ps, st.last_ps)

    def restore(self, snap: tuple) -> None:
        st = self.stats
        (self.umc_free, self.open_row, self.last_dir, st.page_hits, st.page_misses, st.page_opens,
         st.bytes_read, st.bytes_written, st.bursts, st.first_ps, st.last_ps) = snap
        self.umc_free, self.open_row, self.last_dir = self.umc_free.copy(), self.open_row.copy(), self.last_dir.copy()
        st.page_hits, st.page_misses, st.page_opens = st.page_hits.copy(), st.page_misses.copy(), st.page_opens.copy()

    # ------------------------------------------------------------------ addressing
    def decode(self, addr: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(umc, bank key = umc * banks + bank, row) of DDR byte addresses."""
        g = addr >> self.granule_bits
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
        """Serve requests issued (in array order) at `issue` ps; returns each request's response time
        back at the GDMA port (read data / write B response)."""
        arrive = issue + self.request_ps
        if write:
            arrive = arrive + -(-size // self.fabric_bytes) * self.fabric_ps
        umc, bank_key, row = self.decode(addr)
        split = self._limit_split(umc)
        if split is None:
            return self._serve(arrive, umc, bank_key, row, size, write)
        return self._serve_limited(arrive, umc, bank_key, row, size, write, split)

    def _serve(self, arrive, umc, bank_key, row, size, write: bool, done_out: list | None = None) -> np.ndarray:
        order = np.argsort(umc, kind="stable")
        u = umc[order]
        starts, counts = _runs(u)
        order = self._cam_order(order, u, starts, bank_key[order], row[order])
        u = umc[order]
        a = self.umc_clock.align_array(arrive[order])
        hit, closed = self._page_state(bank_key[order], row[order])
        direction = 1 if write else 0
        switch = np.zeros(len(u), dtype=bool)
        switch[starts] = self.last_dir[u[starts]] == 1 - direction
        beats = -(-size[order] // self.beat_bytes)
        miss_cost = np.where(closed, self.open_ps, self.close_ps[direction] + self.open_ps)
        s = beats * self.beat_ps + np.where(hit, switch * self.turn_ps[direction], miss_cost)
        done = segmented_fifo(starts, counts, a, s, self.umc_free[u[starts]])
        ends = starts + counts - 1
        self.umc_free[u[ends]] = done[ends]
        self.last_dir[u[starts]] = direction
        self._count(u, hit, closed, size, write, a, done)
        if done_out is not None:
            back = np.empty_like(done)
            back[order] = done
            done_out.append(back)
        resp = done + (self.response_ps if write else self.min_read_ps + self.response_ps)
        out = np.empty_like(resp)
        out[order] = resp
        return out

    def _cam_order(self, order, u, starts, bank_key, row) -> np.ndarray:
        """Service order after AuxCam's page grouping (unchanged when pages already come grouped)."""
        page = bank_key * (1 << 32) + row
        step = np.diff(page)
        same_umc = u[1:] == u[:-1]
        if not np.any(same_umc & (step < 0)):
            return order     # non-decreasing pages per UMC: already grouped
        pos = np.arange(len(u)) - np.repeat(starts, np.diff(np.append(starts, len(u))))
        window = np.repeat(starts, np.diff(np.append(starts, len(u)))) + pos // self.cam_entries
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
        o2 = np.argsort(bank_key, kind="stable")
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

    def _count(self, u, hit, closed, size, write: bool, start, done) -> None:
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
        first = int(start.min())
        st.first_ps = first if st.first_ps < 0 else min(st.first_ps, first)
        st.last_ps = max(st.last_ps, int(done.max()))

    # ------------------------------------------------------------------ outstanding limits
    def _limit_split(self, umc: np.ndarray):
        """None when no fabric level can exceed its limit in this call, else per-request part ids such
        that the request `limit` places before any request in its group is in an earlier part."""
        groups = []
        for per_group, limit in self.limits:
            group = umc // per_group
            if np.bincount(group).max() > limit:
                groups.append((group.tolist(), limit))
        if not groups:
            return None
        part = [0] * len(umc)
        history = [dict() for _ in groups]   # group -> list of part ids in rank order
        current = 0
        for i in range(len(umc)):
            for (group, limit), hist in zip(groups, history):
                seen = hist.setdefault(group[i], [])
                if len(seen) >= limit:
                    current = max(current, seen[-limit] + 1)
            part[i] = current
            for (group, _), hist in zip(groups, history):
                hist[group[i]].append(current)
        return np.asarray(part)

    def _serve_limited(self, arrive, umc, bank_key, row, size, write: bool, part: np.ndarray) -> np.ndarray:
        """Serve in parts that stay within every limit; a request over a limit is admitted when the
        request `limit` earlier in its group is done, and holds later requests of its channel."""
        resp = np.empty_like(arrive)
        done_all = np.zeros_like(arrive)
        channel = umc // self.umcs_per_channel
        held = np.zeros(int(channel.max()) + 1, dtype=np.int64)
        for p in range(int(part[-1]) + 1):
            idx = np.flatnonzero(part == p)
            a = arrive[idx].copy()
            for per_group, limit in self.limits:
                a = np.maximum(a, _release(umc // per_group, limit, idx, done_all))
            a = _hold_per_channel(a, channel[idx], held)
            out: list = []
            resp[idx] = self._serve(a, umc[idx], bank_key[idx], row[idx], size[idx], write, out)
            done_all[idx] = out[0]
        return resp


def _rank_in_group(group: np.ndarray) -> np.ndarray:
    """0-based position of each element among the elements of its group, in array order."""
    order = np.argsort(group, kind="stable")
    g = group[order]
    starts, counts = _runs(g)
    rank = np.empty(len(g), dtype=np.int64)
    rank[order] = np.arange(len(g)) - np.repeat(starts, counts)
    return rank


def _release(group: np.ndarray, limit: int, idx: np.ndarray, done_all: np.ndarray) -> np.ndarray:
    """For requests idx: done time of the request `limit` places earlier in the same group (0 if none)."""
    rank = _rank_in_group(group)
    out = np.zeros(len(idx), dtype=np.int64)
    order = np.argsort(group, kind="stable")
    position = np.empty(len(group), dtype=np.int64)
    position[order] = np.arange(len(group))
    earlier = rank[idx] >= limit
    if np.any(earlier):
        out[earlier] = done_all[order[position[idx[earlier]] - limit]]
    return out


def _hold_per_channel(admit: np.ndarray, channel: np.ndarray, held: np.ndarray) -> np.ndarray:
    """In-order fabric per channel: a request cannot pass one admitted later before it."""
    out = admit.copy()
    for ch in np.unique(channel):
        sel = np.flatnonzero(channel == ch)
        v = np.maximum.accumulate(np.maximum(admit[sel], held[ch]))
        out[sel] = v
        held[ch] = v[-1]
    return out
