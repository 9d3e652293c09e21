"""Integer instructions in SG2260 descriptors: RqDqTiu (tsk_typ 4) and the signed / unsigned int8 forms of
CONV and MM2 round-trip, land in the register fields tpu-mlir reads, and unmodelled RQ/DQ forms are refused."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpuflow.codegen.sg2260 import decode_descriptors, descriptor_form, encode_descriptor, register_layout
from tpuflow.errors import BinaryFormatError
from tpuflow.isa import ConvTiu, Engine, Mm2Tiu, Prec, RqDqTiu
from tpuflow.isa.tiu import RQ_ROUND_MODES, dq0_scalars, rq0_scalars, rq1_scalars

INT8, INT16, INT32 = int(Prec.INT8), int(Prec.INT16), int(Prec.INT32)
LMEM_ADDR = st.integers(0, (1 << 24) - 1).map(lambda a: a & ~0x1F)


def _round_trip(instr):
    data = encode_descriptor(instr)
    (back,) = decode_descriptors(data, Engine.TIU)
    assert back == instr
    return data


def _field(data: bytes, register: str, name: str) -> int:
    return register_layout(register).fields[name].take(int.from_bytes(data, "little"))


@st.composite
def rq_instructions(draw):
    op = draw(st.sampled_from(sorted(RqDqTiu.OPS)))
    shape = {f"res0_{d}": draw(st.integers(1, 300)) for d in "nchw"}
    per_channel = draw(st.booleans())
    if per_channel:
        params = {"opt_opd1_const": 0, "opd1_addr": draw(LMEM_ADDR)}
    elif op == "rq1":
        params = rq1_scalars(draw(st.integers(-(1 << 31), (1 << 31) - 1)), draw(st.integers(-127, 128)),
                             draw(st.integers(-(1 << 15), (1 << 15) - 1)))
    elif op == "rq0":
        params = rq0_scalars(draw(st.floats(-1024, 1024, width=32)), draw(st.floats(-300, 300, width=32)))
    else:
        params = dq0_scalars(draw(st.integers(-(1 << 15), (1 << 15) - 1)), draw(st.floats(0.25, 10, width=32)))
    out_prec = draw(st.sampled_from([INT8, INT16, INT32] if op != "dq0" else [int(Prec.FP32), int(Prec.FP16),
                                                                             int(Prec.BF16)]))
    layout = {}
    if draw(st.booleans()):   # free strides: only the long RQ&DQ register holds them
        layout = {"short_res0_str": 3, "res0_w_str": 1, "res0_h_str": shape["res0_w"],
                  "short_opd0_str": draw(st.sampled_from([0, 1])), "res0_c_str": draw(st.integers(0, (1 << 15) - 1))}
    return RqDqTiu(op=op, res0_addr=draw(LMEM_ADDR), opd0_addr=draw(LMEM_ADDR), **shape, **params, **layout,
                   opt_res0_prec=out_prec, opt_opd0_prec=draw(st.sampled_from([INT8, INT16, INT32])),
                   opt_opd0_sign=draw(st.integers(0, 1)), opt_opd2_sign=draw(st.integers(0, 1)),
                   opd2_n_str=draw(st.sampled_from(sorted(RQ_ROUND_MODES.values()))),
                   cmd_id_dep=draw(st.integers(0, (1 << 20) - 1)))


@settings(max_examples=300, deadline=None)
@given(rq_instructions())
def test_rq_dq_round_trip_and_short_form_when_layouts_are_aligned(instr):
    data = _round_trip(instr)
    aligned = instr.short_res0_str == 0 and instr.short_opd0_str == 0 and instr.res0_c_str == 0
    fits_short = aligned and instr.res0_addr < 1 << 26 and instr.opd0_addr < 1 << 27
    assert descriptor_form(instr) == ("sRQ&sDQ" if fits_short else "RQ&DQ")
    register = descriptor_form(instr)
    assert _field(data, register, "tsk_typ") == 4
    assert _field(data, register, "tsk_eu_typ") == RqDqTiu.OPS[instr.op]
    assert _field(data, register, "opd2_n_str") == instr.round_mode
    assert _field(data, register, "opt_opd2_sign") == instr.opt_opd2_sign   # the result's sign (tpu-mlir)


def test_rq1_scalars_put_shift_and_zero_point_where_tpu_mlir_reads_them():
    """sRQ_sDQ_converter, rq_1 constants: shift = int8(opd2_addr), zp = int16(opd2_addr >> 8); the stored
    shift is -rshift."""
    fields = rq1_scalars(multiplier=-3, rshift=5, zero_point=-2)
    instr = RqDqTiu(op="rq1", res0_addr=0, res0_n=1, res0_c=1, res0_h=1, res0_w=1, opd0_addr=64, **fields)
    data = _round_trip(instr)
    assert _field(data, "sRQ&sDQ", "opd1_addr") == (-3) & 0xFFFFFFFF
    opd2 = _field(data, "sRQ&sDQ", "opd2_addr")
    assert opd2 & 0xFF == (-5) & 0xFF and (opd2 >> 8) & 0xFFFF == (-2) & 0xFFFF and opd2 >> 24 == 0
    assert _field(data, "sRQ&sDQ", "opt_opd1_const") == 1


@pytest.mark.parametrize("signs", [(1, 1), (0, 1), (1, 0), (0, 0)])
def test_int8_conv_and_mm2_signs_are_written_and_read_back(signs):
    conv = ConvTiu(res0_addr=0, res0_n=1, res0_c=8, res0_h=4, res0_w=4, opd0_addr=0x4000, opd0_c=3, opd0_h=6,
                   opd0_w=6, opd1_addr=0x8000, opd1_h=3, opd1_w=3, opt_opd0_prec=INT8, opt_opd1_prec=INT8,
                   opt_opd2_prec=INT32, opt_res0_prec=INT32, weight_ic_block=64,
                   opt_opd0_sign=signs[0], opt_opd1_sign=signs[1])
    mm2 = Mm2Tiu(op="nn", res0_addr=0, res0_c=16, res0_w=32, opd0_addr=64, opd0_c=16, opd0_w=8, opd1_addr=128,
                 opd1_c=8, opd1_w=32, opt_opd0_prec=INT8, opt_opd1_prec=INT8, opt_opd2_prec=INT32,
                 opt_res0_prec=INT32, opt_opd0_sign=signs[0], opt_opd1_sign=signs[1])
    for instr, register in ((conv, "sCONV"), (mm2, "sMM2")):
        data = _round_trip(instr)
        assert descriptor_form(instr) == register
        assert (_field(data, register, "opt_opd0_sign"), _field(data, register, "opt_opd1_sign")) == signs
        assert _field(data, register, "opt_opd0_prec") == INT8


def test_conv_pad_value_is_written_two_s_complement_in_opd3():
    conv = ConvTiu(res0_addr=0, res0_n=1, res0_c=8, res0_h=4, res0_w=4, opd0_addr=0x4000, opd0_c=3, opd0_h=6,
                   opd0_w=6, opd1_addr=0x8000, opd1_h=3, opd1_w=3, opt_opd0_prec=INT8, opt_opd1_prec=INT8,
                   opt_opd2_prec=INT32, opt_res0_prec=INT32, weight_ic_block=64, opd3_addr=-7)
    data = _round_trip(conv)
    assert _field(data, "sCONV", "opd3_addr") == 0xFFFFFFF9 and _field(data, "sCONV", "opt_opd3_const") == 1
    assert conv.pad_value == -7
    assert dataclasses.replace(conv, opd3_addr=None).opd3_addr == 0


def test_signs_default_to_signed_for_integers_and_unsigned_for_floats():
    base = dict(op="nn", res0_addr=0, res0_c=4, res0_w=4, opd0_addr=64, opd0_c=4, opd0_w=4, opd1_addr=128,
                opd1_c=4, opd1_w=4)
    assert (Mm2Tiu(**base).opt_opd0_sign, Mm2Tiu(**base).opt_opd1_sign) == (0, 0)
    ints = Mm2Tiu(**base, opt_opd0_prec=INT8, opt_opd1_prec=INT8)
    assert (ints.opt_opd0_sign, ints.opt_opd1_sign) == (1, 1)
    assert dataclasses.replace(ints, opt_opd1_sign=0).opt_opd0_sign == 1    # an explicit flag is kept


def _rq_record(**over) -> int:
    instr = RqDqTiu(op="rq1", res0_addr=0, res0_n=1, res0_c=1, res0_h=1, res0_w=1, opd0_addr=64)
    raw = int.from_bytes(encode_descriptor(instr), "little")
    fields = register_layout("sRQ&sDQ").fields
    for name, value in over.items():
        raw = (raw & ~fields[name].mask) | fields[name].place(value)
    return raw


def test_unmodelled_rq_dq_forms_are_refused_with_the_byte_offset():
    dq1 = _rq_record(tsk_eu_typ=4).to_bytes(32, "little")
    with pytest.raises(BinaryFormatError, match="byte offset 0: quant.dq1"):
        decode_descriptors(dq1, Engine.TIU)
    sym = _rq_record(sym_range=1).to_bytes(32, "little")
    with pytest.raises(BinaryFormatError, match="sym_range"):
        decode_descriptors(sym, Engine.TIU)


def test_vendor_streams_read_rq_dq_records_and_constant_conv_pads():
    """tpu-mlir's RQ&DQ records become RqDqTiu (dq1, not modelled, as rq1 of equal cost); a conv's opd3 is its
    pad value only when opt_opd3_const is set."""
    from tpuflow.codegen.vendor import decode_vendor_stream
    from tpuflow.isa import SysTiu

    rq = RqDqTiu(op="dq0", res0_addr=0x100, res0_n=1, res0_c=70, res0_h=3, res0_w=5, opd0_addr=0x2000,
                 opt_opd0_prec=INT8, opt_res0_prec=int(Prec.FP16), **dq0_scalars(-3, 0.5))
    dq1 = _rq_record(tsk_eu_typ=4).to_bytes(32, "little")
    conv = ConvTiu(res0_addr=0, res0_n=1, res0_c=8, res0_h=4, res0_w=4, opd0_addr=0x4000, opd0_c=3, opd0_h=6,
                   opd0_w=6, opd1_addr=0x8000, opd1_h=3, opd1_w=3, opt_opd0_prec=INT8, opt_opd1_prec=INT8,
                   opt_opd2_prec=INT32, opt_res0_prec=INT32, weight_ic_block=64, opd3_addr=5)
    from_lmem = _set_fields(encode_descriptor(conv), "sCONV", opt_opd3_const=0)
    data = encode_descriptor(rq) + dq1 + encode_descriptor(conv) + from_lmem + encode_descriptor(SysTiu(op="end"))
    got = decode_vendor_stream(data, Engine.TIU).instructions
    assert got[0] == rq and got[1].op == "rq1"
    as_read = dataclasses.replace(conv, weight_ic_block=1)     # the vendor reader leaves weight blocks at 1
    assert got[2] == as_read and got[3] == dataclasses.replace(as_read, opd3_addr=0)


def _set_fields(data: bytes, register: str, **over) -> bytes:
    raw = int.from_bytes(data, "little")
    fields = register_layout(register).fields
    for name, value in over.items():
        raw = (raw & ~fields[name].mask) | fields[name].place(value)
    return raw.to_bytes(len(data), "little")


def test_disassembly_of_int8_lines():
    from tpuflow.chip import load_chip
    from tpuflow.codegen.disasm import tiu_line
    chip = load_chip("sg2260")
    shape = dict(res0_addr=0x8000, res0_n=1, res0_c=64, res0_h=8, res0_w=8, opd0_addr=0x0)
    rq = RqDqTiu(op="rq1", **shape, **rq1_scalars(12345, 9, -3), opd2_n_str=1, opt_opd2_sign=0)
    assert tiu_line(3, rq, chip) == ("B3 quant.rq1 res0=(1,64,8,8)@L0:0x8000:int8 opd0=(1,64,8,8)@L0:0x0000:int32 "
                                     "round=half_away_from_zero unsigned_out mul=12345 rshift=9 zp=-3")
    dq = RqDqTiu(op="dq0", **shape, opt_opd0_prec=INT8, opt_opd0_sign=0, opt_res0_prec=int(Prec.FP16),
                 **dq0_scalars(128, 0.125))
    assert tiu_line(4, dq, chip).endswith("round=half_to_even unsigned_in zp=128 scale=0.125")
    conv = ConvTiu(res0_addr=0x8000, res0_n=1, res0_c=64, res0_h=8, res0_w=8, opd0_addr=0x0, opd0_c=64, opd0_h=8,
                   opd0_w=8, opd1_addr=0x4000, opd1_h=1, opd1_w=1, opt_opd0_prec=INT8, opt_opd1_prec=INT8,
                   opt_opd2_prec=INT32, opt_res0_prec=INT32)
    assert "opd0=(1,64,8,8)@L0:0x0000:int8 opd1=(1,64,1,64)@L0:0x4000:int8:compact" in tiu_line(1, conv, chip)
    assert "sign" not in tiu_line(1, conv, chip)       # signed int8 is the default, not printed
