"""int8 lookup tables end to end (frontend/lookup.py -> LookupTable -> SG gathers): a float model with a
hard-swish (Add, Clip, Mul, Div) and a Sigmoid compiled --dtype int8 verifies against onnxruntime, its
elementwise chains became tables run by sg.pe_s_gather_*; a QDQ model made by onnxruntime's quantize_static
with Add / Mul / Clip / HardSwish chains verifies; and the program with tables gives exactly the integers of
the program without them (the chain's ops emitted one by one), on every code, for any scales, zero points
and constants (hypothesis)."""

from __future__ import annotations

import logging
import sys
import tempfile
from pathlib import Path
from unittest import mock

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "frontend"))

import tpuflow.frontend.lookup as lookup  # noqa: E402
from lookup_models import SHAPE, hard_swish  # noqa: E402
from tpuflow.hwmodel.functional import run  # noqa: E402
from tpuflow.isa import SgTiu  # noqa: E402
from tpuflow.options import CompileOptions  # noqa: E402
from tpuflow.pipeline import compile_model, verify  # noqa: E402


def float_cnn(hard_swish_op: bool = False) -> onnx.ModelProto:
    """conv -> hard-swish (x * clip(x + 3, 0, 6) / 6, or the HardSwish op) -> conv -> sigmoid -> conv."""
    rng = np.random.default_rng(3)
    n = helper.make_node
    w = lambda name, shape, s=0.3: numpy_helper.from_array(  # noqa: E731
        (rng.standard_normal(shape) * s).astype(np.float32), name)
    k = lambda name, v: numpy_helper.from_array(np.asarray(v, np.float32), name)  # noqa: E731
    swish = [n("HardSwish", ["c1"], ["h1"], name="hs")] if hard_swish_op else [
        n("Add", ["c1", "three"], ["a1"], name="hs_add"), n("Clip", ["a1", "zero", "six"], ["k1"], name="hs_clip"),
        n("Mul", ["c1", "k1"], ["m1"], name="hs_mul"), n("Div", ["m1", "six"], ["h1"], name="hs_div")]
    nodes = [n("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]), *swish,
             n("Conv", ["h1", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]), n("Sigmoid", ["c2"], ["s2"], name="sig"),
             n("Add", ["s2", "half"], ["s3"], name="shift"), n("Mul", ["s3", "two"], ["s4"], name="gain"),
             n("Conv", ["s4", "w3"], ["y"], name="conv3")]
    inits = [w("w1", (8, 3, 3, 3)), w("b1", (8,), 0.1), w("w2", (8, 8, 3, 3), 0.2), w("w3", (4, 8, 1, 1)),
             k("three", 3.0), k("zero", 0.0), k("six", 6.0), k("half", -0.5), k("two", 2.0)]
    graph = helper.make_graph(nodes, "lut_cnn", [helper.make_tensor_value_info("x", T.FLOAT, [1, 3, 12, 12])],
                              [helper.make_tensor_value_info("y", T.FLOAT, [1, 4, 12, 12])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def gathers(program) -> int:
    return sum(isinstance(i, SgTiu) for core in program.cores for i in core.tiu)


def test_float_model_with_hard_swish_and_sigmoid_compiled_int8_verifies():
    result = verify(float_cnn(), "sg2260", CompileOptions(dtype="int8"))
    assert result["ok"], result["outputs"]
    graph, program = compile_model(float_cnn(), "sg2260", CompileOptions(dtype="int8"))
    tables = [n for n in graph.nodes() if n.op_type == "LookupTable"]
    assert len(tables) == 2 and gathers(program) >= 2       # the hard-swish; sigmoid (+ its Add / Mul)


class _Reader:
    def __init__(self, model):
        rng = np.random.default_rng(0)
        self.feeds = iter([{"x": rng.standard_normal((1, 3, 12, 12)).astype(np.float32)} for _ in range(4)])

    def get_next(self):
        return next(self.feeds, None)


def quantize_static_model(model: onnx.ModelProto) -> onnx.ModelProto:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    logging.getLogger().setLevel(logging.ERROR)
    reader = type("Reader", (_Reader, CalibrationDataReader), {})(model)
    with tempfile.TemporaryDirectory(prefix="tpuflow_lut_") as tmp:
        src, dst = Path(tmp) / "float.onnx", Path(tmp) / "quant.onnx"
        onnx.save(model, src)
        quantize_static(str(src), str(dst), reader, quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8)
        return onnx.load(str(dst))


@pytest.mark.parametrize("hard_swish_op", [False, True], ids=["add-clip-mul-div", "HardSwish"])
def test_quantize_static_qdq_model_verifies(hard_swish_op):
    model = quantize_static_model(float_cnn(hard_swish_op))
    result = verify(model, "sg2260", CompileOptions(dtype="fp16"))
    assert result["ok"], result["outputs"]
    graph, program = compile_model(model, "sg2260", CompileOptions(dtype="fp16"))
    assert any(n.op_type == "LookupTable" for n in graph.nodes()) and gathers(program) >= 1


def _program_output(model, collapse: bool) -> np.ndarray:
    """y0 on every code of x, with or without the lookup tables."""
    with mock.patch.object(lookup, "collapse_lookup_tables", wraps=lookup.collapse_lookup_tables) as patched:
        if not collapse:
            patched.side_effect = lambda graph: graph
        graph, program = compile_model(model, "sg2260", CompileOptions(dtype="fp32"))
    assert any(n.op_type == "LookupTable" for n in graph.nodes()) == collapse
    assert (gathers(program) > 0) == collapse
    codes = np.arange(256, dtype=np.uint8).view(graph.tensor("xq").dtype).reshape(SHAPE)
    return run(program, {"xq": codes})["y0"]


@settings(max_examples=6, deadline=None)
@given(scales=st.lists(st.floats(0.004, 0.1), min_size=4, max_size=4),
       zps=st.lists(st.integers(-10, 10), min_size=4, max_size=4), three=st.floats(-4, 4), six=st.floats(1, 8),
       x_scale=st.floats(0.01, 0.1), unsigned=st.booleans())
def test_tables_give_onnxruntimes_integers(scales, zps, three, six, x_scale, unsigned):
    """On every code the gathers give exactly onnxruntime's integers (the tables are onnxruntime's), and those of
    the program without tables (each op as ElementwiseQuant emits it alone) but at rare ties, by one step: that
    program requantises by the product with fp32(1 / s), which rounds an exact tie of QuantizeLinear's fp32
    division the other way (2.522461 / 0.080078125 = 31.5 -> 32, times fp32(1 / 0.080078125) = 31.499998 -> 31):
    a property of emit_requant, where the tables agree with onnxruntime."""
    from tpuflow.compare import run_onnxruntime
    shift = 128 if unsigned else 0
    model = hard_swish([np.float32(s) for s in scales], [z + shift for z in zps], three, six,
                       "uint8" if unsigned else "int8", np.float32(x_scale), shift)
    codes = np.arange(256, dtype=np.uint8).view("uint8" if unsigned else "int8").reshape(SHAPE)
    reference = run_onnxruntime(model, {"xq": codes}, optimize=False)["y0"]
    tables, ops = _program_output(model, True), _program_output(model, False)
    np.testing.assert_array_equal(tables, reference)
    assert np.mean(tables == ops) >= 0.98 and np.max(np.abs(tables - ops)) <= max(scales)     # ties: rare, one step
