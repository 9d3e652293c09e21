"""The lookup-table graph rule (frontend/lookup.py): which elementwise subgraphs of one 8-bit tensor collapse
into one LookupTable and which do not (a second runtime source, a per-channel constant, an intermediate read
outside the set, a per-channel quantized source, a lone code clamp), and that the collapsed graph computes
exactly what the model computes on every one of the 256 codes (onnxruntime on the model against onnxruntime
on the canonical graph's export; hypothesis over scales, zero points and constants)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tpuflow.frontend.lookup as lookup
from frontend_util import run_ort
from lookup_models import SHAPE, Chain, float_sigmoid, hard_swish
from tpuflow.frontend import load
from tpuflow.frontend.export import graph_to_onnx


def every_code(storage: str) -> dict:
    return {"xq": np.arange(256, dtype=np.uint8).view(storage).reshape(SHAPE)}


def kinds(graph) -> list[str]:
    return [n.op_type for n in graph.nodes()]


def assert_same_on_every_code(model, storage="int8"):
    graph = load(model)
    feeds = every_code(storage)
    for want, got in zip(run_ort(model, feeds), run_ort(graph_to_onnx(graph), feeds)):
        np.testing.assert_array_equal(got, want)
    return graph


def test_hard_swish_of_four_quantized_ops_is_one_table():
    graph = assert_same_on_every_code(hard_swish())
    assert kinds(graph) == ["LookupTable", "DequantizeLinear"]
    (lut,) = [n for n in graph.nodes() if n.op_type == "LookupTable"]
    table = graph.tensor(lut.inputs[1])
    assert table.shape == (256,) and table.quant == graph.tensor(lut.outputs[0]).quant
    assert set(graph.tensors) == {"xq", lut.inputs[1], lut.outputs[0], "y0"}     # inner tensors and constants gone


@pytest.mark.parametrize("storage", ["int8", "uint8"])
def test_a_float_op_between_dequantize_and_quantize_is_a_table(storage):
    graph = assert_same_on_every_code(float_sigmoid(storage), storage)
    assert kinds(graph) == ["LookupTable", "DequantizeLinear"]


@settings(max_examples=12, deadline=None)
@given(scales=st.lists(st.floats(0.002, 0.2), min_size=4, max_size=4),
       zps=st.lists(st.integers(-20, 20), min_size=4, max_size=4), three=st.floats(-4, 4), six=st.floats(0.5, 8),
       x_scale=st.floats(0.005, 0.3), x_zp=st.integers(-30, 30), unsigned=st.booleans(), absorbed=st.booleans())
def test_tables_are_exact_for_any_scales_zero_points_and_constants(scales, zps, three, six, x_scale, x_zp, unsigned,
                                                                   absorbed):
    """The hard-swish as ops on quantized tensors (quantized constants) or as float ops between
    DequantizeLinear and QuantizeLinear (float constants)."""
    storage = "uint8" if unsigned else "int8"
    shift = 128 if unsigned else 0
    graph = assert_same_on_every_code(hard_swish([np.float32(s) for s in scales], [z + shift for z in zps],
                                                 three, six, storage, np.float32(x_scale), x_zp + shift, absorbed),
                                      storage)
    assert kinds(graph)[0] == "LookupTable"


def test_a_second_runtime_source_stays():
    c = Chain()
    z = c.runtime_input("z")
    y = c.quantize(c.op("Add", ["x", z], "a"), 0.05, 0)
    graph = load(c.model(y))
    assert "LookupTable" not in kinds(graph) and "Add" in kinds(graph)


def test_a_per_channel_constant_ends_the_set():
    """(x + 3) * 2 (scalars, each its own scale) is a table; the Mul by one value per channel after it is not in it."""
    c = Chain()
    a = c.quantize(c.op("Add", ["x", c.qconst(3.0)], "a"), 0.04, 0)
    b = c.quantize(c.op("Mul", [a, c.qconst(2.0)], "b"), 0.08, 0)
    y = c.quantize(c.op("Mul", [b, c.const(np.arange(1, 5, dtype=np.float32).reshape(1, 4, 1, 1))], "m"), 0.1, 0)
    graph = assert_same_on_every_code(c.model(y))
    assert kinds(graph) == ["LookupTable", "DequantizeLinear", "Mul", "QuantizeLinear", "DequantizeLinear"]
    assert graph.tensor(graph.node("b/lookup_table").inputs[0]).name == "xq"


def test_an_intermediate_read_outside_ends_the_set_before_it():
    """hard-swish (quantized ops) whose clip(x + 3) is also an output: x + 3 and the clip are one table (the
    clip's result, read outside, is its exit), x * clip(.) reads two runtime tensors, / 6 alone is one
    requantising Mul: both stay."""
    c = Chain()
    a = c.quantize(c.op("Add", ["x", c.qconst(3.0)], "a"), 0.04, 0)
    k = c.quantize(c.op("Clip", [a, c.const(0.0), c.const(6.0)], "k"), 0.03, 0)
    m = c.quantize(c.op("Mul", ["x", k], "m"), 0.05, 0)
    y = c.quantize(c.op("Mul", [m, c.qconst(1 / 6)], "h"), 0.02, 0)
    graph = assert_same_on_every_code(c.model(y, k))
    assert kinds(graph) == ["LookupTable", "DequantizeLinear", "Mul", "Mul", "DequantizeLinear"]
    assert [n.outputs[0] for n in graph.nodes() if n.op_type == "LookupTable"] == ["k_q"]


def test_a_per_channel_quantized_source_is_not_a_table_source():
    c = Chain(x_axis_scales=np.asarray([0.01, 0.02, 0.03, 0.04], np.float32))
    y = c.quantize(c.op("Add", ["x", c.const(1.0)], "a"), 0.05, 0)
    graph = load(c.model(y))
    assert not any(n.op_type == "LookupTable" and n.inputs[0] == "xq" for n in graph.nodes())


@pytest.mark.parametrize("op", ["Relu", "Add", "Sigmoid"])
def test_one_op_is_a_table_only_when_it_computes_in_float(op):
    """One requantising Relu / Add on quantized tensors (dequantise, op, requantise on the vector unit) is
    cheaper than a gather and stays; one float op between DequantizeLinear and QuantizeLinear becomes a table."""
    c = Chain(scale=0.05)
    inputs = ["x", c.qconst(1.0)] if op == "Add" else ["x"]
    y = c.quantize(c.op(op, inputs, "r"), 0.03, 0)
    graph = assert_same_on_every_code(c.model(y))
    assert ("LookupTable" in kinds(graph)) == (op == "Sigmoid"), kinds(graph)


def test_a_shared_dequantize_serves_two_tables():
    """DequantizeLinear(x) read by a Sigmoid and a Tanh, each quantized: two tables of x, the float result gone."""
    c = Chain()
    a = c.quantize(c.op("Sigmoid", ["x"], "s"), 1 / 255, 0)
    b = c.quantize(c.op("Tanh", ["x"], "t"), 1 / 127, 0)
    graph = load(c.model(a, b))
    luts = [n for n in graph.nodes() if n.op_type == "LookupTable"]
    assert [n.inputs[0] for n in luts] == ["xq", "xq"] and len({n.inputs[1] for n in luts}) == 2
    assert kinds(graph) == ["LookupTable", "LookupTable", "DequantizeLinear", "DequantizeLinear"]
    assert_same_on_every_code(c.model(a, b))


def test_a_shared_dequantize_stays_for_its_other_readers():
    """x * sigmoid(x) with the product in float (SE-like): the table of sigmoid reads x's codes, the
    DequantizeLinear stays for the Mul."""
    c = Chain()
    s = c.quantize(c.op("Sigmoid", ["x"], "s"), 1 / 255, 0)
    graph = assert_same_on_every_code(c.model(c.op("Mul", ["x", s], "m")))
    assert kinds(graph)[:2] == ["DequantizeLinear", "LookupTable"] and "x" in graph.tensors


def test_graphs_without_quantized_tensors_are_left_alone():
    c = Chain()
    graph = load(c.model(c.quantize(c.op("Relu", ["x"], "r"), 0.05, 0)))
    assert lookup.collapse_lookup_tables(graph) is graph


def test_a_relu_the_product_fuses_joins_no_set():
    """Conv -> Relu -> + 1 -> * 2, each with its own scale: the Relu, the Conv's only reader, is fused into the
    Conv's requantisation, so the table starts after it; with the Conv's result read elsewhere too, the Relu is
    not fused and joins the table."""
    from onnx import helper, numpy_helper
    for shared in (False, True):
        c = Chain()
        weights = np.random.default_rng(0).integers(-3, 4, (4, 4, 3, 3)).astype(np.int8)
        c.inits += [numpy_helper.from_array(weights, "wq"), numpy_helper.from_array(np.int8(0), "zw")]
        c.nodes.append(helper.make_node("DequantizeLinear", ["wq", c.const(0.05), "zw"], ["w"], name="w_dq"))
        conv = c.quantize(c.op("Conv", ["x", "w"], "conv", pads=[1, 1, 1, 1]), 0.05, 0)
        relu = c.quantize(c.op("Relu", [conv], "r"), 0.03, 0)
        a = c.quantize(c.op("Add", [relu, c.qconst(1.0)], "a"), 0.04, 0)
        y = c.quantize(c.op("Mul", [a, c.qconst(2.0)], "m"), 0.08, 0)
        graph = assert_same_on_every_code(c.model(*((y, conv) if shared else (y,))))
        luts = [n for n in graph.nodes() if n.op_type == "LookupTable"]
        assert len(luts) == 1 and ("Relu" in kinds(graph)) != shared, kinds(graph)
        assert luts[0].inputs[0] == ("conv_q" if shared else "r_q")
