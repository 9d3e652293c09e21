"""The scheduler's view of dependency chunks (scheduler.dag.in_chunk_order, the candidate choice in
scheduler._listed): the rebuilt program's waits are computed per LMEM chunk (lowering.deps), so an
order is timed with an edge between any two accesses of one chunk, and the order kept is the one
that times best that way."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from scheduler_programs import CHIP, lmem_tile, random_program, specs

from tpuflow.scheduler import schedule_with_report
from tpuflow.scheduler.checker import check_schedule
from tpuflow.scheduler.dag import build_dag, in_chunk_order
from tpuflow.scheduler.listsched import list_schedule
from tpuflow.scheduler.rebuild import program_in_order


def _chunks(ranges) -> set[tuple[int, int]]:
    size, lanes = CHIP.chunk_bytes_per_lane, CHIP.deps.chunk_lanes
    return {(lane // lanes, off // size) for r in ranges if r.hi > r.lo
            for lane in range(r.lane, r.lane + r.lanes) for off in range(r.lo, r.hi, 64)}


def _conflict(x, y) -> bool:
    """Whether two Accesses meet in an LMEM chunk with at least one of them writing it."""
    xw, yw = _chunks(x.lmem_writes), _chunks(y.lmem_writes)
    return bool(xw & (_chunks(y.lmem_reads) | yw) or yw & _chunks(x.lmem_reads))


def _reachable(dag, order) -> list[set[int]]:
    """Per node, the nodes it can be reached from (order: a topological order of dag)."""
    before: list[set[int]] = [set() for _ in range(dag.size)]
    for b in order:
        for a in dag.preds(b).tolist():
            before[b] |= before[a] | {a}
    return before


@settings(max_examples=25, deadline=None)
@given(specs)
def test_chunk_conflicts_are_ordered_as_issued(spec):
    """Every pair of nodes of different engines that meet in a chunk is ordered by a path in the DAG,
    from the one issued first; every edge points forward in the order; the precise edges stay."""
    program = random_program(spec)
    dag = build_dag(program)
    order = list_schedule(dag).order.tolist()
    timed = in_chunk_order(dag, order, CHIP)
    pos = {b: k for k, b in enumerate(order)}
    src, dst = timed.edges()
    assert all(pos[a] < pos[b] for a, b in zip(src.tolist(), dst.tolist()))
    old = set(zip(*(e.tolist() for e in dag.edges())))
    assert old <= set(zip(src.tolist(), dst.tolist()))
    before = _reachable(timed, order)
    for i, a in enumerate(order):
        for b in order[i + 1:]:
            if timed.engine[a] != timed.engine[b] and _conflict(dag.accesses[a], dag.accesses[b]):
                assert a in before[b], (a, b)


@settings(max_examples=25, deadline=None)
@given(specs)
def test_kept_order_times_best_with_its_chunk_waits(spec):
    """The list method keeps the candidate whose chunk-timed makespan is the smallest (so never worse
    than the emission order's), the result passes the independent checker, and the kept list order
    is the rebuilt program's issue order."""
    program = random_program(spec)
    result, report = schedule_with_report(program, "list")
    assert check_schedule(program, result) == []
    assert set(report.chunk_model_ps) == {"list", "list-chunked", "program"}
    assert report.chunk_model_ps[report.kept] == min(report.chunk_model_ps.values())
    assert report.chosen == ("program" if report.kept == "program" else "list")
    dag = build_dag(program)
    order = {"list": lambda: list_schedule(dag).order,
             "list-chunked": lambda: list_schedule(build_dag(program, chunked=True)).order,
             "program": lambda: np.arange(dag.size)}[report.kept]()
    assert result.issue_order == program_in_order(program, dag, order).issue_order


def test_chunk_edges_join_disjoint_bytes_of_one_chunk():
    """A TIU add reading bytes 0-2 KiB and a GDMA load writing bytes 8-10 KiB of the same 16 KiB
    chunk have no precise hazard but a chunk edge; a load into another chunk has neither."""
    a, b = lmem_tile(0, 0, 4, 512), lmem_tile(0, 8192, 4, 512)
    far = lmem_tile(0, 4 * CHIP.chunk_bytes_per_lane, 4, 512)
    program = random_program([("load", a, 0), ("add", a, a, a), ("load", b, 1), ("load", far, 2)])
    dag = build_dag(program)
    add, load_b, load_far = 1, 2, 3
    assert add not in dag.preds(load_b).tolist()
    timed = in_chunk_order(dag, np.arange(dag.size), CHIP)
    assert add in timed.preds(load_b).tolist()
    assert add not in timed.preds(load_far).tolist()
    hoisted = in_chunk_order(dag, [0, load_b, add, load_far], CHIP)
    assert load_b in hoisted.preds(add).tolist()
