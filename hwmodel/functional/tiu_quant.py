"""TIU RQ / DQ (tsk_typ 4, RqDqTiu): quant.rq1 integer requant, quant.rq0 float requant, quant.dq0 dequant,
bit for bit as tpuflow.isa.tiu.RqDqTiu specifies (the arithmetic lives in integers.py)."""

from __future__ import annotations

import numpy as np

from tpuflow.isa.base import Prec
from tpuflow.isa.tiu import RQ0_FUSED_MULTIPLY_ADD, RQ0_NAN_RESULT, RqDqTiu

from tpuflow.hwmodel.functional import operands
from tpuflow.hwmodel.functional.errors import ExecutionError
from tpuflow.hwmodel.functional.floats import to_f32
from tpuflow.hwmodel.functional.integers import right_shift_round, round_real, saturate, values_of


def _int8(bits) -> np.ndarray:
    return (np.asarray(bits, np.int64) & 0xFF).astype(np.uint8).view(np.int8).astype(np.int64)


def _int16(bits) -> np.ndarray:
    return (np.asarray(bits, np.int64) & 0xFFFF).astype(np.uint16).view(np.int16).astype(np.int64)


def _as_f32(bits) -> np.ndarray:
    return (np.asarray(bits, np.int64) & 0xFFFFFFFF).astype(np.uint32).view(np.float32)


def param_words(m, ins: RqDqTiu) -> tuple[np.ndarray, np.ndarray]:
    """The two parameter words as int64 bit patterns: scalars (opd1_addr, opd2_addr) or, per channel,
    (1, C, 1, 1) arrays from opd1's (1, C, 1, 2) tensor, which must start on res0's lane."""
    if ins.opt_opd1_const:
        return np.int64(ins.opd1_addr & 0xFFFFFFFF), np.int64(ins.opd2_addr & 0xFFFFFFFF)
    params = operands.tensor_of(m, ins, "opd1", ins.params_shape())
    result = operands.tensor_of(m, ins, "res0", ins.res0_shape)
    if params.start_lane(m.chip) != result.start_lane(m.chip):
        raise ExecutionError(f"per-channel parameters start on lane {params.start_lane(m.chip)}, res0 on lane "
                             f"{result.start_lane(m.chip)}: a lane reads only its own channels' parameters")
    words = m.lmem.read(params).astype(np.int64) & 0xFFFFFFFF
    return words[..., :1], words[..., 1:]


def rq1_params(m, ins: RqDqTiu) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(multiplier, shift, zero point): scalars pack s | zp << 8, channel words s | zp << 16."""
    first, second = param_words(m, ins)
    zp_bit = 8 if ins.opt_opd1_const else 16
    multiplier = (first ^ 0x80000000) - 0x80000000          # the word as a signed int32
    return multiplier, _int8(second), _int16(second >> zp_bit)


def _integer_input(m, ins: RqDqTiu) -> np.ndarray:
    prec = Prec(ins.opt_opd0_prec)
    if prec.is_float:
        raise ExecutionError(f"quant.{ins.op} reads an integer opd0, got {prec.dtype_name}")
    return values_of(operands.raw(m, ins, "opd0", ins.res0_shape), bool(ins.opt_opd0_sign))


def _integer_result(ins: RqDqTiu) -> Prec:
    prec = Prec(ins.opt_res0_prec)
    if prec.is_float:
        raise ExecutionError(f"quant.{ins.op} writes an integer res0, got {prec.dtype_name}")
    return prec


def _store(m, ins: RqDqTiu, values: np.ndarray, prec: Prec) -> None:
    stored = saturate(values, prec, bool(ins.opt_opd2_sign))
    operands.write_raw(m, ins, "res0", ins.res0_shape, stored)


def execute_rq1(m, ins: RqDqTiu) -> None:
    """res0 = saturate(zp + RightShiftRound(x * m, -s, mode))."""
    prec = _integer_result(ins)
    x = _integer_input(m, ins)
    multiplier, shift, zero_point = rq1_params(m, ins)
    _store(m, ins, zero_point + right_shift_round(x * multiplier, -shift, ins.round_mode), prec)


def execute_rq0(m, ins: RqDqTiu) -> None:
    """res0 = saturate(round_mode(fp32(fp32(x) * scale) + offset)) (one rounding to fp32 of x * scale + offset
    with RQ0_FUSED_MULTIPLY_ADD); NaN gives RQ0_NAN_RESULT."""
    prec = _integer_result(ins)
    in_prec = Prec(ins.opt_opd0_prec)
    stored = operands.raw(m, ins, "opd0", ins.res0_shape)
    x = to_f32(stored, in_prec) if in_prec.is_float else values_of(stored, bool(ins.opt_opd0_sign)).astype(np.float32)
    first, second = param_words(m, ins)
    scale, offset = _as_f32(first), _as_f32(second)
    if RQ0_FUSED_MULTIPLY_ADD:
        y = (x.astype(np.float64) * scale + offset).astype(np.float32)     # the product exact in float64
    else:
        y = (x * scale).astype(np.float32) + offset
    rounded = np.nan_to_num(round_real(y.astype(np.float32), ins.round_mode), nan=float(RQ0_NAN_RESULT))
    _store(m, ins, np.clip(rounded, -2.0 ** 62, 2.0 ** 62).astype(np.int64), prec)   # inf saturates


def execute_dq0(m, ins: RqDqTiu) -> None:
    """res0 = fp32(x - zp) * scale in fp32, rounded to res0's float precision."""
    prec = Prec(ins.opt_res0_prec)
    if not prec.is_float:
        raise ExecutionError(f"quant.dq0 writes a float res0, got {prec.dtype_name}")
    x = _integer_input(m, ins)
    first, second = param_words(m, ins)
    y = (x - _int16(first)).astype(np.float32) * _as_f32(second)
    operands.write(m, ins, "res0", ins.res0_shape, y.astype(np.float32))


def execute_rq_dq(m, ins: RqDqTiu) -> None:
    {"rq1": execute_rq1, "rq0": execute_rq0, "dq0": execute_dq0}[ins.op](m, ins)


HANDLERS = {RqDqTiu: execute_rq_dq}
