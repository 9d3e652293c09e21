"""`tpuflow disasm`: one text line per instruction of the TIU, GDMA and TILE streams.

Line format: engine letter + cmd_id (B = TIU as in .BD files, D = GDMA, T = TILE), the
dependency (`dep=D7`: waits for GDMA command 7; `dep=B3` for GDMA), the op name, then operands
and flags. TIU operands: `res0=(n,c,h,w)@L<lane>:0x<per-lane offset>`, then `:<dtype>` when
not fp32 and `:compact` / `:str(n,c,h,w)` when not EU-aligned; a constant operand is `#value`.
GDMA endpoints: DDR as `0x<address>`, LMEM as `L<lane>:0x<offset>`, tensors with their element
strides. SFU Taylor coefficients, read by every lane, print as `coef[n]=L*:0x<offset>`.
SYS waits on the TILE engine (TILE_WAIT_TAG) print as `wait T<k>`; cross-core messages as
`msg=<id> cnt=<count>`. A multi-core folder lists core by core under `# core <k>`. TILE blocks are
LinxISA assembly, e.g. `TMATMUL <M:64, N:32, K:64, FP32> T#2, U#1, ->ACC<8KB>`, with their
waits as `wait=B5,D9`. Any other field that differs from its default is printed as
`name=value`, so nothing in the bytes is hidden.
"""

from __future__ import annotations

import dataclasses
import re
import struct
from pathlib import Path
from typing import Iterator

from tpuflow.chip import ChipConfig, load_chip
from tpuflow.errors import InputFileError
from tpuflow.isa import (AccCvt, ArTiu, CmpTiu, ConvTiu, Engine, GeneralDma, Instruction, MatrixDma,
                         PordTiu, Prec, RqDqTiu, SfuTiu, SgTiu, StrideMode, SysTiu, TensorDma, TImg2Col, TMatmul, TMove, TPush,
                         is_lmem, lmem_address, ref_name)
from tpuflow.isa.gdma import ALL_LANES
from tpuflow.isa.tiu import SG_TABLE_PER_LANE
from tpuflow.isa.messages import GDMA_COUNT_SHIFT, TIU_COUNT_SHIFT
from tpuflow.isa.tile import QUEUES, size_text
from tpuflow.isa.tiu import RQ_ROUND_MODES
from tpuflow.program import ENGINES, Program

from tpuflow.codegen.writer import MANIFEST, decode_stream, read_manifest, read_program
from tpuflow.codegen.vendor import decode_vendor_stream, is_stream_dir, read_stream_dir_cores

SHAPE_FIELD = re.compile(r"^(res[01]|opd[0-3])_[nchw]$")
CAST_ROUNDING = {0: "rne", 1: "rna", 2: "rtz", 3: "floor", 4: "ceil"}
PREC_CODES = frozenset(int(p) for p in Prec)


def lmem_text(flat: int, chip: ChipConfig) -> str:
    lane, offset = divmod(flat, chip.lmem_bytes_per_lane)
    return f"L{lane}:0x{offset:04x}"


def global_text(addr: int, chip: ChipConfig) -> str:
    return lmem_text(lmem_address(addr, chip), chip) if is_lmem(addr, chip) else f"0x{addr:x}"


def const_text(bits: int, prec: Prec | None) -> str:
    if prec is not None and prec.is_float:
        return f"#{struct.unpack('<f', struct.pack('<I', bits & 0xFFFFFFFF))[0]:g}"
    return f"#{bits}"


def prec_of(code: int) -> Prec | None:
    """The Prec of a precision code (None for codes tpuflow does not use)."""
    return Prec(code) if code in PREC_CODES else None


def prec_suffix(code: int) -> str:
    """`:fp16` etc., nothing for fp32."""
    prec = prec_of(code)
    return "" if prec is Prec.FP32 else f":{prec.dtype_name}" if prec is not None else f":prec{code}"


def _tuple(values) -> str:
    return "(" + ",".join(str(v) for v in values) + ")"


