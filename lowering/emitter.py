"""Emitter: appends instructions (in issue order, tagged with their layer) and builds TIU/GDMA
instructions from LTile / DRegion handles."""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

import numpy as np

from tpuflow.chip import ChipConfig
from tpuflow.isa import (ArTiu, CmpTiu, Engine, GeneralDma, Instruction, LinTiu, PordTiu, Prec, SfuTiu,
                         StrideMode, TensorDma, global_lmem_address)
from tpuflow.isa.base import aligned_strides, lmem_ranges
from tpuflow.errors import LoweringError
from tpuflow.lowering.tensors import DRegion, LTile

MAX_DMA_DIM = 65535


def f32_bits(value: float) -> int:
    return struct.unpack("<I", struct.pack("<f", float(value)))[0]


def const_bits(value: float, prec: Prec) -> int:
    """Bits of a scalar as the constant_value of a GDMA fill in `prec`."""
    if prec == Prec.FP32:
        return f32_bits(value)
    if prec == Prec.FP16:
        return int(np.array([value], np.float16).view(np.uint16)[0])
    if prec == Prec.BF16:
        return f32_bits(value) >> 16
    return int(value) & 0xFFFFFFFF


@dataclass
class Record:
    engine: Engine
    instr: Instruction
    layer: str


class Emitter:
    """Collects the instruction stream of a compilation in issue order."""

    def __init__(self, chip: ChipConfig):
        self.chip = chip
        self.records: list[Record] = []
        self.layer = ""

    # ------------------------------------------------------------ raw append
    def tiu(self, instr: Instruction) -> None:
        self.records.append(Record(Engine.TIU, instr, self.layer))

    def gdma(self, instr: Instruction) -> None:
        self.records.append(Record(Engine.GDMA, instr, self.layer))

    def tile(self, instr: Instruction) -> None:
        self.records.append(Record(Engine.TILE, instr, self.layer))

    # ------------------------------------------------------------ DMA
    def _lmem_side(self, t: LTile) -> tuple[int, tuple, tuple]:
        return global_lmem_address(t.addr, self.chip), t.shape, t.strides

    def load(self, dst: LTile, src: DRegion) -> None:
        """DDR region -> LMEM tile (same element count; reshapes allowed)."""
        self._tensor_dma(src.addr, src.shape, src.strides, *self._lmem_side(dst), src.prec)

    def store(self, src: LTile, dst: DRegion) -> None:
        self._tensor_dma(*self._lmem_side(src), dst.addr, dst.shape, dst.strides, dst.prec)

    def lmem_copy(self, dst: LTile, src: LTile) -> None:
        self._tensor_dma(*self._lmem_side(src), *self._lmem_side(dst), src.prec)

    def region_copy(self, dst: DRegion, src: DRegion) -> None:
        """Strided copy between two regions (DDR or LMEM-window addresses; shapes may differ,
        element counts agree)."""
        if src.shape == dst.shape:
            for s_addr, d_addr, shape, s_st, d_st in _split_big_dims(src, dst):
                self._tensor_dma(s_addr, shape, s_st, d_addr, shape, d_st, src.prec)
            return
        self._tensor_dma(src.addr, src.shape, src.strides, dst.addr, dst.shape, dst.strides, src.prec)

    def fill(self, dst: LTile | DRegion, value: float) -> None:
        if isinstance(dst, LTile):
            addr, shape, strides = self._lmem_side(dst)
        else:
            addr, shape, strides = dst.addr, dst.shape, dst.strides
        prec = dst.prec
        self.gdma(TensorDma(src_start_addr=0, dst_start_addr=addr, **_sizes("src", shape, strides),
                            **_sizes("dst", shape, strides), src_data_format=int(prec),
                            fill_constant_en=1, constant_value=const_bits(value, prec)))

    def broadcast_load(self, dst: LTile, src_addr: int, prec: Prec) -> None:
        """One row of `dst.w` elements at src_addr, replicated into every channel of `dst`
        (DDR channel stride 0)."""
        n, c, h, w = dst.shape
        lanes, lb = self.chip.lanes, self.chip.lmem_bytes_per_lane
        if n == 1 and h == 1 and (dst.addr // lb) % lanes + c <= lanes:
            # read the row once and write it into every lane (dma.general.broadcast)
            self.gdma(GeneralDma(op="broadcast", src_start_addr=src_addr, dst_start_addr=self._lmem_side(dst)[0],
                                 src_cstride=w, dst_csize=c, src_data_format=int(prec)))
            return
        src_strides = (0, 0, w, 1)
        self._tensor_dma(src_addr, dst.shape, src_strides, *self._lmem_side(dst), prec)

    def _tensor_dma(self, s_addr, s_shape, s_strides, d_addr, d_shape, d_strides, prec: Prec) -> None:
        if math.prod(s_shape) != math.prod(d_shape):
            raise LoweringError(f"layer {self.layer}: DMA shapes {s_shape} -> {d_shape} differ in size")
        for dims in (s_shape, d_shape):
            if max(dims) > MAX_DMA_DIM:
                raise LoweringError(f"layer {self.layer}: DMA dimension {max(dims)} exceeds {MAX_DMA_DIM}")
        self.gdma(TensorDma(src_start_addr=s_addr, dst_start_addr=d_addr, **_sizes("src", s_shape, s_strides),
                            **_sizes("dst", d_shape, d_strides), src_data_format=int(prec)))

    def general_copy(self, dst_addr: int, src_addr: int, elements: int, prec: Prec) -> None:
        self.gdma(GeneralDma(src_start_addr=src_addr, dst_start_addr=dst_addr, src_cstride=elements,
                             src_data_format=int(prec)))

    # ------------------------------------------------------------ TIU helpers
    def ar(self, op: str, dst: LTile, a, b=None, round_mode: int | None = None) -> None:
        f = dst.fields("res0", with_shape=True)
        f.update(operand_fields("opd0", a, dst.prec))
        if b is not None:
            f.update(operand_fields("opd1", b, dst.prec))
        if round_mode is not None:
            f.update(opd2_addr=round_mode, opt_opd2_const=1)
        self.tiu(ArTiu(op=op, **f))

    def lin(self, op: str, dst: LTile, a, b, c=None) -> None:
        """dst = a * b + c (lin.mac) as two arith instructions, a multiply into dst and then the add
        (fp32 arithmetic rounded to dst after each, as lin.mac's fp32 a * b + c is): tpu-mlir 1.30.2
        renders no LIN record (no converter for the long LIN; sLIN's opd2_addr sits past its 288-bit
        record, python/debugger/target_1690/regdef.py). A c that overlaps dst keeps lin.mac."""
        if op == "mac" and not self._overlaps(c, dst):
            self.tiu(_arith("mul", dst, a, b))
            self.tiu(_arith("add", dst, dst, c))
            return
        f = dst.fields("res0", with_shape=True)
        f.update(operand_fields("opd0", a, dst.prec))
        f.update(operand_fields("opd1", b, dst.prec))
        if c is not None:
            f.update(operand_fields("opd2", c, dst.prec))
        self.tiu(LinTiu(op=op, **f))

    def cmp(self, op: str, dst: LTile, a, b, x, y) -> None:
        f = dst.fields("res0", with_shape=True)
        for prefix, v in (("opd0", a), ("opd1", b), ("opd2", x)):   # sCMP holds no strides
            keep = prefix == "opd2" and isinstance(y, LTile)              # opd3 follows opd2's strides
            f.update(operand_fields(prefix, v if keep else settled(v, self.chip), dst.prec))
        f.update(_compare_scalar(a, b, f))
        if isinstance(y, LTile):
            f.update(opd3_addr=y.addr)
        else:
            f.update(opd3_addr=f32_bits(y), opt_opd3_const=1)
        self.tiu(CmpTiu(op=op, **f))

    def sfu(self, op: str, dst: LTile, src: LTile, table_addr: int = 0, terms: int = 0, res1: LTile | None = None):
        f = dst.fields("res0", with_shape=True)
        f.update(src.fields("opd0"))
        self.tiu(SfuTiu(op=op, opd1_addr=table_addr, opd1_n=terms, res1_addr=res1.addr if res1 else 0, **f))

    def row_pool(self, op: str, dst: LTile, src: LTile, scale: float = 1.0) -> None:
        """Reduce each channel's whole (h, w) plane: dst (n, c, 1, 1) = pool over src (n, c, h, w)."""
        f = dst.fields("res0", with_shape=True)
        f.update(src.fields("opd0"))
        f.update(pool_scale_fields(op, src.prec, scale))
        self.tiu(PordTiu(op=op, opd0_h=src.h, opd0_w=src.w, opd1_h=src.h, opd1_w=src.w, **f))

    def _overlaps(self, x, dst: LTile) -> bool:
        """Whether operand x (an LTile or a scalar) shares LMEM bytes with dst."""
        if not isinstance(x, LTile):
            return False
        mine = lmem_ranges(dst.addr, dst.shape, dst.strides, dst.prec.bytes, self.chip)
        return any(r.overlaps(o) for r in lmem_ranges(x.addr, x.shape, x.strides, x.prec.bytes, self.chip)
                   for o in mine)


def _arith(op: str, dst: LTile, a, b) -> ArTiu:
    """An arith instruction whose float scalars are fp32 constants (opt_X_prec = FP32): tpu-mlir reads a
    constant in its operand's precision, so a 16-bit result keeps its scalars in fp32 bits."""
    const_prec = Prec.FP32 if dst.prec.is_float else dst.prec
    f = dst.fields("res0", with_shape=True)
    f.update(operand_fields("opd0", a, const_prec))
    f.update(operand_fields("opd1", b, const_prec))
    return ArTiu(op=op, **f)


def _compare_scalar(a, b, fields: dict) -> dict:
    """opd1 fields of a scalar b compared as a float (fields: the instruction's so far): in a 16-bit
    float tile a's precision when b is exact there (sCMP reads opd1 in opd0's precision, tpu-mlir
    1.30.2 opparam.py sCMP_converter; CmpTiu reads an fp16 constant from the low 16 bits), else fp32
    bits with opt_opd1_prec FP32. A tile or an integer constant b: no change."""
    if isinstance(b, LTile) or not Prec(fields["opt_opd1_prec"]).is_float:
        return {}
    b = float(b)
    if isinstance(a, LTile) and a.prec in (Prec.FP16, Prec.BF16):
        bits = narrow_bits(b, a.prec)
        narrowed = float(np.array([bits], np.uint16).view(np.float16)[0]) if a.prec == Prec.FP16 else \
            float(np.array([bits], np.uint32).view(np.float32)[0])
        if narrowed == b:
            return {"opd1_addr": bits, "opt_opd1_prec": int(a.prec)}
    return {"opd1_addr": f32_bits(b), "opt_opd1_prec": int(Prec.FP32)}


def settled(x, chip: ChipConfig):
    """x itself, or for a FREE-strided LTile that reads exactly the elements of the aligned layout
    (a stride only matters along an axis of size > 1, and the channel stride only when the channels
    wrap past the last lane) the same tile in the ALIGNED mode, which the short descriptors hold. A pure
    broadcast (every stride 0) stays as written (sCMP / sAR hold it as it is)."""
    if not isinstance(x, LTile) or x.mode != StrideMode.FREE or not any(x.strides):
        return x
    start = (x.addr // chip.lmem_bytes_per_lane) % chip.lanes
    eu = chip.core.eu_bytes_per_lane // x.prec.bytes
    aligned = aligned_strides(x.shape, eu, chip.lanes, start)
    used = (x.n > 1, start + x.c > chip.lanes, x.h > 1, x.w > 1)
    if any(u and s != a for u, s, a in zip(used, x.strides, aligned)):
        return x
    return LTile(x.addr, x.shape, x.prec, aligned, StrideMode.ALIGNED)


def pool_scale_fields(op: str, prec: Prec, scale: float = 1.0) -> dict:
    """opd1 of a float pooling carries opd0's precision (tpu-mlir 1.30.2's sPorD_converter reads opd1 in
    opd0's precision, python/debugger/target_1690/opparam.py); average pooling's scale is then the
    constant in that precision, rounded to nearest (narrow_bits)."""
    if not prec.is_float:
        return {"opd1_addr": f32_bits(scale), "opt_opd1_const": 1} if op == "avgpooling" else {}
    fields = {"opt_opd1_prec": int(prec)}
    if op == "avgpooling":
        fields.update(opd1_addr=narrow_bits(scale, prec), opt_opd1_const=1)
    return fields


def narrow_bits(value: float, prec: Prec) -> int:
    """A float scalar rounded to nearest even in `prec`, as tpu-mlir 1.30.2 reads a constant of that
    precision (target_common/op_support.py Scalar): fp16 in the low 16 bits; fp32, and bf16 as the
    fp32 bits of the bf16 value (low 16 bits 0)."""
    if prec == Prec.FP16:
        return int(np.array([value], np.float16).view(np.uint16)[0])
    bits = f32_bits(value)
    if prec == Prec.BF16:
        return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return bits


def operand_fields(prefix: str, x, prec: Prec) -> dict:
    """Fields of a TIU operand: an LTile, or a python scalar (fp32 bits / int32 constant)."""
    if isinstance(x, LTile):
        return x.fields(prefix)
    if isinstance(x, (int, np.integer)) and not prec.is_float:
        return {f"{prefix}_addr": int(x), f"opt_{prefix}_const": 1, f"opt_{prefix}_prec": int(prec)}
    return {f"{prefix}_addr": f32_bits(float(x)), f"opt_{prefix}_const": 1,
            f"opt_{prefix}_prec": int(prec if prec.is_float else Prec.FP32)}


def _sizes(side: str, shape, strides) -> dict:
    out = {}
    for d, size, stride in zip("nchw", shape, strides):
        out[f"{side}_{d}size"] = size
        out[f"{side}_{d}stride"] = stride
    return out


def _split_big_dims(src: DRegion, dst: DRegion):
    """Cut a same-shape copy into pieces whose dimensions fit the 16-bit size fields."""
    shape = list(src.shape)
    big = [i for i, s in enumerate(shape) if s > MAX_DMA_DIM]
    if not big:
        yield src.addr, dst.addr, tuple(shape), src.strides, dst.strides
        return
    i = big[0]
    step = MAX_DMA_DIM
    for start in range(0, shape[i], step):
        count = min(step, shape[i] - start)
        sub = list(shape)
        sub[i] = count
        s = DRegion(src.addr + start * src.strides[i] * src.prec.bytes, tuple(sub), src.strides, src.prec)
        d = DRegion(dst.addr + start * dst.strides[i] * dst.prec.bytes, tuple(sub), dst.strides, dst.prec)
        yield from _split_big_dims(s, d)
