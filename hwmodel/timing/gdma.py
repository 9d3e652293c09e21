"""GDMA command timing: setup, read and write streams of bursts, outstanding credits, LMEM port, WDC.

One command runs at a time (the next dispatches after the previous one's transfer_done), pipelined
inside. Every time below is relative to the command's dispatch; edges of the GDMA / fabric / UMC
clocks are taken relative to it too (the memory path's clocks keep a fixed phase to the GDMA's), so a
command's whole timeline is a function of the command alone (and of the DRAM pages earlier commands
left open, which does not depend on time): `CommandTable` computes every command of a program in one
vectorised pass; the simulator only adds dispatch times.

* t0 = cmd_setup_cycles. The read side issues its bursts in order, one every segment_issue_cycles
  (+ unaligned_penalty_cycles for a burst that does not start on a bus word).
* DDR reads need a read credit (gdma.outstanding_reads = O): a semaphore, so request i may issue
  once i - O + 1 requests have been answered, i.e. at the (i - O + 1)-th earliest response among the
  requests before it. A response of a request at or after i comes after i's issue, so that is also
  the (i - O + 1)-th earliest response of the whole stream: credit_i = sort(responses)[i - O].
  Starting from no credits, responses are recomputed until no credit moves an issue; the iteration
  only grows and its fixed point is the unique causal solution (exact, not an approximation).
* Read data return over the GDMA data bus, bus_bytes per GDMA cycle, in arrival order; a read
  credit is freed when its data are in.
* LMEM reads go through the LMEM read port, LMEM writes through the write port: one burst after the
  other, each holding it max(segment_issue_cycles, beats) cycles (+ unaligned penalty), done
  lmem_access_latency_ns after its beats.
* The write side consumes the read side's byte stream in order: a write burst is ready once every
  read burst up to its stream position (scaled by src/dst bytes for broadcasts) has delivered.
  DDR writes need write credits (freed by the B response) and carry their data over the GDMA bus at
  issue (max(segment_issue_cycles, beats) cycles each).
* DDR->DDR copies: the writes are served after the command's reads on each UMC (they share the
  UMCs, so the DRAM occupancy is the same; one read->write turnaround per UMC is charged).
* Completion (in order): the last write acknowledgement, on a GDMA edge, but not before
  setup + DDR-side bytes / (direction rate x gdma.direction_efficiency): the direction rate is
  gdma.s2l_gbps (DDR -> LMEM, bytes read), l2s_gbps (LMEM -> DDR, bytes written) or s2s_gbps
  (DDR -> DDR); 0 means no such limit. The DDR-side bytes are charged per contiguous run (a piece
  contiguous on both sides; LMEM channels break runs): at least gdma.min_run_bytes each, and a run of
  one element gdma.element_load_run_bytes when DDR is read, element_store_run_bytes when it is only
  written (0: as min_run_bytes). tdma_sync_id follows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tpuflow.chip import ChipConfig
from tpuflow.hwmodel.timing.clocks import Clock, Clocks, ns_to_ps
from tpuflow.hwmodel.timing.segments import Bursts, Side, _contiguous_dims, side_bursts, transfer_sides
from tpuflow.hwmodel.timing.wdc import (BIG, DramPlan, DramState, WdcParams, group_rank, runs, seg_cummax,
                                        seg_serial)
from tpuflow.isa import Instruction, SysDma

NONE, LMEM, DDR = 0, 1, 2


@dataclass
class CommandTable:
    """Per GDMA command (queue order), relative to its dispatch: end, stalls, DDR bursts, DRAM window."""

    end: np.ndarray            # ps after dispatch
    credit_stall: np.ndarray   # ps the issue threads waited for credits
    dram_stall: np.ndarray     # ps the last DDR response came after an ideal memory's
    ddr_bursts: np.ndarray
    nbytes: np.ndarray
    dram_first: np.ndarray     # first DDR arrival (ps after dispatch), -1 if none
    dram_last: np.ndarray      # last DramUnit completion
    state: DramState
    iterations: int


def direction_floor_ps(chip: ChipConfig, read_kinds, write_kinds, src_bytes, dst_bytes) -> np.ndarray:
    """Least ps each command's data need at its direction's rate (see the module docstring)."""
    g = chip.gdma
    rk, wk = np.asarray(read_kinds, dtype=np.int64), np.asarray(write_kinds, dtype=np.int64)
    gbps = np.zeros(len(rk))
    gbps[(rk == DDR) & (wk == LMEM)] = g.s2l_gbps
    gbps[(rk == LMEM) & (wk == DDR)] = g.l2s_gbps
    gbps[(rk == DDR) & (wk == DDR)] = g.s2s_gbps
    nbytes = np.where((rk == LMEM) & (wk == DDR), np.asarray(dst_bytes, dtype=np.int64),
                      np.asarray(src_bytes, dtype=np.int64))
    rate = gbps * g.direction_efficiency * 1e-3            # bytes per ps
    return np.where(rate > 0, np.ceil(nbytes / np.where(rate > 0, rate, 1.0)), 0).astype(np.int64)


def _run_elements(side: Side | None) -> int:
    """Elements in one contiguous run of a side (segments.py's cut: LMEM channels sit on different lanes)."""
    if side is None:
        return 1 << 62
    k = _contiguous_dims(side.shape, side.strides)
    if side.lmem and side.shape[1] > 1:
        k = min(k, 2)
    n, c, h, w = side.shape
    return {3: c * h * w, 2: h * w, 1: w, 0: 1}[k]


def run_elements(src: Side | None, dst: Side | None, chip: ChipConfig | None = None) -> int:
    """Elements in one contiguous run of a transfer (contiguous on both sides; a side in the tile
    buffer takes any element order, segments.py, so it does not cut runs)."""
    in_buffer = (lambda s: chip is not None and s is not None and s.lmem and chip.in_tile_buffer(s.addr))
    return min(_run_elements(None if in_buffer(src) else src), _run_elements(None if in_buffer(dst) else dst))


def charged_ddr_bytes(chip: ChipConfig, src: Side | None, dst: Side | None) -> int:
    """DDR-side bytes the direction floor charges a transfer: each run counts at least gdma.min_run_bytes,
    a one-element run gdma.element_load_run_bytes / element_store_run_bytes (see the module docstring)."""
    ddr = src if src is not None and not src.lmem else dst
    if ddr is None or ddr.lmem:
        return src.nbytes if src is not None else 0
    g = chip.gdma
    run = run_elements(src, dst, chip)
    runs = -(-ddr.nbytes // (run * ddr.esize))
    element = g.element_load_run_bytes if ddr is src else g.element_store_run_bytes
    per_run = element if run == 1 and element else g.min_run_bytes
    return max(ddr.nbytes, runs * per_run)


class _Side:
    """The bursts of one side (read or write) of every command, concatenated in queue order."""

    def __init__(self, bursts: list[Bursts | None], kinds: list[int]):
        self.kind = np.asarray(kinds, dtype=np.int64)
        counts = np.asarray([len(b) if b is not None else 0 for b in bursts], dtype=np.int64)
        self.counts = counts
        self.start = np.cumsum(counts) - counts
        present = [b for b in bursts if b is not None and len(b)]
        cat = (lambda f: np.concatenate([getattr(b, f) for b in present]) if present else np.zeros(0, dtype=np.int64))
        self.addr, self.size, self.beats = cat("addr"), cat("size"), cat("beats")
        self.unaligned, self.stream_end = cat("unaligned").astype(bool), cat("stream_end")
        self.cmd = np.repeat(np.arange(len(bursts), dtype=np.int64), counts)
        self.kind_of = self.kind[self.cmd]

    def select(self, kind: int) -> np.ndarray:
        return np.flatnonzero(self.kind_of == kind)


class CommandModel:
    """Computes the CommandTable of a GDMA queue."""

    def __init__(self, chip: ChipConfig, clocks: Clocks):
        g = chip.gdma
        self.chip, self.p = chip, WdcParams.of(chip, clocks)
        self.clock: Clock = clocks.gdma
        self.period = clocks.gdma.period
        self.burst_bytes = min(g.bus_bytes * g.max_burst_beats, 1 << chip.wdc.interleave_bits, chip.dram.page_bytes)
        self.setup = g.cmd_setup_cycles * self.period
        self.issue_gap = g.segment_issue_cycles * self.period
        self.unaligned = g.unaligned_penalty_cycles * self.period
        self.lmem_latency = ns_to_ps(g.lmem_access_latency_ns)
        self.outstanding = (g.outstanding_reads, g.outstanding_writes)
        self.iterations = 0

    # ------------------------------------------------------------------ assembly
    # commands are solved in chunks of about this many bursts: 64k keeps the arrays in cache (timing_bench:
    # 1.6-1.9x faster than 2M on the synthetic and the TILE-path ResNet-50 programs; same results)
    CHUNK_BURSTS = 1 << 16

    def table(self, instrs: list[Instruction], same: list[int] | None = None) -> CommandTable:
        """Every command's timeline; chunks of commands carry the DRAM page state from one to the next,
        so chunking changes nothing but the memory used."""
        state = DramState(self.p)
        parts, chunk, bursts = [], [], 0
        done: list = []       # sides per command; same[i] = the first command equal to i apart from waits
        for i, instr in enumerate(instrs):
            first = same[i] if same is not None else i
            sides = done[first] if first < i else self._sides(instr)
            done.append(sides)
            chunk.append(sides)
            bursts += sum(len(b) for b in sides[:2] if b is not None)
            if bursts >= self.CHUNK_BURSTS:
                parts.append(self._chunk(chunk, state))
                chunk, bursts = [], 0
        if chunk or not parts:
            parts.append(self._chunk(chunk, state))
        cat = (lambda f: np.concatenate([getattr(p, f) for p in parts]))
        return CommandTable(cat("end"), cat("credit_stall"), cat("dram_stall"), cat("ddr_bursts"), cat("nbytes"),
                            cat("dram_first"), cat("dram_last"), state, self.iterations)

    def _sides(self, instr: Instruction):
        """(read bursts, write bursts, read kind, write kind, src bytes, dst bytes, floor bytes) of one command."""
        src, dst = (None, None) if isinstance(instr, SysDma) else transfer_sides(instr, self.chip)
        return (side_bursts(src, self.chip, self.burst_bytes) if src is not None else None,
                side_bursts(dst, self.chip, self.burst_bytes) if dst is not None else None,
                NONE if src is None else (LMEM if src.lmem else DDR), NONE if dst is None else (LMEM if dst.lmem else DDR),
                src.nbytes if src is not None else 0, dst.nbytes if dst is not None else 0,
                charged_ddr_bytes(self.chip, src, dst) if dst is not None else 0)

    def _chunk(self, chunk: list, state: DramState) -> CommandTable:
        n = len(chunk)
        reads, writes, rk, wk, src_bytes, dst_bytes, charged = (list(col) for col in zip(*chunk)) if chunk else ([],) * 7
        rs, ws = _Side(reads, rk), _Side(writes, wk)
        plan = self._plan(rs, ws, state)
        ddr_read = self._ddr(plan, rs, False, np.full(len(rs.select(DDR)), self.setup, dtype=np.int64))
        data = np.full(len(rs.addr), self.setup, dtype=np.int64)
        lm = rs.select(LMEM)
        data[lm] = self._lmem_port(rs, lm, np.full(len(lm), self.setup, dtype=np.int64))
        if ddr_read is not None:
            data[rs.select(DDR)] = ddr_read.release
        ready = self._write_ready(rs, ws, data, np.asarray(src_bytes, dtype=np.int64), np.asarray(dst_bytes, dtype=np.int64))
        done = np.zeros(len(ws.addr), dtype=np.int64)
        lm = ws.select(LMEM)
        done[lm] = self._lmem_port(ws, lm, ready[lm])
        dd = ws.select(DDR)
        init = self._copy_init(plan, ddr_read) if len(dd) and ddr_read is not None else None
        ddr_write = self._ddr(plan, ws, True, ready[dd], init)
        if ddr_write is not None:
            done[dd] = ddr_write.release
        self.streams = (ddr_read, ddr_write)
        table = self._collect(n, ws, done, self.streams, np.asarray(dst_bytes, dtype=np.int64), state)
        floor = direction_floor_ps(self.chip, rk, wk, charged, charged)
        capped = np.flatnonzero(floor > 0)
        table.end[capped] = np.maximum(table.end[capped], self.clock.align_array(self.setup + floor[capped]))
        return table

    def _plan(self, rs: _Side, ws: _Side, state: DramState) -> DramPlan | None:
        r, w = rs.select(DDR), ws.select(DDR)
        if not len(r) and not len(w):
            return None
        cmd = np.concatenate([rs.cmd[r], ws.cmd[w]])
        write = np.concatenate([np.zeros(len(r), dtype=bool), np.ones(len(w), dtype=bool)])
        stream = cmd * 2 + write
        order = np.argsort(stream, kind="stable")           # reads of a command before its writes
        addr = np.concatenate([rs.addr[r], ws.addr[w]])[order]
        size = np.concatenate([rs.size[r], ws.size[w]])[order]
        return DramPlan(self.p, addr, size, write[order], stream[order], state)

    def _lmem_port(self, side: _Side, sel: np.ndarray, ready: np.ndarray) -> np.ndarray:
        """Completion of LMEM accesses: one port per command, bursts in order."""
        if not len(sel):
            return np.zeros(0, dtype=np.int64)
        beats = side.beats[sel]
        occ = np.maximum(self.issue_gap, beats * self.period) + side.unaligned[sel] * self.unaligned
        first, counts = runs(side.cmd[sel])
        start = seg_serial(ready, occ, group_rank(counts), first)
        return start + beats * self.period + self.lmem_latency

    def _write_ready(self, rs: _Side, ws: _Side, data: np.ndarray, src_bytes, dst_bytes) -> np.ndarray:
        """A write burst is ready when the read bursts up to its stream position have delivered."""
        ready = np.full(len(ws.addr), self.setup, dtype=np.int64)
        has = np.flatnonzero((ws.kind_of != NONE) & (rs.kind[ws.cmd] != NONE))
        if not len(has) or not len(data):
            return ready
        rank = rs.cmd
        delivered = seg_cummax(data, rank)
        c = ws.cmd[has]
        need = ws.stream_end[has]
        scaled = src_bytes[c] != dst_bytes[c]
        need = np.where(scaled, -(-need * src_bytes[c] // np.maximum(dst_bytes[c], 1)), need)
        # read bursts of every command are contiguous and their stream_end ascend: search per command
        key_r = rs.cmd * BIG + rs.stream_end
        idx = np.searchsorted(key_r, c * BIG + need, side="left")
        last = rs.start[c] + rs.counts[c] - 1
        ready[has] = delivered[np.minimum(idx, last)]
        return ready

    def _copy_init(self, plan: DramPlan, reads: "_StreamResult") -> np.ndarray | None:
        """For DDR->DDR commands: each write run starts when the command's reads on that UMC are done."""
        if False not in plan.directions or True not in plan.directions:
            return None
        rd, wr = plan.directions[False], plan.directions[True]
        ends = rd.starts + rd.counts - 1
        read_key = (rd.stream[rd.starts] // 2) * self.p.umcs + rd.umc[rd.starts]
        write_key = (wr.stream[wr.starts] // 2) * self.p.umcs + wr.umc[wr.starts]
        pos = np.searchsorted(read_key, write_key)
        pos = np.minimum(pos, len(read_key) - 1)
        found = read_key[pos] == write_key
        return np.where(found, reads.done[ends][pos], 0)

    def _collect(self, n, ws: _Side, done, streams, dst_bytes, state) -> CommandTable:
        end = np.full(n, self.setup, dtype=np.int64)
        has = np.flatnonzero(ws.counts > 0)
        if len(ws.addr):
            last = np.maximum.reduceat(done, ws.start[has]) if len(has) else np.zeros(0, dtype=np.int64)
            end[has] = self.clock.align_array(last)
        credit, dram = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
        bursts = np.zeros(n, dtype=np.int64)
        first, lastd = np.full(n, -1, dtype=np.int64), np.zeros(n, dtype=np.int64)
        for s in streams:
            if s is None:
                continue
            np.add.at(credit, s.cmd_of_stream, s.credit_stall)
            dram[s.cmd_of_stream] = np.maximum(dram[s.cmd_of_stream], s.dram_stall)
            np.add.at(bursts, s.cmd_of_stream, s.counts)
            f = np.where(first[s.cmd_of_stream] < 0, s.first, np.minimum(first[s.cmd_of_stream], s.first))
            first[s.cmd_of_stream] = f
            lastd[s.cmd_of_stream] = np.maximum(lastd[s.cmd_of_stream], s.last)
        return CommandTable(end, credit, dram, bursts, dst_bytes, first, lastd, state, self.iterations)

    # ------------------------------------------------------------------ DDR streams
    def _ddr(self, plan: DramPlan | None, side: _Side, write: bool, ready: np.ndarray,
             init: np.ndarray | None = None) -> "_StreamResult | None":
        if plan is None or write not in plan.directions:
            return None
        sel = side.select(DDR)
        return self._solve(plan.directions[write], side, sel, ready, write, init)

    def _solve(self, d, side: _Side, sel: np.ndarray, ready: np.ndarray, write: bool, init) -> "_StreamResult":
        """The credit fixed point of every DDR stream of one direction (see the module docstring). Streams
        (commands) are independent: each iteration only recomputes those whose credits still move."""
        cmd = side.cmd[sel]
        first, counts = runs(cmd)
        beats, size = side.beats[sel], side.size[sel]
        gap = np.full(len(sel), self.issue_gap)
        if write:
            gap = np.maximum(gap, beats * self.period)
        gap = gap + side.unaligned[sel] * self.unaligned
        ready = self.clock.align_array(ready)
        problem = _Problem.full(self, d, first, counts, gap, ready, self.p.request_latency(size, write), beats, init)
        n = len(sel)
        issue, arrive, release = (np.zeros(n, dtype=np.int64) for _ in range(3))
        done, base = np.zeros(n, dtype=np.int64), ready.copy()
        where = np.arange(n)
        passes = 0
        while True:
            self.iterations += 1
            passes += 1
            p_issue, p_arrive, p_done, p_release, credit = problem.iterate(base[where])
            issue[where], arrive[where], release[where], done[where] = p_issue, p_arrive, p_release, p_done
            if credit is None:
                break
            better = np.maximum(problem.ready, credit)
            moving = np.maximum.reduceat(better - p_issue, problem.first) > 0
            if problem.moved is not None:      # fabric admissions still changing
                moving |= np.maximum.reduceat(problem.moved.astype(np.int64), problem.first) > 0
            if not moving.any():
                break
            if passes > 4 * n + 16:
                raise AssertionError("GDMA credit fixed point did not converge")
            base[where] = np.maximum(base[where], better)
            keep = problem.positions(moving)
            problem, where = problem.subset(moving, keep), where[keep]
        free = np.roll(issue + gap, 1)
        free[first] = 0
        stall = np.clip(base - np.maximum(free, ready), 0, None)
        ideal = issue + self._ideal(size, write)
        by_issue = np.empty(n, dtype=np.int64)
        by_issue[d.index] = done
        return _StreamResult.of(cmd, first, counts, issue, release, stall, ideal, arrive, by_issue, done)

    def _ideal(self, size: np.ndarray, write: bool) -> np.ndarray:
        """Issue-to-release time of a DDR request on an idle, page-hit DRAM."""
        p = self.p
        beats = -(-size // p.beat_bytes)
        if write:
            return p.request_latency(size, True) + beats * p.beat_ps + p.response_ps
        return p.request_ps + beats * p.beat_ps + p.min_read_ps + p.response_ps \
            + -(-size // self.chip.gdma.bus_bytes) * self.period


class _Problem:
    """The DDR streams of one direction still being solved: arrays in issue order and in service order;
    both orders lay the streams out in the same segments (first, counts), so positions of whole streams
    are the same in both."""

    def __init__(self, model: CommandModel, **arrays):
        self.model = model
        self.__dict__.update(arrays)

    @classmethod
    def full(cls, model, d, first, counts, gap, ready, request, beats, init) -> "_Problem":
        write = d.write
        return cls(model, write=write, first=first, counts=counts, gap=gap, ready=ready, request=request,
                   index=d.index, run_of=group_rank(d.counts), run_init=init, incl=d.incl, excl=d.excl,
                   served_beats=beats[d.index] * model.period, response=d.response_ps,
                   outstanding=model.outstanding[1 if write else 0], limits=d.limits,
                   held=np.zeros(len(gap), dtype=np.int64))._derive()

    def _derive(self) -> "_Problem":
        self.rank = group_rank(self.counts)
        k = np.arange(len(self.gap)) - np.repeat(self.first, self.counts)
        before = np.cumsum(self.gap) - self.gap
        self.before = before - np.repeat(before[self.first], self.counts)
        self.credited = k >= self.outstanding
        self.src = np.flatnonzero(self.credited) - self.outstanding
        self.run_starts, run_counts = runs(self.run_of)
        self.offset = group_rank(run_counts) * BIG
        self.init = self.run_init[self.run_of[self.run_starts]] if self.run_init is not None else None
        return self

    def positions(self, streams: np.ndarray) -> np.ndarray:
        """Positions (issue or service order) of the selected streams' requests."""
        f, c = self.first[streams], self.counts[streams]
        return np.repeat(f - (np.cumsum(c) - c), c) + np.arange(int(c.sum()))

    def subset(self, streams: np.ndarray, keep: np.ndarray) -> "_Problem":
        inverse = np.full(len(self.gap), -1, dtype=np.int64)
        inverse[keep] = np.arange(len(keep))
        c = self.counts[streams]
        request = self.request[keep] if np.ndim(self.request) else self.request
        limits = self.limits.subset(keep, inverse) if self.limits is not None else None
        return _Problem(self.model, write=self.write, first=np.cumsum(c) - c, counts=c, gap=self.gap[keep],
                        ready=self.ready[keep], request=request, index=inverse[self.index[keep]],
                        run_of=self.run_of[keep], run_init=self.run_init, incl=self.incl[keep],
                        excl=self.excl[keep], served_beats=self.served_beats[keep], response=self.response,
                        outstanding=self.outstanding, limits=limits, held=self.held[keep])._derive()

    def iterate(self, base: np.ndarray):
        """One pass: issue, arrival, DramUnit done (service order), release (issue order) and the credits
        those releases hand out (None when no request needs one)."""
        m = self.model
        issue = seg_cummax(base - self.before, self.rank) + self.before
        arrive = issue + self.request
        if self.limits is not None:    # fabric outstanding limits, against the previous pass's done times
            arrive = self.limits.admit(arrive, self.held)
        x = m.p.umc_clock.align_array(arrive[self.index]) - self.excl
        if self.init is not None:
            x[self.run_starts] = np.maximum(x[self.run_starts], self.init)
        done = np.maximum.accumulate(x + self.offset) - self.offset + self.incl
        resp = done + self.response
        order = np.argsort(self.rank * BIG + resp, kind="stable")     # time order within each stream
        if self.write:
            ordered = resp[order]
        else:   # data cross the GDMA bus one burst after the other, in arrival order
            occ = self.served_beats[order]
            ordered = seg_serial(m.clock.align_array(resp[order]), occ, self.rank, self.first) + occ
            if np.any((ordered[1:] < ordered[:-1]) & (self.rank[1:] == self.rank[:-1])):
                again = np.argsort(self.rank * BIG + ordered, kind="stable")
                ordered, order = ordered[again], order[again]
        release = np.empty(len(resp), dtype=np.int64)
        release[self.index[order]] = ordered
        self.moved = None
        if self.limits is not None:
            by_issue = np.empty(len(done), dtype=np.int64)
            by_issue[self.index] = done
            self.moved = by_issue != self.held
            self.held = by_issue
        if not len(self.src):
            if self.moved is not None and self.moved.any():
                return issue, arrive, done, release, np.zeros(len(resp), dtype=np.int64)
            return issue, arrive, done, release, None
        credit = np.zeros(len(resp), dtype=np.int64)
        credit[self.credited] = m.clock.align_array(ordered[self.src])
        return issue, arrive, done, release, credit


class _StreamResult:
    """Per request times (issue order) and per stream sums of one direction's DDR streams."""

    @classmethod
    def of(cls, cmd, first, counts, issue, release, stall, ideal, arrive, done_by_issue, done) -> "_StreamResult":
        r = cls()
        r.issue, r.release = issue, release
        r.cmd_of_stream = cmd[first]
        r.counts = counts
        r.credit_stall = np.add.reduceat(stall, first)
        r.dram_stall = np.maximum(0, np.maximum.reduceat(release, first) - np.maximum.reduceat(ideal, first))
        r.first = np.minimum.reduceat(arrive, first)
        r.last = np.maximum.reduceat(done_by_issue, first)
        r.done = done
        return r
