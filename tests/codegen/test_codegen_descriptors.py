"""SG2260 TIU/GDMA descriptors: round trips, short-form choice, field errors, stream decoding errors."""

from __future__ import annotations

import dataclasses

import pytest
from codegen_strategies import DESCRIPTOR_KINDS, any_descriptor_instruction, descriptor_instruction
from hypothesis import given, settings
from hypothesis import strategies as st

from tpuflow.codegen.bitfields import ConstantMismatch, FieldRangeError, Layout
from tpuflow.codegen.sg2260 import (KIND_REGISTERS, REGISTER_OPS, check_table_heads, decode_descriptors, descriptor_form,
                                    encode_descriptor, encode_descriptors, register_layout, register_table)
from tpuflow.errors import BinaryFormatError, EncodingError
from tpuflow.isa import (ArTiu, CmpTiu, ConvTiu, Engine, GeneralDma, Mm2Tiu, PordTiu, SysDma, SysTiu, TensorDma,
                         TIU_KINDS)


def conv(**over):
    fields = dict(res0_addr=0, res0_n=1, res0_c=64, res0_h=56, res0_w=56, opd0_addr=0x4000, opd0_c=3,
                  opd0_h=230, opd0_w=230, opd1_addr=0x8000, opd1_h=7, opd1_w=7)
    return ConvTiu(**(fields | over))


def mm2(op="nn", **over):
    fields = dict(op=op, res0_addr=0, res0_c=16, res0_w=32, opd0_addr=64, opd0_c=16, opd0_w=8,
                  opd1_addr=128, opd1_c=8, opd1_w=32)
    return Mm2Tiu(**(fields | over))


def ar(**over):
    fields = dict(op="add", res0_addr=0, res0_n=1, res0_c=4, res0_h=2, res0_w=8, opd0_addr=0x100, opd1_addr=0x200)
    return ArTiu(**(fields | over))


def tensor_dma(**over):
    fields = dict(src_start_addr=0x1000, dst_start_addr=0x1F0000000000, src_nsize=1, src_csize=2, src_hsize=3,
                  src_wsize=4, src_nstride=24, src_cstride=12, src_hstride=4, src_wstride=1, dst_nsize=1,
                  dst_csize=2, dst_hsize=3, dst_wsize=4, dst_nstride=16, dst_cstride=16, dst_hstride=4,
                  dst_wstride=1)
    return TensorDma(**(fields | over))


# ----------------------------------------------------------------------------------- tables

def test_table_keeps_its_source_note_and_heads_sit_where_the_packing_note_says():
    table = register_table()
    assert "tpu-mlir" in table["source"] and "LSB-first" in table["packing"]
    check_table_heads()


@pytest.mark.parametrize("cls", DESCRIPTOR_KINDS, ids=lambda c: c.__name__)
def test_class_op_codes_agree_with_the_register_table(cls):
    """Each op is in every register of its kind that holds it, with the table's type and op codes
    (REGISTER_OPS: registers that hold some of the ops, e.g. TensorDma's transpose is DMA_cw_transpose)."""
    regs = {reg for reg, _ in KIND_REGISTERS[cls]}
    table = register_table()["tiu_ops" if cls.ENGINE is Engine.TIU else "dma_ops"]
    type_key, op_key = ("tsk_typ", "tsk_eu_typ") if cls.ENGINE is Engine.TIU else ("cmd_type", "cmd_sp_func")
    for op, code in cls.OPS.items():
        holders = {reg for reg in regs if op in REGISTER_OPS.get(reg, cls.OPS)}
        assert holders, op
        for reg in holders:
            want = REGISTER_OPS.get(reg, cls.OPS)[op]
            rows = [e for e in table if e["reg"] == reg and e[op_key] == want]
            assert rows and len({e["name"] for e in rows}) == 1, (reg, op)
            if reg not in REGISTER_OPS:
                name = f"{cls.PREFIX}.{op}" if cls.ENGINE is Engine.TIU else _gdma_name(cls, op)
                assert all(e["name"] == name and e[type_key] == getattr(cls, "TSK_TYP", getattr(cls, "CMD_TYPE", None))
                           for e in rows), name


