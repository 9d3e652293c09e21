"""tpu-mlir's SG2260 (bm1690) command streams read as tpuflow instructions, for disassembly and timing.

tpu-mlir writes records tpuflow's own decoder rejects (kinds tpuflow never emits, such as sMM and
SYS_TR_ACC, ops outside tpuflow's op sets, flags tpuflow writes differently). This reader takes
every register of the table (tpu-mlir 1.30.2's layouts), reads each record's fields by name and
builds the tpuflow instruction that does the same work on the same operands, so that the timing
model can simulate the vendor's program as it is:

* sCONV / sPorD / sAR / sMM2 / sCMP / sSFU / LIN / sCW&sBC / sRQ&sDQ / sSG / DMA_tensor / DMA_matrix /
  DMA_general / DMA_gather / sDMA_sys / SYS (and the long forms): the dataclass of the same kind,
  its fields copied by name. Ops outside the
  dataclass's op set become the op of equal cost: saturating add/sub/mul -> add/sub/mul, other
  binary arith -> max, other unary arith -> copy, other pooling -> maxpooling, other compares
  -> sel_gt, other SFU -> taylor, other lane copies -> l_copy.
* sMM (mm.normal: L rows opd0_n, K = opd0_w * (opd0_c - 1) + opd1_w, N = res0_c * res0_w with the N
  columns on the lanes, L transposed when opt_left_tran): tpuflow's read-only MmTiu, fields by name.
  Its precision fields say what the hardware does: every sMM of the corpus is FP32 (opt_opd0_prec =
  opt_res0_prec = 2), in the F16 programs too, because tpu-mlir casts the FC's 2-byte input and
  weights to fp32 in LMEM (arith.cast before each mm.normal, dis.mlir) and casts the result back.
* SYS_TR_ACC (writes immediates into TIU registers, no data): a TIU nop.
* cmd_id_dep: the low 20 bits, as tpu-mlir's decoder takes them (it sets bit 20 in every non-SYS record).
* DMA_matrix: the DDR matrix (rows, columns, row stride) is read from the DDR side's fields (src
  on loads, dst on stores); tpu-mlir spreads column blocks of dst_wsize / src_wsize over the lanes
  where tpuflow's MatrixDma puts rows on lanes: same bytes and DDR pattern, other LMEM placement.
* DMA addresses lose their memory tag (DDR tags 1 / 2); L2 (tag 30) is taken as DDR at its
  offset; LMEM (tag 31) is kept (tpuflow's LMEM window). With nchw_copy the destination takes
  the source's shape. DMA_tensor's N<->C transpose is read as a copy of the same bytes (tpuflow has
  no N<->C transpose); DMA_cw_transpose is tpuflow's transpose.
Each stream ends at the end command (SYS end / sDMA_sys chain_end) followed by zero padding.
Unknown heads, kinds no rule covers and truncated records raise BinaryFormatError naming the
byte offset.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass, field

from tpuflow.errors import BinaryFormatError
from tpuflow.isa import (ArTiu, CmpTiu, ConvTiu, CwBcTiu, Engine, GatherDma, GeneralDma, Instruction, LinTiu,
                         MatrixDma, Mm2Tiu, MmTiu, PordTiu, Prec, RqDqTiu, SfuTiu, SgTiu, SysDma, SysTiu, TensorDma)

from tpuflow.codegen.sg2260 import HEAD_BYTES, INTEGER_PRECS, REGISTER_OPS, address_tags, head_table, register_layout

L2_TAG = 30
LMEM_TAG = 31
# The waited-for id is the low 20 bits of cmd_id_dep (tpu-mlir 1.30.2 target_1690/opdef.py
# fix_cmd_id_dep: value & 0xFFFFF); every non-SYS record of the corpus also sets bit 20.
VENDOR_DEP_ID_BITS = 20
ARITH_SAME_COST = {15: "add", 16: "sub", 20: "mul"}  # add_satu, sub_satu, mul_satu
ARITH_UNARY_CODES = frozenset({1, 14, 19, 26})


@dataclass
class VendorStream:
    """One decoded vendor stream: instructions, the register of each record, and its size in bytes."""

    engine: Engine
    instructions: list[Instruction] = field(default_factory=list)
    registers: list[str] = field(default_factory=list)
    consumed_bytes: int = 0
    padding_bytes: int = 0

    def register_counts(self) -> dict[str, int]:
        return dict(Counter(self.registers))


def _copy(cls, values: dict, **override) -> Instruction:
    """An instance of `cls` with every field it shares with `values` (then `override`)."""
    kw = {}
    for f in dataclasses.fields(cls):
        if f.name in override:
            kw[f.name] = override[f.name]
        elif f.name in values:
            kw[f.name] = values[f.name]
    return cls(**kw)


def _op(cls, code: int, fallback: str) -> str:
    return next((op for op, c in cls.OPS.items() if c == code), fallback)


def _prec(code: int) -> int:
    return code if code in {int(p) for p in Prec} else int(Prec.FP32)


def _precs(values: dict) -> dict:
    return {k: _prec(v) for k, v in values.items() if k.startswith("opt_") and k.endswith("_prec")}


def _signed_consts(values: dict) -> dict:
    """Integer constant operands as signed 32-bit values (as tpuflow's dataclasses hold them)."""
    out = {}
    for x in ("opd0", "opd1", "opd2", "opd3"):
        prec = values.get(f"opt_{x}_prec", values.get("opt_opd2_prec"))
        if values.get(f"opt_{x}_const") and prec in INTEGER_PRECS and values.get(f"{x}_addr", 0) >= 1 << 31:
            out[f"{x}_addr"] = values[f"{x}_addr"] - (1 << 32)
    return out


def _dep(values: dict) -> dict:
    return {"cmd_id_dep": values.get("cmd_id_dep", 0) & ((1 << VENDOR_DEP_ID_BITS) - 1)}


def _tiu(cls, values: dict, op: str | None, **override) -> Instruction:
    extra = {**_precs(values), **_signed_consts(values), **_dep(values), **override}
    if op is not None:
        extra["op"] = op
    return _copy(cls, values, **extra)


def _conv(v: dict) -> Instruction:
    """opd3 is the padding value only when constant (tpu-mlir can read it from LMEM: then zero padding here)."""
    return _tiu(ConvTiu, v, "normal", opd3_addr=v.get("opd3_addr", 0) if v.get("opt_opd3_const") else 0)


def _rq_dq(v: dict) -> Instruction:
    """RQ&DQ: RqDqTiu by name; dq1 (integer dequant, not modelled) is read as rq1, the op of equal cost."""
    return _tiu(RqDqTiu, v, _op(RqDqTiu, v["tsk_eu_typ"], "rq1"))


def _sg(v: dict) -> Instruction:
    """sSG / SG: SgTiu by name; every other scatter / gather op is read as pe_s_gather_hzd over res0's shape
    (tpu-mlir's cycle model costs every SG op alike: one element per lane and cycle), its index taken as
    res0-shaped (opd1_c / opd1_w = res0's) and its table length kept."""
    op = _op(SgTiu, v["tsk_eu_typ"], "pe_s_gather_hzd")
    short = v.get("short_opd0_str", 0)
    return _tiu(SgTiu, v, op, res0_h=1, opd0_h=1, opd1_c=v["res0_c"], opd1_w=v["res0_w"],
                short_opd0_str=short if short in (0, 4) else 0, opt_res0_prec=_prec(v.get("opt_res0_prec", 0)),
                opt_opd0_prec=_prec(v.get("opt_res0_prec", 0)), opd0_w=max(1, v.get("opd0_w", 1)),
                opt_opd1_prec=v.get("opt_opd1_prec", 0) if v.get("opt_opd1_prec", 0) in (0, 3) else 0)


def _pord(v: dict) -> Instruction:
    return _tiu(PordTiu, v, _op(PordTiu, v["tsk_eu_typ"], "maxpooling"))


def _arith(v: dict) -> Instruction:
    code = v["tsk_eu_typ"]
    unary = code in ARITH_UNARY_CODES or v.get("tsk_opd_num") == 1
    op = _op(ArTiu, code, ARITH_SAME_COST.get(code, "copy" if unary else "max"))
    if op == "cast":  # tpu-mlir keeps the round mode in opd2_n_str, tpuflow in a constant opd2
        return _tiu(ArTiu, v, op, opd2_addr=v["opd2_n_str"], opt_opd2_const=1)
    return _tiu(ArTiu, v, op)


def _mm(v: dict) -> Instruction:
    return _tiu(MmTiu, v, _op(MmTiu, v["tsk_eu_typ"], "normal"))


def _mm2(v: dict) -> Instruction:
    op = _op(Mm2Tiu, v["tsk_eu_typ"], "nn")
    opd0 = {}
    if "opd0_c" not in v:  # sMM2: L's shape follows from res0 and R
        opd0 = {"opd0_c": v["res0_c"] if op != "tt" else v["opd1_w"],
                "opd0_w": v["opd1_c"] if op == "nn" else v["opd1_w"] if op == "nt" else v["res0_c"]}
    return _tiu(Mm2Tiu, v, op, **opd0)


def _cmp(v: dict) -> Instruction:
    return _tiu(CmpTiu, v, _op(CmpTiu, v["tsk_eu_typ"], "sel_gt"))


def _sfu(v: dict) -> Instruction:
    return _tiu(SfuTiu, v, _op(SfuTiu, v["tsk_eu_typ"], "taylor"))


def _lin(v: dict) -> Instruction:
    return _tiu(LinTiu, v, _op(LinTiu, v["tsk_eu_typ"], "mac"))


def _cwbc(v: dict) -> Instruction:
    return _tiu(CwBcTiu, v, _op(CwBcTiu, v["tsk_eu_typ"], "l_copy"))


def _sys(v: dict) -> Instruction:
    return _copy(SysTiu, v, op=_op(SysTiu, v["tsk_eu_typ"], "nop"), reg_idx=v.get("reg_idx", 0) & 0xFF, **_dep(v))


def _tr_acc(v: dict) -> Instruction:
    return SysTiu(op="nop")


def _address(raw: int, where: str) -> int:
    tags = address_tags()
    if raw >> tags.shift == L2_TAG:
        return raw & tags.low_mask
    address = tags.untag(raw)
    if address is None:
        raise BinaryFormatError(f"{where}: address {raw:#x} has memory tag {raw >> tags.shift}, "
                                "not DDR (1, 2), L2 (30) or LMEM (31)")
    return address


def _dma_values(v: dict, where: str) -> dict:
    out = dict(v, src_data_format=_prec(v["src_data_format"]), **_dep(v))
    for name in ("src_start_addr", "dst_start_addr"):
        out[name] = _address(v[name], where)
    if v.get("nchw_copy"):
        for d in "nchw":
            out[f"dst_{d}size"] = v[f"src_{d}size"]
    return out


def _tensor_dma(v: dict, where: str) -> Instruction:
    """DMA_tensor: copy or broadcast; its N<->C transpose (function 1), which tpuflow lacks, is read as
    a copy of the same bytes."""
    ops = REGISTER_OPS["DMA_tensor（0x000）"]
    op = next((o for o, c in ops.items() if c == v["cmd_special_function"]), "tensor")
    return _copy(TensorDma, _dma_values(v, where), op=op)


def _cw_transpose_dma(v: dict, where: str) -> Instruction:
    return _copy(TensorDma, _dma_values(v, where), op="transpose")


def _matrix_dma(v: dict, where: str) -> Instruction:
    """The DDR matrix's rows / columns / row stride are the DDR side's fields (src on loads, dst on
    stores); the LMEM side's c stride is tpuflow's lmem_cstride."""
    values = _dma_values(v, where)
    if v["src_start_addr"] >> address_tags().shift == LMEM_TAG:  # a store: the DDR matrix is dst
        values.update(src_hsize=v["dst_hsize"], src_wsize=v["dst_wsize"], src_hstride=v["dst_hstride"],
                      dst_cstride=v["src_cstride"])
    return _copy(MatrixDma, values, op=_op(MatrixDma, v["cmd_special_function"], "matrix"))


def _general_dma(v: dict, where: str) -> Instruction:
    return _copy(GeneralDma, _dma_values(v, where), op=_op(GeneralDma, v["cmd_special_function"], "general"))


def _gather_dma(v: dict, where: str) -> Instruction:
    values = _dma_values(v, where)
    values["index_start_addr"] = _address(v["index_start_addr"], where)
    return _copy(GatherDma, values, op="gather")


def _sys_dma(v: dict, where: str) -> Instruction:
    op = _op(SysDma, v["cmd_special_function"], "nop")
    return SysDma(op=op, **_dep(v))


TIU_RULES = {"sCONV": _conv, "CONV": _conv, "sPorD": _pord, "PorD": _pord, "sAR": _arith, "AR": _arith,
             "sMM": _mm, "MM": _mm, "sMM2": _mm2, "MM2": _mm2, "sCMP": _cmp, "CMP": _cmp, "sSFU": _sfu,
             "SFU": _sfu, "LIN": _lin, "sLIN": _lin, "sCW&sBC": _cwbc, "CW&BC": _cwbc, "SYS": _sys,
             "SYS_TR_ACC": _tr_acc, "sRQ&sDQ": _rq_dq, "RQ&DQ": _rq_dq, "sSG": _sg, "SG": _sg}
DMA_RULES = {"DMA_tensor（0x000）": _tensor_dma, "DMA_cw_transpose": _cw_transpose_dma, "DMA_matrix": _matrix_dma, "DMA_general": _general_dma,
             "DMA_gather": _gather_dma, "sDMA_sys": _sys_dma}
END_OPS = {Engine.TIU: ("SYS", 31), Engine.GDMA: ("sDMA_sys", 0)}


def _is_end(engine: Engine, register: str, values: dict) -> bool:
    reg, code = END_OPS[engine]
    op = values.get("tsk_eu_typ", values.get("cmd_special_function"))
    return register == reg and op == code


def decode_vendor_stream(data: bytes, engine: Engine, source: str = "<bytes>") -> VendorStream:
    """Every record of a tpu-mlir bm1690 .BD (TIU) or .GDMA stream, up to its end command."""
    engine = Engine(engine)
    heads = head_table(engine)
    rules = TIU_RULES if engine is Engine.TIU else DMA_RULES
    out = VendorStream(engine)
    pos, size = 0, len(data)
    while pos < size:
        if size - pos < HEAD_BYTES:
            raise BinaryFormatError(f"{source}: truncated record at byte offset {pos}")
        key = heads.head(int.from_bytes(data[pos:pos + HEAD_BYTES], "little"))
        entry = heads.entries.get(key)
        where = f"{source}: byte offset {pos}"
        if entry is None:
            raise BinaryFormatError(f"{where}: unknown {engine.name} descriptor head {key}")
        _, register, _ = entry
        rule = rules.get(register)
        if rule is None:
            raise BinaryFormatError(f"{where}: {register} records are not read (no rule for this kind)")
        layout = register_layout(register)
        end = pos + layout.nbytes
        if end > size:
            raise BinaryFormatError(f"{where}: truncated {register} record ({layout.nbytes} bytes, {size - pos} left)")
        values = layout.unpack_int(int.from_bytes(data[pos:end], "little"))
        try:
            instr = rule(values) if engine is Engine.TIU else rule(values, where)
        except (TypeError, ValueError) as exc:
            raise BinaryFormatError(f"{where}: {register} does not map onto a tpuflow instruction: {exc}") from None
        out.instructions.append(instr)
        out.registers.append(register)
        pos = end
        if _is_end(engine, register, values):
            if any(data[pos:]):
                raise BinaryFormatError(f"{source}: byte offset {pos}: non-zero bytes after the end command")
            break
    out.consumed_bytes, out.padding_bytes = pos, size - pos
    return out


def issue_order(tiu: list[Instruction], gdma: list[Instruction]) -> str:
    """A global issue order ('B' TIU, 'D' GDMA) in which each command follows the one it waits for.

    TIU cmd_id_dep names a GDMA command (1-based) and GDMA cmd_id_dep a TIU command; a command is
    issued as soon as what it waits for has been issued, TIU first on ties (as tpu-mlir's
    merge_instruction orders them)."""
    order, t, g = [], 0, 0
    while t < len(tiu) or g < len(gdma):
        tiu_ready = t < len(tiu) and tiu[t].cmd_id_dep <= g
        gdma_ready = g < len(gdma) and gdma[g].cmd_id_dep <= t
        if tiu_ready or (not gdma_ready and t < len(tiu) and g >= len(gdma)):
            order.append("B")
            t += 1
        elif gdma_ready or g < len(gdma):
            order.append("D")
            g += 1
        else:
            order.append("B")
            t += 1
    return "".join(order)


def stream_files(directory) -> dict[str, dict[Engine, "Path"]]:
    """{name: {engine: path}} of the core-0 `<name>.BD.0` / `<name>.GDMA.0` files of a folder."""
    from pathlib import Path
    out: dict[str, dict[Engine, Path]] = {}
    for path in sorted(Path(directory).iterdir()):
        for suffix, engine in ((".BD.0", Engine.TIU), (".GDMA.0", Engine.GDMA)):
            if path.name.endswith(suffix) and path.is_file():
                out.setdefault(path.name[:-len(suffix)], {})[engine] = path
    return out


def is_stream_dir(path) -> bool:
    """A folder of raw streams without a manifest.json (tpuflow's compile output has one)."""
    from pathlib import Path
    p = Path(path)
    return p.is_dir() and not (p / "manifest.json").exists() and bool(stream_files(p))


def read_stream_dir(directory, chip) -> tuple["Program", dict[Engine, VendorStream]]:
    """The Program of a folder of raw streams (one `<name>` pair; no graph, no layers)."""
    from tpuflow.errors import InputFileError
    found = stream_files(directory)
    if len(found) != 1:
        raise InputFileError(f"{directory}: expected the streams of one program (<name>.BD.0 / <name>.GDMA.0), "
                             f"found {sorted(found) or 'none'}")
    program, per_core = read_stream_dir_cores(directory, chip)
    return program, per_core[0]


def _core_stream_files(directory, name: str) -> list[dict[Engine, "Path"]]:
    """Per core k = 0, 1, ... (while either file exists): its `<name>.BD.<k>` / `<name>.GDMA.<k>` paths."""
    from pathlib import Path
    cores = []
    while True:
        files = {e: Path(directory) / f"{name}.{e.stream_suffix}.{len(cores)}" for e in (Engine.TIU, Engine.GDMA)}
        files = {e: p for e, p in files.items() if p.is_file()}
        if not files:
            return cores
        cores.append(files)


def read_stream_dir_cores(directory, chip) -> tuple["Program", list[dict[Engine, VendorStream]]]:
    """The Program of a folder of raw streams with every core's `<name>.BD.<k>` / `.GDMA.<k>` pair
    (cores 0, 1, ... up to the first missing one), and each core's decoded streams."""
    from tpuflow.errors import InputFileError
    from tpuflow.program import Program
    found = stream_files(directory)
    if len(found) != 1:
        raise InputFileError(f"{directory}: expected the streams of one program (<name>.BD.0 / <name>.GDMA.0), "
                             f"found {sorted(found) or 'none'}")
    name = next(iter(found))
    per_core = []
    for files in _core_stream_files(directory, name):
        streams = {}
        for engine in (Engine.TIU, Engine.GDMA):
            path = files.get(engine)
            data = path.read_bytes() if path is not None else b""
            streams[engine] = decode_vendor_stream(data, engine, str(path))
        per_core.append(streams)
    programs = [stream_program(name, streams, chip) for streams in per_core]
    if len(programs) == 1:
        return programs[0], per_core
    return Program.from_cores(programs[0], [p.cores[0] for p in programs]), per_core


def stream_program(name: str, streams: dict[Engine, VendorStream], chip) -> "Program":
    """The Program of one decoded TIU / GDMA stream pair (no graph; each record's layer is its register)."""
    from tpuflow.program import Program
    tiu, gdma = streams[Engine.TIU].instructions, streams[Engine.GDMA].instructions
    return Program(chip=chip, tiu=list(tiu), gdma=list(gdma), model_name=name,
                   tiu_layers=list(streams[Engine.TIU].registers), gdma_layers=list(streams[Engine.GDMA].registers),
                   issue_order=issue_order(tiu, gdma))
