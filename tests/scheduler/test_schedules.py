"""Schedules on random programs: valid in the DAG model, never below the lower bound,
cpsat <= list <= program on the model makespan, accepted by the independent checker, deterministic;
and exact timelines of the list scheduler on hand-built DAGs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from scheduler_programs import random_program, specs

from tpuflow.errors import OptionError
from tpuflow.scheduler import schedule, schedule_with_report
from tpuflow.scheduler.bounds import lower_bounds
from tpuflow.scheduler.checker import check_schedule
from tpuflow.scheduler.cpsat import Refiner
from tpuflow.scheduler.dag import Dag, build_dag
from tpuflow.scheduler.listsched import EdgeTable, list_schedule, retime


def make_dag(engines, durations, edges, head=None, tail=None) -> Dag:
    n = len(engines)
    preds = [sorted(a for a, b in edges if b == j) for j in range(n)]
    ptr = np.concatenate(([0], np.cumsum([len(p) for p in preds]))).astype(np.int64)
    idx = np.asarray([a for p in preds for a in p], dtype=np.int64)
    zeros = np.zeros(n, np.int64)
    return Dag(np.asarray(engines, np.int8), np.arange(n), np.asarray(durations, np.int64),
               zeros if head is None else np.asarray(head, np.int64),
               zeros if tail is None else np.asarray(tail, np.int64), ptr, idx, [])


def assert_model_valid(dag: Dag, sched, start_ordered: bool = True) -> None:
    """The schedule's order is a topological order, its starts meet every edge, engines never overlap
    and (start_ordered) the issue order is the start order."""
    order = sched.order.tolist()
    assert sorted(order) == list(range(dag.size))
    pos = {b: k for k, b in enumerate(order)}
    src, dst = dag.edges()
    for a, b in zip(src.tolist(), dst.tolist()):
        assert pos[a] < pos[b]
        assert sched.start[b] >= sched.start[a] + dag.duration[a] + dag.lag(a, b)
    for e in range(3):
        mine = [b for b in order if dag.engine[b] == e]
        for a, b in zip(mine, mine[1:]):
            assert sched.start[b] >= sched.start[a] + dag.duration[a]
    if start_ordered:
        assert (np.diff(sched.start[sched.order]) >= 0).all(), "issue order is the start order"


def test_list_schedule_exact_timeline():
    # GDMA loads 0 and 1 (10 and 4 ns); TIU 2 needs load 0 (head 2 ns), TIU 3 needs load 1;
    # bottom levels put the TIU node with the longer tail first once both loads are done.
    dag = make_dag([1, 1, 0, 0], [10_000, 4_000, 5_000, 20_000], [(0, 2), (1, 3)], head=[0, 0, 2_000, 2_000])
    sched = list_schedule(dag)
    # load 1 leads to the longer chain (4 + 2 + 20 > 10 + 2 + 5): it goes first
    assert sched.order.tolist() == [1, 0, 3, 2]
    assert sched.start.tolist() == [4_000, 0, 26_000, 6_000]
    assert sched.makespan(dag) == 31_000
    assert_model_valid(dag, sched)
    emitted = retime(dag, [0, 1, 2, 3])
    assert emitted.start.tolist() == [0, 10_000, 12_000, 17_000]
    assert emitted.makespan(dag) == 37_000


@settings(max_examples=40, deadline=None)
@given(specs)
def test_list_and_retime_are_valid_and_above_the_bound(spec):
    program = random_program(spec)
    dag = build_dag(program)
    edges = EdgeTable(dag)
    bound = lower_bounds(program, dag)["lower_bound_ps"]
    listed, emitted = list_schedule(dag, edges), retime(dag, range(dag.size), edges)
    assert_model_valid(dag, listed)
    assert_model_valid(dag, emitted, start_ordered=False)
    refined, _ = Refiner(dag, edges).refine(listed, 0.2)
    assert_model_valid(dag, refined)
    assert bound <= refined.makespan(dag) <= listed.makespan(dag)
    assert emitted.makespan(dag) >= bound


@settings(max_examples=25, deadline=None)
@given(specs)
def test_methods_are_ordered_valid_and_checked(spec):
    program = random_program(spec)
    results = {}
    for method in ("program", "list", "cpsat"):
        result, report = schedule_with_report(program, method, time_limit_s=0.5)
        assert check_schedule(program, result) == []
        results[method] = (result, report)
    lst, cps = results["list"][1], results["cpsat"][1]
    # list keeps the order the DAG model times fastest with the chunk waits of its own order
    assert lst.chunk_model_ps[lst.kept] == min(lst.chunk_model_ps.values())
    assert lst.chunk_model_ps[lst.kept] <= lst.chunk_model_ps["program"]
    assert cps.result_model_ps <= lst.result_model_ps
    assert lst.result_model_ps >= lower_bounds(program)["lower_bound_ps"]
    assert results["program"][0] is program


@settings(max_examples=15, deadline=None)
@given(specs)
def test_same_input_same_order(spec):
    program = random_program(spec)
    for method in ("list", "cpsat"):
        first, second = schedule(program, method, 0.5), schedule(program, method, 0.5)
        assert first.issue_order == second.issue_order
        assert (first.tiu, first.gdma, first.tile) == (second.tiu, second.gdma, second.tile)


def test_reordering_happens_and_stays_valid():
    # two independent load -> add -> store chains, emitted back to back: the list schedule overlaps
    # the second chain's load with the first chain's compute
    a, b, c, d = ((off, (1, 2, 1, 512)) for off in (0, 4096, 8192, 12288))
    spec = [("load", a, 0), ("load", b, 1), ("add", a, a, b), ("store", a, 2),
            ("load", c, 3), ("load", d, 4), ("add", c, c, d), ("store", c, 5)]
    program = random_program(spec)
    result, report = schedule_with_report(program, "list")
    assert report.chosen == "list"
    assert report.result_model_ps < report.model_ps["program"]
    assert result.issue_order != program.issue_order
    assert check_schedule(program, result) == []


def test_unknown_method_is_an_option_error():
    with pytest.raises(OptionError, match="--schedule"):
        schedule(random_program([("matmul",)]), "greedy")
