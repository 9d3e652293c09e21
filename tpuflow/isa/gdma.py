"""GDMA (DMA) instructions of the SG2260 family, one frozen dataclass per descriptor kind.

Addresses are 45-bit global addresses (the descriptor's *_l32 / *_h13 pair is one field here).
An address at or above chip.core.gdma_lmem_base_address is LMEM (flat address = address - base,
i.e. lane * lmem_bytes_per_lane + offset); anything below is DDR.

Tensor endpoints iterate (n, c, h, w) over their sizes with element strides. On the DDR side,
element (n,c,h,w) is at addr + (n*ns + c*cs + h*hs + w*ws) * bytes. On the LMEM side, channel c
is on lane (start_lane + c) % lanes at offset off + (n*ns + ((start_lane + c)//lanes)*cs +
h*hs + w*ws) * bytes, exactly as for TIU operands. `cmd_id_dep`: the command dispatches once
TIU has completed that cmd_id (0 = no wait).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from tpuflow.isa import messages
from tpuflow.isa.base import (TILE_WAIT_TAG, Accesses, DdrRange, Engine, Instruction, LmemRange, Prec, ddr_range,
                              lmem_ranges)

if TYPE_CHECKING:
    from tpuflow.chip import ChipConfig

FP32 = int(Prec.FP32)
ALL_LANES = (1 << 64) - 1


def is_lmem(addr: int, chip: "ChipConfig") -> bool:
    return addr >= chip.core.gdma_lmem_base_address


def lmem_address(addr: int, chip: "ChipConfig") -> int:
    """Flat LMEM address of a GDMA global address in the LMEM window."""
    return addr - chip.core.gdma_lmem_base_address


def global_lmem_address(flat: int, chip: "ChipConfig") -> int:
    return flat + chip.core.gdma_lmem_base_address


class DmaInstruction(Instruction):
    ENGINE: ClassVar[Engine] = Engine.GDMA
    WAIT_FIELDS: ClassVar[dict] = {Engine.TIU: "cmd_id_dep"}
    CMD_TYPE: ClassVar[int]
    PREFIX: ClassVar[str] = "dma"

    @property
    def cmd_special_function(self) -> int:
        return self.OPS[self.op]  # type: ignore[attr-defined]

    def __post_init__(self) -> None:
        self._check_op()

    def _endpoint(self, addr: int, shape, strides, chip) -> tuple[tuple, tuple]:
        esize = Prec(self.src_data_format).bytes  # type: ignore[attr-defined]
        if is_lmem(addr, chip):
            return lmem_ranges(lmem_address(addr, chip), shape, strides, esize, chip), ()
        return (), ddr_range(addr, shape, strides, esize)


@dataclass(frozen=True)
class TensorDma(DmaInstruction):
    """dma.tensor: copies the src tensor into dst; elements are taken in src's (n,c,h,w) order
    and placed in dst's (n,c,h,w) order, so dst may be a reshape (equal element counts).
    op 'transpose': dst[n,w,h,c] = src[n,c,h,w] (dst_csize = src_wsize, dst_wsize = src_csize).
    op 'broadcast': dst[n,c,h,w] = src[n,0,h,w] for c < dst_csize (src_csize = 1), LMEM dst.
    fill_constant_en: dst is filled with constant_value (its bits in src_data_format), src unused.
    Local endpoints honour localmem_mask (bit l = lane l may be written).
    """

    CMD_TYPE: ClassVar[int] = 0
    PREFIX: ClassVar[str] = "dma.tensor"
    OPS: ClassVar[dict] = {"tensor": 0, "transpose": 1, "broadcast": 3}
    src_start_addr: int
    dst_start_addr: int
    src_nsize: int
    src_csize: int
    src_hsize: int
    src_wsize: int
    src_nstride: int
    src_cstride: int
    src_hstride: int
    src_wstride: int
    dst_nsize: int
    dst_csize: int
    dst_hsize: int
    dst_wsize: int
    dst_nstride: int
    dst_cstride: int
    dst_hstride: int
    dst_wstride: int
    op: str = "tensor"
    src_data_format: int = FP32
    cmd_id_dep: int = 0
    fill_constant_en: int = 0
    constant_value: int = 0
    localmem_mask: int = ALL_LANES

    @property
    def op_name(self) -> str:
        return "dma.tensor" if self.op == "tensor" else f"dma.tensor.{self.op}"

    @property
    def src_shape(self):
        return (self.src_nsize, self.src_csize, self.src_hsize, self.src_wsize)

    @property
    def dst_shape(self):
        return (self.dst_nsize, self.dst_csize, self.dst_hsize, self.dst_wsize)

    @property
    def src_strides(self):
        return (self.src_nstride, self.src_cstride, self.src_hstride, self.src_wstride)

    @property
    def dst_strides(self):
        return (self.dst_nstride, self.dst_cstride, self.dst_hstride, self.dst_wstride)

    @property
    def nbytes(self) -> int:
        n, c, h, w = self.dst_shape
        return n * c * h * w * Prec(self.src_data_format).bytes

    def accesses(self, chip: "ChipConfig") -> Accesses:
        dst_l, dst_d = self._endpoint(self.dst_start_addr, self.dst_shape, self.dst_strides, chip)
        if self.fill_constant_en:
            return Accesses(lmem_writes=dst_l, ddr_writes=dst_d)
        src_l, src_d = self._endpoint(self.src_start_addr, self.src_shape, self.src_strides, chip)
        return Accesses(lmem_reads=src_l, lmem_writes=dst_l, ddr_reads=src_d, ddr_writes=dst_d)


@dataclass(frozen=True)
class MatrixDma(DmaInstruction):
    """dma.matrix: a row-major DDR matrix [rows, cols] (row stride in elements) to or from an
    LMEM tensor (1, rows, 1, cols) with rows across lanes and group stride `lmem_cstride`.
    The DDR endpoint is whichever address is below the LMEM window. Sizes: src_hsize = rows,
    src_wsize = cols; ddr row stride = src_hstride; lmem_cstride = dst_cstride.
    op 'transpose' stores the LMEM tensor as (1, cols, 1, rows) (DDR -> LMEM only)."""

    CMD_TYPE: ClassVar[int] = 1
    PREFIX: ClassVar[str] = "dma.matrix"
    OPS: ClassVar[dict] = {"matrix": 0, "transpose": 1}
    src_start_addr: int
    dst_start_addr: int
    src_hsize: int
    src_wsize: int
    src_hstride: int
    dst_cstride: int
    op: str = "matrix"
    src_data_format: int = FP32
    cmd_id_dep: int = 0

    @property
    def op_name(self) -> str:
        return "dma.matrix" if self.op == "matrix" else "dma.matrix.transpose"

    def endpoints(self, chip) -> tuple[tuple, tuple, tuple, tuple]:
        """(ddr_addr, ddr shape/strides, lmem_addr, lmem shape/strides) as 4-D tensors."""
        rows, cols = self.src_hsize, self.src_wsize
        ddr_side = (1, rows, 1, cols), (rows * self.src_hstride, self.src_hstride, cols, 1)
        lmem_shape = (1, cols, 1, rows) if self.op == "transpose" else (1, rows, 1, cols)
        w = lmem_shape[3]
        lmem_side = lmem_shape, (self.dst_cstride * -(-lmem_shape[1] // chip.lanes), self.dst_cstride, w, 1)
        return ddr_side, lmem_side  # type: ignore[return-value]

    @property
    def nbytes(self) -> int:
        return self.src_hsize * self.src_wsize * Prec(self.src_data_format).bytes

    def accesses(self, chip):
        ddr_side, lmem_side = self.endpoints(chip)
        if is_lmem(self.dst_start_addr, chip):
            ddr_addr, lmem_addr, to_lmem = self.src_start_addr, self.dst_start_addr, True
        else:
            ddr_addr, lmem_addr, to_lmem = self.dst_start_addr, self.src_start_addr, False
        esize = Prec(self.src_data_format).bytes
        lr = lmem_ranges(lmem_address(lmem_addr, chip), *lmem_side, esize, chip)
        dr = ddr_range(ddr_addr, *ddr_side, esize)
        if to_lmem:
            return Accesses(lmem_writes=lr, ddr_reads=dr)
        return Accesses(lmem_reads=lr, ddr_writes=dr)


@dataclass(frozen=True)
class GeneralDma(DmaInstruction):
    """dma.general: copies `src_cstride` ("move length") contiguous elements of src_data_format
    from src to dst (either side DDR or LMEM; LMEM ranges stay inside one lane).
    op 'broadcast': the same bytes are written at the same offset in `dst_csize` consecutive
    lanes starting at dst's lane."""

    CMD_TYPE: ClassVar[int] = 3
    PREFIX: ClassVar[str] = "dma.general"
    OPS: ClassVar[dict] = {"general": 0, "broadcast": 1}
    src_start_addr: int
    dst_start_addr: int
    src_cstride: int
    op: str = "general"
    dst_csize: int = 1
    src_data_format: int = FP32
    cmd_id_dep: int = 0

    @property
    def op_name(self) -> str:
        return "dma.general" if self.op == "general" else "dma.general.broadcast"

    @property
    def nbytes(self) -> int:
        return self.src_cstride * Prec(self.src_data_format).bytes * (self.dst_csize if self.op == "broadcast" else 1)

    def _flat(self, addr, lanes, chip):
        n = self.src_cstride * Prec(self.src_data_format).bytes
        if is_lmem(addr, chip):
            flat = lmem_address(addr, chip)
            lane, off = divmod(flat, chip.lmem_bytes_per_lane)
            return (LmemRange(lane % chip.lanes, lanes, off, off + n),), ()
        return (), (DdrRange(addr, addr + n),)

    def accesses(self, chip):
        src_l, src_d = self._flat(self.src_start_addr, 1, chip)
        dst_l, dst_d = self._flat(self.dst_start_addr, self.dst_csize if self.op == "broadcast" else 1, chip)
        return Accesses(lmem_reads=src_l, lmem_writes=dst_l, ddr_reads=src_d, ddr_writes=dst_d)