def _gdma_name(cls, op):
    """dma_ops name: 'dma.tensor' for the plain op, 'dma.tensor.transpose' otherwise."""
    return cls.PREFIX if op == cls.PREFIX.rsplit(".", 1)[-1] else f"{cls.PREFIX}.{op}"


# ------------------------------------------------------------------------------ round trips

@pytest.mark.parametrize("cls", DESCRIPTOR_KINDS, ids=lambda c: c.__name__)
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_decode_of_encode_is_identity_for_every_kind(cls, data):
    instr = data.draw(descriptor_instruction(cls))
    blob = encode_descriptor(instr)
    assert decode_descriptors(blob, cls.ENGINE) == [instr]
    assert len(blob) == register_layout(descriptor_form(instr)).nbytes


@settings(max_examples=60, deadline=None)
@given(st.lists(any_descriptor_instruction(), min_size=1, max_size=12), st.sampled_from([Engine.TIU, Engine.GDMA]))
def test_streams_of_mixed_kinds_and_lengths_decode_in_order(instrs, engine):
    instrs = [i for i in instrs if i.ENGINE is engine]
    assert decode_descriptors(encode_descriptors(instrs), engine) == instrs


def test_every_descriptor_field_the_dataclass_lacks_is_zero_or_its_hardware_meaning():
    blob = encode_descriptor(conv(res0_n_str=1, short_res0_str=3))  # long CONV
    layout = register_layout("CONV")
    raw = int.from_bytes(blob, "little")
    head = {"cmd_short", "tsk_typ", "tsk_eu_typ"}
    names = {f.name for f in dataclasses.fields(ConvTiu)} | head
    # opd3 (the padding value) is the constant 0, not an LMEM operand; weights and bias are compact
    implied = {"opt_opd3_const": 1, "short_opd1_str": 1, "short_opd2_str": 1}
    for bit in layout.bits:
        if bit.name not in names:
            assert bit.extract(raw) == implied.get(bit.name, 0), bit.name


# ------------------------------------------------------------------------------- short forms

@pytest.mark.parametrize("instr, register", [
    (conv(), "sCONV"),
    (conv(opd0_h_str=7, short_opd0_str=3), "sCONV"),            # opd0 strides exist in sCONV
    (conv(short_res0_str=1), "CONV"),                           # sCONV has no short_res0_str
    (conv(res0_addr=1 << 26), "CONV"),                          # sCONV's res0_addr is 26 bits
    (mm2("nn"), "sMM2"),                                        # opd0 (16 x 8) implied by res0 and opd1
    (mm2("nn", opd0_w=9), "MM2"),                               # not the implied K
    (mm2("nt", opd0_w=8, opd1_c=32, opd1_w=8), "sMM2"),
    (mm2("tt", opd0_c=8, opd0_w=16, opd1_c=32, opd1_w=8), "sMM2"),
    (ar(), "sAR"),
    (ar(short_opd0_str=3, opd0_h_str=(1 << 19) - 1), "sAR"),    # 20-bit signed h stride in sAR
    (ar(short_opd0_str=3, opd0_h_str=1 << 19), "AR"),           # ... and the long form's 32 bits
    (ar(short_opd0_str=3, opd0_w_str=-(1 << 19)), "sAR"),
    (ar(short_opd0_str=3, opd0_w_str=-(1 << 19) - 1), "AR"),
    (CmpTiu(op="sel_gt", res0_addr=0, res0_n=1, res0_c=1, res0_h=1, res0_w=1, opd0_addr=0, opd1_addr=0,
            opd2_addr=0, opd3_addr=0), "sCMP"),
    (CmpTiu(op="sel_gt", res0_addr=0, res0_n=1, res0_c=1, res0_h=1, res0_w=1, opd0_addr=0, opd1_addr=0,
            opd2_addr=0, opd3_addr=0, opt_res0_prec=1), "CMP"),       # sCMP has no opt_res0_prec
    (PordTiu(op="maxpooling", res0_addr=0, res0_n=1, res0_c=8, res0_h=4, res0_w=4, opd0_addr=64, opd0_h=8,
             opd0_w=8, opd1_h=2, opd1_w=2, res_op_x_str=2, res_op_y_str=2), "sPorD"),
    (SysTiu(op="end"), "SYS"),
    (SysDma(op="chain_end"), "sDMA_sys"),
])
def test_short_form_is_used_exactly_when_the_fields_fit(instr, register):
    assert descriptor_form(instr) == register
    assert decode_descriptors(encode_descriptor(instr), instr.ENGINE) == [instr]


