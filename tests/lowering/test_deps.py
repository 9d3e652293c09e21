"""Dependency ids from chunk bitmaps: every cross-engine hazard ordered, auto mode serialising,
the id window, and ids beyond the descriptor fields surviving the binaries."""

from __future__ import annotations

import functools
import tempfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpuflow.chip import load_chip, replace_param
from tpuflow.codegen import read_program, write_program
from tpuflow.isa import (TILE_WAIT_TAG, AccCvt, ArTiu, Engine, SysDma, SysTiu, TensorDma, TMatmul, TPush,
                         global_lmem_address, size_code, tile_ref)
from tpuflow.isa.ids import window_floor
from tpuflow.lowering.deps import assign_dependencies
from tpuflow.lowering.emitter import Record
from tpuflow.options import CompileOptions
from tpuflow.pipeline import verify
from tpuflow.program import Program

CHIP = load_chip("sg2260")
LB = CHIP.lmem_bytes_per_lane


def lmem_tile(lane: int, offset: int, channels: int, width: int):
    return lane * LB + offset, (1, channels, 1, width)


def tiu_copy(dst, src) -> ArTiu:
    (d_addr, shape), (s_addr, _) = dst, src
    return ArTiu(op="copy", res0_addr=d_addr, res0_n=1, res0_c=shape[1], res0_h=1, res0_w=shape[3],
                 opd0_addr=s_addr, short_res0_str=1, short_opd0_str=1)


def dma(tile, to_lmem: bool) -> TensorDma:
    addr, (n, c, h, w) = tile
    lm = global_lmem_address(addr, CHIP)
    ddr = (0, (n, c, h, w), (c * h * w, h * w, w, 1))
    lmem_side = (lm, (n, c, h, w), (w, w, w, 1))
    src, dst = (ddr, lmem_side) if to_lmem else (lmem_side, ddr)
    kw = {}
    for side, (a, shape, strides) in (("src", src), ("dst", dst)):
        kw[f"{side}_start_addr"] = a
        for d, s, t in zip("nchw", shape, strides):
            kw[f"{side}_{d}size"], kw[f"{side}_{d}stride"] = s, t
    return TensorDma(**kw)


tiles = st.builds(lambda lane, block, c, w: lmem_tile(lane, block * 8192, c, w),
                  st.integers(0, 63), st.integers(0, 20), st.integers(1, 8), st.sampled_from([8, 64, 1024]))
ops = st.one_of(
    st.tuples(st.just("tiu"), tiles, tiles),
    st.tuples(st.just("load"), tiles),
    st.tuples(st.just("store"), tiles),
    st.tuples(st.just("matmul"), st.just(None)),
)


def build_records(spec) -> list[Record]:
    records = []
    for op in spec:
        if op[0] == "tiu":
            records.append(Record(Engine.TIU, tiu_copy(op[1], op[2]), "l"))
        elif op[0] in ("load", "store"):
            records.append(Record(Engine.GDMA, dma(op[1], op[0] == "load"), "l"))
        else:   # a TILE block sequence whose slots GDMA fills and drains
            for q in (0, 1):
                slot = CHIP.tile_slot_address(q, sum(1 for r in records if isinstance(r.instr, TPush)
                                                     and r.instr.dst_queue == q) % 16)
                records.append(Record(Engine.GDMA, dma((slot, (1, 1, 1, 256)), True), "t"))
                records.append(Record(Engine.TILE, TPush(dst_queue=q, dst_size=size_code(1024)), "t"))
            records.append(Record(Engine.TILE, TMatmul(fn="TMATMUL", dt="FP32", m=16, n=16, k=16, src0=tile_ref("T", 1),
                                                       src1=tile_ref("U", 1), acc_size=size_code(1024)), "t"))
            pushes = sum(1 for r in records if isinstance(r.instr, AccCvt))
            records.append(Record(Engine.TILE, AccCvt(layout="NZ2ND", row=16, col=16, dst_queue=2,
                                                      dst_size=size_code(1024)), "t"))
            out = CHIP.tile_slot_address(2, pushes % 16)
            records.append(Record(Engine.GDMA, dma((out, (1, 1, 1, 256)), False), "t"))
    return records


def program_of(records, chip=CHIP, mode="bitmap") -> Program:
    queues, layers, order = assign_dependencies(records, chip, mode)
    return Program(chip=chip, tiu=queues[0], gdma=queues[1], tile=queues[2], tiu_layers=layers[0],
                   gdma_layers=layers[1], tile_layers=layers[2], issue_order=order)


