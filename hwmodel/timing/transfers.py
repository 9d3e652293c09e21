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
    command in queue order (occupancy.py: once per distinct request pattern). beat_ps = U x
    data_width / dram.peak_gbps: one core sees each of the U UMCs at 1/U of its port rate, exactly as
    in the per-burst model.

* reorder: the write side consumes the read stream in order, but each UMC serves its granule's
  bursts one after the other, so the data of the last interleave round (U granules) all arrive at
  the end of the DRAM phase and are written after it: + write-side time x (min(DDR bytes read,
  U x granule) - granule) / DDR bytes read (the round's first granule trickles in during the phase).

Sums over a side's bursts are kept per cached burst list (segments.relative_bursts): moving a side by
whole bursts changes none of them.

`occupancy[u]` (ps of UMC u) is what the command takes from the shared DRAM; memory.SharedMemory
divides the UMCs between concurrent commands. A command without DDR side only has port and latency.
Not modelled at this level: the fabrics' per-UMC outstanding limits (the UMC is the bottleneck where
they would bind) and the queueing of one request behind another's page miss inside a UMC beyond its
occupancy.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from operator import attrgetter

import numpy as np

from tpuflow.chip import ChipConfig
from tpuflow.hwmodel.timing.clocks import Clocks, ns_to_ps
from tpuflow.hwmodel.timing.gdma import DDR, LMEM, NONE, charged_ddr_bytes, direction_floor_ps
from tpuflow.hwmodel.timing.occupancy import command_occupancy, patterns
from tpuflow.hwmodel.timing.segments import Bursts, burst_position, relative_bursts, transfer_sides
from tpuflow.hwmodel.timing.wdc import DramState, WdcParams
from tpuflow.isa import Instruction, SysDma, TensorDma