def test_short_descriptors_are_shorter():
    assert len(encode_descriptor(conv())) == 64 and len(encode_descriptor(conv(short_res0_str=1))) == 128
    assert len(encode_descriptor(mm2())) == 32 and len(encode_descriptor(SysTiu(op="nop"))) == 16


# ---------------------------------------------------------------------------- field values

def test_negative_strides_are_twos_complement_and_round_trip():
    instr = conv(short_res0_str=3, res0_h_str=-56, res0_w_str=-1, res0_n_str=-(1 << 15))
    raw = int.from_bytes(encode_descriptor(instr), "little")
    field = register_layout("CONV").fields["res0_w_str"]
    assert field.signed and (raw >> field.parts[0].offset) & 0xFFFFFFFF == 0xFFFFFFFF
    assert decode_descriptors(encode_descriptor(instr), Engine.TIU) == [instr]
    dma = tensor_dma(src_hstride=-4, dst_nstride=-(1 << 31))
    assert decode_descriptors(encode_descriptor(dma), Engine.GDMA) == [dma]


def test_integer_constants_are_signed_and_float_constants_are_bits():
    shift = ar(op="logic_shift", opd1_addr=-3, opt_opd1_const=1, opt_opd1_prec=4, opt_opd0_prec=4, opt_res0_prec=4)
    assert decode_descriptors(encode_descriptor(shift), Engine.TIU) == [shift]
    with pytest.raises(EncodingError, match="opd1_addr"):
        encode_descriptor(dataclasses.replace(shift, opd1_addr=1 << 31))
    fp = ar(opd1_addr=0xBF800000, opt_opd1_const=1)  # -1.0f
    assert decode_descriptors(encode_descriptor(fp), Engine.TIU) == [fp]
    with pytest.raises(EncodingError, match="opd1_addr"):
        encode_descriptor(dataclasses.replace(fp, opd1_addr=-1))


@pytest.mark.parametrize("instr, field", [
    (conv(res_op_x_str=16), "res_op_x_str"),
    (conv(opd0_up_pad=-1), "opd0_up_pad"),
    (conv(cmd_id_dep=1 << 23), "cmd_id_dep"),
    (conv(res0_c=1 << 16), "res0_c"),
    (mm2(opd1_addr=1 << 32), "opd1_addr"),
    (ar(short_res0_str=3, res0_w_str=1 << 31), "res0_w_str"),
    (tensor_dma(src_start_addr=1 << 45), "src_start_addr"),
    (tensor_dma(cmd_id_dep=1 << 21), "cmd_id_dep"),
    (tensor_dma(localmem_mask=1 << 64), "localmem_mask"),
    (GeneralDma(src_start_addr=0, dst_start_addr=0, src_cstride=-1), "src_cstride"),
    (SysDma(op="sys_wait", index=256), "index"),
    (SysTiu(op="nop", imm=1 << 64), "imm"),
])
def test_a_value_that_does_not_fit_names_the_kind_and_the_field(instr, field):
    with pytest.raises(EncodingError) as err:
        encode_descriptor(instr)
    assert type(instr).__name__ in str(err.value) and f"field {field} " in str(err.value)


# --------------------------------------------------------------------------- stream errors

