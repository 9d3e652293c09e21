"""Hypothesis strategies for instructions of every kind, with field ranges taken from the tables."""

from __future__ import annotations

import dataclasses

from hypothesis import strategies as st

from tpuflow.codegen import linx
from tpuflow.codegen.sg2260 import ADDRESS_FIELDS, INT32_CONST_RANGE, KIND_REGISTERS, codec_for
from tpuflow.isa import GDMA_KINDS, TIU_KINDS, AccCvt, ConvTiu, Engine, Mm2Tiu, Prec, SgTiu, TMatmul, TPush
from tpuflow.isa.tile import DT_CODES, LAYOUT_CODES, ROUND_MODES

DESCRIPTOR_KINDS = tuple(k for k in KIND_REGISTERS if k.ENGINE is Engine.TIU) + tuple(k for k in KIND_REGISTERS if k.ENGINE is Engine.GDMA)
TILE_KINDS = (TMatmul, AccCvt, TPush)
PRECS = [int(p) for p in Prec]


def _long_field(cls, name):
    """The logical field of `name` in the kind's long (last) register."""
    return codec_for(cls).forms[-1].layout.fields[name]


def value_strategy(lo: int, hi: int, default=None):
    """Mostly small or default values (so short forms get exercised), sometimes the extremes."""
    choices = [st.integers(max(lo, 0), min(hi, 15)), st.integers(lo, hi), st.sampled_from([lo, hi])]
    if default is not None:
        choices.insert(0, st.just(default))
    return st.one_of(*choices)


@st.composite
def descriptor_instruction(draw, cls):
    """A random legal instruction of a TIU / GDMA kind: every field anywhere in its long-form range."""
    if cls is SgTiu:
        return draw(sg_instruction())
    codec = codec_for(cls)
    use_defaults = draw(st.booleans())
    values = {}
    for f in dataclasses.fields(cls):
        if f.name == "op":
            values["op"] = draw(st.sampled_from(sorted(cls.OPS)))
            continue
        if f.default is None:   # derived from other fields when left at None (ConvTiu / Mm2Tiu signs)
            values[f.name] = None
            continue
        default = None if f.default is dataclasses.MISSING else f.default
        if (use_defaults or f.name not in codec.forms[-1].layout.fields) and default is not None:
            values[f.name] = default
            continue
        lfield = _long_field(cls, f.name)
        if f.name in ADDRESS_FIELDS:  # DDR, or tpu-mlir's L2 / LMEM memory tags
            values[f.name] = draw(st.one_of(value_strategy(0, (1 << 40) - 1, default),
                                            st.sampled_from([30, 31]).map(lambda t: t << 40),
                                            st.integers(0, (1 << 40) - 1).map(lambda a: a | 31 << 40)))
        elif (f.name.startswith("opt_") and f.name.endswith("_prec")) or f.name == "src_data_format":
            values[f.name] = draw(st.sampled_from(PRECS))
        else:
            values[f.name] = draw(value_strategy(lfield.lo, lfield.hi, default))
    for c in codec.const_operands:
        if values[c.const] and c.prec and not Prec(values[c.prec]).is_float:
            values[c.addr] = draw(value_strategy(*INT32_CONST_RANGE))
    if cls is ConvTiu and draw(st.booleans()):  # the cube-aligned weight layout, when sCONV can hold the rest
        aligned = dict(values, weight_ic_block=ConvTiu.ALIGNED_IC_BLOCK.get(values["opt_opd0_prec"], 1))
        if codec.forms[0].try_pack(aligned, codec.derive(aligned), strict=False) is not None:
            values = aligned
    if cls is Mm2Tiu and draw(st.booleans()):  # shapes consistent with the op (sMM2 candidates)
        from tpuflow.codegen.sg2260 import _mm2_opd0
        values["opd0_c"], values["opd0_w"] = _mm2_opd0(values)
    return cls(**values)


