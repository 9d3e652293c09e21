"""`tpuflow disasm`: listing format per engine, directory listings with layers, CLI errors."""

from __future__ import annotations

import re

from codegen_programs import gdma_lmem, lmem, sample_program
from codegen_strategies import any_descriptor_instruction, any_tile_instruction
from hypothesis import given, settings

from tpuflow.chip import load_chip
from tpuflow.cli import main
from tpuflow.codegen import encode_descriptor, instruction_line, write_program
from tpuflow.isa import (TILE_WAIT_TAG, AccCvt, ArTiu, ConvTiu, Engine, GeneralDma, Mm2Tiu, SysDma, SysTiu, TensorDma,
                         TMatmul, TPush, tile_ref)

CHIP = load_chip("sg2260")


def line(engine, cmd_id, instr):
    return instruction_line(engine, cmd_id, instr, CHIP)


def test_conv_line_matches_the_documented_format():
    conv = ConvTiu(cmd_id_dep=7, res0_addr=lmem(CHIP, 0, 0), res0_n=1, res0_c=64, res0_h=56, res0_w=56,
                   opd0_addr=lmem(CHIP, 3, 0x4000), opd0_c=3, opd0_h=230, opd0_w=230,
                   opd1_addr=lmem(CHIP, 0, 0x8000), opd1_h=7, opd1_w=7, opd0_up_pad=3, opd0_dn_pad=3,
                   opd0_lf_pad=3, opd0_rt_pad=3, res_op_x_str=2, res_op_y_str=2)
    assert line(Engine.TIU, 12, conv) == (
        "B12 dep=D7 conv.normal res0=(1,64,56,56)@L0:0x0000 opd0=(1,3,230,230)@L3:0x4000 "
        "opd1=(1,64,1,147)@L0:0x8000:compact opd2=#0 k=(7,7) pad=(3,3,3,3) str=2")


def test_tiu_operands_show_dtype_strides_constants_and_flags():
    add = ArTiu(op="add", res0_addr=lmem(CHIP, 2, 0x40), res0_n=1, res0_c=4, res0_h=1, res0_w=8,
                opd0_addr=lmem(CHIP, 2, 0x100), opd1_addr=0x3F800000, opt_opd1_const=1, opt_res0_prec=5,
                opt_opd0_prec=5, short_opd0_str=3, opd0_n_str=8, opd0_c_str=8, opd0_h_str=0, opd0_w_str=-1)
    assert line(Engine.TIU, 3, add) == ("B3 arith.add res0=(1,4,1,8)@L2:0x0040:bf16 "
                                        "opd0=(1,4,1,8)@L2:0x0100:bf16:str(8,8,0,-1) opd1=#1")
    shift = ArTiu(op="arith_shift", res0_addr=0, res0_n=1, res0_c=1, res0_h=1, res0_w=1, opd0_addr=0,
                  opd1_addr=-3, opt_opd1_const=1, opt_res0_prec=4, opt_opd0_prec=4, opt_opd1_prec=4)
    assert line(Engine.TIU, 1, shift).endswith("opd1=#-3")
    mm = Mm2Tiu(op="nt", res0_addr=0, res0_c=16, res0_w=32, opd0_addr=64, opd0_c=16, opd0_w=8, opd1_addr=128,
                opd1_c=32, opd1_w=8, opt_relu=1, opt_res_add=1)
    assert line(Engine.TIU, 2, mm) == ("B2 mm2.nt res0=(1,16,1,32)@L0:0x0000 opd0=(1,16,1,8)@L0:0x0040 "
                                       "opd1=(1,32,1,8)@L0:0x0080 relu acc")


def test_sys_waits_on_tile_and_other_fields_are_shown():
    assert line(Engine.TIU, 9, SysTiu(op="wait_msg", reg_idx=TILE_WAIT_TAG, imm=3)) == "B9 system.wait_msg wait T3"
    assert line(Engine.TIU, 9, SysTiu(op="send_msg", imm=5)) == "B9 system.send_msg msg=5 cnt=0"
    assert line(Engine.TIU, 9, SysTiu(op="send_msg", imm=1 << 30)) == f"B9 system.send_msg imm={1 << 30}"
    assert line(Engine.GDMA, 2, SysDma.wait(7, 4)) == "D2 dma.sys.sys_wait msg=7 cnt=4"
    assert line(Engine.GDMA, 4, SysDma(op="sys_wait", index=TILE_WAIT_TAG, constant_value=2, cmd_id_dep=3)) == \
        "D4 dep=B3 dma.sys.sys_wait wait T2"


