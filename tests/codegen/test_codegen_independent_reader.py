"""An independent SG2260 reader parses the .BD/.GDMA bytes record by record and agrees field by field.

The reader uses only the JSON register table and ctypes: one LittleEndianStructure of c_uint64
bit-fields per register, generated from the field list (the packing note says this layout is
exactly the descriptor's), and head structures for the TIU/GDMA heads. It shares no code with
tpuflow.codegen.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import tempfile
from functools import lru_cache
from pathlib import Path

from codegen_strategies import descriptor_instruction, DESCRIPTOR_KINDS
from hypothesis import given, settings
from hypothesis import strategies as st

from tpuflow.chip import load_chip
from tpuflow.codegen import encode_descriptors, write_program
from tpuflow.isa import (ArTiu, CmpTiu, ConvTiu, CwBcTiu, Engine, GeneralDma, LinTiu, MatrixDma, Mm2Tiu, PordTiu,
                         SfuTiu, SysDma, SysTiu, TensorDma)
from tpuflow.program import Program

TABLE = json.loads((Path(__file__).resolve().parents[2] / "codegen" / "tables" / "sg2260_regs.json")
                   .read_text(encoding="utf-8"))
REGISTERS = {  # the brief's kind -> register mapping (long, short)
    ConvTiu: {"CONV", "sCONV"}, Mm2Tiu: {"MM2", "sMM2"}, ArTiu: {"AR", "sAR"}, PordTiu: {"PorD", "sPorD"},
    SfuTiu: {"SFU", "sSFU"}, LinTiu: {"LIN", "sLIN"}, CmpTiu: {"CMP", "sCMP"}, CwBcTiu: {"CW&BC", "sCW&sBC"},
    SysTiu: {"SYS"}, TensorDma: {"DMA_tensor（0x000）"}, MatrixDma: {"DMA_matrix"}, GeneralDma: {"DMA_general"},
    SysDma: {"sDMA_sys"},
}
SPLIT = {"src_start_addr": ("src_start_addr_l32", "src_start_addr_h13", 32),
         "dst_start_addr": ("dst_start_addr_l32", "dst_start_addr_h13", 32),
         "localmem_mask": ("localmem_mask_l32", "localmem_mask_h32", 32)}
RENAMED = {"src_cstride": "src_cstride(move length)"}


class TiuHead(ctypes.LittleEndianStructure):
    _fields_ = [("cmd_short", ctypes.c_uint64, 1), ("_a", ctypes.c_uint64, 40), ("tsk_typ", ctypes.c_uint64, 4),
                ("tsk_eu_typ", ctypes.c_uint64, 5), ("_b", ctypes.c_uint64, 14)]


class GdmaHead(ctypes.LittleEndianStructure):
    _fields_ = [("_a", ctypes.c_uint64, 3), ("cmd_short", ctypes.c_uint64, 1), ("_b", ctypes.c_uint64, 28),
                ("cmd_type", ctypes.c_uint64, 5), ("cmd_sp_func", ctypes.c_uint64, 3), ("_c", ctypes.c_uint64, 24)]


@lru_cache(maxsize=None)
def structure(register: str):
    """(ctypes Structure class, [(attribute, table field name, width)]) of a register."""
    spec = TABLE["registers"][register]
    attrs = [(f"f{i}", name, width) for i, (name, width) in enumerate(spec["fields"])]
    cls = type(f"Reg{abs(hash(register))}", (ctypes.LittleEndianStructure,),
               {"_fields_": [(a, ctypes.c_uint64, w) for a, _, w in attrs]})
    assert ctypes.sizeof(cls) * 8 == spec["length_bits"], register
    return cls, attrs


def _entry(engine: Engine, head: bytes) -> dict:
    if engine is Engine.TIU:
        h = TiuHead.from_buffer_copy(head)
        rows = [e for e in TABLE["tiu_ops"] if e["tsk_typ"] == h.tsk_typ and e["cmd_short"] == h.cmd_short
                and e["tsk_eu_typ"] == h.tsk_eu_typ & ((1 << _width(e["reg"], "tsk_eu_typ")) - 1)]
    else:
        h = GdmaHead.from_buffer_copy(head)
        rows = [e for e in TABLE["dma_ops"] if (e["cmd_short"], e["cmd_type"], e["cmd_sp_func"])
                == (h.cmd_short, h.cmd_type, h.cmd_sp_func)]
    assert len(rows) == 1, rows
    return rows[0]


def _width(register: str, name: str) -> int:
    return next(w for n, w in TABLE["registers"][register]["fields"] if n == name)


def read_records(data: bytes, engine: Engine) -> list[tuple[dict, list[tuple[str, int]]]]:
    """[(op-table entry, [(field name, value), ...])] of every record."""
    out, pos = [], 0
    while pos < len(data):
        entry = _entry(engine, data[pos:pos + 8])
        cls, attrs = structure(entry["reg"])
        size = ctypes.sizeof(cls)
        record = cls.from_buffer_copy(data[pos:pos + size])
        out.append((entry, [(name, getattr(record, a)) for a, name, _ in attrs]))
        pos += size
    assert pos == len(data)
    return out


def _expected_bits(value: int, width: int) -> int:
    assert -(1 << width) < value < 1 << width
    return value & ((1 << width) - 1)


def check_agrees(instr, entry: dict, fields: list[tuple[str, int]]) -> None:
    cls = type(instr)
    reg = entry["reg"]
    assert reg in REGISTERS[cls]
    got = dict(fields)
    widths = dict(TABLE["registers"][reg]["fields"])
    tiu = cls.ENGINE is Engine.TIU
    op_field = "tsk_eu_typ" if tiu else "cmd_special_function"
    assert got[op_field] == cls.OPS[instr.op]
    assert got["tsk_typ" if tiu else "cmd_type"] == (cls.TSK_TYP if tiu else cls.CMD_TYPE)
    explained = {op_field, "tsk_typ", "cmd_type", "cmd_short"}
    for f in dataclasses.fields(cls):
        value = getattr(instr, f.name)
        if f.name == "op":
            continue
        if f.name in SPLIT:
            lo, hi, shift = SPLIT[f.name]
            assert got[lo] | got[hi] << shift == value, f.name
            explained |= {lo, hi}
            continue
        name = RENAMED.get(f.name, f.name) if RENAMED.get(f.name) in got else f.name
        if name in got:
            assert got[name] == _expected_bits(value, widths[name]), f.name
            explained.add(name)
        else:
            assert reg.startswith("s"), f"{f.name} missing from long form {reg}"
    for name, value in fields:
        if name not in explained and not (reg == "SYS" and name == "rsvd0"):
            assert value == 0, f"{reg}.{name} = {value} is not a field of {cls.__name__}"


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from(DESCRIPTOR_KINDS).flatmap(descriptor_instruction), min_size=1, max_size=20))
def test_independent_reader_agrees_with_every_record(instrs):
    for engine in (Engine.TIU, Engine.GDMA):
        queue = [i for i in instrs if i.ENGINE is engine]
        records = read_records(encode_descriptors(queue), engine)
        assert len(records) == len(queue)
        for instr, (entry, fields) in zip(queue, records):
            check_agrees(instr, entry, fields)


@settings(max_examples=10, deadline=None)
@given(st.lists(st.sampled_from(DESCRIPTOR_KINDS).flatmap(descriptor_instruction), min_size=1, max_size=20))
def test_independent_reader_parses_written_files(instrs):
    program = Program(chip=load_chip("sg2260"), tiu=[i for i in instrs if i.ENGINE is Engine.TIU],
                      gdma=[i for i in instrs if i.ENGINE is Engine.GDMA])
    with tempfile.TemporaryDirectory() as d:
        out = write_program(program, d, name="net")
        for engine, suffix in ((Engine.TIU, "BD"), (Engine.GDMA, "GDMA")):
            records = read_records((out / f"net.{suffix}.0").read_bytes(), engine)
            queue = program.queue(engine)
            assert len(records) == len(queue)
            for instr, (entry, fields) in zip(queue, records):
                check_agrees(instr, entry, fields)


def test_the_reader_notices_a_single_flipped_bit():
    conv = ConvTiu(res0_addr=0, res0_n=1, res0_c=64, res0_h=56, res0_w=56, opd0_addr=0x4000, opd0_c=3, opd0_h=230,
                   opd0_w=230, opd1_addr=0x8000, opd1_h=7, opd1_w=7, short_res0_str=1)  # long CONV
    blob = bytearray(encode_descriptors([conv]))
    (entry, fields), = read_records(bytes(blob), Engine.TIU)
    check_agrees(conv, entry, fields)
    offset = 0
    for name, width in TABLE["registers"]["CONV"]["fields"]:
        if name == "res0_c":
            break
        offset += width
    blob[offset // 8] ^= 1 << (offset % 8)
    (entry, fields), = read_records(bytes(blob), Engine.TIU)
    try:
        check_agrees(conv, entry, fields)
    except AssertionError as exc:
        assert "res0_c" in str(exc)
    else:
        raise AssertionError("a flipped res0_c bit went unnoticed")
