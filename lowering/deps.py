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

import dataclasses

import numpy as np

from tpuflow.chip import ChipConfig
from tpuflow.isa import TILE_WAIT_TAG, Engine, SysDma, SysTiu, resolve_stream
from tpuflow.isa.ids import IdFields, clamp
from tpuflow.lowering.emitter import Record

ENGINE_INDEX = {Engine.TIU: 0, Engine.GDMA: 1, Engine.TILE: 2}


class ChunkTable:
    """Per engine, the last reader and last writer id of every LMEM chunk."""

    def __init__(self, chip: ChipConfig):
        self.lane_div = chip.deps.chunk_lanes
        self.off_div = chip.chunk_bytes_per_lane
        groups = chip.lanes // self.lane_div
        per_group = chip.lmem_bytes_per_lane // self.off_div
        self.readers = np.zeros((3, groups, per_group), np.int64)
        self.writers = np.zeros((3, groups, per_group), np.int64)

    def boxes(self, ranges) -> list[tuple[slice, slice]]:
        out = []
        for r in ranges:
            g0, g1 = r.lane // self.lane_div, (r.lane + r.lanes - 1) // self.lane_div + 1
            c0, c1 = r.lo // self.off_div, (r.hi - 1) // self.off_div + 1
            out.append((slice(g0, g1), slice(c0, c1)))
        return out

    def conflict(self, other: int, reads, writes) -> int:
        best = 0
        for box in reads + writes:
            best = max(best, int(self.writers[other][box].max()))
        for box in writes:
            best = max(best, int(self.readers[other][box].max()))
        return best

    def record(self, engine: int, cmd_id: int, reads, writes) -> None:
        for box in reads:
            self.readers[engine][box] = cmd_id
        for box in writes:
            self.writers[engine][box] = cmd_id


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
        e = ENGINE_INDEX[engine]
        queues[e].append(instr)
        layers[e].append(layer)
        order.append(engine.letter)
        return len(queues[e])

    for rec in records:
        e = ENGINE_INDEX[rec.engine]
        acc = next(tile_acc) if rec.engine is Engine.TILE else rec.instr.accesses(chip)
        reads, writes = table.boxes(acc.lmem_reads), table.boxes(acc.lmem_writes)
        if dep_mode == "auto":
            waits = [len(queues[0]), len(queues[1]), len(queues[2])]
        else:
            waits = [table.conflict(o, reads, writes) if o != e else 0 for o in range(3)]
        instr = rec.instr
        if rec.engine is Engine.TILE:
            bits = widths.tile_bits
            instr = dataclasses.replace(instr, wait_tiu_id=clamp(waits[0], len(queues[0]), bits),
                                        wait_gdma_id=clamp(waits[1], len(queues[1]), bits))
        else:
            if waits[2] > tile_waited[e]:
                push(rec.engine, _tile_wait(rec.engine, waits[2]), rec.layer)
                tile_waited[e] = waits[2]
            bits = widths.tiu_bits if e == 0 else widths.gdma_bits
            instr = dataclasses.replace(instr, cmd_id_dep=clamp(waits[1 - e], len(queues[1 - e]), bits))
        cmd_id = push(rec.engine, instr, rec.layer)
        table.record(e, cmd_id, reads, writes)
    return queues, layers, "".join(order)


def _tile_wait(engine: Engine, tile_id: int):
    if engine is Engine.TIU:
        return SysTiu(op="wait_msg", reg_idx=TILE_WAIT_TAG, imm=tile_id)
    return SysDma(op="sys_wait", index=TILE_WAIT_TAG, constant_value=tile_id)
