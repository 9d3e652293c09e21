"""TILE stream: LinxISA v0.56 CUBE blocks as 32-bit little-endian words, word formats declared as data.

Word formats (lingxi.md "Encoding"; fields LSB-first, constants are the opcode bits):

* BSTART.CUBE Fn, DT — starts a block; a block ends where the next BSTART starts. tpuflow puts
  TMATMUL's / TGEMV's / ACCCVT's `acc` (which accumulator, tpuflow.isa.tile.TMatmul.acc) in bits 26..25
  (zero in v0.56); other blocks keep them 0.
* B.DIM 0, uimm, ->LBn — one per dimension: TMATMUL/TGEMV LB0=M, LB1=N, LB2=K; ACCCVT LB0=Row,
  LB1=Col; a missing LB is 1. RegSrc is always x0 (tpuflow dims are immediates) and
  uimm[16] is 0 because LBn keeps 16 bits, so a dimension above 65535 is an EncodingError.
* B.IOT — two-input (TMATMUL: Src0 = A, Src1 = B, DstQueue = 7 (the ACC is implicit),
  size = acc_size, S0/S1.reuse), one-input (the .BIAS bias tile, DstQueue 7, size 0) and
  no-input (ACCCVT and TPUSH: DstQueue = the pushed queue, size = its size code).
  `last` is set on a block's final B.IOT.
* B.DATR — ACCCVT's layout code, destination type, round mode and saturate. tpuflow puts
  `canon` in bit 15 (pad[0], spare in v0.56) and `relu` in bit 16 (pad[1]); the other pad bits and
  the compare mode are 0.
* B.IOD — one word per wait, omitted when the wait is 0. The published page lacks B.IOD's
  bits; tpuflow's layout keeps B.IOD's opcode (6..0 = 0010011, function 14..12 = 001) and
  uses: 8..7 = DepSrc engine (1 = TIU: tiu_sync_id >= id, 2 = GDMA: tdma_sync_id >= id),
  11..9 = id[19:17], 31..15 = id[16:0] (ids up to 2**20 - 1).

Block word order as encoded: BSTART, B.DIMs, B.IOTs, B.DATR, B.IODs. The decoder groups a
block's words by format, so B.DIM / B.DATR / B.IOD may come in any order (each B.DIM LB, the
B.DATR and each B.IOD DepSrc at most once); the B.IOTs must come in the order above.

TPUSH is BSTART.CUBE function 31 with a no-input B.IOT (see tpuflow.isa.tile) and, when it pushes
more than one slot, one B.DIM LB0 = count.

TMOVE (tpuflow extension, function 30; tpuflow.isa.tile) is BSTART.CUBE (dt = the move's data
type), B.DIM LB0 = the byte length L of its dma.tensor descriptor in the SG2260 layout
(codegen/sg2260.py, the form the GDMA stream would use), then ceil(L / 3) B.DESC words carrying
the descriptor bytes in order, three per word (the last one zero padded), then its B.IODs.
B.DESC is tpuflow's word: opcode 6..0 = 0001011 (RISC-V custom-0, unused by the CUBE formats),
bit 7 = 0, bits 31..8 = three descriptor bytes, the first in bits 15..8.

TIMG2COL (tpuflow extension, function 29; tpuflow.isa.tile.TImg2Col) is BSTART.CUBE (dt), B.DIM LB0 =
TImg2Col.PARAM_BYTES, then its parameters (TImg2Col.PARAMS: little-endian, in that order) in B.DESC
words as TMOVE's descriptor, then its B.IODs.
"""

from __future__ import annotations

from tpuflow.errors import BinaryFormatError, EncodingError
import struct

from tpuflow.isa import AccCvt, Engine, TensorDma, TileInstruction, TImg2Col, TMatmul, TMove, TPush
from tpuflow.isa.tile import DT_CODES, LAYOUT_CODES, NO_QUEUE, ROUND_MODES

from tpuflow.codegen.bitfields import ConstantMismatch, FieldRangeError, Layout