class _Line:
    """Accumulates the parts of one line and the fields they cover."""

    def __init__(self, instr: Instruction):
        self.instr = instr
        self.parts: list[str] = []
        self.covered = {"op", "cmd_id_dep"}

    def add(self, text: str, *fields: str) -> None:
        self.parts.append(text)
        self.covered.update(fields)

    def flag(self, field: str, text: str) -> None:
        self.covered.add(field)
        if getattr(self.instr, field, 0):
            self.parts.append(text)

    def rest(self) -> None:
        """Every field not shown yet that differs from its default."""
        for f in dataclasses.fields(self.instr):  # type: ignore[arg-type]
            if f.name in self.covered or SHAPE_FIELD.match(f.name):
                continue
            value = getattr(self.instr, f.name)
            default = f.default
            if default is None:     # a field the instruction derives when left at None (ConvTiu's signs)
                default = getattr(dataclasses.replace(self.instr, **{f.name: None}), f.name)
            if default is dataclasses.MISSING or value != default:
                self.parts.append(f"{f.name}={value}")

    def text(self, head: str) -> str:
        self.rest()
        return " ".join([head, *self.parts])


# ------------------------------------------------------------------------------------- TIU

def _operand(line: _Line, prefix: str, shape, chip: ChipConfig, like: str | None = None) -> None:
    """`prefix=(shape)@L..:0x..[:dtype][:layout]`; `like` names the operand whose layout it shares."""
    instr, like = line.instr, like or prefix
    line.covered.update({f"{prefix}_addr", f"opt_{prefix}_const", f"opt_{like}_prec", f"short_{like}_str",
                         *(f"{like}_{d}_str" for d in "nchw")})
    code = getattr(instr, f"opt_{like}_prec", int(Prec.FP32))
    addr = getattr(instr, f"{prefix}_addr")
    if getattr(instr, f"opt_{prefix}_const", 0):
        line.parts.append(f"{prefix}={const_text(addr, prec_of(code))}")
        return
    text = f"{prefix}={_tuple(shape)}@{lmem_text(addr, chip)}" + prec_suffix(code)
    mode = getattr(instr, f"short_{like}_str", StrideMode.ALIGNED)
    if mode == StrideMode.COMPACT:
        text += ":compact"
    elif mode == StrideMode.FREE:
        text += ":str" + _tuple(getattr(instr, f"{like}_{d}_str", 0) for d in "nchw")
    elif isinstance(instr, SgTiu) and prefix == "opd0" and mode == SG_TABLE_PER_LANE:
        text += ":per_lane"                     # the table's channel stride is 0: one table in every lane
    elif mode != StrideMode.ALIGNED:
        text += f":mode{mode}"
    line.parts.append(text)


def _window(line: _Line) -> None:
    i = line.instr
    line.add(f"k=({i.opd1_h},{i.opd1_w})", "opd1_h", "opd1_w")
    pads = (i.opd0_up_pad, i.opd0_dn_pad, i.opd0_lf_pad, i.opd0_rt_pad)
    line.covered.update({"opd0_up_pad", "opd0_dn_pad", "opd0_lf_pad", "opd0_rt_pad", "res_op_x_str",
                         "res_op_y_str", "opd1_x_ins0", "opd1_y_ins0"})
    if any(pads):
        line.parts.append(f"pad={_tuple(pads)}")
    for name, (y, x) in (("str", (i.res_op_y_str, i.res_op_x_str)), ("dil", (i.opd1_y_ins0 + 1, i.opd1_x_ins0 + 1))):
        if (y, x) != (1, 1):
            line.parts.append(f"{name}={y}" if y == x else f"{name}=({y},{x})")


def _tiu_extras(line: _Line, chip: ChipConfig) -> None:
    i = line.instr
    if isinstance(i, (ConvTiu, PordTiu)):
        _window(line)
    if isinstance(i, CmpTiu):
        _operand(line, "opd3", i.res0_shape, chip, like="opd2")
    if isinstance(i, ArTiu) and i.op == "cast":
        rounding = CAST_ROUNDING.get(i.opd2_addr, i.opd2_addr) if i.opt_opd2_const else "?"
        line.add(f"round={rounding}", "opd2_addr", "opt_opd2_const")
    if isinstance(i, RqDqTiu):
        _rq_dq(line)
    if isinstance(i, SgTiu):
        line.covered.update({"opd0_w", "opd1_c", "opd1_w", "res0_h", "opd0_h"})     # shown in the operand shapes
        if i.opt_opd2_const and i.opt_opd3_const:
            line.add(f"fill={i.opd2_addr}", "opd2_addr", "opt_opd2_const", "opt_opd3_const")
    if isinstance(i, SfuTiu) and i.op in ("taylor", "taylor_4x"):
        line.add(f"coef[{i.opd1_n}]=L*:0x{i.opd1_addr % chip.lmem_bytes_per_lane:04x}", "opd1_addr", "opd1_n")
    if isinstance(i, SfuTiu) and i.op == "normalize":
        line.add(f"res1={_tuple(i.res0_shape)}@{lmem_text(i.res1_addr, chip)}", "res1_addr")
    if i.is_tile_wait:
        line.add(f"wait T{i.imm}", "imm", "reg_idx")
    _message(line, "imm")
    line.flag("opt_relu", "relu")
    line.flag("opt_res_add", "acc")


