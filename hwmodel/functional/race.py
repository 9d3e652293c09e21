"""Race detector: happens-before between engines (of every core) by vector clocks, and LMEM (per
core) and DDR (shared, multi-core programs) accesses tracked at byte-range precision in buckets.

Clocks: one component per (core, engine), core * 3 + Engine.code (the engine's code on one core).
Instruction k of an engine inherits the clock of the engine's previous instruction and, for every
wait, the clock (at completion) of the instruction it waited for; a message wait also joins the
clocks of the sends of its round (`joins`, given by the executor). Component f of a clock is the
number of f's instructions that happen before it. Accesses (from Program.accesses) are kept per
(space, bucket): space = the core for LMEM (private), DDR for DDR; LMEM records are (lane mask, lo,
hi, component, cmd_id, is_write), a DDR record is one instruction's ranges in the bucket (lo, hi,
component, cmd_id, is_write, ranges): strided DMAs have hundreds of rows each. Two accesses race when they overlap in bytes and lanes, come from
different components, at least one writes, and the earlier one's cmd_id is beyond the later one's
clock. DDR is checked for multi-core programs only (on one core only GDMA touches DDR, in order).

Pruning keeps buckets short without missing a race: a record is dropped once every other
component's future clock covers it (it can never race again), or when a later access of the same
component covers its part of the bucket (a write covers reads and writes, a read covers reads):
anything unordered with the older access is unordered with the newer one too. A core's LMEM has a
horizon of its own engines only (no other core touches it); the DDR horizon spans every core and
is recomputed every HORIZON_STEPS instructions (an older horizon only prunes less).
"""

from __future__ import annotations

from tpuflow.errors import RaceError
from tpuflow.isa.base import Accesses, Engine
from tpuflow.isa.tile import TileQueueError
from tpuflow.program import ENGINES, Program

from tpuflow.hwmodel.functional.engines import Wait
from tpuflow.hwmodel.functional.errors import ExecutionError
from tpuflow.hwmodel.functional.machine import describe

BUCKET_BYTES = 16384
DDR_BUCKET_BYTES = 65536
DDR = -1            # the space key of DDR (LMEM spaces are core numbers)
NEVER = 1 << 62
HORIZON_STEPS = 32


def join(a: tuple, b: tuple) -> tuple:
    return tuple(x if x >= y else y for x, y in zip(a, b))


