"""TIU vector instructions beyond AR: SFU (taylor, normalize, rsqrt), LIN (mac, square sum /
difference) and CMP (select by comparison)."""

from __future__ import annotations

import numpy as np

from tpuflow.isa.base import LocalTensor, Prec
from tpuflow.isa.tiu import CmpTiu, LinTiu, SfuTiu

from tpuflow.hwmodel.functional import operands
from tpuflow.hwmodel.functional.errors import ExecutionError
from tpuflow.hwmodel.functional.floats import narrow_const_value


def _lane_of_channels(m, tensor: LocalTensor) -> np.ndarray:
    c = tensor.shape[1]
    return (tensor.start_lane(m.chip) + np.arange(c)) % m.chip.lanes


def _taylor(m, ins: SfuTiu, x: np.ndarray) -> np.ndarray:
    """Horner over each lane's own fp32 coefficient table at opd1's per-lane offset."""
    count = ins.opd1_n
    if count < 1:
        raise ExecutionError("sfu.taylor needs at least one coefficient (opd1_n >= 1)")
    offset = ins.opd1_addr % m.chip.lmem_bytes_per_lane
    m.lmem.lane_bytes(offset, 4 * count)  # bounds check
    res = operands.tensor_of(m, ins, "res0", ins.res0_shape)
    lanes = _lane_of_channels(m, res)[:, None]
    coef = m.lmem.gather_rows(lanes, offset + 4 * np.arange(count)[None, :], np.float32)  # (C, count)
    c = ins.res0_c
    y = np.broadcast_to(coef[:, count - 1].reshape(1, c, 1, 1), x.shape).astype(np.float32)
    for k in range(count - 2, -1, -1):
        y = y * x + coef[:, k].reshape(1, c, 1, 1)
    return y


def _normalize(m, ins: SfuTiu, x: np.ndarray) -> np.ndarray:
    """m in [1, 2) with x's sign into res0, exponent e (as a float) into res1 (res0's layout)."""
    mant, exp = np.frexp(x)
    zero = x == 0
    mant = np.where(zero, 0, mant * 2).astype(np.float32)
    exp = np.where(zero, 0, exp - 1).astype(np.float32)
    res = operands.tensor_of(m, ins, "res0", ins.res0_shape)
    res1 = LocalTensor(ins.res1_addr, res.shape, res.strides, res.prec)
    operands.write(m, ins, "res0", ins.res0_shape, exp, tensor=res1)
    return mant


def execute_sfu(m, ins: SfuTiu) -> None:
    x = operands.value(m, ins, "opd0", ins.res0_shape, as_float=True)
    if ins.op in ("taylor", "taylor_4x"):
        y = _taylor(m, ins, x)
    elif ins.op == "normalize":
        y = _normalize(m, ins, x)
    else:
        with np.errstate(divide="ignore", invalid="ignore"):
            y = np.float32(1) / np.sqrt(x)
    operands.write(m, ins, "res0", ins.res0_shape, y)


LIN = {
    "mac": lambda a, b, c: a * b + c,
    "square_sum": lambda a, b, c: (a + b) * (a + b),
    "square_diff": lambda a, b, c: (a - b) * (a - b),
}


def execute_lin(m, ins: LinTiu) -> None:
    shape = ins.res0_shape
    names = ("res0", "opd0", "opd1") + (("opd2",) if ins.op == "mac" else ())
    as_float = operands.is_float_domain(ins, names)
    a = operands.value(m, ins, "opd0", shape, as_float)
    b = operands.value(m, ins, "opd1", shape, as_float)
    c = operands.value(m, ins, "opd2", shape, as_float) if ins.op == "mac" else None
    operands.write(m, ins, "res0", shape, LIN[ins.op](a, b, c))


COMPARE = {"sel_gt": np.greater, "sel_eq": np.equal, "sel_lt": np.less}


def _opd3(m, ins: CmpTiu, as_float: bool):
    """opd3: a constant, or a tensor laid out like opd2 with opd2's precision."""
    prec = Prec(ins.opt_opd2_prec)
    if ins.opt_opd3_const:
        return operands.value(m, ins, "opd3", (), as_float, prec=prec)
    stored = m.lmem.read(ins.opd3(m.chip))
    return operands.convert(stored, prec, as_float)


def execute_cmp(m, ins: CmpTiu) -> None:
    shape = ins.res0_shape
    cmp_float = operands.is_float_domain(ins, ("opd0", "opd1"))
    a = operands.value(m, ins, "opd0", shape, cmp_float)
    b = operands.value(m, ins, "opd1", shape, cmp_float)
    if ins.opt_opd1_const and Prec(ins.opt_opd1_prec) == Prec.FP16:   # an fp16 constant (CmpTiu)
        b = np.float32(narrow_const_value(ins.opd1_addr, Prec.FP16))
    sel_float = operands.is_float_domain(ins, ("res0", "opd2"))
    chosen = np.where(COMPARE[ins.op](a, b), operands.value(m, ins, "opd2", shape, sel_float),
                      _opd3(m, ins, sel_float))
    operands.write(m, ins, "res0", shape, chosen)


HANDLERS = {SfuTiu: execute_sfu, LinTiu: execute_lin, CmpTiu: execute_cmp}
