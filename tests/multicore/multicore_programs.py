"""Hand-built multi-core Programs: every core adds 1 to its channel slice of x (DDR -> LMEM -> TIU ->
DDR y), a chip-wide barrier, then core 0 reads the slice core 1 wrote and stores it + 1 as z."""

from __future__ import annotations

import struct
from dataclasses import replace

import numpy as np

from tpuflow.chip import load_chip
from tpuflow.isa import ArTiu, Engine, SysDma, SysTiu, TensorDma, aligned_strides, barrier, barrier_id
from tpuflow.program import CoreStreams, DdrTensor, MemoryPlan, Program

CHIP = load_chip("sg2260")
C_PER_CORE, W = 4, 16
ONE = struct.unpack("<I", struct.pack("<f", 1.0))[0]
IN_OFF, OUT_OFF, PEER_OFF = 0x0, 0x1000, 0x2000      # per-lane LMEM offsets (lane 0)
SLICE = (1, C_PER_CORE, 1, W)
SLICE_BYTES = C_PER_CORE * W * 4
LOCAL_STRIDES = aligned_strides(SLICE, CHIP.core.eu_bytes_per_lane // 4, CHIP.lanes)


def _glob(offset: int) -> int:
    return CHIP.core.gdma_lmem_base_address + offset


def _dma(src: int, dst: int, to_lmem: bool, **extra) -> TensorDma:
    ddr, lmem = (1 * C_PER_CORE * W, W, W, 1), LOCAL_STRIDES
    src_str, dst_str = (ddr, lmem) if to_lmem else (lmem, ddr)
    return TensorDma(src_start_addr=src, dst_start_addr=dst,
                     **{f"src_{k}size": v for k, v in zip("nchw", SLICE)},
                     **{f"src_{k}stride": v for k, v in zip("nchw", src_str)},
                     **{f"dst_{k}size": v for k, v in zip("nchw", SLICE)},
                     **{f"dst_{k}stride": v for k, v in zip("nchw", dst_str)}, **extra)


def _add_one(res: int, opd: int, dep: int) -> ArTiu:
    return ArTiu(op="add", res0_addr=res, res0_n=1, res0_c=C_PER_CORE, res0_h=1, res0_w=W, opd0_addr=opd,
                 opd1_addr=ONE, opt_opd1_const=1, cmd_id_dep=dep)


def _memory(cores: int) -> MemoryPlan:
    nbytes = cores * SLICE_BYTES
    x, y, z = 0x0, 0x4000, 0x8000
    shape = (1, cores * C_PER_CORE, 1, W)
    tensors = {"x": DdrTensor("x", x, shape, "fp32", "input", nbytes),
               "y": DdrTensor("y", y, shape, "fp32", "output", nbytes),
               "z": DdrTensor("z", z, SLICE, "fp32", "output", SLICE_BYTES)}
    return MemoryPlan(tensors=tensors, ddr_bytes_used=z + SLICE_BYTES)


def _core(k: int, cores: int, with_barrier: bool) -> CoreStreams:
    x, y, z = 0x0, 0x4000, 0x8000
    tiu = [_add_one(OUT_OFF, IN_OFF, dep=1)]
    gdma = [_dma(x + k * SLICE_BYTES, _glob(IN_OFF), True),
            _dma(_glob(OUT_OFF), y + k * SLICE_BYTES, False, cmd_id_dep=1)]
    order = "DBD"
    if with_barrier:
        sync = barrier(cores, barrier_id(0))
        tiu += sync[Engine.TIU]
        gdma += sync[Engine.GDMA]
        order += "BBDD"
    if k == 0:      # read what core 1 wrote, add one, store z
        gdma.append(_dma(y + SLICE_BYTES, _glob(PEER_OFF), True))
        tiu.append(_add_one(OUT_OFF, PEER_OFF, dep=len(gdma)))
        gdma.append(_dma(_glob(OUT_OFF), z, False, cmd_id_dep=len(tiu)))
        order += "DBD"
    names = lambda q: [f"core{k}"] * len(q)
    return CoreStreams(tiu=tiu, gdma=gdma, tiu_layers=names(tiu), gdma_layers=names(gdma), issue_order=order)


def sliced_add_program(cores: int, with_barrier: bool = True) -> Program:
    base = Program(chip=CHIP, memory=_memory(cores), model_name=f"sliced_add_{cores}")
    split = [{"axis": "c", "range": [k * C_PER_CORE, (k + 1) * C_PER_CORE]} for k in range(cores)]
    return Program.from_cores(base, [_core(k, cores, with_barrier) for k in range(cores)], core_split=split)


def sliced_add_reference(x: np.ndarray) -> dict[str, np.ndarray]:
    y = x + np.float32(1)
    return {"y": y, "z": y[:, C_PER_CORE:2 * C_PER_CORE] + np.float32(1)}


def without(program: Program, core: int, engine: Engine, index: int) -> Program:
    """A copy with one instruction of one core removed (its layer name too)."""
    streams = [replace(s, tiu=list(s.tiu), gdma=list(s.gdma), tiu_layers=list(s.tiu_layers),
                       gdma_layers=list(s.gdma_layers)) for s in program.cores]
    s = streams[core]
    del s.queue(engine)[index]
    del (s.tiu_layers if engine is Engine.TIU else s.gdma_layers)[index]
    pos = [i for i, ch in enumerate(s.issue_order) if ch == engine.letter][index]
    s.issue_order = s.issue_order[:pos] + s.issue_order[pos + 1:]
    return Program.from_cores(program, streams)
