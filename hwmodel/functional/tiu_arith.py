"""TIU AR instructions: elementwise arithmetic, bitwise logic, shifts, copy, abs and cast
(fp32 arithmetic when any operand or the result is a float; int64 then wrap otherwise; cast
saturates integer results)."""

from __future__ import annotations

import numpy as np

from tpuflow.isa.base import Prec
from tpuflow.isa.tiu import ArTiu

from tpuflow.hwmodel.functional import operands
from tpuflow.hwmodel.functional.errors import ExecutionError
from tpuflow.hwmodel.functional.floats import Round, from_bits

BITWISE = {"and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor}


def _int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Integer division truncating toward zero; x / 0 = 0."""
    safe = np.where(b == 0, 1, b)
    q = np.abs(a) // np.abs(safe) * np.sign(a) * np.sign(safe)
    return np.where(b == 0, 0, q)


def _float_div(a, b):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.divide(a, b, dtype=np.float32)


ARITH = {
    "mul": (np.multiply, np.multiply), "add": (np.add, np.add), "sub": (np.subtract, np.subtract),
    "max": (np.maximum, np.maximum), "min": (np.minimum, np.minimum), "div": (_float_div, _int_div),
}


def _operand_precs(ins: ArTiu) -> tuple[str, ...]:
    return ("res0", "opd0") if ins.op in ins.UNARY else ("res0", "opd0", "opd1")


def _values(m, ins: ArTiu, as_float: bool):
    shape = ins.res0_shape
    a = operands.value(m, ins, "opd0", shape, as_float)
    if ins.op in ins.UNARY:
        return a, None
    return a, operands.value(m, ins, "opd1", shape, as_float)


def _shift(m, ins: ArTiu) -> np.ndarray:
    """opd0 (its own width) shifted left by opd1, right when opd1 < 0 (logical or arithmetic)."""
    width = 8 * Prec(ins.opt_opd0_prec).bytes
    a = operands.bits(m, ins, "opd0", ins.res0_shape)
    s = np.asarray(operands.value(m, ins, "opd1", ins.res0_shape, as_float=False))
    left = np.where(s >= width, 0, np.left_shift(a, np.clip(s, 0, 63)))
    right_by = np.clip(-s, 0, 63)
    if ins.op == "logic_shift":
        unsigned = a & ((1 << width) - 1)
        right = np.where(-s >= width, 0, np.right_shift(unsigned, right_by))
    else:
        signed = np.where(a & (1 << (width - 1)), a | ~((1 << width) - 1), a & ((1 << width) - 1))
        right = np.right_shift(signed, right_by)
    return np.where(s >= 0, left, right)


def _bitwise(m, ins: ArTiu) -> np.ndarray:
    a = operands.bits(m, ins, "opd0", ins.res0_shape)
    if ins.op == "not":
        return ~a
    return BITWISE[ins.op](a, operands.bits(m, ins, "opd1", ins.res0_shape))


def _cast_mode(ins: ArTiu) -> Round:
    if not ins.opt_opd2_const:
        raise ExecutionError("arith.cast takes its rounding mode as a constant opd2 (opt_opd2_const = 1)")
    if ins.opd2_addr not in tuple(Round):
        raise ExecutionError(f"arith.cast rounding mode {ins.opd2_addr} is not one of 0..4")
    return Round(ins.opd2_addr)


def _unary(a, ins: ArTiu):
    if ins.op == "abs":
        return np.abs(a)
    return a  # copy, cast: the conversion happens when the result is rounded to res0's precision


def execute_ar(m, ins: ArTiu) -> None:
    shape = ins.res0_shape
    if ins.op in BITWISE or ins.op == "not" or ins.op.endswith("_shift"):
        result = _bitwise(m, ins) if not ins.op.endswith("_shift") else _shift(m, ins)
        operands.write_raw(m, ins, "res0", shape, from_bits(result, Prec(ins.opt_res0_prec)))
        return
    if ins.op == "copy" and ins.opt_opd0_prec == ins.opt_res0_prec and not ins.opt_opd0_const:
        operands.write_raw(m, ins, "res0", shape, operands.raw(m, ins, "opd0", shape))
        return
    as_float = operands.is_float_domain(ins, _operand_precs(ins))
    a, b = _values(m, ins, as_float)
    result = _unary(a, ins) if b is None else ARITH[ins.op][0 if as_float else 1](a, b)
    mode = _cast_mode(ins) if ins.op == "cast" else Round.RNE
    saturate = ins.op == "cast" and not Prec(ins.opt_res0_prec).is_float
    operands.write(m, ins, "res0", shape, result, mode, saturate)


HANDLERS = {ArTiu: execute_ar}