WORD_BYTES = 4
OPC_BSTART, OPC_BDIM, OPC_BIOX, OPC_BDATR, OPC_BDESC = 0b0000001, 0b1000011, 0b0010011, 0b0100011, 0b0001011
DESC_BYTES_PER_WORD = 3
FN_IOT2, FN_IOT1, FN_IOT0, FN_IOD, FN_IOR = 0b100, 0b101, 0b110, 0b001, 0b000
DEP_TIU, DEP_GDMA = 1, 2

BSTART_CUBE = Layout("BSTART.CUBE", [
    ("opcode", 7, OPC_BSTART), ("block_kind", 5, 0b00011), ("func", 3, 0b001), ("cube", 5, 0b00110),
    ("fn", 5), ("acc", 2), ("dt", 5)])
B_DIM = Layout("B.DIM", [
    ("opcode", 7, OPC_BDIM), ("uimm_hi", 4), ("uimm16", 1, 0), ("lb", 3), ("reg_src", 5, 0), ("uimm_lo", 12)],
    logical={"uimm": ("uimm_lo", "uimm_hi")})
_IOT_HEAD = [("opcode", 7, OPC_BIOX)]
B_IOT2 = Layout("B.IOT (two inputs)", _IOT_HEAD + [
    ("src0_lo", 5), ("func", 3, FN_IOT2), ("src0_hi", 1), ("src1", 6), ("dst_queue", 3), ("size", 4),
    ("last", 1), ("reuse0", 1), ("reuse1", 1)], logical={"src0": ("src0_lo", "src0_hi")})
B_IOT1 = Layout("B.IOT (one input)", _IOT_HEAD + [
    ("src0_lo", 5), ("func", 3, FN_IOT1), ("src0_hi", 1), ("src1", 6, 0), ("dst_queue", 3), ("size", 4),
    ("last", 1), ("reuse0", 1), ("reuse1", 1, 0)], logical={"src0": ("src0_lo", "src0_hi")})
B_IOT0 = Layout("B.IOT (no input)", _IOT_HEAD + [
    ("src0_lo", 5, 0), ("func", 3, FN_IOT0), ("src0_hi", 1, 0), ("src1", 6, 0), ("dst_queue", 3),
    ("size", 4), ("last", 1), ("reuse", 2, 0)])
B_DATR = Layout("B.DATR", [
    ("opcode", 7, OPC_BDATR), ("layout", 5), ("func", 3, 0b001), ("canon", 1), ("relu", 1), ("pad", 3, 0), ("dt", 5),
    ("compare_mode", 3, 0), ("round_mode", 3), ("saturate", 1)])
B_DESC = Layout("B.DESC", [("opcode", 7, OPC_BDESC), ("zero", 1, 0), ("data", 24)])
B_IOD = Layout("B.IOD", [
    ("opcode", 7, OPC_BIOX), ("dep_src", 2), ("id_hi", 3), ("func", 3, FN_IOD), ("id_lo", 17)],
    logical={"id": ("id_lo", "id_hi")})

FN_NAMES = {code: name for cls in (TMatmul, AccCvt, TPush, TMove, TImg2Col) for name, code in cls.FN.items()}
IMG2COL_FORMAT = "<" + "".join(code for _, code in TImg2Col.PARAMS)
DT_NAMES = {code: name for name, code in DT_CODES.items()}
LAYOUT_NAMES = {code: name for name, code in LAYOUT_CODES.items()}
ROUND_NAMES = {code: name for name, code in ROUND_MODES.items()}


def _word(fmt: Layout, kind: str, names: dict | None = None, **values) -> int:
    """One word; `names` maps format fields to the dataclass fields they carry (for errors)."""
    try:
        return fmt.pack_int(values)
    except FieldRangeError as exc:
        name = (names or {}).get(exc.field.name, exc.field.name)
        raise EncodingError(f"{kind}: field {name} = {exc.value} does not fit {fmt.name}'s "
                            f"{exc.field.describe()}") from None


