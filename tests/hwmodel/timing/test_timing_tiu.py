"""Exact TIU timelines: bank-conflict bubbles from real operand addresses, DPC pipes, compute formulas."""

from hypothesis import given, settings, strategies as st

from tpuflow.chip import load_chip
from tpuflow.hwmodel.timing import instruction_cycles, instruction_latency_cycles, simulate
from tpuflow.hwmodel.timing.banks import bank_bubbles
from tpuflow.hwmodel.timing.compute import tiu_macs, tiu_work
from tpuflow.hwmodel.timing.synthetic import ProgramBuilder, ar, conv, matmul
from tpuflow.isa import Prec

CHIP = load_chip("sg2260")
SHAPE = (1, 64, 16, 16)      # fp32: 256 elements per lane = 16 EU vectors of 16


def run_alone(instr):
    b = ProgramBuilder(CHIP)
    b.add(instr)
    r = simulate(b.build())
    return r, r.index("tiu", 1)


def test_ar_bank_conflicts_cost_exactly_the_bubbles():
    """arith.add over (1, 64, 16, 16) fp32, alone. IFE: 1024-bit descriptor = 4 TXI words -> check 9 ns,
    issue 10 ns, in the TIU list at 11 ns = dispatch (DES). Vector pipe: GEN in at 11 + 2 = 13 ns,
    first COMPUTE cycle 13 + GEN 1 + ISSUE 1 = 15 ns. Body = startup 10 + 16 steps (+ bubbles), then
    the add's compute latency 3 cycles.
      opd0 0x0000, opd1 0x4000, res0 0x8000: banks 0, 1, 2 -> no bubble:        end 15 + 26 + 3 = 44 ns
      opd0 0x0000, opd1 0x4000, res0 0x1000: r0 and w0 share bank 0: 1 x 16     end 44 + 16  = 60 ns
      opd0 0x0000, opd1 0x1000, res0 0x2000: all three in bank 0: 2 x 16        end 44 + 32  = 76 ns
      opd1 a constant, opd0 / res0 in bank 0: constants take no part: 1 x 16    end 60 ns
    """
    cases = [((0x0000, 0x4000, 0x8000, None), 44_000, 0),
             ((0x0000, 0x4000, 0x1000, None), 60_000, 16),
             ((0x0000, 0x1000, 0x2000, None), 76_000, 32),
             ((0x0000, None, 0x1000, 0x3F800000), 60_000, 16)]
    for (a, b, res, const), end, bubbles in cases:
        r, i = run_alone(ar("add", res, a, b, SHAPE, b_const=const))
        assert int(r.times["dispatch"][i]) == 11_000
        assert int(r.times["start"][i]) == 15_000
        assert int(r.times["end"][i]) == end
        assert int(r.stall_cycles("bank_conflict")[i]) == bubbles


def test_bubbles_follow_addresses_across_banks():
    """(1, 64, 64, 128) fp32 = 32 KiB per lane = 512 steps of 64 B. opd0 at 0x0 walks bank 0 (steps
    0-255) then bank 1; res0 at 0x2000 walks bank 0 (steps 0-127), 1 (128-383), 2 (384-511); opd1 at
    0x20000 stays in banks 8-9. Shared banks at steps 0-127 (bank 0) and 256-383 (bank 1): 256 bubbles."""
    instr = ar("add", 0x2000, 0x0, 0x20000, (1, 64, 64, 128))
    assert bank_bubbles(instr, CHIP) == 256
    assert instruction_cycles(instr, CHIP) == 10 + 512 + 256


def test_cube_pairwise_conflicts_per_output_tile():
    """conv 3x3 pad 1, 64 -> 64 channels, 8x8 fp32: fp32 cube = 1 input channel x 16 pixels per lane and
    cycle -> steps = 1 x ceil(64/64) x ceil(64/16) = 4, each 9 x 64 = 576 cycles; startup 23.
    opd0 / opd1 / res0 in one bank: 3 pairwise conflicts per step = 12 bubbles; in three banks: none.
    Alone: dispatch 11, DES 2 + GEN 12 + ISSUE 5 + ARB 5 -> first COMPUTE cycle at 35 ns; end after the
    body and CONV's compute latency 5."""
    same = conv(0x2000, 0x0, 0x1000, n=1, cin=64, h=8, w=8, cout=64)
    apart = conv(0x8000, 0x0, 0x4000, n=1, cin=64, h=8, w=8, cout=64)
    assert bank_bubbles(same, CHIP) == 12 and bank_bubbles(apart, CHIP) == 0
    r, i = run_alone(apart)
    assert int(r.times["start"][i]) == 35_000
    assert int(r.times["end"][i]) == 35_000 + (23 + 4 * 576) * 1000 + 5_000
    r, i = run_alone(same)
    assert int(r.times["end"][i]) == 35_000 + (23 + 4 * 576 + 12) * 1000 + 5_000


def test_back_to_back_vector_instructions_overlap_fill_and_drain():
    """Two independent adds: the second enters DES when the first moves to GEN (13 ns), GEN runs ahead of
    COMPUTE within the 16 + 32 entry buffers, so the second's body starts right where the first's ends
    (15 + 26 = 41 ns) and ends at 41 + 26 + 3 = 70 ns."""
    b = ProgramBuilder(CHIP)
    b.add(ar("add", 0x8000, 0x0, 0x4000, SHAPE))
    b.add(ar("add", 0x20000, 0x10000, 0x14000, SHAPE))
    r = simulate(b.build())
    assert int(r.times["start"][1]) == 41_000 and int(r.times["end"][1]) == 70_000


def test_mm2_formula():
    """mm2.nn M=128, K=256, N=64 fp32: ceil(128/64) * ceil(64/16) = 8 steps of ceil(256/1) = 256, startup 44;
    int8 (64 IC x 4 OHOW): 2 * 16 steps of ceil(256/64) = 4."""
    mm = matmul(0x0, 0x10000, 0x20000, 128, 256, 64)
    w = tiu_work(mm, CHIP)
    assert (w.startup, w.steps, w.cycles_per_step) == (44, 8, 256)
    mm8 = matmul(0x0, 0x10000, 0x20000, 128, 256, 64, prec=int(Prec.INT8))
    w8 = tiu_work(mm8, CHIP)
    assert (w8.steps, w8.cycles_per_step) == (32, 4)
    assert instruction_latency_cycles(mm, CHIP) == 2 + 12 + 5 + 5 + instruction_cycles(mm, CHIP) + 3


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 2), cin=st.integers(1, 300), cout=st.integers(1, 300), hw=st.integers(1, 20),
       k=st.sampled_from([1, 3, 5]), prec=st.sampled_from([Prec.FP32, Prec.FP16, Prec.BF16, Prec.INT8]))
def test_cube_never_beats_its_peak(n, cin, cout, hw, k, prec):
    """Whatever the shape, a CONV's cycles are at least MACs / chip.peak_macs_per_cycle(dtype)."""
    c = conv(0x0, 0x10000, 0x20000, n=n, cin=cin, h=hw, w=hw, cout=cout, k=k, pad=k // 2, prec=int(prec))
    dtype = {Prec.FP32: "fp32", Prec.FP16: "fp16", Prec.BF16: "bf16", Prec.INT8: "int8"}[prec]
    assert instruction_cycles(c, CHIP) * CHIP.peak_macs_per_cycle(dtype) >= tiu_macs(c)
