"""TIU cube instructions: conv.normal (im2col + tensordot) and mm2.nn / nt / tt, fp32 accumulation, or the
exact int32 accumulation of their integer form (int8 / uint8 operands, tpuflow.isa.tiu's "Integer forms")."""

from __future__ import annotations

import numpy as np

from tpuflow.isa.base import Prec
from tpuflow.isa.tiu import ConvTiu, Mm2Tiu

from tpuflow.hwmodel.functional import operands
from tpuflow.hwmodel.functional.errors import ExecutionError
from tpuflow.hwmodel.functional.floats import to_f32
from tpuflow.hwmodel.functional.integers import value_range, values_of, wrap_int32
from tpuflow.hwmodel.functional.windows import Window, pad, windows


def conv2d(x: np.ndarray, weight: np.ndarray, win: Window, fill: float = 0.0) -> np.ndarray:
    """x (N, IC, H, W) fp32, weight (OC, IC, KH, KW) fp32 -> (N, OC, OH, OW) fp32, padding with `fill`."""
    cols = windows(pad(x, win, fill), win)                      # (N, IC, KH, KW, OH, OW)
    out = np.tensordot(weight, cols, axes=([1, 2, 3], [1, 2, 3]))  # (OC, N, OH, OW)
    return out.transpose(1, 0, 2, 3)


def conv_weights(stored: np.ndarray, ins: ConvTiu) -> np.ndarray:
    """ConvTiu's opd1 (1, OC, 1, padded IC * KH * KW) in its weight_ic_block layout
    ([ic // B][kh][kw][ic % B] per output channel) -> (OC, IC, KH, KW)."""
    oc, kh, kw, block = ins.res0_c, ins.opd1_h, ins.opd1_w, ins.weight_ic_block
    blocks = ins.weight_ic_padded // block
    w = np.broadcast_to(stored, ins.weight_shape()).reshape(oc, blocks, kh, kw, block)
    return np.ascontiguousarray(w.transpose(0, 1, 4, 2, 3).reshape(oc, blocks * block, kh, kw)[:, :ins.opd0_c])


def is_integer_form(ins) -> bool:
    """Both multiplicands integer: the exact int32 form (module docstring)."""
    return not (Prec(ins.opt_opd0_prec).is_float or Prec(ins.opt_opd1_prec).is_float)


def _integer_operand(m, ins, prefix: str, shape) -> np.ndarray:
    """An integer multiplicand as float64 holding exact integers (signed or not by opt_X_sign): products
    of 8-bit values are below 2**15, so every partial sum of fewer than 2**38 of them is exact in float64
    (numpy's float matmul, exact and fast)."""
    return values_of(operands.raw(m, ins, prefix, shape), bool(getattr(ins, f"opt_{prefix}_sign"))).astype(np.float64)


def _check_integer_result(ins) -> None:
    if Prec(ins.opt_res0_prec) is not Prec.INT32 or Prec(ins.opt_opd2_prec) is not Prec.INT32:
        raise ExecutionError(f"an integer {ins.op_name} accumulates an INT32 bias into an INT32 res0 (its fused "
                             f"requantisation, opt_rq, is not modelled), got bias {Prec(ins.opt_opd2_prec).dtype_name} "
                             f"and res0 {Prec(ins.opt_res0_prec).dtype_name}")


def execute_conv(m, ins: ConvTiu) -> None:
    n, oc, ic = ins.res0_n, ins.res0_c, ins.opd0_c
    if is_integer_form(ins):
        return _execute_integer_conv(m, ins)
    if ins.opd3_addr:
        raise ExecutionError(f"a float conv pads with zeros only, got the pad value field {ins.opd3_addr:#x}")
    x = operands.value(m, ins, "opd0", (n, ic, ins.opd0_h, ins.opd0_w), as_float=True)
    weight = conv_weights(operands.value(m, ins, "opd1", ins.weight_shape(), as_float=True), ins)
    y = conv2d(x, weight, Window.of(ins))
    bias = operands.value(m, ins, "opd2", (1, oc, 1, 1), as_float=True)
    y = y + np.reshape(bias, (1, -1, 1, 1))
    _finish(m, ins, y, ins.res0_shape)


def _execute_integer_conv(m, ins: ConvTiu) -> None:
    """int32 res0 = wrap(conv(x, w) + bias (+ res0)), relu; padding with ConvTiu.pad_value."""
    _check_integer_result(ins)
    x = _integer_operand(m, ins, "opd0", (ins.res0_n, ins.opd0_c, ins.opd0_h, ins.opd0_w))
    weight = conv_weights(_integer_operand(m, ins, "opd1", ins.weight_shape()), ins)
    lo, hi = value_range(Prec(ins.opt_opd0_prec), bool(ins.opt_opd0_sign))
    if not lo <= ins.pad_value <= hi:
        raise ExecutionError(f"pad value {ins.pad_value} is outside opd0's range [{lo}, {hi}]")
    y = conv2d(x, weight, Window.of(ins), float(ins.pad_value)).astype(np.int64)
    bias = operands.value(m, ins, "opd2", (1, ins.res0_c, 1, 1), as_float=False)
    _finish_integer(m, ins, y + np.reshape(bias, (1, -1, 1, 1)), ins.res0_shape)