class RaceDetector:
    """Checks each instruction's LMEM (and, multi-core, DDR) accesses, just before it runs, against
    the recorded ones."""

    def __init__(self, program: Program, bucket_bytes: int | None = None):
        self.program = program
        self.views = [program.core(k) for k in range(program.core_count)]
        self.multi = program.core_count > 1
        self.bucket_bytes = bucket_bytes or BUCKET_BYTES
        self.sizes = [len(view.queue(e)) for view in self.views for e in ENGINES]
        self.width = len(self.sizes)
        self.clocks: list[list[tuple]] = [[] for _ in range(self.width)]
        self.buckets: dict[tuple[int, int], list[tuple]] = {}
        self._horizon: list[int] | None = None
        self._steps = 0

    def clock_of(self, engine: Engine, index: int, waits: tuple[Wait, ...], core: int = 0,
                 joins: tuple[tuple, ...] = ()) -> tuple:
        e = core * len(ENGINES) + engine.code
        own = self.clocks[e]
        clock = own[-1] if own else (0,) * self.width
        clock = clock[:e] + (index + 1,) + clock[e + 1:]
        for w in waits:
            clock = join(clock, self.clocks[core * len(ENGINES) + w.engine.code][w.count - 1])
        for other in joins:
            clock = join(clock, other)
        return clock

    def step(self, engine: Engine, index: int, waits: tuple[Wait, ...], core: int = 0,
             joins: tuple[tuple, ...] = ()) -> tuple:
        """Check the accesses of instruction `index` of `engine` of `core` (about to run), record
        them, and return its clock."""
        e = core * len(ENGINES) + engine.code
        clock = self.clock_of(engine, index, waits, core, joins)
        accesses = self._accesses(core, engine, index)
        horizon = self.core_horizon(core, e, clock) if self.multi else self.horizon(e, clock)
        for rng in accesses.lmem_reads:
            self._access(core, e, index + 1, clock, ((1 << rng.lanes) - 1) << rng.lane, rng.lo, rng.hi, False, horizon)
        for rng in accesses.lmem_writes:
            self._access(core, e, index + 1, clock, ((1 << rng.lanes) - 1) << rng.lane, rng.lo, rng.hi, True, horizon)
        if self.multi:
            horizon = self.horizon(e, clock)
            for ranges, write in ((accesses.ddr_reads, False), (accesses.ddr_writes, True)):
                if ranges:
                    self._ddr_access(e, index + 1, clock, ranges, write, horizon)
        self.clocks[e].append(clock)
        return clock

    def horizon(self, e: int, clock: tuple) -> list[int]:
        """Per component f: the least f-count that every other component's future instructions have
        seen (NEVER when no other has instructions left): records below it are dead."""
        if self.multi:
            self._steps += 1
            if self._horizon is None or self._steps % HORIZON_STEPS == 0:
                self._horizon = self._views_horizon([(e, clock)] + self._unfinished(e))
            return self._horizon
        return self._views_horizon([(e, clock)] + self._unfinished(e))

    def core_horizon(self, core: int, e: int, clock: tuple) -> list[int]:
        """The horizon of a core's private LMEM: only that core's engines can touch it, so a record
        is dead once the core's other engines have seen it (other components: NEVER, unused)."""
        first = core * len(ENGINES)
        mine = range(first, first + len(ENGINES))
        views = [(e, clock)] + [(g, self.clocks[g][-1] if self.clocks[g] else (0,) * self.width)
                                for g in mine if g != e and len(self.clocks[g]) < self.sizes[g]]
        horizon = [NEVER] * self.width
        for f in mine:
            horizon[f] = min((c[f] for g, c in views if g != f), default=NEVER)
        return horizon

    def _unfinished(self, e: int) -> list[tuple[int, tuple]]:
        return [(g, self.clocks[g][-1] if self.clocks[g] else (0,) * self.width)
                for g in range(self.width) if g != e and len(self.clocks[g]) < self.sizes[g]]

    def _views_horizon(self, views: list[tuple[int, tuple]]) -> list[int]:
        return [min((c[f] for g, c in views if g != f), default=NEVER) for f in range(self.width)]

    def _accesses(self, core: int, engine: Engine, index: int) -> Accesses:
        try:
            return self.views[core].accesses(engine, index)
        except TileQueueError as exc:
            raise ExecutionError(f"{'core %d ' % core if self.multi else ''}TILE stream: {exc}") from None

    def _access(self, space: int, e: int, cid: int, clock: tuple, mask: int, lo: int, hi: int, write: bool,
                horizon: list[int]) -> None:
        if lo >= hi or mask <= 0:
            return
        size = self.bucket_bytes
        new = (mask, lo, hi, e, cid, write)
        for b in range(lo // size, (hi - 1) // size + 1):
            records = self.buckets.get((space, b))
            if records is None:
                self.buckets[(space, b)] = [new]
                continue
            self.buckets[(space, b)] = self._merge(space, records, new, clock, horizon, b * size, (b + 1) * size)

    def _ddr_access(self, e: int, cid: int, clock: tuple, ranges, write: bool, horizon: list[int]) -> None:
        """DDR: one record per instruction and bucket holding its byte ranges there (a strided DMA has
        hundreds), checked against each older record whose span overlaps by merging the two lists."""
        size = DDR_BUCKET_BYTES
        parts: dict[int, list[tuple[int, int]]] = {}
        for rng in ranges:
            if rng.hi <= rng.lo:
                continue
            for b in range(rng.lo // size, (rng.hi - 1) // size + 1):
                parts.setdefault(b, []).append((max(rng.lo, b * size), min(rng.hi, (b + 1) * size)))
        for b, mine in parts.items():
            mine.sort()
            new = (mine[0][0], max(hi for _, hi in mine), e, cid, write, tuple(mine))
            kept = []
            for rec in self.buckets.get((DDR, b), ()):
                lo2, hi2, e2, id2, w2, parts2 = rec
                if id2 <= horizon[e2]:
                    continue
                if e2 != e:
                    if (write or w2) and id2 > clock[e2] and lo2 < new[1] and new[0] < hi2:
                        at = _first_overlap(new[5], parts2)
                        if at is not None:
                            raise self._race(DDR, (1, at, at + 1, e2, id2, w2), (1, at, at + 1, e, cid, write), clock[e2])
                elif (write or not w2) and len(mine) == 1 and new[0] <= lo2 and hi2 <= new[1]:
                    continue
                kept.append(rec)
            kept.append(new)
            self.buckets[(DDR, b)] = kept

    def _merge(self, space: int, records: list[tuple], new: tuple, clock: tuple, horizon: list[int],
               b_lo: int, b_hi: int) -> list[tuple]:
        mask, lo, hi, e, cid, write = new
        new_lo, new_hi = max(lo, b_lo), min(hi, b_hi)
        kept = []
        for rec in records:
            m2, lo2, hi2, e2, id2, w2 = rec
            if id2 <= horizon[e2]:
                continue
            if e2 != e:
                if (write or w2) and id2 > clock[e2] and m2 & mask and lo2 < hi and lo < hi2:
                    raise self._race(space, rec, new, clock[e2])
            elif (write or not w2) and not m2 & ~mask and new_lo <= max(lo2, b_lo) and min(hi2, b_hi) <= new_hi:
                continue
            kept.append(rec)
        kept.append(new)
        return kept

    def _label(self, e: int, cid: int) -> str:
        core, engine = divmod(e, len(ENGINES))
        view, engine = self.views[core], ENGINES[engine]
        label = describe(view.queue(engine)[cid - 1], cid, view.layer_of(engine, cid - 1))
        return f"core {core} {label}" if self.multi else label

    def _race(self, space: int, old: tuple, new: tuple, seen: int) -> RaceError:
        verb = {True: "writes", False: "reads"}
        core, engine = divmod(old[3], len(ENGINES))
        later = f"{ENGINES[new[3] % len(ENGINES)].letter}{new[4]}"
        earlier = f"{ENGINES[engine].name} cmd {seen}" + (f" of core {core}" if self.multi else "")
        if space == DDR:
            where = f"DDR race at {max(old[1], new[1]):#x}"
        else:
            both = old[0] & new[0]
            lane = (both & -both).bit_length() - 1
            where = f"LMEM race{f' on core {space}' if self.multi else ''} at lane {lane} offset {max(old[1], new[1]):#x}"
        order = "no wait or message orders them" if self.multi else "no wait orders them"
        return RaceError(f"{where}: {self._label(old[3], old[4])} {verb[old[5]]} and {self._label(new[3], new[4])} "
                         f"{verb[new[5]]} these bytes, and {order} ({later} is ordered after {earlier} at most)")


def _first_overlap(a: tuple, b: tuple) -> int | None:
    """The first byte two lists of ranges (each sorted by start) share, or None."""
    i = j = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if lo < hi:
            return lo
        if a[i][1] <= b[j][1]:
            i += 1
        else:
            j += 1
    return None
