"""SG gathers (SgTiu, tsk_typ 6) in SG2260 descriptors: round trips in the short sSG form, the fields land where
tpu-mlir's atomic_pes_sg_d1hzd_gen_cmd writes them (op code, opd0_h = 1, table width, index C / W, channel
stride 0 of the table as short_opd0_str 4), the long SG form decodes to the same instruction, the gathers
tpuflow does not model are refused naming the byte offset, tpu-mlir's records read by the vendor reader, and
the disassembly line."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings

from codegen_strategies import sg_instruction
from tpuflow.chip import load_chip
from tpuflow.codegen.disasm import tiu_line
from tpuflow.codegen.sg2260 import decode_descriptors, descriptor_form, encode_descriptor, register_layout
from tpuflow.errors import BinaryFormatError
from tpuflow.isa import Engine, Prec, SgTiu, SysTiu

CHIP = load_chip("sg2260")


def gather(**over) -> SgTiu:
    fields = dict(op="pe_s_gather_d1coor", res0_addr=0x4000, res0_n=2, res0_c=70, res0_w=300, opd0_addr=0x8000,
                  opd0_w=256, opd1_addr=0x0)
    return SgTiu(**(fields | over))


def _field(data: bytes, register: str, name: str) -> int:
    return register_layout(register).fields[name].take(int.from_bytes(data, "little"))


@settings(max_examples=150, deadline=None)
@given(sg_instruction())
def test_decode_of_encode_is_identity(instr):
    data = encode_descriptor(instr)
    assert descriptor_form(instr) == "sSG" and len(data) == 48
    assert decode_descriptors(data, Engine.TIU) == [instr]


def test_fields_sit_where_tpu_mlir_writes_them():
    data = encode_descriptor(gather())
    expect = dict(cmd_short=1, tsk_typ=6, tsk_eu_typ=5, res0_n=2, res0_c=70, res0_h=1, res0_w=300, opd0_h=1,
                  opd0_w=256, opd1_c=70, opd1_w=300, short_opd0_str=4, opt_opd2_const=0, opt_opd3_const=0,
                  res0_addr=0x4000, opd0_addr=0x8000, opd1_addr=0, opt_res0_prec=0, opt_opd0_prec=0, opt_opd1_prec=0)
    assert {k: _field(data, "sSG", k) for k in expect} == expect
    assert _field(encode_descriptor(gather(op="pe_s_gather_hzd")), "sSG", "tsk_eu_typ") == 13


def test_the_long_form_decodes_to_the_same_instruction():
    """The SG register with the fields tpu-mlir's long-form generator writes."""
    g = gather(opt_opd2_const=1, opt_opd3_const=1, opd2_addr=0x55, opt_opd1_prec=int(Prec.INT16))
    layout = register_layout("SG")
    values = dict(cmd_short=0, tsk_typ=6, tsk_eu_typ=5, res0_n=2, res0_c=70, res0_h=1, res0_w=300, opd0_h=1,
                  opd0_w=256, opd1_c=70, opd1_w=300, short_opd0_str=4, opt_opd2_const=1, opt_opd3_const=1,
                  opd2_addr=0x55, res0_addr=0x4000, opd0_addr=0x8000, opd1_addr=0, opt_opd1_prec=int(Prec.INT16))
    raw = 0
    for name, value in values.items():
        raw |= layout.fields[name].place(value)
    assert decode_descriptors(raw.to_bytes(layout.nbytes, "little"), Engine.TIU) == [g]


def test_gathers_tpuflow_does_not_model_are_refused():
    """sg.pl_gather_d1coor (op 0: one index vector for every lane) is not SgTiu's per-element gather."""
    data = bytearray(encode_descriptor(gather()))
    raw = int.from_bytes(data, "little")
    field = register_layout("sSG").fields["tsk_eu_typ"]
    raw = (raw & ~field.mask) | field.place(0)
    with pytest.raises(BinaryFormatError, match="byte offset 0: sg.pl_gather_d1coor .* not an instruction"):
        decode_descriptors(raw.to_bytes(48, "little"), Engine.TIU)


def test_bad_instructions_are_refused():
    with pytest.raises(ValueError, match="index"):
        gather(opd1_c=3)
    with pytest.raises(ValueError, match="res0's precision"):
        gather(opt_opd0_prec=int(Prec.FP16))
    with pytest.raises(ValueError, match="res0_w"):
        gather(res0_w=1 << 16)


def test_vendor_reader_takes_sg_records():
    """tpu-mlir's sSG records become SgTiu; a gather tpuflow does not model (pl_gather, op 0) is read as the
    per-element gather of equal cost over res0's shape."""
    from tpuflow.codegen.vendor import decode_vendor_stream
    g = gather()
    pl = bytearray(encode_descriptor(g))
    raw = int.from_bytes(pl, "little")
    fields = register_layout("sSG").fields
    raw = (raw & ~fields["tsk_eu_typ"].mask) | fields["tsk_eu_typ"].place(0)
    raw = (raw & ~fields["opd1_c"].mask) | fields["opd1_c"].place(300)
    data = encode_descriptor(g) + raw.to_bytes(48, "little") + encode_descriptor(SysTiu(op="end"))
    got = decode_vendor_stream(data, Engine.TIU).instructions
    assert got[0] == g and got[1] == dataclasses.replace(g, op="pe_s_gather_hzd")


def test_disassembly_line():
    assert tiu_line(4, gather(opt_opd2_const=1, opt_opd3_const=1, opd2_addr=7), CHIP) == (
        "B4 sg.pe_s_gather_d1coor res0=(2,70,1,300)@L0:0x4000:int8 opd0=(1,70,1,256)@L0:0x8000:int8:per_lane "
        "opd1=(2,70,1,300)@L0:0x0000:int8 fill=7")