def _finish_integer(m, ins, y: np.ndarray, shape) -> None:
    """+ res0 (opt_res_add), wrapped to int32 after every sum, relu (opt_relu), store."""
    y = wrap_int32(y).astype(np.int64)
    if ins.opt_res_add:
        y = wrap_int32(y + operands.value(m, ins, "res0", shape, as_float=False)).astype(np.int64)
    if ins.opt_relu:
        y = np.maximum(y, 0)
    operands.write_raw(m, ins, "res0", shape, wrap_int32(y).reshape(shape))


def _finish(m, ins, y: np.ndarray, shape) -> None:
    """+ res0 (opt_res_add), relu (opt_relu), round and store into res0."""
    if ins.opt_res_add:
        y = y + operands.value(m, ins, "res0", shape, as_float=True)
    if ins.opt_relu:
        y = np.maximum(y, np.float32(0))
    operands.write(m, ins, "res0", shape, y.reshape(shape))


def _matrix(m, ins, prefix: str, rows: int, cols: int) -> np.ndarray:
    if is_integer_form(ins):
        return _integer_operand(m, ins, prefix, (1, rows, 1, cols)).reshape(rows, cols)
    return operands.value(m, ins, prefix, (1, rows, 1, cols), as_float=True).reshape(rows, cols)


def _mm2_operands(m, ins: Mm2Tiu) -> tuple[np.ndarray, np.ndarray]:
    """L (M x K) and R (K x N) as stored for nn / nt / tt."""
    mm, nn, k = ins.mnk
    expect = {"nn": ((mm, k), (k, nn)), "nt": ((mm, k), (nn, k)), "tt": ((k, mm), (nn, k))}[ins.op]
    got = ((ins.opd0_c, ins.opd0_w), (ins.opd1_c, ins.opd1_w))
    if got != expect:
        raise ExecutionError(f"mm2.{ins.op} with res0 {mm}x{nn} and K={k} needs opd0 {expect[0][0]}x{expect[0][1]} "
                             f"and opd1 {expect[1][0]}x{expect[1][1]}, got {got[0]} and {got[1]}")
    left = _matrix(m, ins, "opd0", *expect[0])
    right = _matrix(m, ins, "opd1", *expect[1])
    return (left.T if ins.op == "tt" else left), (right if ins.op == "nn" else right.T)


def _mm2_bias(m, ins: Mm2Tiu, as_float: bool = True) -> np.ndarray:
    """Bias (1, M, 1, N) or a scalar: output row r reads the bias row from its own lane, at opd2's offset
    (fp32, or int64 values of the integer form's INT32 bias)."""
    if ins.opt_opd2_const:
        return operands.value(m, ins, "opd2", (), as_float=as_float)
    mm, nn, _ = ins.mnk
    res = operands.tensor_of(m, ins, "res0", (1, mm, 1, nn))
    bias = operands.tensor_of(m, ins, "opd2", (1, 1, 1, nn))
    lanes = (res.start_lane(m.chip) + np.arange(mm)) % m.chip.lanes
    offsets = bias.offset(m.chip) + np.arange(nn) * bias.prec.bytes
    m.lmem.lane_bytes(bias.addr, nn * bias.prec.bytes)  # bounds check
    stored = m.lmem.gather_rows(lanes[:, None], offsets[None, :], bias.prec.storage_dtype)
    values = to_f32(stored, bias.prec) if as_float else stored.astype(np.int64)
    return values.reshape(1, mm, 1, nn)


def execute_mm2(m, ins: Mm2Tiu) -> None:
    """res0 = L @ R (+ res0) + bias, then relu (integer form: exact, wrapped to int32)."""
    left, right = _mm2_operands(m, ins)
    shape = (1, ins.res0_c, 1, ins.res0_w)
    if is_integer_form(ins):
        _check_integer_result(ins)
        y = (left @ right).astype(np.int64).reshape(shape) + _mm2_bias(m, ins, as_float=False)
        return _finish_integer(m, ins, y, shape)
    y = (left @ right).reshape(shape)
    if ins.opt_res_add:
        y = y + operands.value(m, ins, "res0", shape, as_float=True)
    y = y + _mm2_bias(m, ins)
    if ins.opt_relu:
        y = np.maximum(y, np.float32(0))
    operands.write(m, ins, "res0", shape, y)


HANDLERS = {ConvTiu: execute_conv, Mm2Tiu: execute_mm2}
