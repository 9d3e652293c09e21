"""The independent checker: accepts exactly the reorderings that keep every precise hazard in its
original direction (brute-force oracle), and names broken orders, lost waits, deadlocks, missing or
foreign instructions and a reordered TILE queue."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scheduler_programs import program_of, random_program, records_of, specs
from test_dag import brute_hazards, nodes_of

from tpuflow.isa import ArTiu, SysDma, SysTiu, TensorDma
from tpuflow.scheduler.checker import ScheduleCheckError, assert_valid, check_schedule

A, B = (0, (1, 4, 1, 64)), (8192, (1, 4, 1, 64))


@st.composite
def permuted(draw):
    """(spec, body records in a random order with the TILE records kept in their order)."""
    spec = draw(specs)
    body = records_of(spec)[:-2]
    perm = draw(st.permutations(range(len(body))))
    tile_positions = [k for k, i in enumerate(perm) if body[i].instr.ENGINE.value == "tile"]
    tile_indices = sorted(perm[k] for k in tile_positions)
    perm = list(perm)
    for k, i in zip(tile_positions, tile_indices):
        perm[k] = i
    return spec, perm


@settings(max_examples=80, deadline=None)
@given(permuted())
def test_checker_agrees_with_the_hazard_oracle(case):
    spec, perm = case
    records = records_of(spec)
    body, ends = records[:-2], records[-2:]
    original = program_of(records)
    scheduled = program_of([body[i] for i in perm] + ends)
    position = {i: k for k, i in enumerate(perm)}
    hazards = brute_hazards(original, nodes_of(original))
    keeps_hazards = all(position[i] < position[j] for i, j in hazards)
    problems = check_schedule(original, scheduled)
    if keeps_hazards:
        assert problems == []
    distinct = len({r.instr for r in body}) == len(body)
    if distinct and not keeps_hazards:
        assert problems and any("hazard" in p for p in problems)


def test_same_engine_swap_of_conflicting_instructions_is_caught():
    records = records_of([("load", A, 0), ("store", A, 1)])
    original = program_of(records)
    swapped = program_of([records[1], records[0]] + records[2:])
    problems = check_schedule(original, swapped)
    assert len(problems) == 1 and "hazard not ordered" in problems[0]
    assert "D1 (dma.tensor, load)" in problems[0] and "D2 (dma.tensor, store)" in problems[0]
    with pytest.raises(ScheduleCheckError, match="hazard not ordered"):
        assert_valid(original, swapped)


def test_a_lost_cross_engine_wait_is_caught():
    original = random_program([("load", A, 0), ("copy", B, A)])
    assert original.tiu[0].cmd_id_dep == 1
    lost = dataclasses.replace(original, tiu=[dataclasses.replace(original.tiu[0], cmd_id_dep=0)] + original.tiu[1:])
    problems = check_schedule(original, lost)
    assert problems and "writes bytes that B1 (arith.copy, copy) reads" in problems[0]


def test_deadlock_is_caught():
    copy = ArTiu(op="copy", res0_addr=B[0], res0_n=1, res0_c=4, res0_h=1, res0_w=64, opd0_addr=A[0],
                 short_res0_str=1, short_opd0_str=1)
    original = random_program([("load", A, 0), ("copy", B, A)])
    load = original.gdma[0]
    cyclic = dataclasses.replace(original, tiu=[dataclasses.replace(copy, cmd_id_dep=1), SysTiu(op="end")],
                                 gdma=[dataclasses.replace(load, cmd_id_dep=1), SysDma(op="chain_end")])
    problems = check_schedule(original, cyclic)
    assert any(p.startswith("deadlock: B1 waits for D1; D1 waits for B1") for p in problems)


def test_wait_on_a_later_issued_instruction_is_caught():
    original = random_program([("load", A, 0), ("copy", B, A)])
    late = dataclasses.replace(original, issue_order="BDBD")
    assert any("issued after it" in p for p in check_schedule(original, late))


def test_missing_and_foreign_instructions_are_caught():
    original = random_program([("load", A, 0), ("load", B, 1), ("copy", B, A)])
    dropped = dataclasses.replace(original, gdma=original.gdma[1:], gdma_layers=original.gdma_layers[1:],
                                  issue_order=original.issue_order.replace("D", "", 1))
    assert any("missing" in p for p in check_schedule(original, dropped))
    other = dataclasses.replace(original.gdma[0], src_start_addr=original.gdma[0].src_start_addr + 64)
    assert isinstance(other, TensorDma)
    foreign = dataclasses.replace(original, gdma=[other] + original.gdma[1:])
    assert any("not an instruction of the original" in p for p in check_schedule(original, foreign))


def test_reordered_tile_queue_and_lost_stream_end_are_caught():
    original = random_program([("matmul",)])
    tile = original.tile
    swapped = dataclasses.replace(original, tile=[tile[1], tile[0]] + tile[2:])
    assert any("TILE queue is reordered" in p for p in check_schedule(original, swapped))
    records = records_of([("copy", B, A), ("copy", A, B)])
    original = program_of(records)
    end_first = program_of([records[2], records[0], records[1], records[3]])
    assert any("no longer ends with system.end" in p for p in check_schedule(original, end_first))