def _dims(kind: str, dims: dict[str, int]) -> list[int]:
    return [_word(B_DIM, kind, {"uimm": name}, lb=lb, uimm=v) for lb, (name, v) in enumerate(dims.items())]


def _waits(kind: str, instr) -> list[int]:
    out = []
    for tag, value, name in ((DEP_TIU, instr.wait_tiu_id, "wait_tiu_id"), (DEP_GDMA, instr.wait_gdma_id, "wait_gdma_id")):
        if value:
            try:
                out.append(B_IOD.pack_int({"dep_src": tag, "id": value}))
            except FieldRangeError:
                raise EncodingError(f"{kind}: field {name} = {value} does not fit B.IOD's "
                                    f"{B_IOD.fields['id'].describe()}") from None
    return out


def block_words(instr: TileInstruction) -> list[int]:
    """The 32-bit words of one CUBE block."""
    kind = type(instr).__name__
    if isinstance(instr, TMatmul):
        head = [_word(BSTART_CUBE, kind, fn=instr.FN[instr.fn], dt=DT_CODES[instr.dt], acc=instr.acc)] + _dims(
            kind, {"m": instr.m, "n": instr.n, "k": instr.k})
        bias = instr.bias_src >= 0
        iots = [_word(B_IOT2, kind, {"size": "acc_size"}, src0=instr.src0, src1=instr.src1, dst_queue=NO_QUEUE, size=instr.acc_size,
                      reuse0=instr.reuse0, reuse1=instr.reuse1, last=int(not bias))]
        if bias:
            iots.append(_word(B_IOT1, kind, {"src0": "bias_src"}, src0=instr.bias_src, dst_queue=NO_QUEUE, last=1))
        return head + iots + _waits(kind, instr)
    if isinstance(instr, AccCvt):
        return ([_word(BSTART_CUBE, kind, fn=instr.FN["ACCCVT"], dt=DT_CODES[instr.src_dt], acc=instr.acc)]
                + _dims(kind, {"row": instr.row, "col": instr.col})
                + [_word(B_IOT0, kind, {"size": "dst_size"}, dst_queue=instr.dst_queue, size=instr.dst_size, last=1),
                   _word(B_DATR, kind, layout=LAYOUT_CODES[instr.layout], dt=DT_CODES[instr.dst_dt],
                         round_mode=ROUND_MODES[instr.round_mode], saturate=instr.saturate, canon=instr.canon,
                         relu=instr.relu)]
                + _waits(kind, instr))
    if isinstance(instr, TPush):       # count > 1: B.DIM LB0 = count (tpuflow's TPUSH extension)
        return ([_word(BSTART_CUBE, kind, fn=instr.FN["TPUSH"], dt=DT_CODES[instr.dt], acc=0)]
                + (_dims(kind, {"count": instr.count}) if instr.count > 1 else [])
                + [_word(B_IOT0, kind, {"size": "dst_size"}, dst_queue=instr.dst_queue, size=instr.dst_size, last=1)]
                + _waits(kind, instr))
    if isinstance(instr, TMove):
        return [_word(BSTART_CUBE, kind, fn=instr.FN["TMOVE"], dt=DT_CODES[instr.dt], acc=0)] + _desc_words(kind, instr.desc) \
            + _waits(kind, instr)
    if isinstance(instr, TImg2Col):
        return [_word(BSTART_CUBE, kind, fn=instr.FN["TIMG2COL"], dt=DT_CODES[instr.dt], acc=0)] + _param_words(kind, instr) \
            + _waits(kind, instr)
    raise EncodingError(f"{kind} is not a TILE instruction")


def _desc_words(kind: str, desc: TensorDma) -> list[int]:
    """B.DIM LB0 = descriptor bytes, then the bytes three per B.DESC word."""
    from tpuflow.codegen.sg2260 import encode_descriptor
    return _bytes_words(kind, encode_descriptor(desc))


