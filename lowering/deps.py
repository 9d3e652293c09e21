"""Dependency ids from chunk bitmaps: turns the emitted stream (issue order) into the three
queues with cmd_id_dep, TILE waits and the explicit SYS waits on TILE.

The rule (the timing model's IFE check re-derives it independently): LMEM is cut into chunks
(lane // chip.deps.chunk_lanes, offset // chip.chunk_bytes_per_lane). Walking the stream in issue
order with, per engine and chunk, the last reader id and the last writer id, an instruction X of
engine E waits for engine O at

    max(last_writer[O][c] for c in reads(X) | writes(X), last_reader[O][c] for c in writes(X))

(RAW, WAW, WAR), 0 if nothing conflicts, then moved forward into the id window of the field
that carries it (tpuflow.isa.ids: never more than 2**bits - 1 ids behind the other engine's last
issued instruction). TIU <-> GDMA waits go in cmd_id_dep. TILE blocks carry
wait_tiu_id / wait_gdma_id. A TIU or GDMA instruction that conflicts with TILE chunks is preceded,
in its own queue, by a SYS wait on that TILE block (system.wait_msg / dma.sys.sys_wait tagged
TILE_WAIT_TAG), unless an earlier wait of the same queue already covers it. In auto mode
(DIS_AUTO_DEP_ID = 1) every instruction waits for everything the other engines were issued
before it.
"""

from __future__ import annotations

from operator import itemgetter

from tpuflow.chip import ChipConfig
from tpuflow.isa import Engine, resolve_stream
from tpuflow.isa.ids import IdFields
from tpuflow.isa.tile import sys_tile_wait
from tpuflow.lowering.emitter import Record


class ChunkTable:
    """Per engine, the last reader and last writer id of every LMEM chunk (flat chunk index =
    lane group * chunks per group + offset chunk), as one list per engine: entries [0, chunks) the
    last writers, [chunks, 2 * chunks) the last readers. An instruction's facts (cached by its LMEM
    ranges: programs repeat their patterns) are the entries its conflicts read and the entries its
    record writes; most instructions touch a few chunks, so plain lists beat numpy's per-call cost."""

    def __init__(self, chip: ChipConfig):
        self.lane_div = chip.deps.chunk_lanes
        self.off_div = chip.chunk_bytes_per_lane
        self.per_group = chip.lmem_bytes_per_lane // self.off_div
        self.count = (chip.lanes // self.lane_div) * self.per_group
        self.table = [[0] * (2 * self.count) for _ in range(3)]
        self._cache: dict[tuple, list[int]] = {}
        self._facts: dict[tuple, tuple] = {}

    def chunks(self, ranges) -> list[int]:
        """Flat chunk indices touched by LMEM ranges (sorted, unique)."""
        key = tuple((r.lane, r.lanes, r.lo, r.hi) for r in ranges)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = self._chunks_of(key)
        return hit

    def _chunks_of(self, key: tuple) -> list[int]:
        out: set[int] = set()
        for lane, lanes, lo, hi in key:
            first, last = lo // self.off_div, (hi - 1) // self.off_div + 1
            for g in range(lane // self.lane_div, (lane + lanes - 1) // self.lane_div + 1):
                out.update(range(g * self.per_group + first, g * self.per_group + last))
        return sorted(out)

    def facts(self, acc) -> tuple:
        """(conflict getter, record entries) of an instruction's Accesses. The getter takes one
        engine's list to a tuple of the writer entries of every chunk the instruction reads or
        writes and the reader entries of every chunk it writes (None if there are none); the
        record entries are the writer entries of its writes and the reader entries of its reads."""
        key = (acc.lmem_reads, acc.lmem_writes)
        hit = self._facts.get(key)
        if hit is None:
            reads, writes = self.chunks(acc.lmem_reads), self.chunks(acc.lmem_writes)
            touched = self.chunks(acc.lmem_reads + acc.lmem_writes)
            n = self.count
            conflict = touched + [c + n for c in writes]
            getter = itemgetter(*conflict, conflict[0]) if conflict else None   # always a tuple
            hit = self._facts[key] = (getter, writes + [c + n for c in reads])
        return hit

    def conflicts_at(self, getter) -> list[int]:
        """Per engine: the largest id among the entries of `getter` (facts()), 0 if none."""
        if getter is None:
            return [0, 0, 0]
        return [max(getter(ids)) for ids in self.table]

    def record_at(self, engine: int, cmd_id: int, entries: list[int]) -> None:
        ids = self.table[engine]
        for k in entries:
            ids[k] = cmd_id


def assign_dependencies(records: list[Record], chip: ChipConfig, dep_mode: str = "bitmap",
                        accesses: list | None = None):
    """Queues (tiu, gdma, tile), their layer lists and the issue order string. `accesses`, when
    given, holds each record's Accesses (None where unknown: computed here; a TILE record's must
    be its block's in this TILE stream, isa.tile.resolve_stream)."""
    if accesses is None:
        tile_acc = iter(resolve_stream([r.instr for r in records if r.engine is Engine.TILE], chip))
        accesses = [next(tile_acc) if r.engine is Engine.TILE else None for r in records]
    table = ChunkTable(chip)
    widths = IdFields.of(chip)
    bits = [widths.bits(e) for e in (Engine.TIU, Engine.GDMA, Engine.TILE)]
    queues: list[list] = [[], [], []]
    layers: list[list[str]] = [[], [], []]
    order: list[str] = []
    tile_waited = [0, 0]
    auto = dep_mode == "auto"

    def push(engine: Engine, instr, layer: str) -> int:
        e = engine.code
        queues[e].append(instr)
        layers[e].append(layer)
        order.append(engine.letter)
        return len(queues[e])

    for rec, acc in zip(records, accesses):
        engine = rec.engine
        e = engine.code
        conflict_get, record_entries = table.facts(rec.instr.accesses(chip) if acc is None else acc)
        if auto:
            waits = [len(queues[0]), len(queues[1]), len(queues[2])]
        else:
            waits = table.conflicts_at(conflict_get)
            waits[e] = 0
        if e != Engine.TILE.code and waits[2] > tile_waited[e]:
            other = [waits[0], waits[1], 0] if auto else [0, 0, 0]
            wait = sys_tile_wait(engine, waits[2])
            push(engine, wait.with_waits(_clamped(other, queues, bits[e])), rec.layer)
            tile_waited[e] = waits[2]
        instr = rec.instr.with_waits(_clamped(waits, queues, bits[e]))
        cmd_id = push(engine, instr, rec.layer)
        table.record_at(e, cmd_id, record_entries)
    return queues, layers, "".join(order)


def _clamped(waits: list[int], queues: list[list], bits: int) -> list[int]:
    """Each engine's id moved forward into the id window of the field that carries it
    (tpuflow.isa.ids.clamp, inlined: this runs for every instruction)."""
    span = (1 << bits) - 1
    out = []
    for w, q in zip(waits, queues):
        floor = len(q) - span
        out.append(w if w >= floor else floor)
    return out
