"""CP-SAT refinement of a schedule on rolling windows of its issue order.

A window is `window` consecutive nodes of the current issue order. Everything before it keeps its
start times (so each engine is free from a known time and every predecessor outside the window
gives a release time); everything after it keeps its order and is re-timed afterwards. Inside:
one fixed-size interval per node, NoOverlap per engine, the DAG's precedences with their lags,
and the objective M >= start + bottom level (the rest of the longest chain after the node) and
M >= end + the work the node's engine still has after the window. The current schedule is a
complete hint, and the start domains are cut to [release, M_hint - bottom level] (no better
solution lies outside). A window is kept only if the re-timed whole schedule has a smaller
makespan.

Determinism: one worker, a fixed seed and a deterministic-time budget per window (CP-SAT's
deterministic units, roughly seconds of work) out of a total of `time_limit_s` units; no wall-clock
limit decides anything, so the same input gives the same order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from ortools.sat.python import cp_model

from tpuflow.scheduler.dag import Dag
from tpuflow.scheduler.listsched import EdgeTable, Schedule, bottom_levels, retime

SEED = 20260
WINDOW = 1000
WINDOW_STEP = 500
WINDOW_DTIME_CAP = 2.0        # deterministic units per window at most
MIN_WINDOW_DTIME = 0.05


@dataclass
class WindowStats:
    windows: int = 0
    improved: int = 0
    deterministic_time: float = 0.0
    proven_bound_ps: int = 0      # a makespan no order can beat, when a window covered the whole DAG


@dataclass
class _Window:
    nodes: np.ndarray          # node ids in the current issue order
    local: dict[int, int]      # node id -> position in the window
    earliest: list[int]        # ps: release by the fixed prefix, pushed along the window's edges
    work_after: list[int]      # ps per engine still to run after the window
    hint: int                  # objective of the current schedule (units)
    bound: int                 # a lower bound of the objective (units)


class Refiner:
    """Holds the DAG-derived tables shared by every window."""

    def __init__(self, dag: Dag, edges: EdgeTable | None = None):
        self.dag = dag
        self.edges = edges or EdgeTable(dag)
        self.bl = bottom_levels(dag, self.edges)
        self.unit = _time_unit(dag)

    def refine(self, sched: Schedule, time_limit_s: float, window: int = WINDOW,
               step: int = WINDOW_STEP) -> tuple[Schedule, WindowStats]:
        """Improve `sched` window by window, in passes over the issue order, while the deterministic
        budget lasts and the previous pass improved something."""
        stats = WindowStats()
        n = self.dag.size
        best, best_span = sched, sched.makespan(self.dag)
        budget = float(time_limit_s)
        positions = [0] if n <= window else list(range(0, n - step, step))
        improved_in_pass = True
        tried: set = set()
        while improved_in_pass and budget >= MIN_WINDOW_DTIME:
            improved_in_pass = False
            for p in positions:
                if budget < MIN_WINDOW_DTIME:
                    break
                key = (p, best.order[p:p + window].tobytes(), best.start[best.order[p:p + window]].tobytes())
                if key in tried:
                    continue            # same window in the same state: the same answer
                tried.add(key)
                order, used, bound = self.solve_window(best, p, min(n, p + window), min(WINDOW_DTIME_CAP, budget))
                stats.proven_bound_ps = max(stats.proven_bound_ps, bound)
                stats.windows += 1
                stats.deterministic_time += used
                if used:
                    budget -= max(used, MIN_WINDOW_DTIME)     # windows decided without a solve are free
                if order is None:
                    continue
                cand = self._retime_from(best, order, p)
                span = cand.makespan(self.dag)
                if span < best_span:
                    best, best_span = cand, span
                    stats.improved += 1
                    improved_in_pass = True
        return best, stats

    def _retime_from(self, sched: Schedule, order: np.ndarray, p: int) -> Schedule:
        """`order` re-timed from position p, then issued in start order (per engine the order is
        unchanged, so the starts stay the same)."""
        free = self._engine_free(sched, p)
        timed = retime(self.dag, order, self.edges, free, sched.start, p)
        rank = np.lexsort((np.arange(len(order)), timed.start[order]))
        return Schedule(order[rank], timed.start)

    def _engine_free(self, sched: Schedule, p: int) -> list[int]:
        dag = self.dag
        free = [0] * dag.units
        prefix = sched.order[:p]
        for e in range(dag.units):
            mine = prefix[dag.engine[prefix] == e]
            if len(mine):
                free[e] = int((sched.start[mine] + dag.duration[mine]).max())
        return free

    def solve_window(self, sched: Schedule, lo: int, hi: int, dtime: float):
        """(new issue order or None, deterministic time used, proven bound) for window positions
        [lo, hi); the bound (ps) is the solver's lower bound on the makespan when the window is the
        whole DAG (the objective is then exactly the makespan), else 0."""
        whole = lo == 0 and hi == self.dag.size
        if hi - lo < 2:
            return None, 0.0, sched.makespan(self.dag) if whole else 0
        win = self._window(sched, lo, hi)
        if win.bound >= win.hint:          # the current order already reaches the window's bound
            return None, 0.0, win.hint * self.unit if whole else 0
        model, obj, svars = self._model(win, sched.start)
        solver = cp_model.CpSolver()
        _parameters(solver, dtime)
        status = solver.solve(model)
        used = float(solver.deterministic_time)
        found = status in (cp_model.OPTIMAL, cp_model.FEASIBLE)
        bound = max(win.bound, math.ceil(solver.best_objective_bound)) * self.unit if whole and found else 0
        if not found or solver.value(obj) >= win.hint:
            return None, used, bound
        new_starts = [solver.value(v) for v in svars]
        ranked = sorted(range(len(win.nodes)), key=lambda k: (new_starts[k], k))
        order = sched.order.copy()
        order[lo:hi] = win.nodes[ranked]
        return order, used, bound

    def _window(self, sched: Schedule, lo: int, hi: int) -> "_Window":
        """Everything the window's model needs, in CP-SAT time units where it says so."""
        dag, unit, bl = self.dag, self.unit, self.bl
        nodes = sched.order[lo:hi]
        local = {int(b): k for k, b in enumerate(nodes)}
        free = self._engine_free(sched, lo)
        suffix = sched.order[hi:]
        work_after = [int(dag.duration[suffix[dag.engine[suffix] == e]].sum()) for e in range(dag.units)]
        starts = sched.start
        hint_ps = max(max(int(starts[b] + bl[b]) for b in nodes),
                      max(int(starts[b] + dag.duration[b]) + work_after[dag.engine[b]] for b in nodes))
        earliest = self._earliest(nodes, local, self._releases(nodes, local, free, starts))
        bound = max(math.ceil((earliest[k] + int(bl[b])) / unit) for k, b in enumerate(nodes))
        for e in range(dag.units):
            load = int(dag.duration[nodes[dag.engine[nodes] == e]].sum())
            if load:
                bound = max(bound, math.ceil((free[e] + load + work_after[e]) / unit))
        return _Window(nodes, local, earliest, work_after, hint_ps // unit, bound)

    def _model(self, win: "_Window", starts: np.ndarray):
        """(model, objective var, start vars): intervals, NoOverlap per engine, precedences, the
        objective's two kinds of terms, start domains [earliest, hint - bottom level], full hint."""
        dag, unit = self.dag, self.unit
        model = cp_model.CpModel()
        obj = model.new_int_var(win.bound, win.hint, "makespan")
        svars, intervals = [], [[] for _ in range(dag.units)]
        for k, b in enumerate(win.nodes.tolist()):
            d = -(-int(dag.duration[b]) // unit)
            first = -(-win.earliest[k] // unit)
            tail = math.ceil(int(self.bl[b]) / unit)
            s = model.new_int_var(first, max(first, win.hint - tail), f"s{b}")
            svars.append(s)
            e = int(dag.engine[b])
            intervals[e].append(model.new_fixed_size_interval_var(s, d, f"i{b}"))
            model.add(obj >= s + tail)
            model.add(obj >= s + d + math.ceil(win.work_after[e] / unit))
            model.add_hint(s, int(starts[b]) // unit)
        for group in intervals:
            if len(group) > 1:
                model.add_no_overlap(group)
        self._precedences(model, win.nodes, win.local, svars)
        model.add_hint(obj, win.hint)
        model.minimize(obj)
        return model, obj, svars

    def _releases(self, nodes, local, free, starts) -> list[int]:
        dag, ed = self.dag, self.edges
        out = []
        for b in nodes.tolist():
            r = free[dag.engine[b]]
            for k in range(ed.pred_ptr[b], ed.pred_ptr[b + 1]):
                a = ed.pred[k]
                if a not in local:
                    r = max(r, int(starts[a]) + ed.pred_offset[k])
            out.append(r)
        return out

    def _earliest(self, nodes, local, release) -> list[int]:
        """Release times pushed along the window's own edges (nodes are in a topological order)."""
        ed = self.edges
        out = list(release)
        for k, b in enumerate(nodes.tolist()):
            for j in range(ed.pred_ptr[b], ed.pred_ptr[b + 1]):
                a = local.get(ed.pred[j])
                if a is not None and out[a] + ed.pred_offset[j] > out[k]:
                    out[k] = out[a] + ed.pred_offset[j]
        return out

    def _precedences(self, model, nodes, local, svars) -> None:
        ed, unit = self.edges, self.unit
        for b in nodes.tolist():
            for k in range(ed.pred_ptr[b], ed.pred_ptr[b + 1]):
                a = local.get(ed.pred[k])
                if a is not None:
                    model.add(svars[local[b]] >= svars[a] + -(-ed.pred_offset[k] // unit))


def _parameters(solver: cp_model.CpSolver, dtime: float) -> None:
    p = solver.parameters
    p.num_workers = 1
    p.random_seed = SEED
    p.max_deterministic_time = dtime
    p.max_time_in_seconds = 10.0 * dtime + 10.0   # safety net only: the deterministic budget binds first
    # presolve's bound propagation crawls along long precedence chains (hundreds of fix-point loops
    # over 1e5-1e6 time units); the domains given are already tight, so search starts at once
    p.cp_model_presolve = False


def _time_unit(dag: Dag) -> int:
    """Largest unit (ps) every duration and lag is a multiple of (CP-SAT works in it exactly)."""
    values = np.concatenate([dag.duration, dag.head, dag.tail])
    values = values[values > 0]
    return int(np.gcd.reduce(values)) if len(values) else 1
