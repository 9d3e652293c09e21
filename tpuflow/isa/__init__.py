"""Instruction definitions of the three engines: TIU (compute), GDMA (DMA), TILE (CUBE blocks)."""

from tpuflow.isa.base import (TILE_WAIT_TAG, Accesses, DdrRange, Engine, Instruction, LmemRange, LocalTensor,
                              Prec, StrideMode, aligned_strides, ddr_range, lmem_ranges, operand_strides)
from tpuflow.isa.gdma import (GDMA_KINDS, DmaInstruction, GatherDma, GeneralDma, MatrixDma, SysDma, TensorDma,
                              global_lmem_address, is_lmem, lmem_address)
from tpuflow.isa.messages import BARRIER_ENGINES, Message, barrier, barrier_id
from tpuflow.isa.tile import (QUEUES, TILE_KINDS, AccCvt, TileInstruction, TileQueues, TImg2Col, TMatmul, TMove,
                              TPush,
                              ref_name, resolve_stream, size_bytes, size_code, tile_ref)
from tpuflow.isa.tiu import (TIU_KINDS, ArTiu, CmpTiu, ConvTiu, CwBcTiu, LinTiu, Mm2Tiu, MmTiu, PordTiu, RqDqTiu,
                             SfuTiu, SgTiu, SysTiu, TiuInstruction)

__all__ = [name for name in dir() if not name.startswith("_")]
