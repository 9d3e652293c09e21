"""Exact timelines of the integer instructions: an int8 CONV at the chip's int8 cube rate (twice fp16's input
channels per cycle) and a quant.rq1 on the vector pipe with RQ/DQ's compute latency."""

import dataclasses

from hypothesis import given, settings, strategies as st

from tpuflow.chip import load_chip
from tpuflow.codegen.sg2260 import descriptor_form
from tpuflow.hwmodel.timing import instruction_cycles
from tpuflow.hwmodel.timing.banks import bank_bubbles
from tpuflow.hwmodel.timing.compute import RQDQ_STARTUP_KEY, tiu_work
from tpuflow.hwmodel.timing.synthetic import ProgramBuilder, conv
from tiu_alone import tiu_alone
from tpuflow.isa import ConvTiu, Prec, RqDqTiu

CHIP = load_chip("sg2260")
INT8, INT32, FP16 = int(Prec.INT8), int(Prec.INT32), int(Prec.FP16)


def run_alone(instr):
    return tiu_alone(instr, CHIP)


def int8_conv(**over) -> ConvTiu:
    fields = dict(res0_addr=0x8000, res0_n=1, res0_c=64, res0_h=8, res0_w=8, opd0_addr=0x0, opd0_c=64, opd0_h=8,
                  opd0_w=8, opd1_addr=0x4000, opd1_h=3, opd1_w=3, opd0_up_pad=1, opd0_dn_pad=1, opd0_lf_pad=1,
                  opd0_rt_pad=1, opt_opd0_prec=INT8, opt_opd1_prec=INT8, opt_opd2_prec=INT32, opt_res0_prec=INT32,
                  weight_ic_block=64)
    return ConvTiu(**(fields | over))


def test_int8_conv_timeline():
    """conv 3x3 pad 1, 64 -> 64 channels, 8x8, int8 in, int32 out (sCONV, 64-channel weight blocks). int8 cube:
    64 input channels x 4 pixels per lane and cycle -> steps = 1 x ceil(64/64) x ceil(64/4) = 16, each
    3 x 3 x ceil(64/64) = 9 cycles; startup 23; input bank 0, weights bank 1, result bank 2: no bubble.
    Dispatch 11 ns; DES 2 + GEN 12 + ISSUE 5 + ARB 5 -> first COMPUTE cycle at 35 ns; end 35 + 23 + 144
    + CONV's latency 5 = 207 ns. The same conv at fp16 (32 channels per cycle) takes 9 x 2 per step: 351 ns."""
    c = int8_conv()
    assert descriptor_form(c) == "sCONV"
    assert tiu_work(c, CHIP).steps == 16 and tiu_work(c, CHIP).cycles_per_step == 9
    assert run_alone(c) == ((11_000, 35_000, 207_000), 0)
    fp16 = dataclasses.replace(c, opt_opd0_prec=FP16, opt_opd1_prec=FP16, opt_opd2_prec=int(Prec.FP32),
                               opt_res0_prec=int(Prec.FP32), weight_ic_block=32, opt_opd0_sign=None, opt_opd1_sign=None)
    assert run_alone(fp16) == ((11_000, 35_000, 351_000), 0)


def test_rq1_timeline_and_its_bank_conflict():
    """quant.rq1 over (1, 64, 8, 8): int32 in (widest operand: 16 per lane per cycle) -> 4 steps; startup
    AR's 10 (RQDQ_STARTUP_KEY); RQDQ compute latency 8 (hardware.md). Dispatch 11 ns, vector DES 2 + GEN 1
    + ISSUE 1 -> start 15 ns; end 15 + 10 + 4 + 8 = 37 ns. Per-channel words at 0x8100 share bank 2 with
    res0 (0x8000): one bubble per step -> 41 ns."""
    assert RQDQ_STARTUP_KEY == "ar" and CHIP.tiu.startup_cycles["ar"] == 10
    rq = RqDqTiu(op="rq1", res0_addr=0x8000, res0_n=1, res0_c=64, res0_h=8, res0_w=8, opd0_addr=0x0,
                 opt_opd1_const=0, opd1_addr=0x4000)
    assert descriptor_form(rq) == "sRQ&sDQ"
    assert run_alone(rq) == ((11_000, 15_000, 37_000), 0)
    shared = dataclasses.replace(rq, opd1_addr=0x8100)
    assert bank_bubbles(shared, CHIP) == 4
    assert run_alone(shared) == ((11_000, 15_000, 41_000), 4)


