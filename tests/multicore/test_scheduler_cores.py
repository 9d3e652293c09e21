"""Scheduler on multi-core programs: one DAG over every core with SEND -> WAIT edges, per-core orders
rebuilt, the independent checker replaying messages; random two-phase programs around a barrier."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from multicore_programs import sliced_add_program, sliced_add_reference, without

from tpuflow.chip import load_chip
from tpuflow.errors import DeadlockError
from tpuflow.hwmodel.functional import run
from tpuflow.isa import ArTiu, Engine, SysDma, SysTiu, TensorDma, barrier, barrier_id, global_lmem_address
from tpuflow.lowering.deps import assign_dependencies
from tpuflow.lowering.emitter import Record
from tpuflow.program import CoreStreams, DdrTensor, MemoryPlan, Program
from tpuflow.scheduler import schedule, schedule_with_report
from tpuflow.scheduler.bounds import lower_bounds
from tpuflow.scheduler.checker import check_schedule
from tpuflow.scheduler.dag import build_dag

CHIP = load_chip("sg2260")
DDR_BASE, REGION, REGIONS = 1 << 16, 4096, 4     # per core: REGIONS phase-1 regions, then REGIONS phase-2 ones
W = 64


def _tile(lane: int, block: int, channels: int):
    return lane * CHIP.lmem_bytes_per_lane + block * 4096, (1, channels, 1, W)


def _sides(side, addr, shape, strides):
    return {f"{side}_start_addr": addr, **{f"{side}_{d}size": v for d, v in zip("nchw", shape)},
            **{f"{side}_{d}stride": v for d, v in zip("nchw", strides)}}


def _lmem(tile):
    return global_lmem_address(tile[0], CHIP), tile[1], (W, W, W, 1)


def _ddr(region: int, shape):
    return DDR_BASE + region * REGION, shape, (shape[1] * W, W, W, 1)


def _op(kind, tile, other, region):
    if kind == "load":
        return Record(Engine.GDMA, TensorDma(**_sides("src", *_ddr(region, tile[1])), **_sides("dst", *_lmem(tile))), kind)
    if kind == "store":
        return Record(Engine.GDMA, TensorDma(**_sides("src", *_lmem(tile)), **_sides("dst", *_ddr(region, tile[1]))), kind)
    addr, (n, c, h, w) = tile
    return Record(Engine.TIU, ArTiu(op="add", res0_addr=addr, res0_n=n, res0_c=c, res0_h=h, res0_w=w, opd0_addr=addr,
                                    opd1_addr=other[0], short_res0_str=1, short_opd0_str=1, short_opd1_str=1), kind)


tiles = st.builds(_tile, st.integers(0, 3), st.integers(0, 3), st.integers(1, 4))
steps = st.tuples(st.sampled_from(["load", "store", "add"]), tiles, tiles, st.integers(0, REGIONS - 1))
phases = st.lists(st.tuples(st.lists(steps, max_size=8), st.lists(steps, max_size=8)), min_size=2, max_size=4)


def _region(kind: str, phase: int, core: int, cores: int, r: int) -> int:
    """Phase 1 touches its own regions; phase 2 loads any core's phase-1 regions, stores its own phase-2 ones."""
    if phase == 0 or kind == "store":
        return (2 * core + phase) * REGIONS + r
    return (2 * ((r + core) % cores)) * REGIONS + r


