"""Engine identity and waits from the ISA (Engine.code, Instruction.waits()) and the IFE check built on
them: the vectorised chunk-bitmap derivation equals the one-instruction-at-a-time rule, and every
wrong wait field is caught."""

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpuflow.chip import load_chip
from tpuflow.hwmodel.timing.deps import (ChunkTables, IssueOrder, bitmap_conflicts, compiled_waits,
                                         derive_bitmap_waits)
from tpuflow.hwmodel.timing.synthetic import ProgramBuilder, ar, copy_bytes, load, store
from tpuflow.isa import (TILE_WAIT_TAG, AccCvt, Engine, SysDma, SysTiu, TMatmul, TPush, size_code, tile_ref)
from tpuflow.isa.base import ENGINES, same_as_earlier
from tpuflow.isa.tile import sys_tile_wait

CHIP = load_chip("sg2260")
SHAPE = (1, 64, 4, 16)


def test_engine_codes_letters_and_suffixes():
    assert [(e.code, e.letter, e.stream_suffix) for e in ENGINES] == [(0, "B", "BD"), (1, "D", "GDMA"),
                                                                      (2, "T", "TILE")]
    assert all(Engine.of_code(e.code) is e and Engine.of_letter(e.letter) is e for e in Engine)


def test_waits_answer_the_wait_fields_per_engine():
    add = dataclasses.replace(ar("add", 0x8000, 0, 0x4000, SHAPE), cmd_id_dep=7)
    dma = dataclasses.replace(load(CHIP, 0, 0, SHAPE), cmd_id_dep=5)
    push = TPush(dst_queue=0, dst_size=8, wait_tiu_id=3, wait_gdma_id=4)
    assert (add.waits(), dma.waits(), push.waits()) == ((0, 7, 0), (5, 0, 0), (3, 4, 0))
    assert add.without_waits().waits() == (0, 0, 0) and add.without_waits().opd1_addr == 0x4000
    assert push.with_waits((9, 8, 7)).waits() == (9, 8, 0)     # a TILE block has no field for TILE
    assert dma.with_waits((1, 2, 3)) == dataclasses.replace(dma, cmd_id_dep=1)
    unchanged = load(CHIP, 0, 0, SHAPE)
    assert unchanged.without_waits() is unchanged


def test_sys_tile_waits_carry_their_block_and_only_they_are_tile_waits():
    tiu_wait = dataclasses.replace(sys_tile_wait(Engine.TIU, 6), cmd_id_dep=2)
    gdma_wait = sys_tile_wait(Engine.GDMA, 9)
    assert tiu_wait == SysTiu(op="wait_msg", reg_idx=TILE_WAIT_TAG, imm=6, cmd_id_dep=2)
    assert gdma_wait == SysDma(op="sys_wait", index=TILE_WAIT_TAG, constant_value=9)
    assert tiu_wait.waits() == (0, 2, 6) and gdma_wait.waits() == (0, 0, 9)
    assert tiu_wait.is_tile_wait and gdma_wait.is_tile_wait
    others = [SysTiu(op="wait_msg", reg_idx=3, imm=6), SysTiu(op="send_msg", reg_idx=TILE_WAIT_TAG, imm=6),
              SysDma(op="sys_wait", index=2, constant_value=9), SysTiu(op="end"), ar("add", 0, 0, 0, SHAPE)]
    assert not any(i.is_tile_wait for i in others)
    assert all(i.waits()[Engine.TILE.code] == 0 for i in others)
    assert tiu_wait.without_waits().waits() == (0, 0, 6)       # the block is an operand, not a wait field


# ------------------------------------------------------------------ the IFE check on random programs

SLOTS = [0x0, 0x4000, 0x8000, 0xC000, 0x10000]
steps = st.one_of(
    st.tuples(st.just("load"), st.sampled_from(SLOTS), st.integers(1, 64)),
    st.tuples(st.just("store"), st.sampled_from(SLOTS), st.integers(1, 64)),
    st.tuples(st.just("add"), st.sampled_from(SLOTS), st.sampled_from(SLOTS), st.sampled_from(SLOTS)),
    st.tuples(st.just("tile"), st.integers(0, 3)),
)


