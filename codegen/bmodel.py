"""tpu-mlir's .bmodel container read for its command buffers (the TIU / GDMA streams of each core).

Facts (tpu-mlir 1.30.2 wheel: python/debugger/bmodel_fbs.py, the generated reader of its bmodel
flatbuffer schema, and disassembler.py's file header): a .bmodel is a 64-byte header (little-endian
u32 magic 0xFF55AAEE, u32 header_size, u32 flatbuffers_size, u64 binary_size, 11 reserved u32),
then the flatbuffer `Model`, then the binary section that every `Binary {start: u64, size: u64}`
struct indexes. The tables read here, with their field slots:

  Model         chip 3 (string), net 4 ([Net])
  Net           name 0 (string), parameter 3 ([NetParameter], one per stage)
  NetParameter  cmd_group 8 ([CmdGroup]), sub_net 12 ([SubNet]), core_num 16 (u32)
  SubNet        cmd_group 1 ([CmdGroup]), id 10 (i32), core_commands 14 ([CoreCommands], one per core)
  CoreCommands  gdma_tiu_commands 0 ([CmdGroup])
  CmdGroup      bdc_num 0 (u32), gdma_num 1 (u32), binary_bdc 2 (Binary), binary_gdma 3 (Binary)

A subnet's command groups are its core_commands' gdma_tiu_commands (multi-core chips such as
BM1690) or, when it has none, its own cmd_group (single-core chips such as BM1684X). Only BM1690
command buffers are decoded (codegen.vendor reads bm1690 records); disasm lists other chips'
command groups (counts and sizes), and estimating them is a clean error.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

from tpuflow.errors import BinaryFormatError, InputFileError
from tpuflow.isa import Engine

MAGIC = 0xFF55AAEE
HEADER = struct.Struct("<IIIQ11I")     # magic, header_size, flatbuffers_size, binary_size, reserved
DECODED_CHIPS = ("BM1690",)
# field slots of the tables read (bmodel_fbs.py: vtable offset = 4 + 2 * slot)
MODEL_CHIP, MODEL_NET = 3, 4
NET_NAME, NET_PARAMETER = 0, 3
PARAM_CMD_GROUP, PARAM_SUB_NET, PARAM_CORE_NUM = 8, 12, 16
SUBNET_CMD_GROUP, SUBNET_ID, SUBNET_CORE_COMMANDS = 1, 10, 14
CORE_GDMA_TIU = 0
GROUP_BDC_NUM, GROUP_GDMA_NUM, GROUP_BINARY_BDC, GROUP_BINARY_GDMA = 0, 1, 2, 3


@dataclass(frozen=True)
class CommandBuffers:
    """One command group of one core: its raw TIU (bdc) and GDMA streams and their command counts."""

    net: str
    stage: int
    subnet: int
    core: int
    group: int
    bdc_num: int
    gdma_num: int
    tiu: bytes
    gdma: bytes

    @property
    def label(self) -> str:
        return f"net {self.net} stage {self.stage} subnet {self.subnet} core {self.core} group {self.group}"


@dataclass(frozen=True)
class Bmodel:
    path: Path
    chip: str
    core_num: int
    buffers: tuple[CommandBuffers, ...]


class _Table:
    """A flatbuffer table at `pos` of `buf` (the wire format: soffset to the vtable, u16 field offsets)."""

    def __init__(self, buf: bytes, pos: int):
        self.buf, self.pos = buf, pos
        vtable = pos - _i32(buf, pos)
        self.vtable, self.vtable_bytes = vtable, _u16(buf, vtable)

    def _field(self, slot: int) -> int:
        at = 4 + 2 * slot
        if at >= self.vtable_bytes:
            return 0
        off = _u16(self.buf, self.vtable + at)
        return self.pos + off if off else 0

    def uint(self, slot: int, fmt: str = "<I") -> int:
        at = self._field(slot)
        return struct.unpack_from(fmt, self.buf, at)[0] if at else 0

    def _indirect(self, at: int) -> int:
        return at + _u32(self.buf, at)

    def string(self, slot: int) -> str:
        at = self._field(slot)
        if not at:
            return ""
        start = self._indirect(at)
        return self.buf[start + 4:start + 4 + _u32(self.buf, start)].decode("utf-8", "replace")

    def tables(self, slot: int) -> list["_Table"]:
        at = self._field(slot)
        if not at:
            return []
        vec = self._indirect(at)
        return [_Table(self.buf, self._indirect(vec + 4 + 4 * j)) for j in range(_u32(self.buf, vec))]

    def binary(self, slot: int) -> tuple[int, int]:
        """(start, size) of an inline Binary struct field."""
        at = self._field(slot)
        return struct.unpack_from("<QQ", self.buf, at) if at else (0, 0)


def _u16(buf, at):
    return struct.unpack_from("<H", buf, at)[0]


def _u32(buf, at):
    return struct.unpack_from("<I", buf, at)[0]


def _i32(buf, at):
    return struct.unpack_from("<i", buf, at)[0]


def _slice(binary: bytes, start: int, size: int, where: str) -> bytes:
    if start + size > len(binary):
        raise BinaryFormatError(f"{where}: command buffer [{start}, {start + size}) lies past the "
                                f"{len(binary)}-byte binary section")
    return bytes(binary[start:start + size])


def _groups(sub: _Table) -> list[tuple[int, int, _Table]]:
    """(core, group index, CmdGroup) of a subnet."""
    cores = sub.tables(SUBNET_CORE_COMMANDS)
    if cores:
        return [(c, g, grp) for c, core in enumerate(cores) for g, grp in enumerate(core.tables(CORE_GDMA_TIU))]
    return [(0, g, grp) for g, grp in enumerate(sub.tables(SUBNET_CMD_GROUP))]


def _buffers(model: _Table, binary: bytes, where: str) -> list[CommandBuffers]:
    out = []
    for net in model.tables(MODEL_NET):
        name = net.string(NET_NAME)
        for stage, param in enumerate(net.tables(NET_PARAMETER)):
            for s, sub in enumerate(param.tables(PARAM_SUB_NET)):
                for core, g, grp in _groups(sub):
                    bdc, gdma = grp.binary(GROUP_BINARY_BDC), grp.binary(GROUP_BINARY_GDMA)
                    label = f"{where}: net {name} stage {stage} subnet {s} core {core} group {g}"
                    out.append(CommandBuffers(name, stage, s, core, g, grp.uint(GROUP_BDC_NUM),
                                              grp.uint(GROUP_GDMA_NUM), _slice(binary, *bdc, label + " binary_bdc"),
                                              _slice(binary, *gdma, label + " binary_gdma")))
    return out


def read_bmodel(path) -> Bmodel:
    """Every command group of every net, stage, subnet and core of a .bmodel."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputFileError(f"{path}: cannot read ({exc.strerror})") from None
    if len(data) < HEADER.size:
        raise BinaryFormatError(f"{path}: byte offset 0: {len(data)} bytes, shorter than the {HEADER.size}-byte "
                                "bmodel header")
    magic, header_size, fb_size, bin_size, *_ = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise BinaryFormatError(f"{path}: byte offset 0: magic {magic:#010x} is not a bmodel's ({MAGIC:#010x})")
    if header_size != HEADER.size or header_size + fb_size + bin_size > len(data):
        raise BinaryFormatError(f"{path}: byte offset 4: header ({header_size} B) + flatbuffer ({fb_size} B) + "
                                f"binary ({bin_size} B) do not fit the {len(data)}-byte file")
    flat = data[header_size:header_size + fb_size]
    binary = data[header_size + fb_size:header_size + fb_size + bin_size]
    try:
        model = _Table(flat, _u32(flat, 0))
        params = [p for net in model.tables(MODEL_NET) for p in net.tables(NET_PARAMETER)]
        core_num = max((p.uint(PARAM_CORE_NUM) for p in params), default=0)
        return Bmodel(path, model.string(MODEL_CHIP), max(core_num, 1), tuple(_buffers(model, binary, str(path))))
    except (struct.error, IndexError) as exc:
        raise BinaryFormatError(f"{path}: byte offset {header_size}: the flatbuffer is not a bmodel Model "
                                f"({exc})") from None