RQ_ROUNDING = {code: name for name, code in RQ_ROUND_MODES.items()}


def _rq_dq(line: _Line) -> None:
    """RQ/DQ: the round mode, signs of input and result, constant parameters decoded (RqDqTiu's packing)."""
    i = line.instr
    line.add(f"round={RQ_ROUNDING.get(i.opd2_n_str, i.opd2_n_str)}", "opd2_n_str")
    line.covered.update({"opt_opd0_sign", "opt_opd2_sign"})     # integers are signed unless the line says so
    if not i.opt_opd0_sign and not Prec(i.opt_opd0_prec).is_float:
        line.parts.append("unsigned_in")
    if not i.opt_opd2_sign and not Prec(i.opt_res0_prec).is_float:
        line.parts.append("unsigned_out")
    if not i.opt_opd1_const:
        line.covered.add("opd2_addr")
        return
    a, b = i.opd1_addr & 0xFFFFFFFF, i.opd2_addr & 0xFFFFFFFF
    s32 = (lambda v: (v ^ 0x80000000) - 0x80000000)
    s8, s16 = (lambda v: ((v & 0xFF) ^ 0x80) - 0x80), (lambda v: ((v & 0xFFFF) ^ 0x8000) - 0x8000)
    f32 = (lambda v: const_text(v, Prec.FP32)[1:])
    text = {"rq1": f"mul={s32(a)} rshift={-s8(b)} zp={s16(b >> 8)}", "rq0": f"scale={f32(a)} offset={f32(b)}",
            "dq0": f"zp={s16(a)} scale={f32(b)}"}[i.op]
    line.add(text, "opd1_addr", "opd2_addr")


def _message(line: _Line, operand: str) -> None:
    """A SEND/WAIT's operand as msg=/cnt= (left raw when it has bits outside those two fields)."""
    message = line.instr.message()
    shift = TIU_COUNT_SHIFT if operand == "imm" else GDMA_COUNT_SHIFT
    if message is not None and getattr(line.instr, operand) == message.msg_id | message.count << shift:
        line.add(f"msg={message.msg_id} cnt={message.count}", operand)


def tiu_line(cmd_id: int, instr, chip: ChipConfig) -> str:
    line = _Line(instr)
    seen = set()
    if not isinstance(instr, SysTiu):
        for prefix, shape in instr.write_operands(chip) + instr.read_operands(chip):
            if prefix not in seen:
                seen.add(prefix)
                _operand(line, prefix, shape, chip)
    _tiu_extras(line, chip)
    return line.text(_head(Engine.TIU, cmd_id, instr))


# ------------------------------------------------------------------------------------ GDMA

def _endpoint(addr: int, shape, strides, chip: ChipConfig) -> str:
    return f"{_tuple(shape)}@{global_text(addr, chip)}:str{_tuple(strides)}"


def gdma_line(cmd_id: int, instr, chip: ChipConfig) -> str:
    line = _Line(instr)
    if isinstance(instr, TensorDma):
        line.covered.update(f"{side}_{d}{kind}" for side in ("src", "dst") for d in "nchw" for kind in ("size", "stride"))
        if instr.fill_constant_en:
            line.add(f"fill=0x{instr.constant_value:x}", "fill_constant_en", "constant_value", "src_start_addr")
        else:
            line.add("src=" + _endpoint(instr.src_start_addr, instr.src_shape, instr.src_strides, chip), "src_start_addr")
        line.add("dst=" + _endpoint(instr.dst_start_addr, instr.dst_shape, instr.dst_strides, chip), "dst_start_addr")
        line.covered.add("localmem_mask")
        if instr.localmem_mask != ALL_LANES:
            line.parts.append(f"mask=0x{instr.localmem_mask:x}")
    elif isinstance(instr, MatrixDma):
        line.add(f"src={global_text(instr.src_start_addr, chip)} dst={global_text(instr.dst_start_addr, chip)} "
                 f"rows={instr.src_hsize} cols={instr.src_wsize} row_str={instr.src_hstride} "
                 f"lmem_cstr={instr.dst_cstride}",
                 "src_start_addr", "dst_start_addr", "src_hsize", "src_wsize", "src_hstride", "dst_cstride")
    elif isinstance(instr, GeneralDma):
        line.add(f"src={global_text(instr.src_start_addr, chip)} dst={global_text(instr.dst_start_addr, chip)} "
                 f"len={instr.src_cstride}", "src_start_addr", "dst_start_addr", "src_cstride")
        if instr.op == "broadcast":
            line.add(f"lanes={instr.dst_csize}", "dst_csize")
    elif instr.is_tile_wait:
        line.add(f"wait T{instr.constant_value}", "constant_value", "index")
    _message(line, "constant_value")
    line.covered.add("src_data_format")
    suffix = prec_suffix(getattr(instr, "src_data_format", int(Prec.FP32)))
    if suffix:
        line.parts.append(suffix[1:])
    return line.text(_head(Engine.GDMA, cmd_id, instr))


