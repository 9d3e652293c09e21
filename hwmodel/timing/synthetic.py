"""Hand-built programs for timing tests and benchmarks: instruction constructors and a ProgramBuilder that
fills in waits by the chunk-bitmap rule (the same rule the IFE check re-derives), in issue order."""

from __future__ import annotations

import dataclasses

from tpuflow.chip import ChipConfig
from tpuflow.hwmodel.timing.deps import ChunkTables
from tpuflow.isa import (Accesses, ArTiu, ConvTiu, Engine, GeneralDma, Instruction, Mm2Tiu, Prec, TensorDma,
                         TileQueues, TImg2Col, TMove, TPush, aligned_strides, global_lmem_address)
from tpuflow.isa.ids import IdFields, clamp
from tpuflow.isa.tile import TileInstruction, sys_tile_wait
from tpuflow.program import Program

FP32 = int(Prec.FP32)
INT8 = int(Prec.INT8)


def lmem_strides(shape, prec: int, chip: ChipConfig, addr: int = 0) -> tuple[int, int, int, int]:
    eu = chip.core.eu_bytes_per_lane // Prec(prec).bytes
    return aligned_strides(tuple(shape), eu, chip.lanes, (addr // chip.lmem_bytes_per_lane) % chip.lanes)


def _nchw(shape) -> tuple[int, int, int, int]:
    n, c, h, w = shape
    return (c * h * w, h * w, w, 1)


def load(chip: ChipConfig, ddr: int, lmem: int, shape, prec: int = FP32, ddr_strides=None) -> TensorDma:
    """DDR (NCHW strides, contiguous by default) -> LMEM (aligned layout at flat address `lmem`)."""
    src, dst = tuple(ddr_strides or _nchw(shape)), lmem_strides(shape, prec, chip, lmem)
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
        self.tile_waited = [0, 0]

    def _accesses(self, instr: Instruction) -> Accesses:
        if isinstance(instr, (TMove, TImg2Col)):      # addressed tile-buffer blocks: their own bytes
            return instr.accesses(self.chip)
        if isinstance(instr, TileInstruction):
            reads, writes = self.tile_queues.step(instr)
            if isinstance(instr, TPush):
                reads, writes = writes, []
            return Accesses(lmem_reads=tuple(s.lmem_range(self.chip) for s in reads),
                            lmem_writes=tuple(s.lmem_range(self.chip) for s in writes))
        return instr.accesses(self.chip)

    def add(self, instr: Instruction, dep: int | None = None) -> int:
        engine = instr.ENGINE
        code = engine.code
        acc = self._accesses(instr)
        found = self.tables.conflicts(acc.lmem_reads, acc.lmem_writes)
        n = [len(self.queues[e]) for e in Engine]
        bits = IdFields.of(self.chip).bits(engine)
        if dep is None:
            if engine is not Engine.TILE and found[2] > self.tile_waited[code]:
                wait = sys_tile_wait(engine, int(found[2]))
                self._append(wait.with_waits([clamp(0, k, bits) for k in n]))
                self.tile_waited[code] = int(found[2])
            instr = instr.with_waits([clamp(int(f), k, bits) for f, k in zip(found, n)])
        elif engine is not Engine.TILE:
            instr = dataclasses.replace(instr, cmd_id_dep=dep)
        cmd_id = self._append(instr)
        self.tables.record(code, cmd_id, acc.lmem_reads, acc.lmem_writes)
        return cmd_id

    def _append(self, instr: Instruction) -> int:
        q = self.queues[instr.ENGINE]
        q.append(instr)
        self.order.append(instr.ENGINE.letter)
        return len(q)

    def build(self) -> Program:
        return Program(chip=self.chip, tiu=list(self.queues[Engine.TIU]), gdma=list(self.queues[Engine.GDMA]),
                       tile=list(self.queues[Engine.TILE]), issue_order="".join(self.order))


# ---------------------------------------------------------------- a ResNet-50-sized synthetic program

RESNET50_STAGES = ((64, 256, 3, 1), (128, 512, 4, 2), (256, 1024, 6, 2), (512, 2048, 3, 2))


def resnet50_convs() -> list[tuple[int, int, int, int, int, bool]]:
    """(cin, cout, input size, kernel, stride, ends_block) of ResNet-50 v1.5's convolutions, 224x224 input."""
    convs = [(3, 64, 224, 7, 2, False)]
    cin, size = 64, 56
    for mid, out, blocks, stride in RESNET50_STAGES:
        for blk in range(blocks):
            s = stride if blk == 0 else 1
            convs.append((cin, mid, size, 1, 1, False))
            convs.append((mid, mid, size, 3, s, False))
            size = size // s
            if blk == 0:
                convs.append((cin, out, size * s, 1, s, False))   # downsample shortcut
            convs.append((mid, out, size, 1, 1, True))
            cin = out
    return convs


class _Lowering:
    """A small stand-in for the real lowering: output-channel chunks x output-row tiles x input-channel
    chunks (partial sums accumulate with opt_res_add), one input and one weight slice load per chunk,
    double-buffered LMEM slots, one store per tile (residual: load + add + relu first)."""

    IN, WGT, OUT = (0, 48 << 10), (96 << 10, 128 << 10), (160 << 10, 200 << 10)
    IN_BYTES, WGT_BYTES, OUT_BYTES = 16 << 10, 32 << 10, 8 << 10
    COUT_CHUNK, CIN_CHUNK = 128, 32

    def __init__(self, chip: ChipConfig, prec: int):
        self.chip, self.prec, self.es = chip, prec, Prec(prec).bytes
        self.b = ProgramBuilder(chip)
        self.ddr = 0
        self.turn = 0

    def alloc(self, nbytes: int) -> int:
        addr = self.ddr
        self.ddr += -(-nbytes // 4096) * 4096
        return addr

    def conv(self, cin, cout, size, k, stride, src: int, residual: int | None) -> int:
        pad = k // 2
        out_size = (size + 2 * pad - k) // stride + 1
        dst = self.alloc(cout * out_size * out_size * self.es)
        wgt = self.alloc(cout * cin * k * k * self.es)
        layer = (cin, cout, size, k, stride, pad, out_size, src, dst, wgt, residual)
        rows = self._rows(cin, cout, size, out_size, k, stride)
        for c0 in range(0, cout, self.COUT_CHUNK):
            for r0 in range(0, out_size, rows):
                self._tile(layer, c0, min(self.COUT_CHUNK, cout - c0), r0, min(rows, out_size - r0))
        return dst

    def _per_lane(self, channels: int, elements: int) -> int:
        eu = self.chip.core.eu_bytes_per_lane // self.es
        return -(-channels // self.chip.lanes) * -(-elements // eu) * eu * self.es

    def _rows(self, cin, cout, size, out_size, k, stride) -> int:
        rows = out_size
        cc, ci = min(cout, self.COUT_CHUNK), min(cin, self.CIN_CHUNK)
        while rows > 1 and (self._per_lane(cc, rows * out_size) > self.OUT_BYTES
                            or self._per_lane(ci, ((rows - 1) * stride + k) * size) > self.IN_BYTES):
            rows = -(-rows // 2)
        return rows

    def _tile(self, layer, c0: int, cc: int, r0: int, th: int) -> None:
        cin, cout, size, k, stride, pad, out_size, src, dst, wgt, residual = layer
        chip, es, b, prec = self.chip, self.es, self.b, self.prec
        oslot = self.OUT[self.turn % 2]
        top = max(0, r0 * stride - pad)
        bottom = min(size, (r0 + th - 1) * stride - pad + k)
        for i0 in range(0, cin, self.CIN_CHUNK):
            ci = min(self.CIN_CHUNK, cin - i0)
            self.turn += 1
            islot, wslot = self.IN[self.turn % 2], self.WGT[self.turn % 2]
            b.add(load(chip, src + (i0 * size + top) * size * es, islot, (1, ci, bottom - top, size), prec,
                       ddr_strides=(cin * size * size, size * size, size, 1)))
            b.add(load(chip, wgt + (c0 * cin + i0) * k * k * es, wslot, (1, cc, 1, ci * k * k), prec,
                       ddr_strides=(cout * cin * k * k, cin * k * k, ci * k * k, 1)))
            instr = conv(oslot, islot, wslot, n=1, cin=ci, h=bottom - top, w=size, cout=cc, k=k, stride=stride,
                         pad=pad, prec=prec)
            b.add(dataclasses.replace(instr, res0_h=th, opd0_up_pad=pad if r0 == 0 else 0,
                                      opd0_dn_pad=pad if r0 + th == out_size else 0, opt_res_add=int(i0 > 0)))
        shape = (1, cc, th, out_size)
        base = ((c0 * out_size) + r0) * out_size * es
        strides = (cout * out_size * out_size, out_size * out_size, out_size, 1)
        if residual is not None:
            islot = self.IN[(self.turn + 1) % 2]
            b.add(load(chip, residual + base, islot, shape, prec, ddr_strides=strides))
            b.add(ar("add", oslot, oslot, islot, shape, prec))
            b.add(ar("max", oslot, oslot, None, shape, prec, b_const=0))
        st = store(chip, oslot, dst + base, shape, prec)
        b.add(dataclasses.replace(st, dst_nstride=strides[0], dst_cstride=strides[1]))
        self.turn += 1


def resnet50_like(chip: ChipConfig, prec: int = FP32) -> Program:
    """A program with ResNet-50's convolutions, DMA volume and instruction mix, lowered the simple way:
    per conv, output-channel chunks whose weights fit a 64 KiB/lane slot, output-row tiles, one input
    load, one CONV and one store per tile (residual: load + add + relu), double-buffered LMEM slots."""
    low = _Lowering(chip, prec)
    x = low.alloc(3 * 224 * 224 * Prec(prec).bytes)
    block_in = shortcut = None
    for cin, cout, size, k, stride, ends in resnet50_convs():
        if k == 1 and cin != cout and cout >= 256 and not ends and block_in is not None:
            shortcut = low.conv(cin, cout, size, k, stride, block_in, None)
            continue
        if block_in is None or (k == 1 and not ends and shortcut is not None and cin >= 256):
            block_in = x
        x = low.conv(cin, cout, size, k, stride, x, shortcut if ends else None)
        if ends:
            block_in, shortcut = x, x
        if cin == 3:
            x = low.conv(64, 64, 112, 3, 2, x, None)    # stands in for the 3x3/2 max pool
            block_in, shortcut = x, None
    return low.b.build()
