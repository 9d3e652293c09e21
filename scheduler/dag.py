"""The instruction DAG the scheduler orders: nodes, precise-hazard edges, durations and lags (arrays).

Nodes are the program's instructions in original issue order, minus the SYS waits on TILE (they
are derived from the order, lowering.deps re-inserts them) and minus each queue's trailing
`end` / `chain_end` (kept last). Edges: RAW/WAR/WAW on precise LMEM and DDR byte ranges
(scheduler.hazards), the TILE queue order (TILE operands are queue-relative), and the queue
neighbours of any other SYS instruction (their effect is not described by ranges, so they stay put
in their queue); a SEND/WAIT message is a fence of its queue (every earlier node before it, every
later one after it). Multi-core programs: build_chip_dag.

Timing model (integer ps, hwmodel.timing.cost.instruction_timing_ps: the cost model the bounds and
the lowering's tiling choices use too):
a node occupies its engine for `duration`; an engine runs one node at a time. An edge a -> b
means start(b) >= start(a) + duration(a) when both are on one engine (in-order pipeline), and
start(b) >= start(a) + duration(a) + tail(a) + head(b) across engines: `tail` is the TIU compute
latency before the sync id advances, `head` the TIU pipe fill (DES + GEN + ISSUE + ARB) paid after
a wait. Completion (what the makespan counts) is start + duration + tail. A SEND's tail includes
core.message_latency_ns (it reaches the waits on other cores that much later).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

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
    engine: np.ndarray        # int8 unit per node: Engine.code (+ 3 * core on a multi-core program)
    queue_index: np.ndarray   # 0-based index in the original engine queue
    duration: np.ndarray      # ps the node occupies its engine (>= 1)
    head: np.ndarray          # ps after a cross-engine wait before the node starts
    tail: np.ndarray          # ps after the node's occupancy before it counts as done
    pred_ptr: np.ndarray      # CSR: predecessors of node i are pred_idx[pred_ptr[i]:pred_ptr[i+1]]
    pred_idx: np.ndarray
    trailer: list[tuple[int, int]]   # (unit, queue index) of the stream ends, in issue order
    units: int = 3            # engine slots: a node's `engine` is core * 3 + Engine.code (the code on one core)
    accesses: list | None = None     # per node its isa Accesses (TILE: resolved in the original TILE stream)

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


_SHARED: dict = {"chip": None, "facts": {}}
SHARED_LIMIT = 1 << 18       # instructions remembered across DAGs (the table restarts beyond it)


def _shared_facts(chip) -> dict:
    """Instruction (without waits) -> (timing, accesses) for `chip`, kept from the last DAGs built
    for it (one chip object at a time, at most SHARED_LIMIT instructions). Keyed by the object, not
    its fingerprint: hashing every key would count as reading every key, and the sweep reuses a
    compiled program across chip values the compiler did not read."""
    if _SHARED["chip"] is not chip or len(_SHARED["facts"]) > SHARED_LIMIT:
        _SHARED["chip"], _SHARED["facts"] = chip, {}
    return _SHARED["facts"]


class _Builder:
    """Collects the nodes of build_dag in issue order."""

    def __init__(self, program: Program, columns: list[list] | None = None, preds: list[list[int]] | None = None,
                 unit_base: int = 0, accesses: list | None = None, chunked: bool = False):
        self.program, self.chip = program, program.chip
        self.finder = hazard_finder(self.chip, program.core_count > 1, chunked)
        self.same = [same_as_earlier(program.queue(e)) for e in Engine]
        self.known: list[dict] = [{}, {}, {}]    # per engine: first equal instruction -> (timing, accesses or None)
        self.shared = _shared_facts(self.chip)
        # engine (unit), queue index, duration, head, tail; shared by the cores of a multi-core DAG
        self.columns: list[list] = [[], [], [], [], []] if columns is None else columns
        self.preds: list[list[int]] = [] if preds is None else preds
        self.accesses: list = [] if accesses is None else accesses    # per node, in node order (shared like columns)
        self.unit_base = unit_base
        self.last_node = [-1, -1, -1]
        self.pinned_open = [False, False, False]
        self.fence = [-1, -1, -1]                      # last SEND/WAIT node per engine
        self.since_fence: list[list[int]] = [[], [], []]

    def add(self, code: int, index: int, instr) -> None:
        node = len(self.preds)
        first = self.same[code][index]
        known = self.known[code].get(first)
        if known is None:
            known = self.known[code][first] = self._facts(code, instr)
        timing, acc = known
        message = instr.message()
        if message is not None and message.kind == "send":     # it reaches the other cores' waits this much later
            timing = (timing[0], timing[1], timing[2] + round(self.chip.core.message_latency_ns * 1000))
        if acc is None:
            acc = self.program.accesses(Engine.of_code(code), index)
        self.accesses.append(acc)
        preds = self.finder.add(node, acc)
        pinned = isinstance(instr, (SysTiu, SysDma))
        if self.last_node[code] >= 0 and (code == TILE or pinned or self.pinned_open[code]):
            preds.add(self.last_node[code])
        self.pinned_open[code], self.last_node[code] = pinned, node
        self._fence(code, node, instr, preds)
        for column, value in zip(self.columns, (code + self.unit_base, index, *timing)):
            column.append(value)
        self.preds.append(sorted(preds))

    def _facts(self, code: int, instr) -> tuple:
        """(timing, accesses or None for TILE) of an instruction, shared with earlier DAGs of the
        same chip (the estimate builds the scheduled program's DAG after the scheduler's): both
        depend on the instruction apart from its waits only."""
        key = instr.without_waits()
        hit = self.shared.get(key)
        if hit is None:
            acc = None if code == TILE else instr.accesses(self.chip)
            hit = self.shared[key] = (node_timing(instr, self.chip), acc)
        return hit

    def _fence(self, code: int, node: int, instr, preds: set[int]) -> None:
        """A SEND/WAIT orders what other cores see: every earlier node of its queue stays before it and
        every later one after it (DDR hazards across cores have no edges of their own)."""
        if instr.message() is not None:
            preds.update(self.since_fence[code])
            self.fence[code], self.since_fence[code] = node, []
            return
        if self.fence[code] >= 0:
            preds.add(self.fence[code])
        self.since_fence[code].append(node)

    def dag(self, trailer: list[tuple[int, int]], units: int = 3) -> Dag:
        ptr = np.zeros(len(self.preds) + 1, dtype=np.int64)
        ptr[1:] = np.cumsum([len(p) for p in self.preds])
        idx = np.fromiter((a for p in self.preds for a in p), dtype=np.int64, count=int(ptr[-1]))
        engine, qindex, dur, head, tail = self.columns
        return Dag(np.asarray(engine, np.int8), np.asarray(qindex, np.int64), np.asarray(dur, np.int64),
                   np.asarray(head, np.int64), np.asarray(tail, np.int64), ptr, idx, trailer, units,
                   self.accesses)


def hazard_finder(chip, exact_ddr: bool, chunked: bool = False) -> HazardFinder:
    """The DAG's hazard index: precise LMEM ranges, or (chunked) ranges widened to the dependency
    chunks (chip.deps: lanes x chunk_bytes_per_lane), the granularity at which the rebuilt program's
    waits are computed (lowering.deps)."""
    chunk = (chip.deps.chunk_lanes, chip.chunk_bytes_per_lane) if chunked else None
    return HazardFinder(chip.lanes, LMEM_LANE_BLOCK, chip.chunk_bytes_per_lane, exact_ddr=exact_ddr, chunk=chunk)


def build_dag(program: Program, chunked: bool = False) -> Dag:
    """The DAG of `program` (see the module docstring); `chunked`: LMEM hazards at dependency-chunk
    granularity (hazard_finder)."""
    if program.core_count > 1:
        return build_chip_dag(program, chunked)
    builder = _Builder(program, chunked=chunked)
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


def build_chip_dag(program: Program, chunked: bool = False) -> Dag:
    """The DAG of a multi-core program: each core's nodes and hazard edges as for one core (LMEM is
    private; a core's DDR hazards against its own accesses), built in a run order of all cores
    (scheduler.cores), plus an edge from every send to each wait that consumed it. Cross-core DDR
    hazards get no edge: the messages order them (the checker verifies that they still do)."""
    from tpuflow.scheduler.cores import run_order
    order, consumed = run_order(program)
    views = [program.core(k) for k in range(program.core_count)]
    columns: list[list] = [[], [], [], [], []]
    preds: list[list[int]] = []
    accesses: list = []
    builders = [_Builder(view, columns, preds, len(Engine) * k, accesses, chunked) for k, view in enumerate(views)]
    ends = [{e.code: len(view.queue(e)) - 1 for e in Engine if view.queue(e) and is_stream_end(view.queue(e)[-1])}
            for view in views]
    trailer: list[tuple[int, int]] = []
    node_of: dict[tuple[int, int, int], int] = {}
    for core, code, index in order:
        instr = views[core].queue(Engine.of_code(code))[index]
        if ends[core].get(code) == index:
            trailer.append((len(Engine) * core + code, index))
        elif not instr.is_tile_wait:
            node_of[(core, code, index)] = len(preds)
            builders[core].add(code, index, instr)
    for wait, sends in consumed.items():
        node = node_of[wait]
        preds[node] = sorted(set(preds[node]) | {node_of[s] for s in sends})
    return builders[0].dag(trailer, len(Engine) * len(views))


def in_chunk_order(dag: Dag, order, chip) -> Dag:
    """`dag` with the LMEM hazards that the dependency chunks give `order` (a topological order of
    `dag`) added: walking the nodes in that order, an edge from every earlier node touching a common
    chunk (lowering.deps: chunk conflicts become waits in whichever order the two are issued, so two
    accesses of one chunk are ordered even where their bytes are disjoint). Every edge then points
    forward in `order`, and retiming `order` on the result times the waits the rebuilt program has."""
    cores = dag.units // len(Engine)
    finders = [hazard_finder(chip, cores > 1, chunked=True) for _ in range(cores)]
    preds = [set(dag.preds(b).tolist()) for b in range(dag.size)]
    unit = dag.engine.tolist()
    for b in (order.tolist() if hasattr(order, "tolist") else order):
        preds[b] |= finders[unit[b] // len(Engine)].add(b, dag.accesses[b])
    ptr = np.zeros(dag.size + 1, dtype=np.int64)
    ptr[1:] = np.cumsum([len(p) for p in preds])
    idx = np.fromiter((a for p in preds for a in sorted(p)), dtype=np.int64, count=int(ptr[-1]))
    return replace(dag, pred_ptr=ptr, pred_idx=idx)