def _head(engine: Engine, cmd_id: int, instr) -> str:
    waits = instr.waits()                 # a TILE wait prints as an operand (`wait T<k>`)
    dep = "".join(f" dep={e.letter}{waits[e.code]}" for e in Engine if e is not Engine.TILE and waits[e.code])
    return f"{engine.letter}{cmd_id}{dep} {instr.op_name}"


# ------------------------------------------------------------------------------------ TILE

def tile_text(instr, chip: ChipConfig | None = None) -> str:
    """A CUBE block in LinxISA assembly syntax (without cmd_id and waits); a TMOVE (tpuflow extension)
    shows its dma.tensor descriptor as the GDMA listing would (needs `chip`)."""
    if isinstance(instr, TMove):
        return "TMOVE " + gdma_line(0, instr.desc, chip).split(" ", 2)[2]
    if isinstance(instr, TMatmul):
        srcs = [ref_name(instr.src0) + (".reuse" if instr.reuse0 else ""),
                ref_name(instr.src1) + (".reuse" if instr.reuse1 else "")]
        if instr.bias_src >= 0:
            srcs.append(ref_name(instr.bias_src))
        if instr.accumulates:
            srcs.append("ACC")
        acc = f"ACC{instr.acc}" if instr.acc else "ACC"
        srcs = [acc if s == "ACC" else s for s in srcs]
        return (f"{instr.fn} <M:{instr.m}, N:{instr.n}, K:{instr.k}, {instr.dt}> {', '.join(srcs)}, "
                f"->{acc}<{size_text(instr.acc_size)}>")
    if isinstance(instr, AccCvt):
        name = "ACCCVT.canon" if instr.canon else "ACCCVT"
        text = (f"{name} {instr.layout} <Row:{instr.row}, Col:{instr.col}, {instr.src_dt}, {instr.dst_dt}> "
                f"{f'ACC{instr.acc}' if instr.acc else 'ACC'}, "
                f"->{QUEUES[instr.dst_queue]}<{size_text(instr.dst_size)}>")
        if instr.round_mode != "RNE":
            text += f" round={instr.round_mode}"
        return text + (" sat" if instr.saturate else "") + (" relu" if instr.relu else "")
    if isinstance(instr, TImg2Col):
        return (f"TIMG2COL <{instr.dt}> halo {instr.c1}x{instr.in_w}x{instr.in_h}@{instr.src_addr:#x} "
                f"k{instr.kh}x{instr.kw} s{instr.sy}x{instr.sx} d{instr.dy}x{instr.dx} out {instr.out_h}x{instr.out_w} "
                f"K[{instr.k_start}+{instr.k_count}] ->{instr.tiles}@{instr.dst_addr:#x}")
    if isinstance(instr, TPush):
        count = f" x{instr.count}" if instr.count > 1 else ""
        return f"TPUSH <{instr.dt}> ->{QUEUES[instr.dst_queue]}<{size_text(instr.dst_size)}>{count}"
    raise TypeError(f"{type(instr).__name__} is not a TILE instruction")


def tile_line(cmd_id: int, instr, chip: ChipConfig | None = None) -> str:
    waits = [f"B{instr.wait_tiu_id}"] * bool(instr.wait_tiu_id) + [f"D{instr.wait_gdma_id}"] * bool(instr.wait_gdma_id)
    return f"T{cmd_id} {tile_text(instr, chip)}" + (f" wait={','.join(waits)}" if waits else "")