@dataclass(frozen=True)
class GatherDma(DmaInstruction):
    """gdma.gather: rows of src picked by a runtime index tensor (embedding lookups).

    For c < dst_csize, h < index_hsize, w < src_wsize:
        i = index[c', h] - start_pos      (c' = 0 when index_csize == 1, else c)
        dst[c, h, w] = src[c, i, w] if 0 <= i < src_hsize, else constant_value (its bits in
        src_data_format).
    Index elements are uint32, contiguous along h: index[c, h] at index_start_addr +
    (c*index_cstride + h) * 4. src (c, i, w) is at src_start_addr + (c*src_cstride + i*src_hstride +
    w) * bytes, dst (c, h, w) at dst_start_addr + (c*dst_cstride + h*dst_hstride + w) * bytes
    (w stride 1 on both). src and index may be DDR or LMEM (LMEM: channel c on lane
    (start_lane + c) % lanes, as for dma.tensor); dst is DDR (the descriptor's localmem_mask,
    which would gate LMEM writes, is written 0). A well-formed command has dst_hsize =
    index_hsize, dst_wsize = src_wsize, src_csize = dst_csize and index_csize 1 or src_csize (the
    functional model rejects others). The DDR rows read are data dependent: accesses() reports the
    whole src tensor.
    """

    CMD_TYPE: ClassVar[int] = 7
    PREFIX: ClassVar[str] = "gdma.gather"
    OPS: ClassVar[dict] = {"gather": 0}
    src_start_addr: int
    dst_start_addr: int
    index_start_addr: int
    src_csize: int
    src_hsize: int
    src_wsize: int
    src_cstride: int
    src_hstride: int
    dst_cstride: int
    dst_hstride: int
    index_csize: int
    index_hsize: int
    index_cstride: int
    dst_csize: int = 0
    dst_hsize: int = 0
    dst_wsize: int = 0
    start_pos: int = 0
    constant_value: int = 0
    op: str = "gather"
    src_data_format: int = FP32
    cmd_id_dep: int = 0

    @property
    def op_name(self) -> str:
        return "gdma.gather"

    @property
    def src_shape(self):
        return (1, self.src_csize, self.src_hsize, self.src_wsize)

    @property
    def src_strides(self):
        return (0, self.src_cstride, self.src_hstride, 1)

    @property
    def dst_shape(self):
        return (1, self.dst_csize, self.dst_hsize, self.dst_wsize)

    @property
    def dst_strides(self):
        return (0, self.dst_cstride, self.dst_hstride, 1)

    @property
    def index_shape(self):
        return (1, self.index_csize, self.index_hsize, 1)

    @property
    def index_strides(self):
        return (0, self.index_cstride, 1, 1)

    @property
    def nbytes(self) -> int:
        return self.dst_csize * self.dst_hsize * self.dst_wsize * Prec(self.src_data_format).bytes

    def _endpoint_of(self, addr, shape, strides, esize, chip):
        if is_lmem(addr, chip):
            return lmem_ranges(lmem_address(addr, chip), shape, strides, esize, chip), ()
        return (), ddr_range(addr, shape, strides, esize)

    def accesses(self, chip: "ChipConfig") -> Accesses:
        esize = Prec(self.src_data_format).bytes
        src_l, src_d = self._endpoint_of(self.src_start_addr, self.src_shape, self.src_strides, esize, chip)
        idx_l, idx_d = self._endpoint_of(self.index_start_addr, self.index_shape, self.index_strides, 4, chip)
        dst_l, dst_d = self._endpoint_of(self.dst_start_addr, self.dst_shape, self.dst_strides, esize, chip)
        return Accesses(lmem_reads=src_l + idx_l, lmem_writes=dst_l, ddr_reads=src_d + idx_d, ddr_writes=dst_d)