@settings(max_examples=40, deadline=None)
@given(cin=st.integers(1, 300), cout=st.integers(1, 200), hw=st.integers(1, 16), k=st.sampled_from([1, 3]))
def test_int8_conv_never_costs_more_than_fp16_and_halves_the_channel_loop(cin, cout, hw, k):
    fp16 = conv(0x0, 0x10000, 0x20000, n=1, cin=cin, h=hw, w=hw, cout=cout, k=k, pad=k // 2, prec=FP16)
    int8 = dataclasses.replace(fp16, opt_opd0_prec=INT8, opt_opd1_prec=INT8, opt_res0_prec=INT32,
                               opt_opd2_prec=INT32, opt_opd0_sign=None, opt_opd1_sign=None)
    assert instruction_cycles(int8, CHIP) <= instruction_cycles(fp16, CHIP)
    w8, w16 = tiu_work(int8, CHIP), tiu_work(fp16, CHIP)
    assert w8.steps == w16.steps
    assert w8.cycles_per_step == k * k * -(-cin // 64) and w16.cycles_per_step == k * k * -(-cin // 32)


def test_int8_loads_move_one_byte_per_element():
    """A (1, 64, 56, 56) activation load: int8 moves 200704 DDR bytes, fp16 twice that; int8 lands in the
    64-per-lane EU-aligned layout (3136 elements = 49 EU vectors of 64 bytes per lane)."""
    from tpuflow.hwmodel.timing import simulate
    from tpuflow.hwmodel.timing.synthetic import load
    shape = (1, 64, 56, 56)
    int8, fp16 = load(CHIP, 0x1000, 0x0, shape, INT8), load(CHIP, 0x1000, 0x0, shape, FP16)
    assert int8.dst_cstride == 3136 and fp16.dst_cstride == 3136          # elements: 49 x 64 and 98 x 32
    assert sum(r.hi - r.lo for r in int8.accesses(CHIP).ddr_reads) == 64 * 56 * 56
    assert sum(r.hi - r.lo for r in fp16.accesses(CHIP).ddr_reads) == 2 * 64 * 56 * 56

    def alone(instr):
        b = ProgramBuilder(CHIP)
        b.add(instr)
        return simulate(b.build()).total_ps
    assert instruction_cycles(int8, CHIP) < instruction_cycles(fp16, CHIP)
    assert alone(int8) < alone(fp16)


def test_int8_depthwise_counts_the_eus_of_its_int8_input():
    """pord.depthwise 3x3 over (1, 64, 16, 16), int8 input and weights, int32 bias and sums: TPUPerf's PorD
    cycles count the EUs of operand 0's type, 64 int8 a lane (eu_bytes_per_lane 64) -> steps = ceil(256 / 64)
    = 4 of kh * kw = 9 cycles; the same instruction in fp32 (16 a lane) takes 16 steps. The pooling of an
    fp16 input into an fp32 result keeps the widest type (8 steps at 32 a lane would be 16 at fp32's 16)."""
    from tpuflow.isa import PordTiu
    dw = PordTiu(op="depthwise", res0_addr=0x8000, res0_n=1, res0_c=64, res0_h=16, res0_w=16, opd0_addr=0x0,
                 opd0_h=16, opd0_w=16, opd1_h=3, opd1_w=3, opd0_up_pad=1, opd0_dn_pad=1, opd0_lf_pad=1, opd0_rt_pad=1,
                 opd1_addr=0x4000, opt_opd1_const=0, opd2_addr=0x4100, opt_opd2_const=0, opt_opd0_prec=INT8,
                 opt_opd1_prec=INT8, opt_opd2_prec=INT32, opt_res0_prec=INT32)
    assert (tiu_work(dw, CHIP).steps, tiu_work(dw, CHIP).cycles_per_step) == (4, 9)
    fp32 = dataclasses.replace(dw, opt_opd0_prec=int(Prec.FP32), opt_opd1_prec=int(Prec.FP32),
                               opt_opd2_prec=int(Prec.FP32), opt_res0_prec=int(Prec.FP32))
    assert tiu_work(fp32, CHIP).steps == 16
    mixed = dataclasses.replace(fp32, op="avgpooling", opt_opd0_prec=FP16, opt_opd1_const=1, opd1_addr=0)
    assert tiu_work(mixed, CHIP).steps == 16
    assert instruction_cycles(dw, CHIP) < instruction_cycles(fp32, CHIP)