def instruction_line(engine: Engine, cmd_id: int, instr, chip: ChipConfig) -> str:
    engine = Engine(engine)
    if engine is Engine.TIU:
        return tiu_line(cmd_id, instr, chip)
    if engine is Engine.GDMA:
        return gdma_line(cmd_id, instr, chip)
    return tile_line(cmd_id, instr, chip)


# --------------------------------------------------------------------------- files, programs

def program_lines(program: Program) -> Iterator[str]:
    """All three streams, with the layer name as a comment wherever it changes; core by core (under
    `# core <k>`) for a multi-core program."""
    if program.core_count == 1:
        yield from _core_lines(program)
        return
    for k in range(program.core_count):
        yield f"# core {k}"
        yield from _core_lines(program.core(k))


def _core_lines(program: Program) -> Iterator[str]:
    for engine in ENGINES:
        queue = program.queue(engine)
        yield f"# {engine.name}: {len(queue)} instructions"
        previous = None
        for index, instr in enumerate(queue):
            layer = program.layer_of(engine, index)
            if layer != previous:
                yield f"# layer {layer or '(none)'}"
                previous = layer
            yield instruction_line(engine, index + 1, instr, program.chip)


STREAM_FILE = re.compile(r"\.(" + "|".join(e.stream_suffix for e in Engine) + r")\.\d+$")


def _file_chip(path: Path, chip) -> ChipConfig:
    if chip is not None:
        return chip if isinstance(chip, ChipConfig) else load_chip(chip)
    if (path.parent / MANIFEST).is_file():
        return load_chip(read_manifest(path.parent)["chip"]["name"])
    return load_chip(None)


def file_lines(path: Path, chip=None) -> Iterator[str]:
    match = STREAM_FILE.search(path.name)
    if match is None:
        raise InputFileError(f"{path}: not a stream file (expected <name>.BD.<core>, <name>.GDMA.<core> or "
                             "<name>.TILE.<core>)")
    engine = next(e for e in Engine if e.stream_suffix == match.group(1))
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputFileError(f"{path}: cannot read ({exc.strerror})") from None
    resolved = _file_chip(path, chip)
    if engine is not Engine.TILE and not (path.parent / MANIFEST).is_file():  # a raw stream (tpu-mlir's too)
        stream = decode_vendor_stream(data, engine, str(path))
        yield f"# {engine.name}: {path.name}, {len(stream.instructions)} instructions"
        for index, (instr, reg) in enumerate(zip(stream.instructions, stream.registers)):
            yield f"{instruction_line(engine, index + 1, instr, resolved)}    ; {reg}"
        return
    instrs = decode_stream(engine, data, str(path))
    yield f"# {engine.name}: {path.name}, {len(instrs)} instructions"
    for index, instr in enumerate(instrs):
        yield instruction_line(engine, index + 1, instr, resolved)


def stream_dir_lines(path: Path, chip=None) -> Iterator[str]:
    """Listing of a folder of raw streams (no manifest): each record as the instruction it reads as,
    with the register it was read from (tpu-mlir's streams included, see codegen.vendor)."""
    program, per_core = read_stream_dir_cores(path, _file_chip(path / "x", chip))
    for k, streams in enumerate(per_core):
        if len(per_core) > 1:
            yield f"# core {k}"
        yield from _raw_stream_lines(streams, program.chip)


def _raw_stream_lines(streams, chip) -> Iterator[str]:
    for engine in (Engine.TIU, Engine.GDMA):
        stream = streams[engine]
        yield (f"# {engine.name}: {len(stream.instructions)} records, {stream.consumed_bytes} bytes + "
               f"{stream.padding_bytes} bytes of zero padding; " +
               ", ".join(f"{reg} {n}" for reg, n in sorted(stream.register_counts().items())))
        for index, (instr, reg) in enumerate(zip(stream.instructions, stream.registers)):
            yield f"{instruction_line(engine, index + 1, instr, chip)}    ; {reg}"


def path_lines(path: str | Path, chip=None) -> Iterator[str]:
    """Listing of an output directory (all streams, layer comments) or of one stream file."""
    p = Path(path)
    if is_stream_dir(p):
        return stream_dir_lines(p, chip)
    if p.is_dir():
        return program_lines(read_program(p, chip))
    if not p.exists():
        raise InputFileError(f"{p}: no such file or directory")
    return file_lines(p, chip)