def two_phase_program(spec) -> Program:
    cores = len(spec)
    streams = []
    for k, phases_of_core in enumerate(spec):
        records = []
        for phase, ops in enumerate(phases_of_core):
            records += [_op(kind, t, o, _region(kind, phase, k, cores, r)) for kind, t, o, r in ops]
            if phase == 0:
                sync = barrier(cores, barrier_id(0))
                records += [Record(e, i, "barrier") for e in (Engine.TIU, Engine.GDMA) for i in sync[e]]
        records += [Record(Engine.TIU, SysTiu(op="end"), ""), Record(Engine.GDMA, SysDma(op="chain_end"), "")]
        queues, layers, order = assign_dependencies(records, CHIP, "bitmap")
        streams.append(CoreStreams(queues[0], queues[1], queues[2], layers[0], layers[1], layers[2], order))
    size = 2 * cores * REGIONS * REGION
    tensors = {"inp": DdrTensor("inp", DDR_BASE, (size // 4,), "fp32", "input", size),
               "out": DdrTensor("out", DDR_BASE, (size // 4,), "fp32", "output", size)}
    base = Program(chip=CHIP, memory=MemoryPlan(tensors=tensors, ddr_bytes_used=DDR_BASE + size),
                   options={"dep_mode": "bitmap", "dtype": "fp32"})
    return Program.from_cores(base, streams)


@given(phases)
@settings(max_examples=25, deadline=None)
def test_list_schedule_of_random_multicore_programs_is_valid_and_computes_the_same(spec):
    program = two_phase_program(spec)
    scheduled = schedule(program, "list")
    assert scheduled.core_count == program.core_count
    assert check_schedule(program, scheduled) == []
    data = np.random.default_rng(len(spec)).standard_normal(program.memory.tensors["inp"].shape).astype(np.float32)
    before = run(program, {"inp": data}, interleave="random", seed=1)["out"]
    after = run(scheduled, {"inp": data}, interleave="random", seed=2)["out"]
    np.testing.assert_array_equal(before, after)


def test_messages_are_edges_of_the_one_dag():
    program = sliced_add_program(2)
    dag = build_dag(program)
    assert dag.units == 6
    units = dag.engine.tolist()
    waits = [b for b in range(dag.size) if dag.queue_index[b] >= 0 and
             program.core(units[b] // 3).queue(Engine.of_code(units[b] % 3))[dag.queue_index[b]].message() is not None
             and program.core(units[b] // 3).queue(Engine.of_code(units[b] % 3))[dag.queue_index[b]].message().kind == "wait"]
    assert len(waits) == 4
    for w in waits:       # every wait follows all four sends (two engines x two cores)
        senders = {units[a] for a in dag.preds(w).tolist()
                   if program.core(units[a] // 3).queue(Engine.of_code(units[a] % 3))[dag.queue_index[a]].message()}
        assert senders == {0, 1, 3, 4}


def test_one_core_schedules_exactly_as_before():
    program = sliced_add_program(1, with_barrier=False)
    assert build_dag(program).units == 3
    scheduled, report = schedule_with_report(program, "list")
    assert scheduled.core_count == 1 and check_schedule(program, scheduled) == []


def test_schedule_keeps_the_numbers_of_the_sliced_add_on_four_cores():
    program = sliced_add_program(4)
    scheduled = schedule(program, "cpsat", time_limit_s=2.0)
    assert check_schedule(program, scheduled) == []
    x = np.random.default_rng(0).standard_normal((1, 16, 1, 16)).astype(np.float32)
    np.testing.assert_array_equal(run(scheduled, {"x": x})["z"], sliced_add_reference(x)["z"])
    bounds = lower_bounds(scheduled)
    assert set(bounds["engine_busy_ps"]) >= {"core0.gdma", "core3.tiu"}


def test_a_removed_send_is_a_deadlock_for_the_scheduler_and_the_checker():
    broken = without(sliced_add_program(2), core=1, engine=Engine.GDMA, index=2)
    with pytest.raises(DeadlockError, match="core 0 TIU at B3"):
        schedule(broken, "list")
    problems = check_schedule(broken, broken)
    assert any(p.startswith("deadlock across cores") and "core 1 D3" in p for p in problems)


def test_checker_reports_a_dropped_barrier_as_an_unordered_ddr_hazard():
    program = sliced_add_program(2)
    broken = program
    for engine, index in ((Engine.TIU, 2), (Engine.TIU, 1), (Engine.GDMA, 3), (Engine.GDMA, 2)):
        for core in (1, 0):
            broken = without(broken, core=core, engine=engine, index=index)
    problems = check_schedule(program, broken)
    assert any("instruction(s) of the original are missing" in p for p in problems)


@given(phases)
@settings(max_examples=6, deadline=None)
def test_cpsat_on_random_multicore_programs_is_valid(spec):
    program = two_phase_program(spec)
    scheduled, report = schedule_with_report(program, "cpsat", time_limit_s=1.0)
    assert check_schedule(program, scheduled) == []
    assert report.chosen in ("list", "program", "cpsat") and report.model_ps["cpsat"] <= report.model_ps["list"]


def test_a_send_reaches_its_waits_after_the_message_latency():
    program = sliced_add_program(2)
    dag = build_dag(program)
    latency = round(program.chip.core.message_latency_ns * 1000)
    for b in range(dag.size):
        core, code = divmod(int(dag.engine[b]), 3)
        message = program.core(core).queue(Engine.of_code(code))[dag.queue_index[b]].message()
        if message is not None:
            assert (dag.tail[b] >= latency) == (message.kind == "send")
