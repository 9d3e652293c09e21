"""Exact timelines of the SG gather (SgTiu): tpu-mlir's sg_op cycle model, one element per lane and cycle with
W rounded up to the EU width, start-up tiu.sg_startup_cycles, no bank bubbles (pe_s_gather_hzd with its index
and result in one bank costs what pe_s_gather_d1coor does)."""

import dataclasses

from hypothesis import given, settings, strategies as st

from tpuflow.chip import load_chip
from tpuflow.codegen.sg2260 import descriptor_form
from tpuflow.hwmodel.timing import instruction_cycles
from tpuflow.hwmodel.timing.banks import bank_bubbles
from tpuflow.hwmodel.timing.compute import tiu_work
from tiu_alone import tiu_alone
from tpuflow.isa import SgTiu

CHIP = load_chip("sg2260")


def run_alone(instr):
    return tiu_alone(instr, CHIP)


def gather(**over) -> SgTiu:
    fields = dict(op="pe_s_gather_d1coor", res0_addr=0x4000, res0_n=1, res0_c=64, res0_w=300, opd0_addr=0x8000,
                  opd0_w=256, opd1_addr=0x0)
    return SgTiu(**(fields | over))


def test_gather_timeline():
    """(1, 64, 1, 300) int8: 300 rounded up to 5 EU vectors of 64 -> 320 cycles on each lane; start-up 11; SG
    has no compute latency entry (0). Vector DES 2 + GEN 1 + ISSUE 1 after the 11 ns dispatch -> start 15 ns,
    end 15 + 11 + 320 = 346 ns. Index bank 0, result bank 1, table bank 2."""
    g = gather()
    assert CHIP.tiu.sg_startup_cycles == 11 and descriptor_form(g) == "sSG"
    w = tiu_work(g, CHIP)
    assert (w.steps, w.cycles_per_step, w.startup, w.latency) == (5, 64, 11, 0)
    assert run_alone(g) == ((11_000, 15_000, 346_000), 0)


def test_more_channels_and_samples_and_a_shared_bank():
    """n 2, c 130 (3 channel groups on 64 lanes), w 64 -> 2 x 3 x 64 = 384 cycles: end 15 + 11 + 384 = 410 ns;
    pe_s_gather_hzd with table, index and result in one bank: no bubble (tpu-mlir's bank_conflict_cycle 0)."""
    g = gather(op="pe_s_gather_hzd", res0_n=2, res0_c=130, res0_w=64, res0_addr=0x4400, opd0_addr=0x4800)
    assert not g.banks_disjoint(CHIP) and bank_bubbles(g, CHIP) == 0
    assert run_alone(g) == ((11_000, 15_000, 410_000), 0)
    assert run_alone(dataclasses.replace(g, op="pe_s_gather_d1coor", res0_addr=0x4000, opd0_addr=0x8000)) == \
        ((11_000, 15_000, 410_000), 0)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 3), c=st.integers(1, 200), w=st.integers(1, 5000))
def test_gather_costs_one_element_per_lane_and_cycle(n, c, w):
    g = gather(res0_n=n, res0_c=c, res0_w=w)
    eu = CHIP.eu_count("int8")
    body = n * -(-c // CHIP.lanes) * -(-w // eu) * eu
    assert instruction_cycles(g, CHIP) >= body + CHIP.tiu.sg_startup_cycles
    assert tiu_work(g, CHIP).body == body