def happens_before(program: Program) -> dict:
    """Vector clock at the completion of every instruction, from its queue predecessor and its
    waits (an oracle independent of the chunk tables)."""
    vc = {}
    last = {e: {Engine.TIU: 0, Engine.GDMA: 0, Engine.TILE: 0} for e in Engine}
    for engine, index in program.issue_sequence():
        instr = program.queue(engine)[index]
        clock = dict(last[engine])
        waits = []
        if engine is Engine.TILE:
            waits = [(Engine.TIU, instr.wait_tiu_id), (Engine.GDMA, instr.wait_gdma_id)]
        else:
            waits = [(Engine.GDMA if engine is Engine.TIU else Engine.TIU, instr.cmd_id_dep)]
            if isinstance(instr, (SysTiu, SysDma)) and getattr(instr, "reg_idx", getattr(instr, "index", 0)) == TILE_WAIT_TAG:
                waits.append((Engine.TILE, instr.imm if isinstance(instr, SysTiu) else instr.constant_value))
        for other, dep in waits:
            if dep:
                for e, v in vc[(other, dep)].items():
                    clock[e] = max(clock[e], v)
        clock[engine] = index + 1
        vc[(engine, index + 1)] = clock
        last[engine] = clock
    return vc


def hazards(program: Program):
    seq = list(program.issue_sequence())
    acc = {(e, i): program.accesses(e, i) for e, i in seq}
    for a in range(len(seq)):
        for b in range(a + 1, len(seq)):
            (ea, ia), (eb, ib) = seq[a], seq[b]
            if ea is eb:
                continue
            x, y = acc[seq[a]], acc[seq[b]]
            pairs = [(w, r) for w in x.lmem_writes for r in y.lmem_reads + y.lmem_writes]
            pairs += [(r, w) for r in x.lmem_reads for w in y.lmem_writes]
            if any(p.overlaps(q) for p, q in pairs):
                yield (ea, ia + 1), (eb, ib + 1)


@settings(max_examples=60, deadline=None)
@given(st.lists(ops, min_size=1, max_size=14))
def test_every_cross_engine_hazard_is_ordered(spec):
    program = program_of(build_records(spec))
    vc = happens_before(program)
    for (ea, ia), (eb, ib) in hazards(program):
        assert vc[(eb, ib)][ea] >= ia, f"{eb.letter}{ib} does not wait for {ea.letter}{ia}"


@settings(max_examples=30, deadline=None)
@given(st.lists(ops, min_size=1, max_size=10))
def test_auto_mode_waits_for_everything_issued_before(spec):
    program = program_of(build_records(spec), mode="auto")
    seen = {Engine.TIU: 0, Engine.GDMA: 0, Engine.TILE: 0}
    for engine, index in program.issue_sequence():
        instr = program.queue(engine)[index]
        if engine is Engine.TIU:
            assert instr.cmd_id_dep == seen[Engine.GDMA]
        elif engine is Engine.GDMA:
            assert instr.cmd_id_dep == seen[Engine.TIU]
        else:
            assert (instr.wait_tiu_id, instr.wait_gdma_id) == (seen[Engine.TIU], seen[Engine.GDMA])
        seen[engine] += 1


@functools.lru_cache(maxsize=None)
def narrow_chip(bits: int):
    chip = CHIP
    for key in ("deps.tiu_dep_id_bits", "deps.gdma_dep_id_bits", "deps.tile_dep_id_bits"):
        chip = replace_param(chip, key, bits)
    return chip


@settings(max_examples=25, deadline=None)
@given(st.lists(ops, min_size=1, max_size=30))
def test_waits_stay_in_the_id_window_and_round_trip_through_the_binaries(spec):
    chip = narrow_chip(2)                       # windows of 3 ids: most programs wrap
    program = program_of(build_records(spec), chip)
    vc = happens_before(program)
    for (ea, ia), (eb, ib) in hazards(program):
        assert vc[(eb, ib)][ea] >= ia
    issued = {Engine.TIU: 0, Engine.GDMA: 0, Engine.TILE: 0}
    for engine, index in program.issue_sequence():
        instr = program.queue(engine)[index]
        if engine is Engine.TIU:
            assert instr.cmd_id_dep >= window_floor(issued[Engine.GDMA], 2)
        if engine is Engine.GDMA:
            assert instr.cmd_id_dep >= window_floor(issued[Engine.TIU], 2)
        issued[engine] += 1
    with tempfile.TemporaryDirectory() as d:
        back = read_program(write_program(program, d), chip)
    assert back.tiu == program.tiu and back.gdma == program.gdma and back.tile == program.tile


def test_a_model_with_ids_wrapping_many_times_still_verifies():
    result = verify("small_cnn", narrow_chip(2), CompileOptions(), race_check=True)
    assert result["ok"] and result["instructions"]["gdma"] > 4 * 4


def test_a_conflicting_tile_block_gets_a_sys_wait():
    records = build_records([("matmul", None)])
    program = program_of(records)
    waits = [i for i in program.gdma if isinstance(i, SysDma) and i.index == TILE_WAIT_TAG]
    assert len(waits) == 1 and waits[0].constant_value == 4     # the store waits for ACCCVT (T4)
