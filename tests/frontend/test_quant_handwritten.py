"""Hand-written quantized models: QDQ at opset 13 (per-channel weights with axis, a float bias,
Relu / Clip / MaxPool between DQ and Q) and opset 21 (output_dtype, per-axis MatMul weights, an
int32 bias), MatMulInteger / ConvInteger, the command line on quantized models, and bad input:
one-line errors naming the node."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T, helper, numpy_helper

from frontend_util import random_feeds, run_ort
from tpuflow import cli
from tpuflow.errors import ModelError, UnsupportedOpError
from tpuflow.frontend import load
from tpuflow.frontend.export import graph_to_onnx
from tpuflow.frontend.quant import first_quantized_node, quantize

rng = np.random.default_rng(7)
f32, i8, u8, i32 = np.float32, np.int8, np.uint8, np.int32


def arr(name: str, value, dtype) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, dtype), name)


def model(nodes, inputs, outputs, inits, opset: int, elem=T.FLOAT) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "hand", [helper.make_tensor_value_info(k, elem, list(v)) for k, v in inputs.items()],
                              [helper.make_tensor_value_info(k, T.FLOAT, list(v)) for k, v in outputs.items()], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8 if opset < 21 else 10)


def qdq(x: str, scale: str, zp: str, tag: str) -> list:
    """x -> QuantizeLinear -> DequantizeLinear -> '{tag}_real' (a PyTorch-style activation pair)."""
    return [helper.make_node("QuantizeLinear", [x, scale, zp], [f"{tag}_q"], name=f"{tag}_quantize"),
            helper.make_node("DequantizeLinear", [f"{tag}_q", scale, zp], [f"{tag}_real"], name=f"{tag}_dequantize")]


W_SCALE = np.asarray([0.010, 0.020, 0.015, 0.030], f32)
CONV_BIAS = np.asarray([0.1, -0.2, 0.05, 0.3], f32)


def opset13_conv_chain() -> onnx.ModelProto:
    """Conv (per-channel int8 weights, axis 0; float bias) -> Relu -> Clip(0, 2) -> MaxPool, every
    step between DQ and Q; activations int8, the last one asymmetric with its scale from a Constant
    node (as PyTorch exporters write them)."""
    n = helper.make_node
    nodes = [*qdq("x", "sx", "z0", "x"),
             n("DequantizeLinear", ["wq", "sw", "zw"], ["w_real"], name="w_dequantize", axis=0),
             n("Conv", ["x_real", "w_real", "bias"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             *qdq("c", "sc", "z0", "c"), n("Relu", ["c_real"], ["r"], name="relu"),
             *qdq("r", "sc", "z0", "r"), n("Clip", ["r_real", "lo", "hi"], ["k"], name="clip"),
             n("Constant", [], ["sk"], name="scale_constant", value=arr("sk_value", 0.01, f32)),
             *qdq("k", "sk", "zk", "k"), n("MaxPool", ["k_real"], ["p"], name="pool", kernel_shape=[2, 2],
                                            strides=[2, 2]),
             *qdq("p", "sk", "zk", "p"), n("Identity", ["p_real"], ["y"], name="out")]
    inits = [arr("sx", 0.05, f32), arr("z0", 0, i8), arr("sc", 0.04, f32), arr("zk", -100, i8),
             arr("wq", rng.integers(-127, 128, (4, 3, 3, 3)), i8), arr("sw", W_SCALE, f32), arr("zw", [0] * 4, i8),
             arr("bias", CONV_BIAS, f32), arr("lo", 0, f32), arr("hi", 2, f32)]
    return model(nodes, {"x": (1, 3, 8, 8)}, {"y": (1, 4, 4, 4)}, inits, 13)


def opset21_matmul() -> onnx.ModelProto:
    """uint8 activations (output_dtype, no zero point), int8 weights per column (axis 1), an int32
    bias of scale input * weight (axis 0) added after the MatMul, as onnxruntime writes a Gemm."""
    n = helper.make_node
    sx, sw = np.float32(0.02), np.asarray(rng.uniform(0.005, 0.02, 5), f32)
    nodes = [n("QuantizeLinear", ["x", "sx"], ["xq"], name="x_quantize", output_dtype=T.UINT8),
             n("DequantizeLinear", ["xq", "sx"], ["x_real"], name="x_dequantize"),
             n("DequantizeLinear", ["wq", "sw", "zw"], ["w_real"], name="w_dequantize", axis=1),
             n("DequantizeLinear", ["bq", "sb"], ["b_real"], name="b_dequantize", axis=0),
             n("MatMul", ["x_real", "w_real"], ["m"], name="matmul"), n("Add", ["m", "b_real"], ["a"], name="bias"),
             n("QuantizeLinear", ["a", "sy", "zy"], ["aq"], name="y_quantize"),
             n("DequantizeLinear", ["aq", "sy", "zy"], ["y"], name="y_dequantize")]
    inits = [arr("sx", sx, f32), arr("wq", rng.integers(-127, 128, (6, 5)), i8), arr("sw", sw, f32),
             arr("zw", [0] * 5, i8), arr("bq", rng.integers(-500, 500, 5), i32), arr("sb", sx * sw, f32),
             arr("sy", 0.05, f32), arr("zy", 120, u8)]
    return model(nodes, {"x": (3, 6)}, {"y": (3, 5)}, inits, 21)


def assert_runs_like_the_model(m: onnx.ModelProto, g, steps: float = 0.0) -> None:
    for seed in range(3):
        feeds = random_feeds(g, seed=seed, positive=False)
        for e, a in zip(run_ort(m, feeds), run_ort(graph_to_onnx(g), feeds)):
            assert e.shape == a.shape and np.max(np.abs(e.astype(np.float64) - a)) <= steps


def test_opset13_qdq_chain_is_absorbed_op_by_op():
    m = opset13_conv_chain()
    g = load(m)
    assert [n.op_type for n in g.nodes()] == ["QuantizeLinear", "Conv", "Relu", "Clip", "MaxPool", "DequantizeLinear"]
    conv = g.node("conv")
    x, w, b, y = (g.tensor(t) for t in (*conv.inputs, *conv.outputs))
    assert w.quant.axis == 0 and np.array_equal(w.quant.scale, W_SCALE) and w.dtype == "int8"
    assert np.array_equal(w.const, numpy_helper.to_array(m.graph.initializer[4])) and w.name == "wq"
    acc = (np.float32(0.05) * W_SCALE).astype(f32)
    assert b.dtype == "int32" and b.quant.axis == 0 and np.array_equal(b.quant.scale, acc)
    assert np.array_equal(b.const, np.rint(CONV_BIAS.astype(np.float64) / acc).astype(i32))     # float bias rounded
    assert float(y.quant.scale) == np.float32(0.04) and int(y.quant.zero_point) == 0
    clip = g.node("clip")
    assert (clip.attrs["min"], clip.attrs["max"]) == (0.0, 2.0)
    pool_out = g.tensor(g.node("pool").outputs[0]).quant
    assert float(pool_out.scale) == np.float32(0.01) and int(pool_out.zero_point) == -100
    assert_runs_like_the_model(m, g, steps=0.01)       # the rounded bias may move a result by one step


def test_opset21_matmul_with_int32_bias_keeps_the_models_integers():
    m = opset21_matmul()
    g = load(m)
    assert [n.op_type for n in g.nodes()] == ["QuantizeLinear", "MatMul", "Add", "DequantizeLinear"]
    mm, add = g.node("matmul"), g.node("bias")
    x, w, acc = (g.tensor(t) for t in (*mm.inputs, *mm.outputs))
    assert x.dtype == "uint8" and int(x.quant.zero_point) == 0 and x.quant.zero_point.dtype == np.uint8
    assert w.quant.axis == 1 and acc.dtype == "int32" and acc.quant.axis == 1
    bias = g.tensor(add.inputs[1])
    assert np.array_equal(bias.const, numpy_helper.to_array(m.graph.initializer[4]))
    assert np.array_equal(bias.quant.scale, acc.quant.scale) and add.outputs == ("aq",)
    assert_runs_like_the_model(m, g, steps=0.05)


def integer_model(op: str) -> onnx.ModelProto:
    """MatMulInteger / ConvInteger on a uint8 input with zero point 3, int8 weights, Cast, Mul."""
    n = helper.make_node
    shape, wshape = ((2, 4), (4, 3)) if op == "MatMulInteger" else ((1, 2, 5, 5), (3, 2, 3, 3))
    nodes = [n(op, ["a", "w", "za", "zw"], ["acc"], name="integer"), n("Cast", ["acc"], ["f"], name="cast", to=T.FLOAT),
             n("Mul", ["f", "scale"], ["y"], name="rescale")]
    inits = [arr("w", rng.integers(-127, 128, wshape), i8), arr("za", 3, u8), arr("zw", 0, i8), arr("scale", 0.01, f32)]
    graph = helper.make_graph(nodes, "integer", [helper.make_tensor_value_info("a", T.UINT8, list(shape))],
                              [helper.make_tensor_value_info("y", T.FLOAT, None)], inits)
    from op_models import with_output_shapes
    return with_output_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8))


@pytest.mark.parametrize("op", ["MatMulInteger", "ConvInteger"])
def test_integer_products_give_an_int32_result_of_scale_one(op):
    m = integer_model(op)
    g = load(m)
    assert [n.op_type for n in g.nodes()] == ["MatMul" if op == "MatMulInteger" else "Conv", "DequantizeLinear", "Mul"]
    a = g.tensor("a")
    assert a.quant is not None and float(a.quant.scale) == 1 and int(a.quant.zero_point) == 3
    acc = g.tensor("acc")
    assert acc.dtype == "int32" and float(acc.quant.scale) == 1
    assert_runs_like_the_model(m, g)


def test_inspect_shows_quantized_tensors_and_compile_compiles(tmp_path, capsys):
    """(The int8 lowering's refusals of unsupported quantized ops: tests/e2e/test_int8_models.py.)"""
    path = tmp_path / "hand13.onnx"
    onnx.save(opset13_conv_chain(), path)
    assert cli.main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "quantized tensors: " in out and "w int8 per-channel(axis 0, 4)" in out and "b int32 per-channel" in out
    assert cli.main(["compile", str(path), "-o", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "manifest.json").exists()


def test_float_models_stay_float():
    from tpuflow import models
    g = load(models.build_model("small_cnn"))
    assert all(t.quant is None for t in g.tensors.values()) and first_quantized_node(g) is None


def conv_weights_model(dq_attrs: dict, scale, zp, dtype=i8, opset: int = 13, scale_input: bool = False):
    n = helper.make_node
    inputs = ["wq", "sw", "zw"] if zp is not None else ["wq", "sw"]
    nodes = [n("DequantizeLinear", inputs, ["w_real"], name="bad_dequantize", **dq_attrs),
             n("Conv", ["x", "w_real"], ["y"], name="conv")]
    inits = [arr("wq", np.ones((4, 3, 1, 1)), dtype)] + ([] if scale_input else [arr("sw", scale, f32)])
    inits += [arr("zw", zp, dtype)] if zp is not None else []
    m = model(nodes, {"x": (1, 3, 4, 4)}, {"y": (1, 4, 4, 4)}, inits, opset)
    if scale_input:
        m.graph.input.append(helper.make_tensor_value_info("sw", T.FLOAT, [4]))
    return m


@pytest.mark.parametrize("kwargs,phrases,error", [
    (dict(dq_attrs={"axis": 0}, scale=[0.1] * 4, zp=[0] * 3), ["zero point shape [3] does not match scale shape [4]"],
     ModelError),
    (dict(dq_attrs={"axis": 0}, scale=[0.1] * 3, zp=[0] * 3), ["3 scales for axis 0 of size 4"], ModelError),
    (dict(dq_attrs={"axis": 0}, scale=[0.1] * 4, zp=None, scale_input=True), ["DequantizeLinear[runtime scale]"],
     UnsupportedOpError),
    (dict(dq_attrs={"axis": 1, "block_size": 3}, scale=np.full((4, 1, 1, 1), 0.1), zp=None, opset=21),
     ["blocked quantization (block_size 3)"], ModelError),
    (dict(dq_attrs={}, scale=0.1, zp=0, dtype=np.int16, opset=21), ["storage 'int16'"], ModelError),
])
def test_bad_quantization_parameters_are_one_line_errors_naming_the_node(kwargs, phrases, error, tmp_path, capsys):
    m = conv_weights_model(**kwargs)
    with pytest.raises(error) as info:
        load(m)
    message = str(info.value)
    assert "\n" not in message and "bad_dequantize" in message, message
    for p in phrases:
        assert p in message, message
    path = tmp_path / "bad.onnx"
    onnx.save(m, path)
    assert cli.main(["inspect", str(path)]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_dynamic_quantization_and_integer_arithmetic_are_refused_by_name():
    n = helper.make_node
    dyn = model([n("DynamicQuantizeLinear", ["x"], ["q", "s", "z"], name="dyn"),
                 n("DequantizeLinear", ["q", "s", "z"], ["y"], name="deq")], {"x": (2, 3)}, {"y": (2, 3)}, [], 13)
    with pytest.raises(UnsupportedOpError, match=r"DynamicQuantizeLinear\[runtime scale.*\(dyn\)"):
        load(dyn)
    raw = model([n("QuantizeLinear", ["x", "s", "z"], ["q"], name="quant"), n("Max", ["q", "q"], ["q2"], name="int_max"),
                 n("DequantizeLinear", ["q2", "s", "z"], ["y"], name="deq")], {"x": (2, 3)}, {"y": (2, 3)},
                [arr("s", 0.1, f32), arr("z", 0, i8)], 13)
    with pytest.raises(ModelError, match=r"node 'int_max' \(Max\) computes on the stored integers of quantized tensor 'q'"):
        load(raw)


def test_quantize_rule_matches_onnxruntime_on_ties_and_saturation():
    """frontend/quant.quantize (used for float biases and constant QuantizeLinear) against onnxruntime."""
    x = np.asarray([-300.0, -2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 126.5, 127.5, 300.0], f32)
    for storage, zp in (("int8", -3), ("uint8", 7)):
        m = model([helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="q")], {"x": (10,)}, {}, [
            arr("s", 1.0, f32), arr("z", zp, storage)], 13)
        m.graph.output.append(helper.make_tensor_value_info("q", T.INT8 if storage == "int8" else T.UINT8, [10]))
        from tpuflow.frontend.quant import Quant
        expected = run_ort(m, {"x": x})[0]
        assert np.array_equal(quantize(x, Quant(np.float32(1), np.asarray(zp, storage), None, storage)), expected)


def test_exact_ops_move_above_the_dequantize():
    """Gemm(transB=1) of two activations: the Transpose the Gemm import adds runs on the int8 tensor
    (DequantizeLinear moved below it), so the MatMul takes quantized operands; a Reshape whose result
    is used in float runs on integers too, before its DequantizeLinear."""
    n = helper.make_node
    nodes = [*qdq("a", "s", "z", "a"), *qdq("b", "s", "z", "b"),
             n("Gemm", ["a_real", "b_real"], ["m"], name="gemm", transB=1), *qdq("m", "sm", "z", "m"),
             n("Reshape", ["m_real", "shape"], ["r"], name="reshape"), n("Softmax", ["r"], ["y"], name="softmax")]
    inits = [arr("s", 0.03, f32), arr("z", 0, i8), arr("sm", 0.1, f32), arr("shape", [12], np.int64)]
    m = model(nodes, {"a": (3, 5), "b": (4, 5)}, {"y": (12,)}, inits, 13)
    g = load(m)
    assert [x.op_type for x in g.nodes()] == ["QuantizeLinear", "QuantizeLinear", "Transpose", "MatMul", "Reshape",
                                              "DequantizeLinear", "Softmax"]
    transpose, reshape = (next(x for x in g.nodes() if x.op_type == k) for k in ("Transpose", "Reshape"))
    assert g.tensor(transpose.outputs[0]).quant == g.tensor("b_q").quant
    assert g.tensor(reshape.outputs[0]).quant == g.tensor("m_q").quant
    assert_runs_like_the_model(m, g)


def per_channel_move(op: str, attrs: dict, extra_inits: list, dq_axis: int | None, out_shape) -> onnx.ModelProto:
    """x [1, 4, 2, 3] -> QuantizeLinear per channel (axis 1) -> `op` on the stored integers -> DQ
    (per channel on `dq_axis`, or per-tensor when None)."""
    n = helper.make_node
    inputs = ["xq"] + [t.name for t in extra_inits]
    dq = ["mq", "s", "z"] if dq_axis is not None else ["mq", "s1", "z1"]
    nodes = [n("QuantizeLinear", ["x", "s", "z"], ["xq"], name="quantize", axis=1),
             n(op, inputs, ["mq"], name="move", **attrs),
             n("DequantizeLinear", dq, ["y"], name="dequantize", **({} if dq_axis is None else {"axis": dq_axis}))]
    extra_inits = extra_inits + [arr("s1", 0.1, f32), arr("z1", 0, i8)]
    inits = [arr("s", [0.1, 0.2, 0.3, 0.4], f32), arr("z", [0, 1, 2, 3], i8), *extra_inits]
    return model(nodes, {"x": (1, 4, 2, 3)}, {"y": out_shape}, inits, 13)


@pytest.mark.parametrize("op,attrs,inits,axis,shape", [
    ("Transpose", {"perm": [0, 2, 3, 1]}, [], 3, (1, 2, 3, 4)),
    ("Reshape", {}, [arr("shape", [1, 4, 6], np.int64)], 1, (1, 4, 6)),
    ("MaxPool", {"kernel_shape": [2, 2], "pads": [0, 0, 0, 1]}, [], 1, (1, 4, 1, 3)),
])
def test_per_channel_quantization_follows_its_channels_through_integer_moves(op, attrs, inits, axis, shape):
    m = per_channel_move(op, attrs, inits, axis, shape)
    g = load(m)
    moved = g.tensor("mq").quant
    assert moved.axis == axis and moved == g.tensor("xq").quant.with_axis(axis)
    assert_runs_like_the_model(m, g)


def test_a_move_that_cuts_the_channels_of_a_per_channel_tensor_is_refused():
    m = per_channel_move("Slice", {}, [arr("b", [1], np.int64), arr("e", [3], np.int64), arr("a", [1], np.int64)],
                         None, (1, 2, 2, 3))
    with pytest.raises(ModelError, match=r"node 'move' \(Slice\).*changes the channels"):
        load(m)


def test_weight_only_quantization_and_shared_float_results_stay_float():
    """DequantizeLinear on weights only (float activations): the Conv stays float on the dequantized
    weights; a quantized op whose float result has another use besides its QuantizeLinear stays float."""
    n = helper.make_node
    nodes = [n("DequantizeLinear", ["wq", "sw"], ["w_real"], name="w_dequantize"),
             n("Conv", ["x", "w_real"], ["c"], name="conv"), *qdq("c", "s", "z", "c"),
             n("Mul", ["c_real", "c_real"], ["r"], name="square"), *qdq("r", "s", "z", "r"),
             n("Add", ["r_real", "r"], ["y"], name="uses_float_too")]
    inits = [arr("wq", rng.integers(-127, 128, (4, 3, 1, 1)), i8), arr("sw", 0.02, f32), arr("s", 0.05, f32),
             arr("z", 0, i8)]
    m = model(nodes, {"x": (1, 3, 4, 4)}, {"y": (1, 4, 4, 4)}, inits, 13)
    g = load(m)
    assert [x.op_type for x in g.nodes()] == ["Conv", "QuantizeLinear", "DequantizeLinear", "Mul", "QuantizeLinear",
                                              "DequantizeLinear", "Add"]
    assert all(g.tensor(t).quant is None for t in g.node("square").inputs)
    conv = g.node("conv")
    assert all(g.tensor(t).quant is None for t in (*conv.inputs, *conv.outputs))
    assert g.tensor(conv.inputs[1]).dtype == "float32"
    assert_runs_like_the_model(m, g)


def test_the_graph_check_catches_a_pass_that_drops_a_quantization():
    from tpuflow.frontend.draft import make_node
    from tpuflow.frontend.graph import TensorInfo
    from tpuflow.frontend.quant import Quant
    from tpuflow.frontend.verify import GraphLintError, lint
    q = Quant(np.float32(0.1), np.int8(0), None, "int8")
    tensors = {"x": TensorInfo("x", (2, 3), "int8", quant=q), "y": TensorInfo("y", (2, 3), "int8", quant=q)}
    lint([make_node("relu", "Relu", ("x",), ("y",))], tensors, ["x"], ["y"])
    tensors["y"] = TensorInfo("y", (2, 3), "int8")
    with pytest.raises(GraphLintError, match=r"node 'relu' \(Relu\): reads quantized tensors but its integer output"):
        lint([make_node("relu", "Relu", ("x",), ("y",))], tensors, ["x"], ["y"])
    tensors["y"] = TensorInfo("y", (2, 3), "uint8", quant=q)
    with pytest.raises(GraphLintError, match=r"tensor 'y': quantization int8 per-tensor does not fit uint8"):
        lint([make_node("relu", "Relu", ("x",), ("y",))], tensors, ["x"], ["y"])


def test_views_stay_above_quantized_elementwise_ops():
    """canonical.sink_views_below_elementwise leaves ops on quantized tensors alone (it would make
    integer tensors without a Quant): Reshape dropping a unit axis, then a quantized Relu."""
    n = helper.make_node
    nodes = [*qdq("x", "s", "z", "x"), n("Reshape", ["x_real", "shape"], ["r"], name="view"), *qdq("r", "s", "z", "r"),
             n("Relu", ["r_real"], ["y0"], name="relu"), *qdq("y0", "s", "z", "y")]
    inits = [arr("s", 0.1, f32), arr("z", 3, i8), arr("shape", [1, 4, 6], np.int64)]
    m = model(nodes, {"x": (1, 4, 6, 1)}, {"y_real": (1, 4, 6)}, inits, 13)
    g = load(m)
    assert [x.op_type for x in g.nodes()] == ["QuantizeLinear", "Reshape", "Relu", "DequantizeLinear"]
    assert all(g.tensor(t).quant is not None for t in (*g.node("relu").inputs, *g.node("relu").outputs))
    assert_runs_like_the_model(m, g)


@pytest.mark.parametrize("op,attrs,float_op", [("QLinearSigmoid", {}, "Sigmoid"),
                                               ("QLinearLeakyRelu", {"alpha": 0.1}, "LeakyRelu")])
def test_contrib_ops_without_an_int8_form_become_lookup_tables(op, attrs, float_op):
    """QLinearSigmoid / QLinearLeakyRelu: DequantizeLinear -> the float op -> QuantizeLinear, a function of the
    input's codes that the frontend collapses into a LookupTable (frontend/lookup.py)."""
    n = helper.make_node
    nodes = [n("QuantizeLinear", ["x", "s", "z"], ["xq"], name="quantize"),
             n(op, ["xq", "s", "z", "s2", "z2"], ["yq"], name="contrib", domain="com.microsoft", **attrs),
             n("DequantizeLinear", ["yq", "s2", "z2"], ["y"], name="dequantize")]
    inits = [arr("s", 0.05, f32), arr("z", 128, u8), arr("s2", 0.004, f32), arr("z2", 0, u8)]
    graph = helper.make_graph(nodes, "contrib", [helper.make_tensor_value_info("x", T.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", T.FLOAT, [2, 3])], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("com.microsoft", 1)],
                          ir_version=8)
    g = load(m)
    assert [x.op_type for x in g.nodes()] == ["QuantizeLinear", "LookupTable", "DequantizeLinear"]
    assert g.tensor("yq").quant.zero_point.dtype == np.uint8
    assert_runs_like_the_model(m, g, steps=0.004)