def _param_words(kind: str, instr: TImg2Col) -> list[int]:
    """B.DIM LB0 = parameter bytes, then the parameters three bytes per B.DESC word."""
    try:
        raw = struct.pack(IMG2COL_FORMAT, *(getattr(instr, name) for name, _ in TImg2Col.PARAMS))
    except struct.error:
        bad = next(name for name, code in TImg2Col.PARAMS if not _fits(code, getattr(instr, name)))
        raise EncodingError(f"{kind}: field {bad} = {getattr(instr, bad)} does not fit its "
                            f"{struct.calcsize(dict(TImg2Col.PARAMS)[bad]) * 8}-bit parameter") from None
    return _bytes_words(kind, raw)


def _fits(code: str, value: int) -> bool:
    return 0 <= value < 1 << (8 * struct.calcsize(code))


def _bytes_words(kind: str, raw: bytes) -> list[int]:
    padded = raw + bytes(-len(raw) % DESC_BYTES_PER_WORD)
    return _dims(kind, {"descriptor bytes": len(raw)}) + [
        B_DESC.pack_int({"data": int.from_bytes(padded[i:i + DESC_BYTES_PER_WORD], "little")})
        for i in range(0, len(padded), DESC_BYTES_PER_WORD)]


def encode_block(instr: TileInstruction) -> bytes:
    return b"".join(w.to_bytes(WORD_BYTES, "little") for w in block_words(instr))


def encode_blocks(instrs) -> bytes:
    return b"".join(encode_block(i) for i in instrs)


# ---------------------------------------------------------------------------------- decoding

def word_layout(word: int) -> Layout | None:
    """The format of a word by its opcode bits and function (None: not a format tpuflow reads)."""
    opcode, func = word & 0x7F, (word >> 12) & 0x7
    if opcode == OPC_BSTART:
        return BSTART_CUBE
    if opcode == OPC_BDIM:
        return B_DIM
    if opcode == OPC_BDATR:
        return B_DATR
    if opcode == OPC_BDESC:
        return B_DESC
    if opcode == OPC_BIOX:
        return {FN_IOT2: B_IOT2, FN_IOT1: B_IOT1, FN_IOT0: B_IOT0, FN_IOD: B_IOD}.get(func)
    return None


