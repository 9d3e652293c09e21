"""Race detector: happens-before between engines by vector clocks, and LMEM accesses tracked at
byte-range precision in buckets of per-lane offsets.

Clocks: instruction k of an engine inherits the clock of the engine's previous instruction
and, for every wait, the clock (at completion) of the instruction it waited for; component f
of a clock is the number of f's instructions that happen before it. Accesses (from
Program.accesses) are kept per bucket (offset // bucket_bytes) as (lane mask, lo, hi, engine,
cmd_id, is_write). Two accesses race when they overlap in bytes and lanes, come from different
engines, at least one writes, and the earlier one's cmd_id is beyond the later one's clock.

Pruning keeps buckets short without missing a race: a record is dropped once every other
engine's future clock covers it (it can never race again), or when a later access of the same
engine covers its part of the bucket (a write covers reads and writes, a read covers reads):
anything unordered with the older access is unordered with the newer one too.
"""

from __future__ import annotations

from tpuflow.errors import RaceError
from tpuflow.isa.base import Accesses, Engine, LmemRange
from tpuflow.isa.tile import TileQueueError
from tpuflow.program import ENGINES, Program

from tpuflow.hwmodel.functional.engines import Wait
from tpuflow.hwmodel.functional.errors import ExecutionError
from tpuflow.hwmodel.functional.machine import describe

BUCKET_BYTES = 16384
NEVER = 1 << 62


class RaceDetector:
    """Checks each instruction's LMEM accesses, just before it runs, against the recorded ones."""

    def __init__(self, program: Program, bucket_bytes: int | None = None):
        self.program = program
        self.bucket_bytes = bucket_bytes or BUCKET_BYTES
        self.sizes = [len(program.queue(e)) for e in ENGINES]
        self.clocks: list[list[tuple[int, int, int]]] = [[] for _ in ENGINES]
        self.buckets: dict[int, list[tuple]] = {}

    def clock_of(self, engine: Engine, index: int, waits: tuple[Wait, ...]) -> tuple[int, int, int]:
        e = engine.code
        own = self.clocks[e]
        clock = list(own[-1]) if own else [0] * len(ENGINES)
        clock[e] = index + 1
        for w in waits:
            other = self.clocks[w.engine.code][w.count - 1]
            clock = [max(a, b) for a, b in zip(clock, other)]
        return tuple(clock)

    def step(self, engine: Engine, index: int, waits: tuple[Wait, ...]) -> None:
        """Check the accesses of instruction `index` of `engine` (about to run) and record them."""
        e = engine.code
        clock = self.clock_of(engine, index, waits)
        accesses = self._accesses(engine, index)
        horizon = self.horizon(e, clock)
        for rng in accesses.lmem_reads:
            self._access(e, index + 1, clock, rng, False, horizon)
        for rng in accesses.lmem_writes:
            self._access(e, index + 1, clock, rng, True, horizon)
        self.clocks[e].append(clock)

    def horizon(self, e: int, clock: tuple) -> list[int]:
        """Per engine f: the least f-count that every other engine's future instructions have
        seen (NEVER when no other engine has instructions left): records below it are dead."""
        views = [(e, clock)]
        for g in range(len(ENGINES)):
            if g != e and len(self.clocks[g]) < self.sizes[g]:
                views.append((g, self.clocks[g][-1] if self.clocks[g] else (0,) * len(ENGINES)))
        return [min((c[f] for g, c in views if g != f), default=NEVER) for f in range(len(ENGINES))]

    def _accesses(self, engine: Engine, index: int) -> Accesses:
        try:
            return self.program.accesses(engine, index)
        except TileQueueError as exc:
            raise ExecutionError(f"TILE stream: {exc}") from None

    def _access(self, e: int, cid: int, clock: tuple, rng: LmemRange, write: bool, horizon: list[int]) -> None:
        if rng.lo >= rng.hi or rng.lanes <= 0:
            return
        mask = ((1 << rng.lanes) - 1) << rng.lane
        size = self.bucket_bytes
        new = (mask, rng.lo, rng.hi, e, cid, write)
        for b in range(rng.lo // size, (rng.hi - 1) // size + 1):
            records = self.buckets.get(b)
            if records is None:
                self.buckets[b] = [new]
                continue
            self.buckets[b] = self._merge(records, new, clock, horizon, b * size, (b + 1) * size)

    def _merge(self, records: list[tuple], new: tuple, clock: tuple, horizon: list[int],
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
                    raise self._race(rec, new, clock[e2])
            elif (write or not w2) and not m2 & ~mask and new_lo <= max(lo2, b_lo) and min(hi2, b_hi) <= new_hi:
                continue
            kept.append(rec)
        kept.append(new)
        return kept

    def _label(self, e: int, cid: int) -> str:
        engine = ENGINES[e]
        instr = self.program.queue(engine)[cid - 1]
        return describe(instr, cid, self.program.layer_of(engine, cid - 1))

    def _race(self, old: tuple, new: tuple, seen: int) -> RaceError:
        both = old[0] & new[0]
        lane = (both & -both).bit_length() - 1
        offset = max(old[1], new[1])
        verb = {True: "writes", False: "reads"}
        later = f"{ENGINES[new[3]].letter}{new[4]}"
        return RaceError(f"LMEM race at lane {lane} offset {offset:#x}: {self._label(old[3], old[4])} "
                         f"{verb[old[5]]} and {self._label(new[3], new[4])} {verb[new[5]]} these bytes, "
                         f"and no wait orders them ({later} is ordered after {ENGINES[old[3]].name} cmd "
                         f"{seen} at most)")
