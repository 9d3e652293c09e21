"""GDMA per-run charges (gdma.min_run_bytes, gdma.element_load_run_bytes / element_store_run_bytes): exact command timelines on BM1684X,
the cost model agreeing with the simulator, and chips without the keys unchanged."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from tpuflow.chip import load_chip, replace_param
from tpuflow.hwmodel.timing import simulate
from tpuflow.hwmodel.timing.clocks import Clocks
from tpuflow.hwmodel.timing.cost import instruction_cycles
from tpuflow.hwmodel.timing.gdma import CommandModel, charged_ddr_bytes
from tpuflow.hwmodel.timing.segments import transfer_sides
from tpuflow.hwmodel.timing.synthetic import ProgramBuilder, load, store
from tpuflow.isa import Prec

BM1684X = load_chip("bm1684x")
DDR = 1 << 30
FP16, FP32 = int(Prec.FP16), int(Prec.FP32)


def command_end_ps(chip, instr) -> int:
    return int(CommandModel(chip, Clocks.of(chip)).table([instr]).end[0])


def charged(chip, instr) -> int:
    return charged_ddr_bytes(chip, *transfer_sides(instr, chip))


def test_one_value_per_lane_load_exact_timeline():
    """(1, 64, 1, 1) fp32 DDR -> LMEM: 256 contiguous DDR bytes land one 4 B element in each of 64 lanes:
    64 one-element runs, each charged element_load_run_bytes = 1024 B at s2l 58 GB/s x 0.931 = 0.053998 B/ps:
    floor = ceil(65536 / 0.053998) = 1213675 ps; end = GDMA edge at or after setup 8 ns + floor
    = 1222 ns (tpu-mlir 1.30.2 charges the same load 1213 cycles)."""
    instr = load(BM1684X, DDR, 0, (1, 64, 1, 1), FP32)
    assert charged(BM1684X, instr) == 64 * 1024
    assert math.ceil(65536 / (58 * 0.931 * 1e-3)) == 1_213_675
    assert command_end_ps(BM1684X, instr) == 1_222_000
    assert instruction_cycles(instr, BM1684X) == 8 + 1_213_675 // 1000


def test_short_runs_are_charged_the_minimum_run():
    """(1, 64, 1, 64) fp16: 64 runs of 128 B, each charged min_run_bytes = 256 B -> 16384 B at the floor:
    the cost model's floor 8 + 303 cycles; the simulator's DRAM timeline (1186 ns) stays above it."""
    instr = load(BM1684X, DDR, 0, (1, 64, 1, 64), FP16)
    assert charged(BM1684X, instr) == 64 * 256
    assert instruction_cycles(instr, BM1684X) == 8 + math.ceil(16384 / (58 * 0.931 * 1e-3)) // 1000
    assert command_end_ps(BM1684X, instr) == 1_186_000


def test_one_value_per_lane_store_uses_the_store_rate():
    """(1, 128, 1, 1) fp16 LMEM -> DDR: 128 one-element runs x element_store_run_bytes 512 B at l2s 44 GB/s
    x 0.931 = 0.040964 B/ps: ceil(65536 / 0.040964) = 1599844 ps; end = GDMA edge at or after 8 ns + that
    = 1608 ns (tpu-mlir: 12.49 cycles per stored value)."""
    instr = store(BM1684X, 0, DDR, (1, 128, 1, 1), FP16)
    assert charged(BM1684X, instr) == 128 * 512
    assert math.ceil(65536 / (44 * 0.931 * 1e-3)) == 1_599_844
    assert command_end_ps(BM1684X, instr) == 1_608_000


def test_long_runs_cost_their_bytes():
    instr = load(BM1684X, DDR, 0, (1, 64, 16, 64), FP16)   # 2 KiB contiguous per channel
    assert charged(BM1684X, instr) == instr.nbytes == 131072


def test_chip_without_run_charges_is_unchanged():
    """With the keys 0 a one-value-per-lane load costs its bytes: the DRAM model alone decides."""
    plain = BM1684X
    for key in ("min_run_bytes", "element_load_run_bytes", "element_store_run_bytes"):
        plain = replace_param(plain, f"gdma.{key}", 0)
    instr = load(plain, DDR, 0, (1, 64, 1, 1), FP32)
    assert charged(plain, instr) == 256
    assert command_end_ps(plain, instr) < command_end_ps(BM1684X, instr)
    sg2260 = load_chip("sg2260").gdma
    assert sg2260.min_run_bytes == sg2260.element_load_run_bytes == sg2260.element_store_run_bytes == 0


def test_whole_program_latency_is_the_command_timeline():
    """One load alone: the simulated program ends when the command ends (plus IFE hand-over before it)."""
    b = ProgramBuilder(BM1684X)
    b.add(load(BM1684X, DDR, 0, (1, 64, 1, 1), FP32))
    sim = simulate(b.build())
    row = sim.index("gdma", 1)
    assert int(sim.times["end"][row] - sim.times["dispatch"][row]) == 1_222_000


@settings(max_examples=60, deadline=None)
@given(c=st.integers(1, 256), h=st.integers(1, 8), w=st.integers(1, 64), fp16=st.booleans())
def test_charge_is_at_least_the_bytes_and_at_least_the_runs(c, h, w, fp16):
    prec = FP16 if fp16 else FP32
    instr = load(BM1684X, DDR, 0, (1, c, h, w), prec)
    got = charged(BM1684X, instr)
    runs = c                                    # h x w contiguous per channel, channels on different lanes
    per_run = 1024 if h * w == 1 else 256
    assert got == max(instr.nbytes, runs * per_run)
    assert instruction_cycles(instr, BM1684X) * 1000 <= command_end_ps(BM1684X, instr)
