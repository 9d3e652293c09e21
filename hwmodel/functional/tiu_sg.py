"""TIU SG per-element gather (tsk_typ 6, SgTiu): res0[n, c, 0, w] = table[c][index[n, c, 0, w]], the bits
copied, exactly as tpuflow.isa.tiu.SgTiu specifies (U8 / U16 index, out-of-range indices refused unless
the fill value is enabled, pe_s_gather_d1coor's different-banks rule checked)."""

from __future__ import annotations

import numpy as np

from tpuflow.isa.tiu import SgTiu

from tpuflow.hwmodel.functional import operands
from tpuflow.hwmodel.functional.errors import ExecutionError

_UNSIGNED = {1: np.uint8, 2: np.uint16}


def _indices(m, ins: SgTiu) -> np.ndarray:
    """The index operand read as unsigned integers (U8 or U16)."""
    stored = operands.raw(m, ins, "opd1", ins.res0_shape)
    return stored.view(_UNSIGNED[stored.dtype.itemsize]).astype(np.int64)


def execute_sg(m, ins: SgTiu) -> None:
    if ins.op == "pe_s_gather_d1coor" and not ins.banks_disjoint(m.chip):
        raise ExecutionError("sg.pe_s_gather_d1coor needs table, index and result in different LMEM banks "
                             "(use sg.pe_s_gather_hzd)")
    table = operands.raw(m, ins, "opd0", ins.table_shape())[0, :, 0, :]          # (C, opd0_w)
    index = _indices(m, ins)                                                      # (N, C, 1, W)
    outside = index >= ins.opd0_w
    fill = bool(ins.opt_opd2_const and ins.opt_opd3_const)
    if outside.any() and not fill:
        raise ExecutionError(f"sg.{ins.op}: index {int(index[outside].max())} is outside the table of "
                             f"{ins.opd0_w} entries")
    channel = np.arange(ins.res0_c).reshape(1, -1, 1, 1)
    gathered = table[channel, np.minimum(index, ins.opd0_w - 1)]
    if fill and outside.any():
        value = np.asarray(ins.opd2_addr & ((1 << 8 * gathered.dtype.itemsize) - 1)).astype(
            _UNSIGNED.get(gathered.dtype.itemsize, np.uint32)).view(gathered.dtype)     # the field's low bits
        gathered = np.where(outside, value, gathered)
    operands.write_raw(m, ins, "res0", ins.res0_shape, gathered)


HANDLERS = {SgTiu: execute_sg}