class _Block:
    """The words of one block, grouped by format, with byte offsets for errors."""

    def __init__(self, source: str, offset: int):
        self.source, self.offset = source, offset
        self.start: dict = {}
        self.dims: dict[int, int] = {}
        self.iots: list[tuple[Layout, dict]] = []
        self.datr: dict | None = None
        self.waits: dict[int, int] = {}
        self.desc = bytearray()

    def fail(self, offset: int, why: str) -> BinaryFormatError:
        return BinaryFormatError(f"{self.source}: byte offset {offset}: {why}")

    def add(self, layout: Layout, values: dict, offset: int) -> None:
        if layout is B_DIM:
            if values["lb"] in self.dims or values["lb"] > 2:
                raise self.fail(offset, f"B.DIM ->LB{values['lb']} repeated or out of LB0..LB2")
            self.dims[values["lb"]] = values["uimm"]
        elif layout is B_DATR:
            if self.datr is not None:
                raise self.fail(offset, "second B.DATR in one block")
            self.datr = values
        elif layout is B_DESC:
            self.desc += values["data"].to_bytes(DESC_BYTES_PER_WORD, "little")
        elif layout is B_IOD:
            if values["dep_src"] not in (DEP_TIU, DEP_GDMA) or values["dep_src"] in self.waits or not values["id"]:
                raise self.fail(offset, f"B.IOD with bad or repeated DepSrc {values['dep_src']} / id {values['id']}")
            self.waits[values["dep_src"]] = values["id"]
        else:
            self.iots.append((layout, values))

    def dim(self, lb: int) -> int:
        return self.dims.get(lb, 1)

    def wait_kwargs(self) -> dict:
        return {"wait_tiu_id": self.waits.get(DEP_TIU, 0), "wait_gdma_id": self.waits.get(DEP_GDMA, 0)}

    def expect_iots(self, *layouts: Layout) -> list[dict]:
        got = tuple(layout for layout, _ in self.iots)
        if got != layouts or any(v.get("last", 0) != (i == len(layouts) - 1) for i, (_, v) in enumerate(self.iots)):
            names = ", ".join(layout.name for layout in layouts)
            raise self.fail(self.offset, f"{FN_NAMES[self.start['fn']]} block needs B.IOT {names} (last bit on the final one)")
        return [v for _, v in self.iots]

    def dt(self, code: int) -> str:
        if code not in DT_NAMES:
            raise self.fail(self.offset, f"data type code {code} is not one tpuflow uses")
        return DT_NAMES[code]

    def build(self) -> TileInstruction:
        fn = FN_NAMES.get(self.start["fn"])
        if fn is None:
            raise self.fail(self.offset, f"BSTART.CUBE function {self.start['fn']} is not one tpuflow models")
        dt = self.dt(self.start["dt"])
        if self.start["acc"] and fn in ("TPUSH", "TMOVE", "TIMG2COL"):
            raise self.fail(self.offset, f"{fn} block has a nonzero BSTART.CUBE acc")
        try:
            return self._build(fn, dt)
        except ValueError as exc:
            raise self.fail(self.offset, f"{fn} block does not decode: {exc}") from None

    def _build(self, fn: str, dt: str) -> TileInstruction:
        if self.datr is not None and fn != "ACCCVT":
            raise self.fail(self.offset, f"{fn} block has a B.DATR")
        if self.desc and fn not in ("TMOVE", "TIMG2COL"):
            raise self.fail(self.offset, f"{fn} block has B.DESC words")
        if fn == "TMOVE":
            return _tmove_build(self, dt)
        if fn == "TIMG2COL":
            return _timg2col_build(self, dt)
        if fn == "TPUSH":
            if set(self.dims) - {0} or self.dims.get(0) == 1:
                raise self.fail(self.offset, "TPUSH block has B.DIM words other than LB0 = count > 1")
            (iot,) = self.expect_iots(B_IOT0)
            return TPush(dst_queue=iot["dst_queue"], dst_size=iot["size"], dt=dt, count=self.dims.get(0, 1),
                         **self.wait_kwargs())
        if fn == "ACCCVT":
            (iot,) = self.expect_iots(B_IOT0)
            if self.datr is None or 2 in self.dims:
                raise self.fail(self.offset, "ACCCVT block needs one B.DATR and only LB0/LB1")
            d = self.datr
            if d["layout"] not in LAYOUT_NAMES or d["round_mode"] not in ROUND_NAMES:
                raise self.fail(self.offset, f"ACCCVT layout {d['layout']} / round mode {d['round_mode']} unknown")
            return AccCvt(layout=LAYOUT_NAMES[d["layout"]], row=self.dim(0), col=self.dim(1),
                          dst_queue=iot["dst_queue"], dst_size=iot["size"], src_dt=dt, dst_dt=self.dt(d["dt"]),
                          canon=d["canon"], round_mode=ROUND_NAMES[d["round_mode"]], saturate=d["saturate"],
                          relu=d["relu"], acc=self.start["acc"], **self.wait_kwargs())
        bias = fn.endswith(".BIAS")
        iots = self.expect_iots(B_IOT2, B_IOT1) if bias else self.expect_iots(B_IOT2)
        if any(v["dst_queue"] != NO_QUEUE or (i and (v["size"] or v["reuse0"])) for i, v in enumerate(iots)):
            raise self.fail(self.offset, f"{fn} B.IOT must have DstQueue 7 (ACC); the bias B.IOT no size or reuse")
        a = iots[0]
        return TMatmul(fn=fn, dt=dt, m=self.dim(0), n=self.dim(1), k=self.dim(2), src0=a["src0"], src1=a["src1"],
                       acc_size=a["size"], bias_src=iots[1]["src0"] if bias else -1, reuse0=a["reuse0"],
                       reuse1=a["reuse1"], acc=self.start["acc"], **self.wait_kwargs())


