"""The instruction DAG the scheduler orders: nodes, precise-hazard edges, durations and lags (arrays).

Nodes are the program's instructions in original issue order, minus the SYS waits on TILE (they
are derived from the order, lowering.deps re-inserts them) and minus each queue's trailing
`end` / `chain_end` (kept last). Edges: RAW/WAR/WAW on precise LMEM and DDR byte ranges
(scheduler.hazards), the TILE queue order (TILE operands are queue-relative), and the queue
neighbours of any other SYS instruction (their effect is not described by ranges, so they stay put
in their queue).

Timing model (integer ps, hwmodel.timing.cost.instruction_timing_ps: the cost model the bounds and
the lowering's tiling choices use too):
a node occupies its engine for `duration`; an engine runs one node at a time. An edge a -> b
means start(b) >= start(a) + duration(a) when both are on one engine (in-order pipeline), and
start(b) >= start(a) + duration(a) + tail(a) + head(b) across engines: `tail` is the TIU compute
latency before the sync id advances, `head` the TIU pipe fill (DES + GEN + ISSUE + ARB) paid after
a wait. Completion (what the makespan counts) is start + duration + tail.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tpuflow.hwmodel.timing.cost import instruction_timing_ps
from tpuflow.isa import Engine, SysDma, SysTiu
from tpuflow.isa.base import same_as_earlier
from tpuflow.program import Program
from tpuflow.scheduler.hazards import HazardFinder

TILE = Engine.TILE.code
LMEM_LANE_BLOCK = 8          # lanes per index bucket (tile slots are single-lane: keeps buckets short)


def is_stream_end(instr) -> bool:
    return (isinstance(instr, SysTiu) and instr.op == "end") or (isinstance(instr, SysDma) and instr.op == "chain_end")


@dataclass
class Dag:
    engine: np.ndarray        # int8 Engine.code per node
    queue_index: np.ndarray   # 0-based index in the original engine queue
    duration: np.ndarray      # ps the node occupies its engine (>= 1)
    head: np.ndarray          # ps after a cross-engine wait before the node starts
    tail: np.ndarray          # ps after the node's occupancy before it counts as done
    pred_ptr: np.ndarray      # CSR: predecessors of node i are pred_idx[pred_ptr[i]:pred_ptr[i+1]]
    pred_idx: np.ndarray
    trailer: list[tuple[int, int]]   # (engine code, queue index) of the stream ends, in issue order

    @property
    def size(self) -> int:
        return len(self.engine)

    def preds(self, i: int) -> np.ndarray:
        return self.pred_idx[self.pred_ptr[i]:self.pred_ptr[i + 1]]

    def edges(self) -> tuple[np.ndarray, np.ndarray]:
        """(src, dst) arrays of every edge."""
        dst = np.repeat(np.arange(self.size), np.diff(self.pred_ptr))
        return self.pred_idx.copy(), dst

    def successor_lists(self) -> list[list[int]]:
        succ: list[list[int]] = [[] for _ in range(self.size)]
        for b in range(self.size):
            for a in self.pred_idx[self.pred_ptr[b]:self.pred_ptr[b + 1]].tolist():
                succ[a].append(b)
        return succ

    def lag(self, a: int, b: int) -> int:
        """Extra ps beyond duration(a) between start(a) and start(b) on edge a -> b."""
        if self.engine[a] == self.engine[b]:
            return 0
        return int(self.tail[a] + self.head[b])


def node_timing(instr, chip) -> tuple[int, int, int]:
    """(duration, head, tail) in ps of one instruction: hwmodel.timing.cost's, the one cost model."""
    return instruction_timing_ps(instr, chip)


class _Builder:
    """Collects the nodes of build_dag in issue order."""

    def __init__(self, program: Program):
        self.program, self.chip = program, program.chip
        self.finder = HazardFinder(self.chip.lanes, LMEM_LANE_BLOCK, self.chip.chunk_bytes_per_lane)
        self.same = [same_as_earlier(program.queue(e)) for e in Engine]
        self.known: list[dict] = [{}, {}, {}]    # per engine: first equal instruction -> (timing, accesses or None)
        self.columns: list[list] = [[], [], [], [], []]   # engine, queue index, duration, head, tail
        self.preds: list[list[int]] = []
        self.last_node = [-1, -1, -1]
        self.pinned_open = [False, False, False]

    def add(self, code: int, index: int, instr) -> None:
        node = len(self.preds)
        first = self.same[code][index]
        known = self.known[code].get(first)
        if known is None:
            acc = None if code == TILE else instr.accesses(self.chip)
            known = self.known[code][first] = (node_timing(instr, self.chip), acc)
        timing, acc = known
        preds = self.finder.add(node, self.program.accesses(Engine.of_code(code), index) if acc is None else acc)
        pinned = isinstance(instr, (SysTiu, SysDma))
        if self.last_node[code] >= 0 and (code == TILE or pinned or self.pinned_open[code]):
            preds.add(self.last_node[code])
        self.pinned_open[code], self.last_node[code] = pinned, node
        for column, value in zip(self.columns, (code, index, *timing)):
            column.append(value)
        self.preds.append(sorted(preds))

    def dag(self, trailer: list[tuple[int, int]]) -> Dag:
        ptr = np.zeros(len(self.preds) + 1, dtype=np.int64)
        ptr[1:] = np.cumsum([len(p) for p in self.preds])
        idx = np.fromiter((a for p in self.preds for a in p), dtype=np.int64, count=int(ptr[-1]))
        engine, qindex, dur, head, tail = self.columns
        return Dag(np.asarray(engine, np.int8), np.asarray(qindex, np.int64), np.asarray(dur, np.int64),
                   np.asarray(head, np.int64), np.asarray(tail, np.int64), ptr, idx, trailer)


def build_dag(program: Program) -> Dag:
    """The DAG of `program` (see the module docstring)."""
    builder = _Builder(program)
    trailer: list[tuple[int, int]] = []
    last_ends = {e: len(program.queue(e)) - 1 for e in Engine
                 if program.queue(e) and is_stream_end(program.queue(e)[-1])}
    for eng, index in program.issue_sequence():
        instr = program.queue(eng)[index]
        if last_ends.get(eng) == index:
            trailer.append((eng.code, index))
        elif not instr.is_tile_wait:
            builder.add(eng.code, index, instr)
    return builder.dag(trailer)
