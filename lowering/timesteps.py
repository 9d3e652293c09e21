"""The timestep table of a sliced run (step t loads slice t, computes slice t - 1 and stores slice
t - 2) and the pipelined order of the run's instructions that follows it wherever their data
hazards allow: loads of the next slice go ahead of this slice's compute, stores trail behind."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import networkx as nx

from tpuflow.chip import ChipConfig
from tpuflow.isa import Engine
from tpuflow.scheduler.dag import LMEM_LANE_BLOCK
from tpuflow.scheduler.hazards import HazardFinder

LOAD, COMPUTE, STORE = 0, 1, 2          # phases, in their order inside a step
PHASE_NAMES = ("load", "compute", "store")


@dataclass(frozen=True)
class Step:
    """One row of the table: the slice whose inputs load, the one computing, the one storing."""

    index: int
    load: int | None
    compute: int | None
    store: int | None

    def slice_in(self, phase: int) -> int | None:
        return (self.load, self.compute, self.store)[phase]


def timestep_table(slices: int) -> list[Step]:
    """Steps 0 .. slices + 1: step t loads slice t, computes slice t - 1, stores slice t - 2."""
    def inside(s: int) -> int | None:
        return s if 0 <= s < slices else None
    return [Step(t, inside(t), inside(t - 1), inside(t - 2)) for t in range(slices + 2)]


def step_of(slice_index: int, phase: int) -> int:
    """The table step in which `phase` of slice `slice_index` runs."""
    return slice_index + phase


def phase_of(engine: Engine, accesses) -> int:
    """LOAD: a DMA from DDR into LMEM; STORE: a DMA from LMEM into DDR; COMPUTE: the rest."""
    if engine != Engine.GDMA:
        return COMPUTE
    if accesses.ddr_reads and accesses.lmem_writes and not accesses.ddr_writes:
        return LOAD
    if accesses.lmem_reads and accesses.ddr_writes and not accesses.lmem_writes:
        return STORE
    return COMPUTE


def pipelined_order(records: Sequence, slice_of: Sequence[int], chip: ChipConfig) -> list[int]:
    """Indices of `records` (one sliced run, in emission order; `slice_of[i]` is record i's
    slice) in timestep-table order: among the records whose hazard predecessors (RAW/WAR/WAW on
    precise LMEM and DDR ranges) are placed, the one of the earliest (step, phase, emission
    index) goes next. A record that touches no memory (SYS) keeps its place relative to all."""
    finder = HazardFinder(chip.lanes, LMEM_LANE_BLOCK, chip.chunk_bytes_per_lane)
    preds: list[set[int]] = []
    keys: list[tuple[int, int, int]] = []
    barrier, since_barrier = -1, []
    for i, record in enumerate(records):
        acc = record.instr.accesses(chip)
        if not (acc.lmem_reads or acc.lmem_writes or acc.ddr_reads or acc.ddr_writes):
            p = set(since_barrier) | ({barrier} if barrier >= 0 else set())
            barrier, since_barrier = i, []
        else:
            p = finder.add(i, acc) | ({barrier} if barrier >= 0 else set())
            since_barrier.append(i)
        preds.append(p)
        phase = phase_of(record.engine, acc)
        keys.append((step_of(slice_of[i], phase), phase, i))
    order = nx.DiGraph()
    order.add_nodes_from(range(len(records)))
    order.add_edges_from((q, i) for i, p in enumerate(preds) for q in p)
    return list(nx.lexicographical_topological_sort(order, key=keys.__getitem__))
