"""One rule for the DDR bytes of a GDMA instruction (hwmodel.timing.segments.ddr_bytes): the bytes of
its transfer sides outside LMEM, used alike by the timing model, the estimate's report and the
scheduler's bounds."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from tpuflow.chip import load_chip
from tpuflow.hwmodel.timing.segments import ddr_bytes
from tpuflow.isa import GeneralDma, Prec, SysDma, global_lmem_address

CHIP = load_chip("sg2260")
DDR = 0x1000


def lmem(lane: int, offset: int = 0) -> int:
    return global_lmem_address(lane * CHIP.lmem_bytes_per_lane + offset, CHIP)


@settings(max_examples=40, deadline=None)
@given(length=st.integers(1, 4096), lanes=st.integers(1, 64), prec=st.sampled_from([Prec.FP32, Prec.FP16, Prec.INT8]))
def test_a_broadcast_reads_its_source_once(length, lanes, prec):
    """DDR -> LMEM broadcast into `lanes` lanes: the DDR reads are one copy of the source, whatever
    the lane count (the lanes are written in LMEM, not DDR)."""
    instr = GeneralDma(op="broadcast", src_start_addr=DDR, dst_start_addr=lmem(0), src_cstride=length,
                       dst_csize=lanes, src_data_format=prec)
    assert ddr_bytes(instr, CHIP) == length * prec.bytes


@pytest.mark.parametrize("src, dst, sides", [(DDR, 0x80000, 2), (DDR, lmem(3), 1), (lmem(3), DDR, 1), (lmem(1), lmem(2), 0)])
def test_each_side_outside_lmem_counts(src, dst, sides):
    instr = GeneralDma(src_start_addr=src, dst_start_addr=dst, src_cstride=100, src_data_format=Prec.FP16)
    assert ddr_bytes(instr, CHIP) == sides * 200


def test_a_sys_command_moves_no_ddr_bytes():
    assert ddr_bytes(SysDma(op="sys_send"), CHIP) == 0


def test_the_bounds_and_the_report_count_the_same_bytes():
    from tpuflow.codegen.report_data import row_ddr_bytes
    from tpuflow.options import CompileOptions
    from tpuflow.pipeline import compile_model
    from tpuflow.scheduler.bounds import ddr_bytes as program_ddr_bytes
    _, program = compile_model("bert_layer", "sg2260", CompileOptions(dtype="fp16"))
    broadcasts = [i for i in program.gdma if getattr(i, "op", "") == "broadcast"]
    assert broadcasts, "bert_layer's bias rows are broadcast loads: the case the two old rules disagreed on"
    assert program_ddr_bytes(program) == int(row_ddr_bytes(program).sum()) > 0
