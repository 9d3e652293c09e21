"""Hand-built programs for timing tests and benchmarks: instruction constructors and a ProgramBuilder that
fills in waits by the chunk-bitmap rule (the same rule the IFE check re-derives), in issue order."""

from __future__ import annotations

import dataclasses

from tpuflow.chip import ChipConfig
from tpuflow.hwmodel.timing.deps import ENGINE_CODE, ChunkTables
from tpuflow.isa import (TILE_WAIT_TAG, Accesses, ArTiu, ConvTiu, Engine, GeneralDma, Instruction, Mm2Tiu, Prec,
                         SysDma, SysTiu, TensorDma, TileQueues, TPush, aligned_strides, global_lmem_address)
from tpuflow.isa.tile import TileInstruction
from tpuflow.program import Program

FP32 = int(Prec.FP32)
INT8 = int(Prec.INT8)


def lmem_strides(shape, prec: int, chip: ChipConfig, addr: int = 0) -> tuple[int, int, int, int]:
    eu = chip.core.eu_bytes_per_lane // Prec(prec).bytes
    return aligned_strides(tuple(shape), eu, chip.lanes, (addr // chip.lmem_bytes_per_lane) % chip.lanes)


def _nchw(shape) -> tuple[int, int, int, int]:
    n, c, h, w = shape
    return (c * h * w, h * w, w, 1)


def load(chip: ChipConfig, ddr: int, lmem: int, shape, prec: int = FP32) -> TensorDma:
    """DDR (contiguous NCHW) -> LMEM (aligned layout at flat address `lmem`)."""
    src, dst = _nchw(shape), lmem_strides(shape, prec, chip, lmem)
    return TensorDma(src_start_addr=ddr, dst_start_addr=global_lmem_address(lmem, chip),
                     src_nsize=shape[0], src_csize=shape[1], src_hsize=shape[2], src_wsize=shape[3],
                     src_nstride=src[0], src_cstride=src[1], src_hstride=src[2], src_wstride=src[3],
                     dst_nsize=shape[0], dst_csize=shape[1], dst_hsize=shape[2], dst_wsize=shape[3],
                     dst_nstride=dst[0], dst_cstride=dst[1], dst_hstride=dst[2], dst_wstride=dst[3],
                     src_data_format=prec)


def store(chip: ChipConfig, lmem: int, ddr: int, shape, prec: int = FP32) -> TensorDma:
    """LMEM (aligned layout) -> DDR (contiguous NCHW)."""
    src, dst = lmem_strides(shape, prec, chip, lmem), _nchw(shape)
    return TensorDma(src_start_addr=global_lmem_address(lmem, chip), dst_start_addr=ddr,
                     src_nsize=shape[0], src_csize=shape[1], src_hsize=shape[2], src_wsize=shape[3],
                     src_nstride=src[0], src_cstride=src[1], src_hstride=src[2], src_wstride=src[3],
                     dst_nsize=shape[0], dst_csize=shape[1], dst_hsize=shape[2], dst_wsize=shape[3],
                     dst_nstride=dst[0], dst_cstride=dst[1], dst_hstride=dst[2], dst_wstride=dst[3],
                     src_data_format=prec)


def copy_bytes(chip: ChipConfig, src: int, dst: int, nbytes: int, *, src_lmem=False, dst_lmem=False) -> GeneralDma:
    """dma.general of `nbytes` (int8 elements); LMEM endpoints are flat addresses in one lane."""
    s = global_lmem_address(src, chip) if src_lmem else src
    d = global_lmem_address(dst, chip) if dst_lmem else dst
    return GeneralDma(src_start_addr=s, dst_start_addr=d, src_cstride=nbytes, src_data_format=INT8)


def ar(op: str, res: int, a: int, b: int | None, shape, prec: int = FP32, b_const: int | None = None) -> ArTiu:
    """Elementwise res = op(a, b) over `shape` (aligned layouts); b_const makes opd1 a constant."""
    n, c, h, w = shape
    kw = dict(op=op, res0_addr=res, res0_n=n, res0_c=c, res0_h=h, res0_w=w, opd0_addr=a,
              opt_res0_prec=prec, opt_opd0_prec=prec, opt_opd1_prec=prec)
    if b_const is not None:
        kw.update(opd1_addr=b_const, opt_opd1_const=1)
    elif b is not None:
        kw.update(opd1_addr=b)
    return ArTiu(**kw)


def conv(res: int, inp: int, wgt: int, *, n: int, cin: int, h: int, w: int, cout: int, k: int = 3,
         stride: int = 1, pad: int = 1, prec: int = FP32) -> ConvTiu:
    oh, ow = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
    return ConvTiu(res0_addr=res, res0_n=n, res0_c=cout, res0_h=oh, res0_w=ow, opd0_addr=inp, opd0_c=cin,
                   opd0_h=h, opd0_w=w, opd1_addr=wgt, opd1_h=k, opd1_w=k, opd0_up_pad=pad, opd0_dn_pad=pad,
                   opd0_lf_pad=pad, opd0_rt_pad=pad, res_op_x_str=stride, res_op_y_str=stride,
                   opt_res0_prec=prec, opt_opd0_prec=prec, opt_opd1_prec=prec, opt_opd2_prec=prec)


def matmul(res: int, left: int, right: int, m: int, k: int, n: int, prec: int = FP32) -> Mm2Tiu:
    return Mm2Tiu(op="nn", res0_addr=res, res0_c=m, res0_w=n, opd0_addr=left, opd0_c=m, opd0_w=k,
                  opd1_addr=right, opd1_c=k, opd1_w=n, opt_res0_prec=prec, opt_opd0_prec=prec,
                  opt_opd1_prec=prec, opt_opd2_prec=prec)


class ProgramBuilder:
    """Append instructions in issue order. `add(instr)` sets its waits by the chunk-bitmap rule (and puts
    a SYS tile wait before a TIU/GDMA instruction that conflicts with TILE); `add(instr, dep=k)` keeps
    what you give it (cmd_id_dep = k, or the TILE waits as constructed)."""

    def __init__(self, chip: ChipConfig):
        self.chip = chip
        self.queues: dict[Engine, list[Instruction]] = {Engine.TIU: [], Engine.GDMA: [], Engine.TILE: []}
        self.order: list[str] = []
        self.tables = ChunkTables(Program(chip=chip))
        self.tile_queues = TileQueues(chip.tile.queue_slots)

    def _accesses(self, instr: Instruction) -> Accesses:
        if isinstance(instr, TileInstruction):
            reads, writes = self.tile_queues.step(instr)
            if isinstance(instr, TPush):
                reads, writes = writes, []
            return Accesses(lmem_reads=tuple(s.lmem_range(self.chip) for s in reads),
                            lmem_writes=tuple(s.lmem_range(self.chip) for s in writes))
        return instr.accesses(self.chip)

    def add(self, instr: Instruction, dep: int | None = None) -> int:
        engine = instr.ENGINE
        code = ENGINE_CODE[engine]
        acc = self._accesses(instr)
        found = self.tables.conflicts(acc.lmem_reads, acc.lmem_writes)
        if dep is None:
            if engine is Engine.TILE:
                instr = dataclasses.replace(instr, wait_tiu_id=int(found[0]), wait_gdma_id=int(found[1]))
            else:
                if found[2]:
                    self._append(self._tile_wait(engine, int(found[2])))
                instr = dataclasses.replace(instr, cmd_id_dep=int(found[1 - code]))
        elif engine is not Engine.TILE:
            instr = dataclasses.replace(instr, cmd_id_dep=dep)
        cmd_id = self._append(instr)
        self.tables.record(code, cmd_id, acc.lmem_reads, acc.lmem_writes)
        return cmd_id

    @staticmethod
    def _tile_wait(engine: Engine, block: int) -> Instruction:
        if engine is Engine.TIU:
            return SysTiu(op="wait_msg", reg_idx=TILE_WAIT_TAG, imm=block)
        return SysDma(op="sys_wait", index=TILE_WAIT_TAG, constant_value=block)

    def _append(self, instr: Instruction) -> int:
        q = self.queues[instr.ENGINE]
        q.append(instr)
        self.order.append(instr.ENGINE.letter)
        return len(q)

    def build(self) -> Program:
        return Program(chip=self.chip, tiu=list(self.queues[Engine.TIU]), gdma=list(self.queues[Engine.GDMA]),
                       tile=list(self.queues[Engine.TILE]), issue_order="".join(self.order))