# every dma.tensor field but the two addresses and the wait: with the burst positions of the addresses, what
# a command's transfer shape depends on (TransferModel._tensor_shape)
_TENSOR_FORM = attrgetter(*[f.name for f in fields(TensorDma) if f.name not in ("src_start_addr", "dst_start_addr",
                                                                              "cmd_id_dep")])


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

    def solo_ps(self, index: int) -> int:
        """Bandwidth phase of command `index` alone on the chip."""
        return max(self.port[index], self.credit[index], self.dram[index])

    def occupancy_of(self, index: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(UMCs, their occupancy ps) of command `index`."""
        row = self.occupancy[index]
        used = np.flatnonzero(row)
        return tuple(used.tolist()), tuple(row[used].tolist())


class _Sums:
    """The sums of one cached burst list that the port, credit and latency terms need (ps and bytes)."""

    __slots__ = ("bursts", "count", "issue", "hold", "bus", "fabric", "nbytes", "last_size", "last_beats")

    def __init__(self, bursts: Bursts, model: "TransferModel"):
        t, b = model.period, bursts
        penalty = b.unaligned * model.unaligned
        self.bursts, self.count = b, len(b)
        self.issue = int((model.issue_gap + penalty).sum())
        self.hold = int((np.maximum(model.issue_gap, b.beats * t) + penalty).sum())
        self.bus = int((-(-b.size // model.chip.gdma.bus_bytes)).sum()) * t
        self.fabric = int((-(-b.size // model.p.fabric_bytes)).sum()) * model.p.fabric_ps
        self.nbytes = int(b.size.sum())
        self.last_size, self.last_beats = (int(b.size[-1]), int(b.beats[-1])) if len(b) else (0, 0)


class TransferModel:
    """Computes the TransferCosts of a GDMA queue (see the module docstring)."""

    def __init__(self, chip: ChipConfig, clocks: Clocks):
        g = chip.gdma
        self.chip = chip
        self.p = p = WdcParams.of(chip, clocks)
        self.period = clocks.gdma.period
        self.setup = g.cmd_setup_cycles * self.period
        self.issue_gap = g.segment_issue_cycles * self.period
        self.unaligned = g.unaligned_penalty_cycles * self.period
        self.lmem_latency = ns_to_ps(g.lmem_access_latency_ns)
        self.outstanding = (g.outstanding_reads, g.outstanding_writes)
        self.burst_bytes = min(g.bus_bytes * g.max_burst_beats, 1 << chip.wdc.interleave_bits, chip.dram.page_bytes)
        self.move = p.umcs * p.page_bytes       # moving requests by this keeps UMCs and moves pages by one
        self.sums: dict[int, _Sums] = {}
        self.charged: dict[tuple, int] = {}
        self.tensor_forms: dict[tuple, tuple] = {}
        self.lmem_base = chip.core.gdma_lmem_base_address

    # ---- one command
    def _side(self, side):
        if side is None:
            return None, 0, NONE
        rel, shift = relative_bursts(side, self.chip, self.burst_bytes)
        sums = self.sums.get(id(rel))
        if sums is None or sums.bursts is not rel:
            sums = self.sums[id(rel)] = _Sums(rel, self)
        return sums, shift, (LMEM if side.lmem else DDR)

    def _shape(self, instr: Instruction) -> tuple:
        """(read sums, shift, kind, write sums, shift, kind, src bytes, dst bytes, charged DDR bytes)."""
        if type(instr) is TensorDma:
            return self._tensor_shape(instr)
        if isinstance(instr, SysDma):
            return (None, 0, NONE, None, 0, NONE, 0, 0, 0)
        return self._sides_shape(instr)

    def _tensor_shape(self, instr: TensorDma) -> tuple:
        """_shape of a dma.tensor, once per form: commands whose fields but the addresses are equal and whose
        addresses have the same burst_position keys share everything but the shifts."""
        chip, base, burst = self.chip, self.lmem_base, self.burst_bytes
        src, dst = instr.src_start_addr, instr.dst_start_addr
        src_lmem, dst_lmem = src >= base, dst >= base
        src_key, src_shift = burst_position(src_lmem, src - base if src_lmem else src, chip, burst)
        dst_key, dst_shift = burst_position(dst_lmem, dst - base if dst_lmem else dst, chip, burst)
        form = (_TENSOR_FORM(instr), src_lmem, src_key, dst_lmem, dst_key)
        shared = self.tensor_forms.get(form)
        if shared is None:
            shape = self._sides_shape(instr)
            shared = self.tensor_forms[form] = (shape[0], shape[2], shape[3], shape[5], *shape[6:])
            assert shape[1] == (src_shift if shape[2] != NONE else 0) and shape[4] == dst_shift
        rs, rk, ws, wk, src_bytes, dst_bytes, charged = shared
        return (rs, src_shift if rk != NONE else 0, rk, ws, dst_shift, wk, src_bytes, dst_bytes, charged)

    def _sides_shape(self, instr: Instruction) -> tuple:
        src, dst = transfer_sides(instr, self.chip)
        form = (src and (src.lmem, *src[2:]), (dst.lmem, *dst[2:]))       # everything but the addresses
        charged = self.charged.get(form)
        if charged is None:
            charged = self.charged[form] = charged_ddr_bytes(self.chip, src, dst)
        return (*self._side(src), *self._side(dst), src.nbytes if src is not None else 0, dst.nbytes, charged)

    # ---- a queue
    def costs(self, instrs: list[Instruction], same: list[int] | None = None) -> TransferCosts:
        shapes: list = []
        for i, instr in enumerate(instrs):
            first = same[i] if same is not None else i
            shapes.append(shapes[first] if first < i else self._shape(instr))
        n = len(shapes)
        state = DramState(self.p)
        occ, service = self._dram(shapes, n, state)
        fixed, port, fill, reorder, kinds = self._port(shapes)
        credit = np.maximum(-(-(fixed[:, 0] + service[:, 0]) // self.outstanding[0]),
                            -(-(fixed[:, 1] + service[:, 1]) // self.outstanding[1]))
        floor = direction_floor_ps(self.chip, kinds[:, 0], kinds[:, 1], kinds[:, 2], kinds[:, 2])
        port = np.maximum(port, floor - fill)          # the floor counts from setup, as in the per-burst model
        busiest = occ.max(axis=1) + reorder if n else np.zeros(0, dtype=np.int64)
        ddr = [(s[0].nbytes if s[2] == DDR else 0) + (s[3].nbytes if s[5] == DDR else 0) for s in shapes]
        return TransferCosts((self.setup + fill).tolist(), port.tolist(), credit.tolist(), busiest.tolist(), occ,
                             ddr, state)

    def _port(self, shapes) -> tuple:
        """Per command: credit constants (read, write), port limit, head + tail, reorder ps, and
        (read kind, write kind, charged bytes)."""
        rows, of_form = [], {}
        for rs, _, rk, ws, _, wk, _, _, charged in shapes:
            form = (id(rs), rk, id(ws), wk, charged)       # the row does not depend on the shifts
            row = of_form.get(form)
            if row is None:
                row = of_form[form] = self._port_row(rs, rk, ws, wk, charged)
            rows.append(row)
        a = np.asarray(rows, dtype=np.int64).reshape(-1, 8)
        return a[:, 0:2], a[:, 2], a[:, 3], a[:, 4], a[:, 5:8]

    def _port_row(self, rs, rk, ws, wk, charged) -> tuple:
        p, t = self.p, self.period
        trip_r = p.request_ps + p.min_read_ps + p.response_ps
        issue = bus = hold_w = lmem = head = tail = ddr_read = fixed_r = fixed_w = 0
        if rk == DDR:
            issue, bus, ddr_read = rs.issue, rs.bus, rs.nbytes
            fixed_r = rs.count * trip_r + rs.bus
            head = trip_r + -(-rs.last_size // self.chip.gdma.bus_bytes) * t
        elif rk == LMEM:
            lmem = rs.hold
            head = rs.last_beats * t + self.lmem_latency
        if wk == DDR:
            hold_w = ws.hold
            fixed_w = ws.count * (p.request_ps + p.response_ps) + ws.fabric
            tail = p.request_ps + -(-ws.last_size // p.fabric_bytes) * p.fabric_ps + p.response_ps
        elif wk == LMEM:
            tail = ws.last_beats * t + self.lmem_latency
        lmem_w = ws.hold if wk == LMEM else 0
        writes = max(hold_w, lmem_w)
        late = max(0, min(ddr_read, p.umcs << p.granule_bits) - (1 << p.granule_bits))
        reorder = writes * late // ddr_read if ddr_read else 0
        return (fixed_r, fixed_w, max(issue, bus, hold_w, lmem, lmem_w), head + tail, reorder, rk, wk, charged)

    def _dram(self, shapes, n: int, state: DramState) -> tuple[np.ndarray, np.ndarray]:
        """(occupancy (n, U), DRAM service (n, 2) read/write) via the distinct request patterns."""
        keys, index, pages, parts = {}, [], [], []
        move = self.move
        of_shape: dict = {}          # id(shape) -> (pattern, page shift) or None; equal commands share shapes
        for c, shape in enumerate(shapes):
            hit = of_shape.get(id(shape), False)
            if hit is False:
                hit = of_shape[id(shape)] = self._pattern(shape, keys, parts, move)
            if hit is not None:
                index.append(c)
                pages.append(hit)
        if not index:
            return np.zeros((n, self.p.umcs), dtype=np.int64), np.zeros((n, 2), dtype=np.int64)
        pats = patterns(self.p, *self._requests(parts), len(parts))
        kp = np.asarray(pages, dtype=np.int64)
        return command_occupancy(self.p, pats, np.asarray(index, dtype=np.int64), kp[:, 0], kp[:, 1], n, state)

    @staticmethod
    def _pattern(shape, keys: dict, parts: list, move: int) -> tuple[int, int] | None:
        """(pattern key, page shift) of a command's DDR requests (None: no DDR side); new patterns are added
        to `keys` and `parts`."""
        rs, rshift, rk, ws, wshift, wk = shape[:6]
        read, write = rk == DDR, wk == DDR
        if not read and not write:
            return None
        base = (rshift if rshift < wshift else wshift) if read and write else (rshift if read else wshift)
        base -= base % move
        key = (id(rs) if read else 0, rshift - base if read else 0, id(ws) if write else 0, wshift - base if write else 0)
        k = keys.get(key)
        if k is None:
            k = keys[key] = len(keys)
            parts.append((rs.bursts if read else None, rshift - base, ws.bursts if write else None, wshift - base))
        return k, base // move

    @staticmethod
    def _requests(parts) -> tuple:
        """(addresses, sizes, write flags, pattern keys) of every pattern's requests, reads before writes."""
        lists, shifts, flags, keys = [], [], [], []
        for k, (reads, rshift, writes, wshift) in enumerate(parts):
            for bursts, shift, flag in ((reads, rshift, False), (writes, wshift, True)):
                if bursts is not None and len(bursts):
                    lists.append(bursts)
                    shifts.append(shift)
                    flags.append(flag)
                    keys.append(k)
        counts = np.fromiter(map(len, lists), dtype=np.int64, count=len(lists))
        addr = np.concatenate([b.addr for b in lists]) + np.repeat(np.asarray(shifts, dtype=np.int64), counts)
        return (addr, np.concatenate([b.size for b in lists]), np.repeat(np.asarray(flags, dtype=bool), counts),
                np.repeat(np.asarray(keys, dtype=np.int64), counts))


__all__ = ["TransferCosts", "TransferModel"]
