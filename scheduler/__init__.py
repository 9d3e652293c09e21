"""Orders each engine's queue: program order, list scheduling, CP-SAT windows; bounds; checker.

    schedule(program, method, time_limit_s=20.0) -> Program

* `program`: the emission order, unchanged.
* `list`: critical-path list scheduling (scheduler.dag, .listsched) on the precise-hazard DAG and on
  the DAG whose LMEM hazards are widened to the dependency chunks; of those two orders and the
  emission order, the one the DAG model times fastest with the chunk waits of its own order
  (dag.in_chunk_order: the rebuilt program's waits are per chunk, so an instruction reordered into a
  chunk another engine uses waits for it) is kept (_listed).
* `cpsat`: the list schedule refined by CP-SAT on rolling windows (scheduler.cpsat), within
  `time_limit_s` deterministic units. Both candidates are then run on the timing model
  (hwmodel.timing.simulate) and the refined order is kept only if it is not slower than the
  list order, so `cpsat` is never worse than `list` on the simulated makespan.

Default (`--schedule`, CompileOptions.schedule): `list`, the best quality for a short time.
Measured with benchmarks/schedule_bench.py (fp32, sg2260; simulated makespans, emission -> list):
ResNet-50 7958 -> 6738 us (-15 %) in 0.35 s of CPU, BERT layer 181 -> 157 us (-13 %), MobileNetV2
1113 -> 1055 us (-5 %), GPT block 183 -> 177 us (-3 %), each in under 0.2 s. `cpsat` (20 units)
then adds 0 % (ResNet-50), 0.02 % (MobileNetV2), 0.4 % (BERT) and 3.6 % (GPT) for 1.7-7 s plus two
full simulations, and nothing on the TILE paths, which are GDMA-bound (list already keeps GDMA
busy 100 % of the simulated time there). benchmarks/results/schedule.json has every number.

The result's issue order is the scheduled start order; cmd_ids are renumbered and every
dependency recomputed from the chunk bitmaps for that order (scheduler.rebuild).

Multi-core programs: one DAG over every core (scheduler.dag.build_chip_dag: per-core hazards, an
edge from each SEND to the WAITs that consume it, one engine slot per core and engine), one list
schedule over it, and each core's queues rebuilt in its nodes' order (messages stay where they are
in their queues: SEND/WAIT fence their queue). `cpsat` refines that order with the same windows
(one NoOverlap per engine of every core) and keeps it only if the multi-core timing model agrees.
Lower bounds: scheduler.bounds. Validity: scheduler.checker (independent of all of the above).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from tpuflow.errors import OptionError
from tpuflow.program import Program
from tpuflow.scheduler.rebuild import program_in_order

METHODS = ("program", "list", "cpsat")


@dataclass
class ScheduleReport:
    """What one scheduling did: DAG-model makespans (ps), bounds, CP-SAT work, chosen order."""

    method: str
    model_ps: dict[str, int] = field(default_factory=dict)     # raw candidates: program, list, cpsat
    chunk_model_ps: dict[str, int] = field(default_factory=dict)   # list, list-chunked, program: with their chunk waits
    result_model_ps: int = 0                                   # the returned order
    simulated_ps: dict[str, int] = field(default_factory=dict)
    chosen: str = "program"
    kept: str = "program"           # the _listed candidate the result starts from: list, list-chunked, program
    windows: int = 0
    windows_improved: int = 0
    deterministic_time: float = 0.0
    proven_bound_ps: int = 0          # CP-SAT's lower bound when one window covered the whole program
    seconds: float = 0.0


def schedule(program: Program, method: str, time_limit_s: float = 20.0) -> Program:
    """`program` reordered by `method` (see the module docstring)."""
    return schedule_with_report(program, method, time_limit_s)[0]


def schedule_with_report(program: Program, method: str, time_limit_s: float = 20.0) -> tuple[Program, ScheduleReport]:
    """The reordered program and what the scheduling did."""
    if method not in METHODS:
        raise OptionError(f"option --schedule: '{method}' is not one of {', '.join(METHODS)}")
    began = time.perf_counter()
    report = ScheduleReport(method)
    if method == "program":
        return program, report
    from tpuflow.scheduler.dag import build_dag
    from tpuflow.scheduler.listsched import EdgeTable

    dag = build_dag(program)
    edges = EdgeTable(dag)
    best = _listed(program, dag, edges, report)
    if method == "cpsat":
        best = _refine(program, dag, edges, best, time_limit_s, report)
    report.chosen = best.name
    report.result_model_ps = best.schedule.makespan(dag)
    result = best.program or program_in_order(program, dag, best.schedule.order)
    report.seconds = time.perf_counter() - began
    return result, report


def _listed(program: Program, dag, edges, report: ScheduleReport) -> "Candidate":
    """The best of three orders, each timed on the DAG with the chunk hazards of its own order
    (dag.in_chunk_order: the waits the rebuilt program has): the list schedule of the precise-hazard
    DAG, that of the DAG with chunk-granular hazards in emission order (it keeps two instructions
    that share a dependency chunk in their emission order instead of reordering one into a wait), and
    the emission order; ties go to the earlier of them."""
    from tpuflow.scheduler.dag import build_dag, in_chunk_order
    from tpuflow.scheduler.listsched import EdgeTable, list_schedule, retime

    chunked = build_dag(program, chunked=True)
    orders = {"list": list_schedule(dag, edges).order, "list-chunked": list_schedule(chunked).order,
              "program": np.arange(dag.size)}
    best = None
    for name, order in orders.items():
        timed = in_chunk_order(dag, order, program.chip)
        report.chunk_model_ps[name] = retime(timed, order, EdgeTable(timed)).makespan(timed)
        report.model_ps.setdefault(name.split("-")[0], retime(dag, order, edges).makespan(dag))
        if best is None or report.chunk_model_ps[name] < report.chunk_model_ps[best]:
            best = name
    report.kept = best
    if best == "program":
        return Candidate("program", retime(dag, orders[best], edges), program)
    return Candidate("list", retime(dag, orders[best], edges))


@dataclass
class Candidate:
    name: str
    schedule: "Schedule"
    program: Program | None = None      # built once it is needed


def _refine(program: Program, dag, edges, start: Candidate, time_limit_s: float, report: ScheduleReport) -> Candidate:
    """CP-SAT windows from `start`; the refined order only if the timing model agrees it is not slower."""
    from tpuflow.hwmodel.timing import simulate
    from tpuflow.scheduler.cpsat import Refiner

    refined, stats = Refiner(dag, edges).refine(start.schedule, time_limit_s)
    report.windows, report.windows_improved = stats.windows, stats.improved
    report.deterministic_time = stats.deterministic_time
    report.proven_bound_ps = stats.proven_bound_ps
    report.model_ps["cpsat"] = refined.makespan(dag)
    if stats.improved == 0:
        return start
    start.program = start.program or program_in_order(program, dag, start.schedule.order)
    candidate = Candidate("cpsat", refined, program_in_order(program, dag, refined.order))
    report.simulated_ps = {start.name: simulate(start.program).total_ps, "cpsat": simulate(candidate.program).total_ps}
    return candidate if report.simulated_ps["cpsat"] <= report.simulated_ps[start.name] else start