@dataclass(frozen=True)
class SysDma(DmaInstruction):
    """dma.sys.*: chain_end (last command of a stream), nop, sys_send, sys_wait.
    sys_wait with index == TILE_WAIT_TAG waits until the TILE engine completed block
    `constant_value` (tpuflow's TILE synchronisation, see tpuflow.isa.tile)."""

    CMD_TYPE: ClassVar[int] = 6
    PREFIX: ClassVar[str] = "dma.sys"
    OPS: ClassVar[dict] = {"chain_end": 0, "nop": 1, "sys_send": 3, "sys_wait": 4}
    op: str
    constant_value: int = 0
    index: int = 0
    cmd_id_dep: int = 0

    @property
    def src_data_format(self) -> int:
        return FP32

    @property
    def is_tile_wait(self) -> bool:
        return self.op == "sys_wait" and self.index == TILE_WAIT_TAG

    def waits(self) -> tuple[int, int, int]:
        return (self.cmd_id_dep, 0, self.constant_value if self.is_tile_wait else 0)

    @classmethod
    def tile_wait(cls, block: int) -> "SysDma":
        """dma.sys.sys_wait that waits until the TILE engine completed block `block`."""
        return cls(op="sys_wait", index=TILE_WAIT_TAG, constant_value=block)

    @classmethod
    def send(cls, msg_id: int, wait_cnt: int) -> "SysDma":
        """dma.sys.sys_send: a cross-core message (tpuflow.isa.messages) consumed by `wait_cnt` waits."""
        return cls(op="sys_send", constant_value=messages.pack(msg_id, wait_cnt, messages.GDMA_COUNT_SHIFT))

    @classmethod
    def wait(cls, msg_id: int, send_cnt: int) -> "SysDma":
        """dma.sys.sys_wait: blocks until `send_cnt` sends of `msg_id` arrived (tpuflow.isa.messages)."""
        return cls(op="sys_wait", constant_value=messages.pack(msg_id, send_cnt, messages.GDMA_COUNT_SHIFT))

    def message(self):
        if self.op not in ("sys_send", "sys_wait") or self.is_tile_wait:
            return None
        msg_id, count = messages.unpack(self.constant_value, messages.GDMA_COUNT_SHIFT)
        return messages.Message("send" if self.op == "sys_send" else "wait", msg_id, count)

    def accesses(self, chip):
        return Accesses()


GDMA_KINDS: tuple[type[DmaInstruction], ...] = (TensorDma, MatrixDma, GeneralDma, GatherDma, SysDma)