def test_truncated_record_names_its_offset():
    blob = encode_descriptors([conv(), conv(short_res0_str=1)])
    with pytest.raises(BinaryFormatError, match=r"truncated CONV record at byte offset 64"):
        decode_descriptors(blob[:-1], Engine.TIU, "x.BD.0")
    with pytest.raises(BinaryFormatError, match=r"byte offset 64: 3 bytes left"):
        decode_descriptors(blob[:64] + b"\0\0\0", Engine.TIU)


def test_unknown_head_and_unmodelled_kinds_name_the_offset():
    good = encode_descriptor(SysTiu(op="nop"))
    bad = bytearray(16)
    bad[5] = 11 << 1  # tsk_typ (bits 41-44) = 11: no TIU register has it
    with pytest.raises(BinaryFormatError, match=r"x\.BD\.0: byte offset 16: unknown TIU descriptor head"):
        decode_descriptors(good + bytes(bad), Engine.TIU, "x.BD.0")
    bw = bytearray(encode_descriptor(conv(short_res0_str=1)))
    bw[5] |= 1 << 5  # tsk_eu_typ 0 -> 1: conv.bw, which tpuflow does not model
    with pytest.raises(BinaryFormatError, match=r"byte offset 0: conv\.bw \(CONV_BW\) is not an instruction tpuflow models"):
        decode_descriptors(bytes(bw), Engine.TIU)
    gdma = bytearray(encode_descriptor(tensor_dma()))
    gdma[4] = 31  # cmd_type 31
    with pytest.raises(BinaryFormatError, match="byte offset 0: unknown GDMA descriptor head"):
        decode_descriptors(bytes(gdma), Engine.GDMA)


def test_bits_tpuflow_never_writes_are_rejected():
    blob = bytearray(encode_descriptor(conv(short_res0_str=1)))
    blob[123] = 0x80  # top bit of res1_addr: ConvTiu has no res1 (its opd3_addr is the padding value)
    with pytest.raises(BinaryFormatError, match="byte offset 0: CONV field res1_addr"):
        decode_descriptors(bytes(blob), Engine.TIU)


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=1, max_size=300), st.sampled_from([Engine.TIU, Engine.GDMA]))
def test_garbage_gives_a_clean_error_or_instructions(data, engine):
    try:
        instrs = decode_descriptors(data, engine)
    except BinaryFormatError as exc:
        assert "byte offset" in str(exc)
    else:  # whatever decodes is a legal instruction list that round-trips
        assert instrs and decode_descriptors(encode_descriptors(instrs), engine) == instrs


# -------------------------------------------------------------------------------- bitfields

def test_layout_logical_fields_constants_and_ranges():
    layout = Layout("demo", [("op", 4, 0b1010), ("a_lo", 3), ("s", 5), ("a_hi", 2), ("pad", 2)],
                    logical={"a": ("a_lo", "a_hi")}, signed=lambda n: n == "s")
    assert layout.nbytes == 2 and set(layout.fields) == {"a", "s", "pad"}
    raw = layout.pack_int({"a": 0b10110, "s": -2})
    assert raw & 0xF == 0b1010 and (raw >> 4) & 7 == 0b110 and (raw >> 12) & 3 == 0b10
    assert (raw >> 7) & 0x1F == 0b11110
    assert layout.unpack_int(raw) == {"a": 0b10110, "s": -2, "pad": 0}
    with pytest.raises(FieldRangeError, match="field a = 32 does not fit its 5-bit unsigned"):
        layout.pack_int({"a": 32})
    with pytest.raises(FieldRangeError, match="field s = 16"):
        layout.pack_int({"s": 16})
    with pytest.raises(ConstantMismatch, match="op"):
        layout.unpack_int(raw ^ 1)
    with pytest.raises(ValueError, match="cover"):
        Layout("bad", [("x", 7)])


def test_every_tiu_kind_has_a_table_binding():
    assert set(TIU_KINDS) <= set(KIND_REGISTERS)