def _tmove_build(block: "_Block", dt: str) -> TileInstruction:
    """A TMOVE block: B.DIM LB0 bytes of descriptor from its B.DESC words, one dma.tensor."""
    from tpuflow.codegen.sg2260 import decode_descriptors
    length = block.dims.get(0)
    if set(block.dims) != {0} or block.iots or length is None or -(-length // DESC_BYTES_PER_WORD) * DESC_BYTES_PER_WORD != len(block.desc):
        raise block.fail(block.offset, "TMOVE block needs B.DIM LB0 = descriptor bytes, that many bytes of B.DESC "
                                       "words and no B.IOT")
    if any(block.desc[length:]):
        raise block.fail(block.offset, "TMOVE descriptor padding is not zero")
    descs = decode_descriptors(bytes(block.desc[:length]), Engine.GDMA, f"{block.source}: TMOVE at byte offset {block.offset}")
    if len(descs) != 1 or not isinstance(descs[0], TensorDma):
        raise block.fail(block.offset, "TMOVE carries one dma.tensor descriptor")
    move = TMove(desc=descs[0], **block.wait_kwargs())
    if move.dt != dt:
        raise block.fail(block.offset, f"TMOVE dt {dt} does not match its descriptor's {move.dt}")
    return move



def _timg2col_build(block: "_Block", dt: str) -> TileInstruction:
    """A TIMG2COL block: B.DIM LB0 = TImg2Col.PARAM_BYTES, its parameters in B.DESC words."""
    length = block.dims.get(0)
    if (set(block.dims) != {0} or block.iots or length != TImg2Col.PARAM_BYTES
            or -(-length // DESC_BYTES_PER_WORD) * DESC_BYTES_PER_WORD != len(block.desc) or any(block.desc[length:])):
        raise block.fail(block.offset, f"TIMG2COL block needs B.DIM LB0 = {TImg2Col.PARAM_BYTES}, that many bytes of "
                                       "B.DESC words (zero padded) and no B.IOT")
    values = struct.unpack(IMG2COL_FORMAT, bytes(block.desc[:length]))
    return TImg2Col(dt=dt, **dict(zip((name for name, _ in TImg2Col.PARAMS), values)), **block.wait_kwargs())


def decode_blocks(data: bytes, source: str = "<bytes>") -> list[TileInstruction]:
    """Decode a TILE stream (a sequence of CUBE blocks)."""
    if len(data) % WORD_BYTES:
        raise BinaryFormatError(f"{source}: truncated word at byte offset {len(data) - len(data) % WORD_BYTES}: "
                                f"the stream is {len(data)} bytes, not a multiple of {WORD_BYTES}")
    out: list[TileInstruction] = []
    block: _Block | None = None
    for offset in range(0, len(data), WORD_BYTES):
        word = int.from_bytes(data[offset:offset + WORD_BYTES], "little")
        layout = word_layout(word)
        if layout is None:
            raise BinaryFormatError(f"{source}: byte offset {offset}: word {word:#010x} is not a CUBE block "
                                    "descriptor tpuflow reads (BSTART.CUBE, B.DIM, B.IOT, B.DATR, B.IOD)")
        try:
            values = layout.unpack_int(word)
        except ConstantMismatch as exc:
            raise BinaryFormatError(f"{source}: byte offset {offset}: {layout.name} word {word:#010x}: {exc}") from None
        if layout is BSTART_CUBE:
            if block is not None:
                out.append(block.build())
            block = _Block(source, offset)
            block.start = values
        elif block is None:
            raise BinaryFormatError(f"{source}: byte offset {offset}: {layout.name} before any BSTART.CUBE")
        else:
            block.add(layout, values, offset)
    if block is not None:
        out.append(block.build())
    return out
