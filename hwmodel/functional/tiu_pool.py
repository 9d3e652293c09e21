"""TIU PorD instructions: depthwise convolution, average, max and min pooling (fp32 accumulation)."""

from __future__ import annotations

import numpy as np

from tpuflow.isa.base import Prec
from tpuflow.isa.tiu import PordTiu

from tpuflow.hwmodel.functional import operands
from tpuflow.hwmodel.functional.errors import ExecutionError
from tpuflow.hwmodel.functional.floats import narrow_const_value
from tpuflow.hwmodel.functional.windows import Window, pad, tap

PAD_VALUE = {"depthwise": 0.0, "avgpooling": 0.0, "maxpooling": -np.inf, "minpooling": np.inf}


def _taps(win: Window):
    return [(i, j) for i in range(win.kh) for j in range(win.kw)]


def _depthwise(m, ins: PordTiu, xp: np.ndarray, win: Window) -> np.ndarray:
    c = ins.res0_c
    weight = operands.value(m, ins, "opd1", (1, c, 1, win.kh * win.kw), as_float=True)
    weight = np.broadcast_to(weight, (1, c, 1, win.kh * win.kw)).reshape(c, win.kh * win.kw)
    acc = np.zeros((ins.res0_n, c, win.oh, win.ow), np.float32)
    for k, (i, j) in enumerate(_taps(win)):
        acc += tap(xp, win, i, j) * weight[:, k].reshape(1, c, 1, 1)
    bias = operands.value(m, ins, "opd2", (1, c, 1, 1), as_float=True)
    return acc + bias


def _average(m, ins: PordTiu, xp: np.ndarray, win: Window) -> np.ndarray:
    if not ins.opt_opd1_const:
        raise ExecutionError("pord.avgpooling takes its scale as a constant (opt_opd1_const = 1)")
    acc = np.zeros((ins.res0_n, ins.res0_c, win.oh, win.ow), np.float32)
    for i, j in _taps(win):
        acc += tap(xp, win, i, j)
    return acc * np.float32(narrow_const_value(ins.opd1_addr, Prec(ins.opt_opd1_prec)))


def _extreme(xp: np.ndarray, win: Window, reduce) -> np.ndarray:
    out = tap(xp, win, 0, 0).copy()
    for i, j in _taps(win)[1:]:
        reduce(out, tap(xp, win, i, j), out=out)
    return out


def _integer_depthwise(m, ins: PordTiu, win: Window) -> np.ndarray:
    """The integer form: int8 inputs and weights, the int32 bias, exact sums (int64 here)."""
    c = ins.res0_c
    x = operands.value(m, ins, "opd0", (ins.res0_n, c, ins.opd0_h, ins.opd0_w), as_float=False)
    xp = pad(x, win, 0)
    weight = operands.value(m, ins, "opd1", (1, c, 1, win.kh * win.kw), as_float=False)
    weight = np.broadcast_to(weight, (1, c, 1, win.kh * win.kw)).reshape(c, win.kh * win.kw)
    acc = np.zeros((ins.res0_n, c, win.oh, win.ow), np.int64)
    for k, (i, j) in enumerate(_taps(win)):
        acc += tap(xp, win, i, j) * weight[:, k].reshape(1, c, 1, 1)
    return acc + operands.value(m, ins, "opd2", (1, c, 1, 1), as_float=False)


def execute_pord(m, ins: PordTiu) -> None:
    win = Window.of(ins)
    if ins.op == "depthwise" and not Prec(ins.opt_opd0_prec).is_float:
        y = _integer_depthwise(m, ins, win)
        operands.write(m, ins, "res0", ins.res0_shape, np.maximum(y, 0) if ins.opt_relu else y)
        return
    x = operands.value(m, ins, "opd0", (ins.res0_n, ins.res0_c, ins.opd0_h, ins.opd0_w), as_float=True)
    xp = pad(x, win, PAD_VALUE[ins.op])
    if ins.op == "depthwise":
        y = _depthwise(m, ins, xp, win)
    elif ins.op == "avgpooling":
        y = _average(m, ins, xp, win)
    else:
        y = _extreme(xp, win, np.maximum if ins.op == "maxpooling" else np.minimum)
    if ins.opt_relu:
        y = np.maximum(y, np.float32(0))
    operands.write(m, ins, "res0", ins.res0_shape, y)


HANDLERS = {PordTiu: execute_pord}