@st.composite
def sg_instruction(draw):
    """A random legal SgTiu: shapes in the 16-bit fields, LMEM addresses, the table in res0's precision, a U8 /
    U16 index, either table layout, the fill / limit flags and value anywhere."""
    dim = value_strategy(1, (1 << 16) - 1)
    addr = value_strategy(0, (1 << 29) - 1)
    prec = draw(st.sampled_from(PRECS))
    return SgTiu(op=draw(st.sampled_from(sorted(SgTiu.OPS))), res0_addr=draw(addr), res0_n=draw(dim),
                 res0_c=draw(dim), res0_w=draw(dim), opd0_addr=draw(addr), opd0_w=draw(dim), opd1_addr=draw(addr),
                 short_opd0_str=draw(st.sampled_from([0, 4])), opd2_addr=draw(value_strategy(0, (1 << 32) - 1, 0)),
                 opt_opd2_const=draw(st.integers(0, 1)), opt_opd3_const=draw(st.integers(0, 1)),
                 cmd_id_dep=draw(value_strategy(0, (1 << 23) - 1, 0)), opt_res0_prec=prec, opt_opd0_prec=prec,
                 opt_opd1_prec=draw(st.sampled_from([int(Prec.INT8), int(Prec.INT16)])))


def any_descriptor_instruction():
    return st.sampled_from(DESCRIPTOR_KINDS).flatmap(descriptor_instruction)


def _range(layout, name):
    f = layout.fields[name]
    return st.integers(f.lo, f.hi)


def _waits():
    iod = linx.B_IOD.fields["id"]
    return {"wait_tiu_id": value_strategy(0, iod.hi, 0), "wait_gdma_id": value_strategy(0, iod.hi, 0)}


def _dim():
    f = linx.B_DIM.fields["uimm"]
    return value_strategy(f.lo, f.hi)


@st.composite
def tmatmul(draw):
    fn = draw(st.sampled_from(sorted(TMatmul.FN)))
    src = _range(linx.B_IOT2, "src0")
    return TMatmul(fn=fn, dt=draw(st.sampled_from(sorted(DT_CODES))), m=draw(_dim()), n=draw(_dim()),
                   k=draw(_dim()), src0=draw(src), src1=draw(src), acc_size=draw(_range(linx.B_IOT2, "size")),
                   bias_src=draw(src) if fn.endswith(".BIAS") else -1, reuse0=draw(st.integers(0, 1)),
                   reuse1=draw(st.integers(0, 1)), **{k: draw(v) for k, v in _waits().items()})


@st.composite
def acccvt(draw):
    return AccCvt(layout=draw(st.sampled_from(sorted(LAYOUT_CODES))), row=draw(_dim()), col=draw(_dim()),
                  dst_queue=draw(st.integers(0, 3)), dst_size=draw(_range(linx.B_IOT0, "size")),
                  src_dt=draw(st.sampled_from(sorted(DT_CODES))), dst_dt=draw(st.sampled_from(sorted(DT_CODES))),
                  canon=draw(st.integers(0, 1)), round_mode=draw(st.sampled_from(sorted(ROUND_MODES))),
                  saturate=draw(st.integers(0, 1)), **{k: draw(v) for k, v in _waits().items()})


@st.composite
def tpush(draw):
    return TPush(dst_queue=draw(st.integers(0, 3)), dst_size=draw(_range(linx.B_IOT0, "size")),
                 dt=draw(st.sampled_from(sorted(DT_CODES))), **{k: draw(v) for k, v in _waits().items()})


TILE_STRATEGIES = {TMatmul: tmatmul, AccCvt: acccvt, TPush: tpush}


def any_tile_instruction():
    return st.one_of(tmatmul(), acccvt(), tpush())


assert set(TIU_KINDS) | set(GDMA_KINDS) <= set(DESCRIPTOR_KINDS)  # every ISA kind has registers
