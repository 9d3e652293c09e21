"""List scheduling on the DAG: critical-path priorities, one ready queue per engine, event-driven; and
`retime`, the earliest-start timing of a given issue order (how every schedule is evaluated).

A schedule is an issue order (node ids, a topological order of the DAG) plus start times. Each
engine (of each core: Dag.units) runs its nodes in issue order; `retime` starts each node at the later of its engine being
free and its predecessors' constraints, so its start times are non-decreasing along the order.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from tpuflow.scheduler.dag import Dag


@dataclass
class Schedule:
    order: np.ndarray      # node ids in issue order
    start: np.ndarray      # ps per node (indexed by node id)

    def makespan(self, dag: Dag) -> int:
        if dag.size == 0:
            return 0
        return int((self.start + dag.duration + dag.tail).max())


class EdgeTable:
    """Per-edge start offsets: start(b) >= start(a) + offset(a, b), in list form for the hot loops."""

    def __init__(self, dag: Dag):
        src, dst = dag.edges()
        cross = dag.engine[src] != dag.engine[dst]
        offset = dag.duration[src] + np.where(cross, dag.tail[src] + dag.head[dst], 0)
        self.pred_ptr = dag.pred_ptr.tolist()
        self.pred = src.tolist()
        self.pred_offset = offset.tolist()
        by_src = np.argsort(src, kind="stable")
        counts = np.bincount(src, minlength=dag.size) if len(src) else np.zeros(dag.size, np.int64)
        self.succ_ptr = np.concatenate(([0], np.cumsum(counts))).tolist()
        self.succ = dst[by_src].tolist()
        self.succ_offset = offset[by_src].tolist()


def bottom_levels(dag: Dag, edges: EdgeTable | None = None) -> np.ndarray:
    """Longest path (ps) from each node's start to the completion of the last node after it."""
    edges = edges or EdgeTable(dag)
    done = (dag.duration + dag.tail).tolist()
    bl = [0] * dag.size
    sp, succ, off = edges.succ_ptr, edges.succ, edges.succ_offset
    for i in range(dag.size - 1, -1, -1):
        best = done[i]
        for k in range(sp[i], sp[i + 1]):
            v = off[k] + bl[succ[k]]
            if v > best:
                best = v
        bl[i] = best
    return np.asarray(bl, dtype=np.int64)


def retime(dag: Dag, order, edges: EdgeTable | None = None, engine_free=None,
           start: np.ndarray | None = None, from_pos: int = 0) -> Schedule:
    """Earliest starts of `order`; with `start` and `from_pos`, nodes before from_pos keep their
    starts and `engine_free` is each engine's (unit's) free time after them."""
    edges = edges or EdgeTable(dag)
    order = np.asarray(order, dtype=np.int64)
    starts = [0] * dag.size if start is None else start.tolist()
    free = list(engine_free) if engine_free is not None else [0] * dag.units
    eng, dur = dag.engine.tolist(), dag.duration.tolist()
    pp, pred, off = edges.pred_ptr, edges.pred, edges.pred_offset
    for b in order[from_pos:].tolist():
        e = eng[b]
        s = free[e]
        for k in range(pp[b], pp[b + 1]):
            v = starts[pred[k]] + off[k]
            if v > s:
                s = v
        starts[b] = s
        free[e] = s + dur[b]
    return Schedule(order, np.asarray(starts, dtype=np.int64))


def list_schedule(dag: Dag, edges: EdgeTable | None = None) -> Schedule:
    """The better (smaller makespan; ties: the first) of two critical-path list schedules: priority
    = the longest chain after a node ends (its bottom level minus its duration: Schrage's rule,
    which favours what feeds long chains on other engines), and priority = the bottom level."""
    edges = edges or EdgeTable(dag)
    bl = bottom_levels(dag, edges)
    best = None
    for priority in (bl - dag.duration, bl):
        sched = priority_schedule(dag, priority, edges)
        if best is None or sched.makespan(dag) < best.makespan(dag):
            best = sched
    return best


def priority_schedule(dag: Dag, priority: np.ndarray, edges: EdgeTable | None = None) -> Schedule:
    """Non-delay list schedule: whenever an engine is free it starts, among its nodes whose
    predecessors allow a start now, the one with the largest priority (ties: original order).
    Engines are served in time order, so the issue order is the start order."""
    edges = edges or EdgeTable(dag)
    prio = priority.tolist()
    n = dag.size
    eng, dur = dag.engine.tolist(), dag.duration.tolist()
    missing = np.diff(dag.pred_ptr).tolist()
    release = [0] * n
    pending: list[list] = [[] for _ in range(dag.units)]    # (release time, -priority, node): predecessors placed
    ready: list[list] = [[] for _ in range(dag.units)]      # (-priority, node): may start at the engine's free time
    for i in range(n):
        if missing[i] == 0:
            heapq.heappush(pending[eng[i]], (0, -prio[i], i))
    free = [0] * dag.units
    start = [0] * n
    order: list[int] = []
    sp, succ, off = edges.succ_ptr, edges.succ, edges.succ_offset
    while len(order) < n:
        e, t = _next_engine(pending, ready, free)
        _promote(pending[e], ready[e], t)
        _, b = heapq.heappop(ready[e])
        start[b] = t
        free[e] = t + dur[b]
        order.append(b)
        for k in range(sp[b], sp[b + 1]):
            j = succ[k]
            v = t + off[k]
            if v > release[j]:
                release[j] = v
            missing[j] -= 1
            if missing[j] == 0:
                heapq.heappush(pending[eng[j]], (release[j], -prio[j], j))
    return Schedule(np.asarray(order, dtype=np.int64), np.asarray(start, dtype=np.int64))


def _promote(pending: list, ready: list, t: int) -> None:
    while pending and pending[0][0] <= t:
        _, neg, node = heapq.heappop(pending)
        heapq.heappush(ready, (neg, node))


def _next_engine(pending, ready, free) -> tuple[int, int]:
    """(engine, time) of the next start decision: the earliest time an engine can start something."""
    best_e, best_t = -1, None
    for e in range(len(free)):
        _promote(pending[e], ready[e], free[e])
        if ready[e]:
            t = free[e]
        elif pending[e]:
            t = max(free[e], pending[e][0][0])
        else:
            continue
        if best_t is None or t < best_t:
            best_e, best_t = e, t
    if best_e < 0:
        raise RuntimeError("list scheduling stalled: the DAG has a cycle")
    return best_e, best_t
