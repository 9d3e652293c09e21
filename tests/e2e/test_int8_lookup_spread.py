"""int8 hard-swish tables on maps of 8 / 16 / 32 / 48 channels end to end: a conv -> hard-swish -> conv model quantized
by onnxruntime's quantize_static (QDQ, seeded calibration) compiles with its lookups' rows spread over the lanes
(lowering/ops/quant_ops.py _spread_lookup: tsbc.l_copy into staging, gathers over more lanes than the map has
channels) and gives onnxruntime's integer codes exactly (verify, on the int8 output), the same output as the program
that gathers in place;
at 64 channels nothing is spread."""

from __future__ import annotations

import logging
import tempfile
from unittest import mock
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T, helper, numpy_helper

import tpuflow.lowering.ops.quant_ops as quant_ops
from tpuflow.hwmodel.functional import run
from tpuflow.isa import CwBcTiu, SgTiu
from tpuflow.options import CompileOptions
from tpuflow.pipeline import compile_model, verify

SIDE = 40


def float_model(channels: int) -> onnx.ModelProto:
    """conv (3 -> channels) -> x * clip(x + 3, 0, 6) / 6 -> conv (channels -> 4), on (1, 3, SIDE, SIDE)."""
    rng = np.random.default_rng(channels)
    n = helper.make_node
    w = lambda name, shape, s: numpy_helper.from_array(  # noqa: E731
        (rng.standard_normal(shape) * s).astype(np.float32), name)
    k = lambda name, v: numpy_helper.from_array(np.asarray(v, np.float32), name)  # noqa: E731
    nodes = [n("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             n("Add", ["c1", "three"], ["a1"], name="hs_add"), n("Clip", ["a1", "zero", "six"], ["k1"], name="hs_clip"),
             n("Mul", ["c1", "k1"], ["m1"], name="hs_mul"), n("Div", ["m1", "six"], ["h1"], name="hs_div"),
             n("Conv", ["h1", "w2"], ["y"], name="conv2", pads=[1, 1, 1, 1])]
    inits = [w("w1", (channels, 3, 3, 3), 0.5), w("b1", (channels,), 0.3), w("w2", (4, channels, 3, 3), 0.2),
             k("three", 3.0), k("zero", 0.0), k("six", 6.0)]
    graph = helper.make_graph(nodes, f"hswish_{channels}",
                              [helper.make_tensor_value_info("x", T.FLOAT, [1, 3, SIDE, SIDE])],
                              [helper.make_tensor_value_info("y", T.FLOAT, [1, 4, SIDE, SIDE])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def quantized(model: onnx.ModelProto) -> onnx.ModelProto:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            rng = np.random.default_rng(0)
            self.feeds = iter([{"x": rng.standard_normal((1, 3, SIDE, SIDE)).astype(np.float32)} for _ in range(4)])

        def get_next(self):
            return next(self.feeds, None)

    logging.getLogger().setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="tpuflow_spread_") as tmp:
        src, dst = Path(tmp) / "float.onnx", Path(tmp) / "quant.onnx"
        onnx.save(model, src)
        quantize_static(str(src), str(dst), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8)
        return onnx.load(str(dst))


def _tiu(program):
    return [i for core in program.cores for i in core.tiu]


@pytest.mark.parametrize("channels", [8, 16, 32, 48, 64])
def test_hard_swish_on_few_channels_spreads_and_verifies(channels):
    model = quantized(float_model(channels))
    result = verify(model, "sg2260", CompileOptions(dtype="fp16"))
    assert result["ok"], result["outputs"]
    row = result["outputs"][0]          # onnxruntime's integers, every one (of one of its two executions)
    assert 0.0 in (row["steps"], row["vs_other_execution"]["steps"])
    graph, program = compile_model(model, "sg2260", CompileOptions(dtype="fp16"))
    assert any(n.op_type == "LookupTable" for n in graph.nodes())
    tiu = _tiu(program)
    gathers = [i for i in tiu if isinstance(i, SgTiu)]
    copies = [i for i in tiu if isinstance(i, CwBcTiu) and i.op == "l_copy"]
    assert gathers
    if channels < 64:
        assert copies and max(g.res0_c for g in gathers) > channels
    else:
        assert not copies
    feeds = {"x": np.random.default_rng(5).standard_normal((1, 3, SIDE, SIDE)).astype(np.float32)}
    with mock.patch.object(quant_ops, "lookup_stage_shape", return_value=None):
        _, unspread = compile_model(model, "sg2260", CompileOptions(dtype="fp16"))
    assert not any(isinstance(i, CwBcTiu) for i in _tiu(unspread))
    np.testing.assert_array_equal(run(program, feeds)["y"], run(unspread, feeds)["y"])