def build(spec):
    """A program whose waits ProgramBuilder sets one instruction at a time (ChunkTables)."""
    b = ProgramBuilder(CHIP)
    pushes = [0, 0, 0]
    for step in spec:
        if step[0] in ("load", "store"):
            shape = (1, step[2], 2, 16)
            b.add(load(CHIP, 1 << 20, step[1], shape) if step[0] == "load" else store(CHIP, step[1], 1 << 21, shape))
        elif step[0] == "add":
            b.add(ar("add", step[1], step[2], step[3], SHAPE))
        else:
            for q in (0, 1):
                b.add(copy_bytes(CHIP, 0, CHIP.tile_slot_address(q, pushes[q] % 16), 1024, dst_lmem=True))
                b.add(TPush(dst_queue=q, dst_size=size_code(1024)))
                pushes[q] += 1
            b.add(TMatmul(fn="TMATMUL", dt="FP32", m=16, n=16, k=16, src0=tile_ref("T", 1), src1=tile_ref("U", 1),
                          acc_size=size_code(1024)))
            b.add(AccCvt(layout="NZ2ND", row=16, col=16, dst_queue=2, dst_size=size_code(1024)))
            b.add(copy_bytes(CHIP, CHIP.tile_slot_address(2, pushes[2] % 16), 1 << 22, 1024, src_lmem=True))
            pushes[2] += 1
            if step[1]:
                b.add(ar("add", CHIP.tile_slot_address(2, (pushes[2] - 1) % 16) % CHIP.lmem_bytes_per_lane,
                         SLOTS[step[1]], SLOTS[0], (1, 1, 1, 16)))
    return b.build()


def incremental_conflicts(program):
    """The chunk-bitmap rule walked one instruction at a time (the builder's reference)."""
    tables, rows = ChunkTables(program), []
    for engine, index in program.issue_sequence():
        acc = program.accesses(engine, index)
        rows.append(tables.conflicts(acc.lmem_reads, acc.lmem_writes))
        tables.record(engine.code, index + 1, acc.lmem_reads, acc.lmem_writes)
    return np.asarray(rows, dtype=np.int64).reshape(-1, 3)


@settings(max_examples=60, deadline=None)
@given(st.lists(steps, min_size=1, max_size=16))
def test_vectorised_bitmap_rule_equals_the_incremental_one(spec):
    program = build(spec)
    order = IssueOrder.of(program)
    sets = [program.accesses(Engine.of_code(c), i) for c, i in zip(order.code.tolist(), order.index.tolist())]
    tables = ChunkTables(program)
    got = bitmap_conflicts(order, [tables.chunks(a.lmem_reads) for a in sets],
                           [tables.chunks(a.lmem_writes) for a in sets])
    want = incremental_conflicts(program)
    other = np.ones_like(got, dtype=bool)
    other[np.arange(len(got)), order.code] = False            # the own engine's column is not a wait
    assert np.array_equal(got[other], want[other])
    waits, problems = derive_bitmap_waits(program)
    assert problems == []
    assert all(np.array_equal(w, compiled_waits(program).ids[e.code]) for e, w in zip(ENGINES, waits.ids))


@settings(max_examples=40, deadline=None)
@given(st.lists(steps, min_size=1, max_size=12), st.data())
def test_every_changed_wait_field_is_reported(spec, data):
    program = build(spec)
    candidates = [(e, i) for e in ENGINES for i, instr in enumerate(program.queue(e)) if instr.WAIT_FIELDS]
    engine, index = data.draw(st.sampled_from(candidates))
    instr = program.queue(engine)[index]
    other = data.draw(st.sampled_from(sorted(instr.WAIT_FIELDS, key=lambda e: e.code)))
    ids = list(instr.waits())
    ids[other.code] += data.draw(st.integers(1, 3))
    queue = list(program.queue(engine))
    queue[index] = instr.with_waits(ids)
    bad = dataclasses.replace(program, **{engine.value: queue})
    _, problems = derive_bitmap_waits(bad)
    assert any(p.startswith(f"{engine.letter}{index + 1} ") for p in problems)


@pytest.mark.parametrize("engine", [Engine.TIU, Engine.GDMA])
def test_an_uncovered_tile_conflict_names_the_instruction(engine):
    program = build([("tile", 1)])
    queue = program.queue(engine)
    waits = [i for i, instr in enumerate(queue) if instr.is_tile_wait]
    assert waits, "the builder guards the TILE slot reader with a SYS tile wait"
    block = queue[waits[0]].waits()[Engine.TILE.code]
    kept = queue[:waits[0]] + queue[waits[0] + 1:]
    letter = engine.letter
    order = program.issue_order
    position = [k for k, ch in enumerate(order) if ch == letter][waits[0]]
    bad = dataclasses.replace(program, **{engine.value: kept}, issue_order=order[:position] + order[position + 1:])
    _, problems = derive_bitmap_waits(bad)
    assert any(f"conflicts with T{block} but is not preceded by a SYS wait for T{block}" in p for p in problems)


def test_same_as_earlier_ignores_waits_and_nothing_else():
    add = ar("add", 0x8000, 0, 0x4000, SHAPE)
    other = ar("add", 0x8000, 0, 0x4040, SHAPE)
    queue = [add, dataclasses.replace(add, cmd_id_dep=3), other, dataclasses.replace(other, cmd_id_dep=9), add]
    assert same_as_earlier(queue) == [0, 0, 2, 2, 0]