def test_gdma_lines_show_ddr_and_lmem_addresses():
    load = TensorDma(cmd_id_dep=5, src_start_addr=0x1000, dst_start_addr=gdma_lmem(CHIP, 3, 0x4000),
                     src_nsize=1, src_csize=2, src_hsize=3, src_wsize=4, src_nstride=24, src_cstride=12,
                     src_hstride=4, src_wstride=1, dst_nsize=1, dst_csize=2, dst_hsize=3, dst_wsize=4,
                     dst_nstride=16, dst_cstride=16, dst_hstride=4, dst_wstride=1, src_data_format=1,
                     localmem_mask=0xF)
    assert line(Engine.GDMA, 7, load) == ("D7 dep=B5 dma.tensor src=(1,2,3,4)@0x1000:str(24,12,4,1) "
                                          "dst=(1,2,3,4)@L3:0x4000:str(16,16,4,1) mask=0xf fp16")
    bc = GeneralDma(op="broadcast", src_start_addr=0x2000, dst_start_addr=gdma_lmem(CHIP, 1, 0x20),
                    src_cstride=64, dst_csize=8)
    assert line(Engine.GDMA, 1, bc) == "D1 dma.general.broadcast src=0x2000 dst=L1:0x0020 len=64 lanes=8"


def test_tile_lines_are_linxisa_assembly():
    mm = TMatmul(fn="TMATMUL", dt="FP32", m=64, n=32, k=64, src0=tile_ref("T", 2), src1=tile_ref("U", 1),
                 acc_size=9)
    assert line(Engine.TILE, 3, mm) == "T3 TMATMUL <M:64, N:32, K:64, FP32> T#2, U#1, ->ACC<8KB>"
    acc = TMatmul(fn="TMATMUL.ACC", dt="FP16", m=64, n=32, k=64, src0=tile_ref("T", 1), src1=tile_ref("T", 2),
                  acc_size=9, reuse1=1, wait_tiu_id=5, wait_gdma_id=9)
    assert line(Engine.TILE, 4, acc) == ("T4 TMATMUL.ACC <M:64, N:32, K:64, FP16> T#1, T#2.reuse, ACC, ->ACC<8KB> "
                                         "wait=B5,D9")
    cvt = AccCvt(layout="NZ2ND", row=64, col=32, dst_queue=2, dst_size=9)
    assert line(Engine.TILE, 5, cvt) == "T5 ACCCVT NZ2ND <Row:64, Col:32, FP32, FP32> ACC, ->M<8KB>"
    push = TPush(dst_queue=1, dst_size=8, wait_gdma_id=2)
    assert line(Engine.TILE, 1, push) == "T1 TPUSH <FP32> ->U<4KB> wait=D2"


@settings(max_examples=200, deadline=None)
@given(any_descriptor_instruction())
def test_every_descriptor_kind_disassembles(instr):
    text = line(instr.ENGINE, 1, instr)
    assert re.match(rf"[BD]1( dep=[BD]\d+)? {re.escape(instr.op_name)}( |$)", text)


@settings(max_examples=100, deadline=None)
@given(any_tile_instruction())
def test_every_tile_kind_disassembles(instr):
    assert line(Engine.TILE, 2, instr).startswith(f"T2 {instr.op_name}")


# ------------------------------------------------------------------------------------- CLI

def test_cli_lists_a_directory_with_layer_comments(tmp_path, capsys):
    out = write_program(sample_program(), tmp_path, name="tiny")
    assert main(["disasm", str(out)]) == 0
    text = capsys.readouterr().out.splitlines()
    assert text[0] == "# TIU: 5 instructions" and text[1] == "# layer conv1"
    assert text[2].startswith("B1 dep=D2 conv.normal res0=(1,8,8,8)@L0:0x0000")
    assert "# layer pool1" in text and "B4 system.wait_msg wait T4" in text and "# layer (none)" in text
    assert "# GDMA: 5 instructions" in text and "# TILE: 4 instructions" in text
    assert "T3 TMATMUL <M:64, N:32, K:64, FP32> T#1, U#1, ->ACC<8KB>" in text
    assert sum(1 for t in text if not t.startswith("#")) == 14


def test_cli_lists_a_single_file(tmp_path, capsys):
    out = write_program(sample_program(), tmp_path, name="tiny")
    assert main(["disasm", str(out / "tiny.TILE.0")]) == 0
    text = capsys.readouterr().out.splitlines()
    assert text[0] == "# TILE: tiny.TILE.0, 4 instructions" and text[1] == "T1 TPUSH <FP32> ->T<8KB> wait=D1"


def test_cli_garbage_is_a_clean_error_with_the_offset(tmp_path, capsys):
    bad = tmp_path / "junk.BD.0"
    bad.write_bytes(encode_descriptor(SysTiu(op="nop")) + b"\xff" * 20)
    assert main(["disasm", str(bad)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert re.fullmatch(r"tpuflow: error: .*junk\.BD\.0: byte offset \d+: .*\n", captured.err)  # a raw file: read as tpu-mlir would
    other = tmp_path / "notes.txt"
    other.write_text("hi")
    assert main(["disasm", str(other)]) == 2
    assert "not a stream file" in capsys.readouterr().err
    assert main(["disasm", str(tmp_path / "missing")]) == 2
    assert "no such file" in capsys.readouterr().err
