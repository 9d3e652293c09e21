"""SG2260 TIU and GDMA descriptors: the register table, dataclass <-> descriptor binding, stream decoding.

Everything here is derived from `tables/sg2260_regs.json` (tpu-mlir 1.30.2's bm1690 register
layouts, see its source note): each register is a Layout of its fields, LSB-first; a dataclass
kind is bound to one or two registers (its short and long form, or one register per op, see
REGISTER_OPS) and the binding below is the only per-kind information.

Field mapping (dataclass -> descriptor):

* A dataclass field is the descriptor field of the same name, except `op` (-> `tsk_eu_typ`
  for TIU, `cmd_special_function` for GDMA, through the class's OPS table) and the logical
  GDMA fields `src_start_addr` / `dst_start_addr` (= `*_l32 | *_h13 << 32`), `localmem_mask`
  (= `localmem_mask_l32 | localmem_mask_h32 << 32`) and `src_cstride` (the table's
  "src_cstride(move length)"). `tsk_typ` / `cmd_type` come from the class, `cmd_short` from
  the chosen form. Descriptor fields the dataclass lacks are written as 0; ClassVar properties
  (ConvTiu.short_opd1_str ...) are not encoded.
* Signedness, per field type: tensor strides are two's complement over their field width
  (TIU `res0/opd0..3_{n,c,h,w}_str`, GDMA `src/dst_{n,c,h,w}stride`; a negative stride walks
  backwards). GDMA's "src_cstride(move length)" is a length and unsigned, like every other
  field. The 32-bit `X_addr` of a constant operand (`opt_X_const = 1`) is the constant
  itself: unsigned bits for float precisions, a signed 32-bit integer (two's complement in
  the field) for integer precisions (`opt_X_prec`; opd3 uses opd2's, as CmpTiu documents).
* A value outside its field's range raises EncodingError naming the kind and the field; it is
  never truncated.

Short-form rule: an instruction is encoded in its short register (sCONV, sMM2, sAR, ...)
whenever decoding the short descriptor gives the instruction back, i.e. every dataclass field
the short layout has fits it, and every field it lacks equals its dataclass default or, for
documented implied fields, the value implied by the others. The implied fields are sMM2's
opd0_c / opd0_w (absent from the short layout): nn: (res0_c, opd1_c), nt: (res0_c, opd1_w),
tt: (opd1_w, res0_c), i.e. L's rows and columns follow from res0 and R; sPorD's and sCMP's
opt_opd1_prec = opt_opd0_prec (tpu-mlir reads their opd1 in opd0's precision); and sCONV's
weight_ic_block = ConvTiu.ALIGNED_IC_BLOCK[opt_opd0_prec] (tpu-mlir's sCONV_converter reads the
weights in Layout.alignIC, input channels in blocks of CUBE_NUM(dtype)); the long CONV form holds
weight_ic_block = 1 (compact [ic][kh][kw], its short_opd1_str). Otherwise the long form.

Hardware-meaning fields: descriptor fields the dataclass does not carry but whose value follows
from the instruction (`DERIVED` below) are written as tpu-mlir 1.30.2's bm1690 decoder reads them
and checked on decode: arith `tsk_opd_num` (1 for unary ops, 2 otherwise), cast's round mode and
div's iteration count (3) in `opd2_n_str`; the `opt_X_sign` flags the dataclass lacks (1 for integer precisions: those integers are signed;
cast's result sign in `opt_opd2_sign`; ConvTiu / Mm2Tiu carry opt_opd0_sign / opt_opd1_sign and RqDqTiu
its signs as fields, written as they are); conv/pool `opt_opd3_const = 1` with the padding value in
`opd3_addr` (0, or -inf / +inf in opd0's precision for max / min pooling) and, in the long forms,
their weight / bias layouts `short_opd1_str` / `short_opd2_str` (compact); sfu.rsqrt's Newton
steps in `opd2_n_str` (3 steps, as tpu-mlir writes); `stride_enable = 1` on
tensor and matrix DMAs (they use their strides), `nchw_copy = 1` on plain tensor copies whose
shapes agree, and `localmem_mask` all lanes on DMAs without one in the dataclass.
GDMA addresses carry tpu-mlir's memory tag in bits 40-44 (table `address_tags`): an ISA address
below 2**40 is DDR and is written with tag 1 when it lies in the coefficient range given to the
encoder (the weight image) and tag 2 otherwise; L2 (30) and LMEM (31) addresses are written as
they are (the chip's gdma_lmem_base_address is tag 31). The decoder strips DDR tags.

Stream decoding reads each record's head (TIU: cmd_short bit 0, tsk_typ bits 41-44,
tsk_eu_typ bits 45-49, 45-47 for SYS_TR_ACC; GDMA: cmd_short bit 3, cmd_type bits 32-36,
cmd_special_function bits 37-39), looks it up in the table's op lists to get the layout and
its length, and decodes. Unknown heads, kinds tpuflow does not model, truncated records and
non-zero bits in fields tpuflow never writes are BinaryFormatError naming the byte offset.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Callable, Mapping

from tpuflow.errors import BinaryFormatError, EncodingError
from tpuflow.isa import (ArTiu, CmpTiu, ConvTiu, CwBcTiu, Engine, GatherDma, GeneralDma, Instruction, LinTiu, MatrixDma,
                         Mm2Tiu, PordTiu, Prec, RqDqTiu, SfuTiu, SgTiu, SysDma, SysTiu, TensorDma)

from tpuflow.codegen.bitfields import FieldRangeError, Layout, LogicalField

TABLE_FILE = "sg2260_regs.json"
SIGNED_FIELD = re.compile(r"^(res[01]|opd[0-5])_[nchw]_str$|^(src|dst)_[nchw]stride$")
GDMA_LOGICAL = {
    "src_start_addr": ("src_start_addr_l32", "src_start_addr_h13"),
    "dst_start_addr": ("dst_start_addr_l32", "dst_start_addr_h13"),
    "localmem_mask": ("localmem_mask_l32", "localmem_mask_h32"),
    "index_start_addr": ("index_start_addr_l32", "index_start_addr_h13"),
    "src_cstride": ("src_cstride(move length)",),
}
INT32_CONST_RANGE = (-(1 << 31), (1 << 31) - 1)
INTEGER_PRECS = frozenset(int(p) for p in Prec if not p.is_float)

# Head positions (bit offset, width) of the table's packing note; checked against every layout.
TIU_HEAD = {"cmd_short": (0, 1), "tsk_typ": (41, 4), "tsk_eu_typ": (45, 5)}
GDMA_HEAD = {"cmd_short": (3, 1), "cmd_type": (32, 5), "cmd_special_function": (37, 3)}


def _mm2_opd0(values: dict) -> tuple[int, int]:
    """(opd0_c, opd0_w) of MM2 implied by res0 and opd1 (see the module docstring)."""
    op = values["op"]
    if op == "nn":
        return values["res0_c"], values["opd1_c"]
    if op == "nt":
        return values["res0_c"], values["opd1_w"]
    return values["opd1_w"], values["res0_c"]


MM2_IMPLIED: dict[str, Callable[[dict], int]] = {
    "opd0_c": lambda v: _mm2_opd0(v)[0],
    "opd0_w": lambda v: _mm2_opd0(v)[1],
}

# sPorD has no opd1 precision: tpu-mlir's sPorD_converter reads opd1 (weights / scale) in opd0's
SPORD_IMPLIED: dict[str, Callable[[dict], int]] = {"opt_opd1_prec": lambda v: v["opt_opd0_prec"]}
# sCMP has no opd1 precision either: tpu-mlir's sCMP_converter reads opd1 in opd0's
SCMP_IMPLIED: dict[str, Callable[[dict], int]] = {"opt_opd1_prec": lambda v: v["opt_opd0_prec"]}

# sCONV's weights are in the cube's input-channel-aligned layout (tpu-mlir sCONV_converter: Layout.alignIC)
SCONV_IMPLIED: dict[str, Callable[[dict], int]] = {
    "weight_ic_block": lambda v: ConvTiu.ALIGNED_IC_BLOCK.get(v["opt_opd0_prec"], 0)}

# dataclass kind -> its registers, preferred (short) first, and implied fields per register
KIND_REGISTERS: dict[type, tuple[tuple[str, Mapping[str, Callable]], ...]] = {
    ConvTiu: (("sCONV", SCONV_IMPLIED), ("CONV", {})),
    Mm2Tiu: (("sMM2", MM2_IMPLIED), ("MM2", {})),
    ArTiu: (("sAR", {}), ("AR", {})),
    PordTiu: (("sPorD", SPORD_IMPLIED), ("PorD", {})),
    SfuTiu: (("sSFU", {}), ("SFU", {})),
    LinTiu: (("LIN", {}),),  # sLIN is inconsistent in tpu-mlir 1.30.2 (see the table's packing note)
    CmpTiu: (("sCMP", SCMP_IMPLIED), ("CMP", {})),
    CwBcTiu: (("sCW&sBC", {}), ("CW&BC", {})),
    SysTiu: (("SYS", {}),),
    RqDqTiu: (("sRQ&sDQ", {}), ("RQ&DQ", {})),   # every field by name, signs included (no derived fields)
    SgTiu: (("sSG", {}), ("SG", {})),            # every field by name; the signs stay 0 (U8 / U16 index)
    TensorDma: (("DMA_tensor（0x000）", {}), ("DMA_cw_transpose", {})),
    MatrixDma: (("DMA_matrix", {}),),
    GeneralDma: (("DMA_general", {}),),
    GatherDma: (("DMA_gather", {}),),
    SysDma: (("sDMA_sys", {}),),
}


# registers that hold only some of their kind's ops, with those ops' codes (others: the class's OPS).
# TensorDma's transpose swaps C and W, which is DMA_cw_transpose (cmd_type 4); DMA_tensor's
# cmd_special_function 1 is an N/C transpose (tpu-mlir opparam DMA_tensor_0x000__converter).
REGISTER_OPS: dict[str, dict[str, int]] = {
    "DMA_tensor（0x000）": {"tensor": 0, "broadcast": 3},
    "DMA_cw_transpose": {"transpose": 0},
}
OPERANDS = ("res0", "opd0", "opd1", "opd2")
ALL_LANES = (1 << 64) - 1
ADDRESS_FIELDS = ("src_start_addr", "dst_start_addr", "index_start_addr")
# sfu.rsqrt: opd2_n_str + 1 Newton steps (tpu-mlir's sSFU_converter); tpu-mlir writes 3 steps for fp32 and
# fp16 in every corpus program, tpuflow's rsqrt is the exact fp32 result
RSQRT_NEWTON_STEPS = 3
# arith.div likewise: opd2_n_str + 1 iterations (sAR_converter); tpu-mlir writes 3 in every corpus div
DIV_NEWTON_STEPS = 3
CAST_ROUND_MODES = range(5)  # ArTiu cast's opd2 (see its docstring); tpu-mlir's round_mode numbering
# padding value of max / min pooling (-inf / +inf, or the integer extremes) per opd0 precision
POOL_PAD = {
    "maxpooling": {int(Prec.FP32): 0xFF800000, int(Prec.FP16): 0xFC00, int(Prec.BF16): 0xFF80,
                   int(Prec.INT8): -(1 << 7), int(Prec.INT16): -(1 << 15), int(Prec.INT32): -(1 << 31)},
    "minpooling": {int(Prec.FP32): 0x7F800000, int(Prec.FP16): 0x7C00, int(Prec.BF16): 0x7F80,
                   int(Prec.INT8): (1 << 7) - 1, int(Prec.INT16): (1 << 15) - 1, int(Prec.INT32): (1 << 31) - 1},
}


def _signs(v: dict) -> dict[str, int]:
    """opt_X_sign = 1 for integer precisions (tpuflow's integers are signed)."""
    return {f"opt_{x}_sign": int(v[f"opt_{x}_prec"] in INTEGER_PRECS) for x in OPERANDS if f"opt_{x}_prec" in v}


def _arith_fields(v: dict) -> dict[str, int]:
    out = _signs(v)
    out["tsk_opd_num"] = 1 if v["op"] in ArTiu.UNARY else 2
    cast = v["op"] == "cast"
    out["opt_opd2_sign"] = int(cast and v["opt_res0_prec"] in INTEGER_PRECS)
    mode = v["opd2_addr"] if cast and v["opt_opd2_const"] else 0
    out["opd2_n_str"] = DIV_NEWTON_STEPS - 1 if v["op"] == "div" else mode if mode in CAST_ROUND_MODES else 0
    return out


# the layouts ConvTiu / PordTiu fix for their weights and bias (class constants; long forms carry them)
CONSTANT_LAYOUTS = {"short_opd1_str": int(ConvTiu.short_opd1_str), "short_opd2_str": int(ConvTiu.short_opd2_str)}
assert CONSTANT_LAYOUTS == {"short_opd1_str": int(PordTiu.short_opd1_str), "short_opd2_str": int(PordTiu.short_opd2_str)}


def _conv_fields(v: dict) -> dict[str, int]:
    return {**_signs(v), **CONSTANT_LAYOUTS, "opt_opd3_const": 1, "opd3_addr": 0}


def _pool_fields(v: dict) -> dict[str, int]:
    pad = POOL_PAD.get(v["op"], {}).get(v["opt_opd0_prec"], 0)
    return {**_signs(v), **CONSTANT_LAYOUTS, "opt_opd3_const": 1, "opd3_addr": pad & 0xFFFFFFFF}


def _tensor_dma_fields(v: dict) -> dict[str, int]:
    same = all(v[f"src_{d}size"] == v[f"dst_{d}size"] for d in "nchw")
    return {"stride_enable": 1, "nchw_copy": int(v["op"] == "tensor" and same and not v["fill_constant_en"])}


# dataclass kind -> descriptor fields it lacks, as functions of its field values (only the
# fields a register has are written; the decoder checks them)
DERIVED: dict[type, Callable[[dict], dict[str, int]]] = {
    ArTiu: _arith_fields,
    ConvTiu: _conv_fields,
    PordTiu: _pool_fields,
    Mm2Tiu: _signs,
    CmpTiu: _signs,
    SfuTiu: lambda v: {**_signs(v), "opd2_n_str": RSQRT_NEWTON_STEPS - 1 if v["op"] == "rsqrt" else 0},
    TensorDma: _tensor_dma_fields,
    MatrixDma: lambda v: {"stride_enable": 1, "localmem_mask": ALL_LANES},
    GeneralDma: lambda v: {"localmem_mask": ALL_LANES},
}


class AddressTags:
    """tpu-mlir's memory tags of 45-bit GDMA addresses (the table's address_tags)."""

    def __init__(self, spec: dict):
        self.shift, self.ddr_coeff, self.ddr_act = spec["tag_shift"], spec["ddr_coeff"], spec["ddr_activation"]
        self.kept = frozenset((spec["l2"], spec["lmem"]))
        self.low_mask = (1 << self.shift) - 1

    def tag(self, addr: int, coeff: tuple[int, int] | None) -> int | None:
        """The descriptor address of ISA address `addr` (None: no tpu-mlir tag fits)."""
        tag = addr >> self.shift
        if tag == 0:
            in_coeff = coeff is not None and coeff[0] <= addr < coeff[1]
            return addr | (self.ddr_coeff if in_coeff else self.ddr_act) << self.shift
        return addr if tag in self.kept else None

    def untag(self, raw: int) -> int | None:
        """The ISA address of descriptor address `raw` (None: not a tpu-mlir memory tag)."""
        tag = raw >> self.shift
        if tag in (self.ddr_coeff, self.ddr_act):
            return raw & self.low_mask
        return raw if tag in self.kept else None


@lru_cache(maxsize=1)
def address_tags() -> AddressTags:
    return AddressTags(register_table()["address_tags"])


@lru_cache(maxsize=1)
def register_table() -> dict:
    """The SG2260 register table (registers, tiu_ops, dma_ops, source and packing notes)."""
    text = resources.files("tpuflow.codegen").joinpath("tables", TABLE_FILE).read_text(encoding="utf-8")
    return json.loads(text)


@lru_cache(maxsize=None)
def register_layout(register: str) -> Layout:
    """The Layout of one register of the table, with tpuflow's logical GDMA fields."""
    spec = register_table()["registers"][register]
    names = {f[0] for f in spec["fields"]}
    logical = {k: parts for k, parts in GDMA_LOGICAL.items() if all(p in names for p in parts)}
    # signedness follows the table's name: "src_cstride(move length)" is a length, not a stride;
    # the 3-bit opd2_n_str of short registers is a mode (round mode, divide iterations), not a stride
    narrow = {f[0] for f in spec["fields"] if f[1] < 8}
    return Layout(register, spec["fields"], length_bits=spec["length_bits"], logical=logical,
                  signed=lambda name: bool(SIGNED_FIELD.match(logical.get(name, (name,))[0])) and name not in narrow)


def _head_spec(engine: Engine) -> dict[str, tuple[int, int]]:
    return TIU_HEAD if engine is Engine.TIU else GDMA_HEAD


@dataclass(frozen=True)
class ConstOperand:
    """A TIU operand whose X_addr holds a constant when opt_X_const is set."""

    addr: str
    const: str
    prec: str | None


class Form:
    """One register a kind can be encoded in: its layout and how dataclass fields map onto it."""

    def __init__(self, codec: "KindCodec", register: str, implied: Mapping[str, Callable]):
        self.codec, self.register = codec, register
        self.layout = register_layout(register)
        ops = _ops_entries(codec.engine, register)
        self.cmd_short = min(e["cmd_short"] for e in ops)
        lf = self.layout.fields
        self.present: tuple[tuple[str, LogicalField], ...] = tuple(
            (name, lf[name]) for name in codec.field_names if name in lf)
        self.absent: tuple[tuple[str, object, Callable | None], ...] = tuple(
            (name, codec.defaults.get(name, dataclasses.MISSING), implied.get(name))
            for name in codec.field_names if name not in lf and name != "op")
        for name, default, implied in self.absent:
            if default is dataclasses.MISSING and implied is None:
                raise ValueError(f"{register} lacks {codec.cls.__name__}.{name}, which has no default")
        self.op_codes = REGISTER_OPS.get(register, codec.op_codes)
        self.op_names = {code: op for op, code in self.op_codes.items()}
        type_field = next(iter(codec.class_head))
        self.head = {type_field: ops[0][type_field]}  # the register's tsk_typ / cmd_type (the table's)
        if "cmd_short" in lf:
            self.head["cmd_short"] = self.cmd_short
        self.head_bits = self.layout.const_bits | sum(lf[n].place(v) for n, v in self.head.items())
        self.op_field = lf[codec.op_field]
        dataclass_names = set(codec.field_names)
        self.derived: tuple[tuple[str, LogicalField], ...] = tuple(
            (name, lf[name]) for name in codec.derived_names if name in lf and name not in dataclass_names)
        self.unmodelled_mask = self._unmodelled_mask()

    def _unmodelled_mask(self) -> int:
        used = 0
        for _, lfield in self.present + self.derived:
            used |= lfield.mask
        for offset, width in _head_spec(self.codec.engine).values():
            used |= ((1 << width) - 1) << offset
        return ((1 << self.layout.length_bits) - 1) & ~used

    def try_pack(self, values: dict, derived: dict, strict: bool) -> int | None:
        """The descriptor integer, or None if this form cannot hold `values` (strict: raise)."""
        op = values.get("op")
        if op is not None and op not in self.op_codes:
            if strict:
                raise self.codec.error("op", f"= {op!r} has no encoding in {self.register}")
            return None
        op_code = self.op_codes[op] if op is not None else 0
        for name, default, implied in self.absent:
            wanted = implied(values) if implied is not None else default
            if values[name] != wanted:
                if strict:
                    raise self.codec.error(name, f"= {values[name]} has no field in {self.register}")
                return None
        raw = self.head_bits | self.op_field.place(op_code)
        for name, lfield in self.present:
            value = values[name]
            if value:
                try:
                    raw |= lfield.place(value)
                except FieldRangeError as exc:
                    if strict:
                        raise self.codec.error(name, f"= {value} does not fit {self.register}'s "
                                               f"{lfield.describe()}") from None
                    return None
        for name, lfield in self.derived:
            if derived[name]:
                try:
                    raw |= lfield.place(derived[name])
                except FieldRangeError:
                    if strict:
                        raise self.codec.error(name, f"= {derived[name]} (implied by the instruction) does not fit "
                                               f"{self.register}'s {lfield.describe()}") from None
                    return None
        return raw

    def check_derived(self, raw: int, derived: dict, where: str) -> None:
        """The hardware-meaning fields of a decoded record are what tpuflow writes for it."""
        for name, lfield in self.derived:
            value = lfield.take(raw)
            if value != derived[name]:
                raise BinaryFormatError(f"{where}: {self.register} field {name} is {value:#x}; tpuflow writes "
                                        f"{derived[name]:#x} for this instruction")


def _ops_entries(engine: Engine, register: str) -> list[dict]:
    table = register_table()["tiu_ops" if engine is Engine.TIU else "dma_ops"]
    return [e for e in table if e["reg"] == register]


class KindCodec:
    """Encoder/decoder of one dataclass kind over its forms (short first)."""

    def __init__(self, cls: type):
        self.cls = cls
        self.engine = cls.ENGINE
        dfields = dataclasses.fields(cls)
        self.field_names = tuple(f.name for f in dfields)
        self.defaults = {f.name: f.default for f in dfields if f.default is not dataclasses.MISSING}
        if self.engine is Engine.TIU:
            self.op_field, self.class_head = "tsk_eu_typ", {"tsk_typ": cls.TSK_TYP}
        else:
            self.op_field, self.class_head = "cmd_special_function", {"cmd_type": cls.CMD_TYPE}
        self.op_codes = dict(cls.OPS)
        self.op_names = {code: op for op, code in cls.OPS.items()}
        self.const_operands = self._const_operands()
        self.derive = DERIVED.get(cls, lambda values: {})
        self.derived_names = tuple(self.derive(self._sample_values()))
        self.addresses = tuple(a for a in ADDRESS_FIELDS if a in self.field_names)
        self.forms = tuple(Form(self, reg, implied) for reg, implied in KIND_REGISTERS[cls])

    def _sample_values(self) -> dict:
        """Field values of some instruction of this kind (the derived fields' names do not depend on them)."""
        values = {name: self.defaults.get(name, 0) for name in self.field_names}
        if "op" in values:
            values["op"] = next(iter(self.op_codes))
        return values

    def _const_operands(self) -> tuple[ConstOperand, ...]:
        names = set(self.field_names)
        out = []
        for x in ("opd0", "opd1", "opd2", "opd3"):
            if f"{x}_addr" in names and f"opt_{x}_const" in names:
                prec = next((p for p in (f"opt_{x}_prec", "opt_opd2_prec" if x == "opd3" else "")
                             if p in names), None)
                out.append(ConstOperand(f"{x}_addr", f"opt_{x}_const", prec))
        return tuple(out)

    def error(self, name: str, what: str) -> EncodingError:
        return EncodingError(f"{self.cls.__name__}: field {name} {what}")

    def _int_const(self, values: dict, c: ConstOperand) -> bool:
        return bool(values[c.const]) and c.prec is not None and values[c.prec] in INTEGER_PRECS

    def encode_int(self, instr: Instruction, coeff: tuple[int, int] | None = None) -> tuple[int, Form]:
        values = {name: getattr(instr, name) for name in self.field_names}
        for name in self.addresses:
            tagged = address_tags().tag(values[name], coeff)
            if tagged is None:
                raise self.error(name, f"= {values[name]:#x} is neither DDR (below 2**40) nor tagged L2 / LMEM")
            values[name] = tagged
        for c in self.const_operands:
            if self._int_const(values, c):
                value = values[c.addr]
                lo, hi = INT32_CONST_RANGE
                if not lo <= value <= hi:
                    raise self.error(c.addr, f"= {value} is an integer constant outside the signed 32-bit range")
                values[c.addr] = value & 0xFFFFFFFF
        derived = self.derive(values)
        forms = [f for f in self.forms if values.get("op") is None or values["op"] in f.op_codes]
        for i, form in enumerate(forms):
            raw = form.try_pack(values, derived, strict=(i == len(forms) - 1))
            if raw is not None:
                return raw, form
        raise AssertionError("unreachable: the last form packs strictly")

    def decode_int(self, form: Form, raw: int, where: str) -> Instruction:
        if raw & form.unmodelled_mask:
            bad = next(b for b in form.layout.bits if raw & form.unmodelled_mask & b.mask)
            raise BinaryFormatError(f"{where}: {form.register} field {bad.name} is {bad.extract(raw):#x}; "
                                    "tpuflow never sets it")
        values = {name: lfield.take(raw) for name, lfield in form.present}
        if "op" in self.field_names:
            code = form.op_field.take(raw)
            values["op"] = form.op_names[code]
        for name, default, implied in form.absent:
            values[name] = implied(values) if implied is not None else default
        for c in self.const_operands:
            if self._int_const(values, c) and values[c.addr] >= 1 << 31:
                values[c.addr] -= 1 << 32
        for name in self.addresses:
            address = address_tags().untag(values[name])
            if address is None:
                raise BinaryFormatError(f"{where}: {form.register} {name} {values[name]:#x} has memory tag "
                                        f"{values[name] >> address_tags().shift}, not DDR (1, 2), L2 (30) or LMEM (31)")
            values[name] = address
        try:
            instr = self.cls(**values)
        except (TypeError, ValueError) as exc:
            raise BinaryFormatError(f"{where}: {form.register} does not decode: {exc}") from None
        form.check_derived(raw, self.derive(self._wire_values(values)), where)
        return instr

    def _wire_values(self, values: dict) -> dict:
        """`values` with integer constants as their 32-bit field bits (as the derived rules see them on encode)."""
        out = dict(values)
        for c in self.const_operands:
            if self._int_const(out, c):
                out[c.addr] &= 0xFFFFFFFF
        return out


@lru_cache(maxsize=None)
def codec_for(cls: type) -> KindCodec:
    return KindCodec(cls)


def encode_descriptor(instr: Instruction, coeff: tuple[int, int] | None = None) -> bytes:
    """The SG2260 descriptor bytes of a TIU or GDMA instruction (short form when it fits).

    `coeff`: the DDR range [lo, hi) of coefficients (weights): DMA addresses inside it get
    memory tag 1, other DDR addresses tag 2."""
    raw, form = codec_for(type(instr)).encode_int(instr, coeff)
    return raw.to_bytes(form.layout.nbytes, "little")


def descriptor_form(instr: Instruction) -> str:
    """The register an instruction is encoded in (e.g. 'sCONV')."""
    return codec_for(type(instr)).encode_int(instr)[1].register


class HeadTable:
    """Head -> (codec, form) of one engine, built from the table's op lists."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.spec = _head_spec(engine)
        bound: dict[str, tuple[KindCodec, Form]] = {}
        for cls in KIND_REGISTERS:
            if cls.ENGINE is engine:
                codec = codec_for(cls)
                for form in codec.forms:
                    bound[form.register] = (codec, form)
        key_field = "tsk_eu_typ" if engine is Engine.TIU else "cmd_sp_func"
        type_field = "tsk_typ" if engine is Engine.TIU else "cmd_type"
        table = register_table()["tiu_ops" if engine is Engine.TIU else "dma_ops"]
        self.op_bits: dict[int, int] = {}    # tsk_typ / cmd_type -> width of the op field
        self.entries: dict[tuple[int, int, int], tuple[str, str, tuple | None]] = {}
        op_name = "tsk_eu_typ" if engine is Engine.TIU else "cmd_special_function"
        for e in table:
            layout = register_layout(e["reg"])
            self.op_bits[e[type_field]] = layout.fields[op_name].width
            key = (e["cmd_short"], e[type_field], e[key_field])
            target = bound.get(e["reg"])
            if target is not None:
                op = target[1].op_names.get(e[key_field])
                target = target if op is not None else None
            self.entries[key] = (e["name"], e["reg"], target)

    def head(self, head: int) -> tuple[int, int, int]:
        (s_off, _), (t_off, t_bits), (o_off, _) = self.spec.values()
        short = (head >> s_off) & 1
        typ = (head >> t_off) & ((1 << t_bits) - 1)
        op = (head >> o_off) & ((1 << self.op_bits.get(typ, 5 if self.engine is Engine.TIU else 3)) - 1)
        return short, typ, op


@lru_cache(maxsize=None)
def head_table(engine: Engine) -> HeadTable:
    return HeadTable(Engine(engine))


HEAD_BYTES = 8


def decode_descriptors(data: bytes, engine: Engine, source: str = "<bytes>") -> list[Instruction]:
    """Decode a concatenation of TIU (.BD) or GDMA (.GDMA) descriptors."""
    heads = head_table(Engine(engine))
    out: list[Instruction] = []
    pos, size = 0, len(data)
    while pos < size:
        if size - pos < HEAD_BYTES:
            raise BinaryFormatError(f"{source}: truncated record at byte offset {pos}: "
                                    f"{size - pos} bytes left, a descriptor head needs {HEAD_BYTES}")
        key = heads.head(int.from_bytes(data[pos:pos + HEAD_BYTES], "little"))
        entry = heads.entries.get(key)
        if entry is None:
            names = tuple(heads.spec)
            raise BinaryFormatError(f"{source}: byte offset {pos}: unknown {heads.engine.name} descriptor head "
                                    + ", ".join(f"{n}={v}" for n, v in zip(names, key)))
        name, register, target = entry
        if target is None:
            raise BinaryFormatError(f"{source}: byte offset {pos}: {name} ({register}) is not an "
                                    "instruction tpuflow models")
        codec, form = target
        end = pos + form.layout.nbytes
        if end > size:
            raise BinaryFormatError(f"{source}: truncated {register} record at byte offset {pos}: "
                                    f"needs {form.layout.nbytes} bytes, {size - pos} left")
        out.append(codec.decode_int(form, int.from_bytes(data[pos:end], "little"), f"{source}: byte offset {pos}"))
        pos = end
    return out


def encode_descriptors(instrs, coeff: tuple[int, int] | None = None) -> bytes:
    return b"".join(encode_descriptor(i, coeff) for i in instrs)


def check_table_heads() -> None:
    """Every register of the op lists has its head fields where the packing note says."""
    for engine in (Engine.TIU, Engine.GDMA):
        table = register_table()["tiu_ops" if engine is Engine.TIU else "dma_ops"]
        for reg in sorted({e["reg"] for e in table}):
            layout = register_layout(reg)
            for name, (offset, width) in _head_spec(engine).items():
                field = layout.field_at(offset)
                if name == "cmd_short" and field.name != name:
                    continue  # SYS / SYS_TR_ACC: no cmd_short bit
                if field.name != name or field.offset != offset or field.width > width:
                    raise ValueError(f"{reg}: head field {name} is not at bit {offset}")
