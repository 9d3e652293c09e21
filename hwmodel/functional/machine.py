"""Machine: the state of one core (DDR, LMEM, tile registers, ACC) and the execution of one
instruction at a time by dispatching on its kind to the family modules."""

from __future__ import annotations

import numpy as np

from tpuflow.chip import ChipConfig
from tpuflow.isa.base import Instruction, LocalTensor

from tpuflow.hwmodel.functional import (gdma, tile, tiu_arith, tiu_matmul, tiu_move, tiu_pool, tiu_quant, tiu_sg,
                                        tiu_vector)
from tpuflow.hwmodel.functional.errors import ExecutionError
from tpuflow.hwmodel.functional.floats import encode
from tpuflow.hwmodel.functional.memory import DdrMemory, LocalMemory

HANDLERS = {**tiu_matmul.HANDLERS, **tiu_pool.HANDLERS, **tiu_arith.HANDLERS, **tiu_vector.HANDLERS,
            **tiu_move.HANDLERS, **tiu_quant.HANDLERS, **tiu_sg.HANDLERS, **gdma.HANDLERS, **tile.HANDLERS}


def describe(instr: Instruction, cmd_id: int | None = None, layer: str = "") -> str:
    """'B12 conv.normal (layer conv1)': engine letter + cmd_id, op name, layer."""
    head = f"{instr.ENGINE.letter}{cmd_id if cmd_id is not None else '?'} {instr.op_name}"
    return f"{head} (layer {layer})" if layer else head


class Machine:
    """One core. DDR holds `ddr_bytes` bytes (or is the given `ddr`, shared with the other cores of
    a chip); LMEM is [lanes, lmem_bytes_per_lane] bytes, private; the TILE engine's queue state
    advances with every TILE instruction executed (in queue order)."""

    def __init__(self, chip: ChipConfig, ddr_bytes: int, lmem_fill: int = 0, ddr: DdrMemory | None = None):
        self.chip = chip
        self.ddr = ddr if ddr is not None else DdrMemory(ddr_bytes)
        self.lmem = LocalMemory(chip.lanes, chip.lmem_bytes_per_lane, lmem_fill)
        self.tile = tile.TileState.for_chip(chip)

    # ---- loading and inspecting memory
    def load_ddr(self, addr: int, data: bytes | np.ndarray) -> None:
        self.ddr.load(addr, data)

    def read_ddr(self, addr: int, nbytes: int) -> np.ndarray:
        return self.ddr.dump(addr, nbytes)

    def read_local(self, tensor: LocalTensor) -> np.ndarray:
        """Stored values of an LMEM tensor (storage dtype; bf16 as uint16 bits)."""
        return self.lmem.read(tensor)

    def write_local(self, tensor: LocalTensor, values) -> None:
        """Store values into an LMEM tensor; values not already of the storage dtype are rounded
        to the tensor's precision (nearest even)."""
        values = np.asarray(values)
        if values.dtype != tensor.prec.storage_dtype:
            values = encode(values, tensor.prec)
        self.lmem.write(tensor, values)

    # ---- execution
    def execute(self, instr: Instruction, cmd_id: int | None = None, layer: str = "") -> None:
        """Execute one instruction; errors name it (engine letter, cmd_id, op, layer)."""
        handler = HANDLERS.get(type(instr))
        if handler is None:
            raise ExecutionError(f"{describe(instr, cmd_id, layer)}: no functional model for {type(instr).__name__}")
        try:
            with np.errstate(all="ignore"):   # overflow to inf, 0/0 = nan: the arithmetic's own results
                handler(self, instr)
        except ExecutionError as exc:
            raise ExecutionError(f"{describe(instr, cmd_id, layer)}: {exc}") from None
