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


import numpy as np

from tpuflow.chip import ChipConfig
from tpuflow.isa import Engine, resolve_stream
from tpuflow.isa.ids import IdFields, clamp
from tpuflow.isa.tile import sys_tile_wait
from tpuflow.lowering.emitter import Record


class ChunkTable:
    """Per engine, the last reader and last writer id of every LMEM chunk (flat chunk index =
    lane group * chunks per group + offset chunk)."""

    def __init__(self, chip: ChipConfig):
        self.lane_div = chip.deps.chunk_lanes
        self.off_div = chip.chunk_bytes_per_lane
        self.per_group = chip.lmem_bytes_per_lane // self.off_div
        chunks = (chip.lanes // self.lane_div) * self.per_group
        self.readers = np.zeros((3, chunks), np.int64)
        self.writers = np.zeros((3, chunks), np.int64)
        self._cache: dict[tuple, np.ndarray] = {}

    def chunks(self, ranges) -> np.ndarray:
        """Flat chunk indices touched by LMEM ranges (cached: programs repeat their patterns)."""
        key = tuple((r.lane, r.lanes, r.lo, r.hi) for r in ranges)
        hit = self._cache.get(key)
        if hit is None:
            parts = []
            for lane, lanes, lo, hi in key:
                g = np.arange(lane // self.lane_div, (lane + lanes - 1) // self.lane_div + 1)
                c = np.arange(lo // self.off_div, (hi - 1) // self.off_div + 1)
                parts.append((g[:, None] * self.per_group + c[None, :]).reshape(-1))
            hit = np.unique(np.concatenate(parts)) if parts else np.zeros(0, np.int64)
            self._cache[key] = hit
        return hit

    def conflicts(self, touched: np.ndarray, writes: np.ndarray) -> list[int]:
        """Per engine: the largest id that wrote a chunk in `touched` (reads and writes) or read
        a chunk in `writes`."""
        best = [0, 0, 0]
        if touched.size:
            best = self.writers[:, touched].max(axis=1).tolist()
        if writes.size:
            best = [max(a, b) for a, b in zip(best, self.readers[:, writes].max(axis=1).tolist())]
        return best

    def record(self, engine: int, cmd_id: int, reads: np.ndarray, writes: np.ndarray) -> None:
        self.readers[engine, reads] = cmd_id
        self.writers[engine, writes] = cmd_id


def assign_dependencies(records: list[Record], chip: ChipConfig, dep_mode: str = "bitmap"):
    """Queues (tiu, gdma, tile), their layer lists and the issue order string."""
    tile_acc = iter(resolve_stream([r.instr for r in records if r.engine is Engine.TILE], chip))
    table = ChunkTable(chip)
    widths = IdFields.of(chip)
    queues: list[list] = [[], [], []]
    layers: list[list[str]] = [[], [], []]
    order: list[str] = []
    tile_waited = [0, 0]

    def push(engine: Engine, instr, layer: str) -> int:
        e = engine.code
        queues[e].append(instr)
        layers[e].append(layer)
        order.append(engine.letter)
        return len(queues[e])

    for rec in records:
        e = rec.engine.code
        acc = next(tile_acc) if rec.engine is Engine.TILE else rec.instr.accesses(chip)
        reads, writes = table.chunks(acc.lmem_reads), table.chunks(acc.lmem_writes)
        if dep_mode == "auto":
            waits = [len(queues[0]), len(queues[1]), len(queues[2])]
        else:
            waits = table.conflicts(table.chunks(acc.lmem_reads + acc.lmem_writes), writes)
            waits[e] = 0
        bits = widths.bits(rec.engine)
        if rec.engine is not Engine.TILE and waits[2] > tile_waited[e]:
            other = [waits[0], waits[1], 0] if dep_mode == "auto" else [0, 0, 0]
            wait = sys_tile_wait(rec.engine, waits[2])
            push(rec.engine, wait.with_waits(_clamped(other, queues, bits)), rec.layer)
            tile_waited[e] = waits[2]
        instr = rec.instr.with_waits(_clamped(waits, queues, bits))
        cmd_id = push(rec.engine, instr, rec.layer)
        table.record(e, cmd_id, reads, writes)
    return queues, layers, "".join(order)


def _clamped(waits: list[int], queues: list[list], bits: int) -> list[int]:
    """Each engine's id moved forward into the id window of the field that carries it."""
    return [clamp(w, len(q), bits) for w, q in zip(waits, queues)]