def is_bmodel(path) -> bool:
    p = Path(path)
    return p.suffix == ".bmodel" and p.is_file()


def decoded_buffers(bmodel: Bmodel) -> list[tuple[CommandBuffers, dict]]:
    """Each command group with its decoded streams {Engine: VendorStream}; the counts must equal bdc_num /
    gdma_num."""
    from tpuflow.codegen.vendor import decode_vendor_stream
    if bmodel.chip.upper() not in DECODED_CHIPS:
        raise InputFileError(f"{bmodel.path}: chip {bmodel.chip}: only {', '.join(DECODED_CHIPS)} command "
                             "buffers are read")
    out = []
    for buf in bmodel.buffers:
        streams = {engine: decode_vendor_stream(data, engine, f"{bmodel.path}: {buf.label} {name}")
                   for engine, data, name in ((Engine.TIU, buf.tiu, "binary_bdc"), (Engine.GDMA, buf.gdma, "binary_gdma"))}
        for engine, expected in ((Engine.TIU, buf.bdc_num), (Engine.GDMA, buf.gdma_num)):
            if len(streams[engine].instructions) != expected:
                raise BinaryFormatError(f"{bmodel.path}: {buf.label}: {len(streams[engine].instructions)} "
                                        f"{engine.name} commands decoded, the bmodel says {expected}")
        out.append((buf, streams))
    return out


def read_bmodel_program(path, chip):
    """The Program of a single-core, single-group .bmodel (estimate simulates one command group)."""
    from tpuflow.codegen.vendor import stream_program
    bmodel = read_bmodel(path)
    groups = decoded_buffers(bmodel)
    if len(groups) != 1:
        raise InputFileError(f"{path}: {len(groups)} command groups ({', '.join(b.label for b, _ in groups)}); "
                             "estimate simulates a bmodel with exactly one (disasm lists them all)")
    buf, streams = groups[0]
    return stream_program(buf.net, streams, chip), streams


def bmodel_lines(path, chip):
    """Listing of every command group of a .bmodel (each record with the register it was read from)."""
    from tpuflow.codegen.disasm import instruction_line
    bmodel = read_bmodel(path)
    yield f"# {Path(path).name}: chip {bmodel.chip}, {bmodel.core_num} core(s), {len(bmodel.buffers)} command group(s)"
    if bmodel.chip.upper() not in DECODED_CHIPS:  # the container only
        for buf in bmodel.buffers:
            yield (f"# {buf.label}: {buf.bdc_num} TIU commands ({len(buf.tiu)} bytes), {buf.gdma_num} GDMA commands "
                   f"({len(buf.gdma)} bytes); {bmodel.chip} records are not decoded")
        return
    for buf, streams in decoded_buffers(bmodel):
        for engine in (Engine.TIU, Engine.GDMA):
            stream = streams[engine]
            yield (f"# {buf.label} {engine.name}: {len(stream.instructions)} records, {stream.consumed_bytes} bytes + "
                   f"{stream.padding_bytes} bytes of zero padding")
            for index, (instr, reg) in enumerate(zip(stream.instructions, stream.registers)):
                yield f"{instruction_line(engine, index + 1, instr, chip)}    ; {reg}"
