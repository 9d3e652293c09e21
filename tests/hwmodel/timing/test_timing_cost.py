"""The scheduler's fast GDMA cost estimate tracks the simulator, including transfers cut into
many small segments (per-burst issue and unaligned penalties)."""

from __future__ import annotations

import pytest

from tpuflow.chip import load_chip
from tpuflow.hwmodel.timing import simulate
from tpuflow.hwmodel.timing.cost import instruction_cycles
from tpuflow.isa import SysDma, SysTiu, TensorDma, global_lmem_address
from tpuflow.program import MemoryPlan, Program

CHIP = load_chip("sg2260")


def load(channels: int, width: int) -> TensorDma:
    kw = {"src_start_addr": 0, "dst_start_addr": global_lmem_address(0, CHIP)}
    for side, strides in (("src", (channels * width, width, width, 1)), ("dst", (width, width, width, 1))):
        for d, size, stride in zip("nchw", (1, channels, 1, width), strides):
            kw[f"{side}_{d}size"], kw[f"{side}_{d}stride"] = size, stride
    return TensorDma(**kw)


def simulated_ns(instr) -> float:
    program = Program(chip=CHIP, tiu=[SysTiu(op="end")], gdma=[instr, SysDma(op="chain_end")], tiu_layers=[""],
                      gdma_layers=["x", ""], issue_order="DDB", memory=MemoryPlan(ddr_bytes_used=1 << 24))
    sim = simulate(program, check=False)
    row = sim.index("gdma", 1)
    return (sim.times["end"][row] - sim.times["start"][row]) / 1e3


@pytest.mark.parametrize("channels,width", [(64, 4096), (1024, 8), (960, 9), (1024, 1), (4096, 1)])
def test_estimate_within_ten_percent_of_the_simulated_transfer(channels, width):
    """Large contiguous rows are bandwidth-bound; one-element rows pay a burst each (about 10 ns
    at the GDMA clock with the unaligned penalty): the estimate must see both."""
    instr = load(channels, width)
    estimate_ns = instruction_cycles(instr, CHIP) * 1e3 / CHIP.clocks.gdma_clock_mhz
    assert estimate_ns == pytest.approx(simulated_ns(instr), rel=0.10)
