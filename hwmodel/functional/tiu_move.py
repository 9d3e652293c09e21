"""TIU lane moves (CW/BC: transposes, lane copy, lane broadcast) and SYS instructions."""

from __future__ import annotations

import numpy as np

from tpuflow.isa.tiu import CwBcTiu, SysTiu

from tpuflow.hwmodel.functional import operands
from tpuflow.hwmodel.functional.errors import ExecutionError


def _moved(ins: CwBcTiu, x: np.ndarray) -> np.ndarray:
    """opd0's stored values rearranged into res0's shape (bit exact)."""
    if ins.op in ("cw_ts", "wc_ts"):
        return x.transpose(0, 3, 2, 1)
    if ins.op == "l_copy":
        if x.size != ins.res0_n * ins.res0_c * ins.res0_h * ins.res0_w:
            raise ExecutionError(f"tsbc.l_copy: opd0 {x.shape} and res0 {ins.res0_shape} differ in size")
        return x.reshape(ins.res0_shape)
    if ins.opd0_c != 1:
        raise ExecutionError(f"tsbc.{ins.op} broadcasts one channel, opd0_c is {ins.opd0_c}")
    return x  # broadcast over res0_c when stored


def execute_cwbc(m, ins: CwBcTiu) -> None:
    x = operands.raw(m, ins, "opd0", ins.opd0_shape())
    y = _moved(ins, x)
    if ins.op in ("cw_ts", "wc_ts") and y.shape != ins.res0_shape:
        raise ExecutionError(f"tsbc.{ins.op}: res0 {ins.res0_shape} is not opd0 {x.shape} with C and W swapped")
    operands.write_raw(m, ins, "res0", ins.res0_shape, y)


def execute_sys(m, ins: SysTiu) -> None:
    """nop, end, barriers and messages change no data; waits are the engines' business."""


HANDLERS = {CwBcTiu: execute_cwbc, SysTiu: execute_sys}
