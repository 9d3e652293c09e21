"""The one per-instruction cost model (hwmodel.timing.cost) and the calibration keys it shares with the
simulator: per-direction GDMA rates, cube cycles per step, the scheduler's DAG timing and bound."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpuflow.chip import ComputeConfig, GdmaConfig, load_chip
from tpuflow.hwmodel.timing import simulate
from tpuflow.hwmodel.timing.clocks import Clocks
from tpuflow.hwmodel.timing.compute import tiu_work
from tpuflow.hwmodel.timing.cost import (instruction_cycles, instruction_latency_cycles, instruction_timing_ps,
                                         pipe_fill_cycles, tile_load_cycles)
from tpuflow.hwmodel.timing.gdma import CommandModel
from tpuflow.hwmodel.timing.synthetic import FP32, ProgramBuilder, conv, copy_bytes, load, matmul, store
from tpuflow.isa import Prec, SysDma, SysTiu
from tpuflow.program import MemoryPlan, Program
from tpuflow.scheduler.bounds import schedule_bound_ps
from tpuflow.scheduler.dag import build_dag

BM1684X = load_chip("bm1684x")
SG2260 = load_chip("sg2260")
FP16 = int(Prec.FP16)
DDR = 1 << 24


def uncapped(chip):
    """The chip without per-direction GDMA limits (the memory path alone decides)."""
    return dataclasses.replace(chip, gdma=dataclasses.replace(chip.gdma, s2l_gbps=0.0, l2s_gbps=0.0, s2s_gbps=0.0))


def alone_ps(chip, instr) -> int:
    """Dispatch-to-end ps of one GDMA command in the full simulator (program: the command, then the ends)."""
    program = Program(chip=chip, tiu=[SysTiu(op="end")], gdma=[instr, SysDma(op="chain_end")], tiu_layers=[""],
                      gdma_layers=["x", ""], issue_order="DDB", memory=MemoryPlan(ddr_bytes_used=1 << 26))
    sim = simulate(program, check=False)
    row = sim.index("gdma", 1)
    return int(sim.times["end"][row] - sim.times["start"][row])


def test_bm1684x_calibration_keys_and_their_sources():
    g, c = BM1684X.gdma, BM1684X.compute
    assert (g.s2l_gbps, g.l2s_gbps, g.s2s_gbps, g.direction_efficiency) == (58.0, 44.0, 28.0, 0.931)
    assert dict(c.cube_cycles_per_step) == {"int8": 1, "fp16": 1, "bf16": 1, "fp32": 2}
    assert (SG2260.gdma.s2l_gbps, SG2260.gdma.direction_efficiency) == (0.0, 1.0)
    for cls, names in ((GdmaConfig, ("s2l_gbps", "l2s_gbps", "s2s_gbps", "direction_efficiency")),
                       (ComputeConfig, ("cube_cycles_per_step",))):
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for name in names:
            meta = fields[name].metadata
            assert meta["doc"] and meta["source"] and "unit" in meta


def test_a_long_load_runs_at_the_calibrated_ddr_to_lmem_rate():
    """1 MiB DDR -> LMEM on BM1684X: 8 setup cycles, then 1048576 B at 58 GB/s x 0.931 = 0.053998 B/ps:
    ceil(1048576 / 0.053998) = 19418794 ps, + 8000 setup, on a GDMA edge -> 19427000 ps. Without the limit the
    memory path (64 GB/s DRAM model) finishes sooner, so the limit is what binds."""
    instr = load(BM1684X, DDR, 0, (1, 64, 1, 4096))
    assert alone_ps(BM1684X, instr) == 19_427_000
    assert alone_ps(uncapped(BM1684X), instr) < 19_427_000


def test_a_long_store_runs_at_the_lmem_to_ddr_rate():
    """512 KiB LMEM -> DDR: ceil(524288 / (44 x 0.931 / 1000)) = 12798751 ps + 8000 setup -> 12807000."""
    instr = store(BM1684X, 0, DDR, (1, 64, 1, 2048))
    assert alone_ps(BM1684X, instr) == 12_807_000


def test_sg2260_has_no_direction_limit():
    instr = load(SG2260, DDR, 0, (1, 64, 1, 4096))
    assert alone_ps(SG2260, instr) == alone_ps(uncapped(SG2260), instr)


@settings(max_examples=25, deadline=None)
@given(direction=st.sampled_from(["s2l", "l2s", "s2s"]), lanes=st.sampled_from([1, 8, 64]),
       width=st.integers(1, 3000), chip=st.sampled_from([BM1684X, SG2260]))
def test_the_gdma_cost_never_exceeds_the_simulated_command(direction, lanes, width, chip):
    """The scheduler's bound stays below every simulated makespan only if no instruction's cost
    exceeds what the simulator charges it alone."""
    shape = (1, lanes, 1, width)
    if direction == "s2l":
        instr = load(chip, DDR, 0, shape)
    elif direction == "l2s":
        instr = store(chip, 0, DDR, shape)
    else:
        instr = copy_bytes(chip, DDR, DDR + (1 << 22), lanes * width * 4)
    period = Clocks.of(chip).gdma.period
    table = CommandModel(chip, Clocks.of(chip)).table([instr])
    assert instruction_cycles(instr, chip) * period <= int(table.end[0])


def test_fp32_cube_steps_take_two_cycles_on_bm1684x():
    """3x3 conv, 64 -> 64 channels, 14x14 output: steps = ceil(64/64) x ceil(196/16) = 13, each
    9 x 64 input channels (ic = 1 for fp32) x 2 cycles -> body 13 x 1152 = 14976 (sg2260: 7488)."""
    c = conv(0, 1 << 16, 1 << 17, n=1, cin=64, h=14, w=14, cout=64, prec=FP32)
    assert tiu_work(c, BM1684X).body == 14976
    assert tiu_work(c, SG2260).body == 7488
    half = conv(0, 1 << 16, 1 << 17, n=1, cin=64, h=14, w=14, cout=64, prec=FP16)
    assert tiu_work(half, BM1684X).body == tiu_work(half, SG2260).body
    mm = matmul(0, 1 << 16, 1 << 17, m=64, k=256, n=64, prec=FP32)
    # MM2 without a bias row: ceil(64/64) x ceil(64/16) = 4 steps of ceil(256/1) x 2 = 512 cycles
    assert tiu_work(mm, BM1684X).body == 4 * 512
    assert tiu_work(mm, SG2260).body == 4 * 256


def test_dag_durations_are_the_cost_models_timing():
    b = ProgramBuilder(BM1684X)
    b.add(load(BM1684X, DDR, 0, (1, 64, 4, 64)))
    b.add(conv(1 << 16, 0, 1 << 17, n=1, cin=64, h=4, w=64, cout=64, k=1, pad=0, prec=FP32))
    b.add(store(BM1684X, 1 << 16, DDR + (1 << 20), (1, 64, 4, 64)))
    program = b.build()
    dag = build_dag(program)
    instrs = [program.gdma[0], program.tiu[0], program.gdma[1]]
    for node, instr in enumerate(instrs):
        assert (dag.duration[node], dag.head[node], dag.tail[node]) == instruction_timing_ps(instr, BM1684X)
    c = program.tiu[0]
    assert instruction_timing_ps(c, BM1684X)[1] == pipe_fill_cycles(c, BM1684X) * 1000 == (2 + 12 + 5 + 5) * 1000
    assert sum(instruction_timing_ps(c, BM1684X)) == instruction_latency_cycles(c, BM1684X) * 1000


@pytest.mark.parametrize("chip", [BM1684X, SG2260], ids=["bm1684x", "sg2260"])
def test_schedule_bound_never_exceeds_the_simulated_makespan(chip):
    b = ProgramBuilder(chip)
    for i in range(3):
        b.add(load(chip, DDR + i * (1 << 20), i * (1 << 15), (1, 64, 8, 64)))
        b.add(conv((4 + i) * (1 << 15), i * (1 << 15), 1 << 17, n=1, cin=64, h=8, w=64, cout=64, k=1, pad=0,
                   prec=FP32))
        b.add(store(chip, (4 + i) * (1 << 15), DDR + (8 + i) * (1 << 20), (1, 64, 8, 64)))
    program = b.build()
    bound = schedule_bound_ps(program)
    assert 0 < bound <= simulate(program).total_ps


def test_tile_loads_cost_more_the_finer_their_pieces():
    """Per tile: a constant tile batched 8 per DMA < one contiguous tile < a runtime tile in 32 B
    pieces < a runtime tile element by element (sg2260 with a plain LMEM tile window, fp32, 64 x 128);
    through the tile buffer (ND -> Nz in flight) a runtime tile read as 512 B rows costs about a
    contiguous one."""
    from tpuflow.chip import replace_param
    plain = replace_param(SG2260, "tile.buffer_chunk_bytes", 0)
    const8 = tile_load_cycles(plain, 64, 128, 4, runtime=False, batch=8)
    const1 = tile_load_cycles(plain, 64, 128, 4, runtime=False)
    pieces = tile_load_cycles(plain, 64, 128, 4, runtime=True)
    elements = tile_load_cycles(plain, 64, 128, 4, runtime=True, piece_elems=1)
    assert const8 < const1 < pieces < elements
    assert pieces / const1 > 4 and math.isfinite(elements)
    buffered = tile_load_cycles(SG2260, 64, 128, 4, runtime=True)
    assert buffered < pieces / 4 and buffered <= 2 * const1
