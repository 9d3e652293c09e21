"""Ops the frontend rewrites into canonical ones, compiled and run on the functional model (race
detector on) and compared with onnxruntime through tpuflow.pipeline.verify."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

sys.path.insert(0, str(Path(__file__).parents[1] / "frontend"))
from op_models import node_model, weights  # noqa: E402

from tpuflow.options import CompileOptions  # noqa: E402
from tpuflow.pipeline import verify  # noqa: E402

rng = np.random.default_rng(3)


def check(model, matmul="tiu", dtype="fp32", **kw):
    result = verify(model, None, CompileOptions(dtype=dtype, matmul=matmul), race_check=True, **kw)
    assert result["ok"], result["outputs"]
    return result


def behind_neg(model: onnx.ModelProto, name: str = "x") -> onnx.ModelProto:
    """The model with input `name` passed through a Neg first (so the op under test never reshapes a
    graph input directly: see test_view_of_graph_input)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for vi in out.graph.input:
        if vi.name == name:
            vi.name = f"{name}_raw"
    out.graph.node.insert(0, helper.make_node("Neg", [f"{name}_raw"], [name], name=f"pre_neg_{name}"))
    return out


def test_view_of_graph_input():
    from onnx_build import ModelBuilder
    b = ModelBuilder()
    x = b.input("x", [2, 3, 4, 5])
    b.output(b.node("Relu", [b.node("Reshape", [x, b.const("s", np.array([2, 3, 20]))], "r")], "y"))
    check(b.model())


ACTIVATIONS = [
    ("PRelu", {"x": (1, 3, 4, 4)}, {"s": np.linspace(0.1, 0.3, 3, dtype=np.float32).reshape(3, 1, 1)}, 13, {}),
    ("Elu", {"x": (2, 5)}, {}, 13, dict(alpha=0.7)),
    ("Selu", {"x": (2, 5)}, {}, 13, {}),
    ("Celu", {"x": (2, 5)}, {}, 13, dict(alpha=2.0)),
    ("Gelu", {"x": (2, 5)}, {}, 20, {}),
    ("Gelu", {"x": (2, 5)}, {}, 20, dict(approximate="tanh")),
    ("Mish", {"x": (2, 5)}, {}, 18, {}),
    ("Softplus", {"x": (2, 5)}, {}, 13, {}),
    ("Softsign", {"x": (2, 5)}, {}, 13, {}),
]


@pytest.mark.parametrize("op,inputs,consts,opset,attrs", ACTIVATIONS, ids=[f"{c[0]}{c[4]}" for c in ACTIVATIONS])
def test_activations(op, inputs, consts, opset, attrs):
    check(node_model(op, inputs, consts, opset=opset, **attrs))


REDUCTIONS = [
    ("Softmax", {"x": (1, 4, 16, 8)}, {}, 17, dict(axis=1)),          # YOLOv8's DFL head shape family
    ("Softmax", {"x": (2, 64, 1, 1)}, {}, 13, dict(axis=1)),
    ("LogSoftmax", {"x": (2, 5, 3)}, {}, 13, dict(axis=0)),
    ("LogSoftmax", {"x": (1, 16, 4, 40)}, {}, 13, dict(axis=1)),    # elementwise over the axis' slices
    ("Softmax", {"x": (2, 40, 3, 8)}, {}, 13, dict(axis=1)),         # axis too long to unroll: Transpose
    ("ReduceMean", {"x": (2, 5, 3)}, {}, 13, dict(axes=[1])),
    ("ReduceL1", {"x": (2, 5, 3)}, {}, 13, dict(axes=[0, 2])),
    ("ReduceL2", {"x": (2, 5, 3)}, {}, 13, dict(axes=[1], keepdims=0)),
    ("ReduceSumSquare", {"x": (2, 5, 3)}, {}, 13, {}),
    ("ReduceLogSumExp", {"x": (2, 5, 3)}, {}, 13, dict(axes=[1])),
    ("ReduceMin", {"x": (2, 5, 3)}, {}, 13, dict(axes=[2], keepdims=0)),
    ("ReduceProd", {"x": (2, 5, 3)}, {}, 13, dict(axes=[1])),
    ("GlobalMaxPool", {"x": (1, 3, 4, 5)}, {}, 13, {}),
]


@pytest.mark.parametrize("op,inputs,consts,opset,attrs", REDUCTIONS, ids=[f"{c[0]}{c[4]}" for c in REDUCTIONS])
def test_reductions_and_softmax(op, inputs, consts, opset, attrs):
    check(behind_neg(node_model(op, inputs, consts, opset=opset, **attrs)))


NORMS = [
    ("InstanceNormalization", {"x": (2, 3, 4, 5)}, {"s": weights(rng, 3), "b": weights(rng, 3)}, 13, {}),
    ("GroupNormalization", {"x": (2, 4, 3, 5)}, {"s": weights(rng, 4), "b": weights(rng, 4)}, 21,
     dict(num_groups=2)),
    ("GroupNormalization", {"x": (2, 4, 3, 5)}, {"s": weights(rng, 2), "b": weights(rng, 2)}, 18,
     dict(num_groups=2)),
    ("MeanVarianceNormalization", {"x": (2, 4, 3, 3)}, {}, 13, {}),
    ("LpNormalization", {"x": (2, 4, 3)}, {}, 13, dict(axis=1, p=2)),
    ("LpNormalization", {"x": (2, 4, 3)}, {}, 13, dict(axis=-1, p=1)),
    ("InstanceNormalization", {"x": (1, 3, 96, 96)}, {"s": weights(rng, 3), "b": weights(rng, 3)}, 13, {}),   # long rows
]


@pytest.mark.parametrize("op,inputs,consts,opset,attrs", NORMS, ids=[f"{c[0]}{c[4]}" for c in NORMS])
def test_normalizations(op, inputs, consts, opset, attrs):
    check(behind_neg(node_model(op, inputs, consts, opset=opset, **attrs)))


BROADCASTS = [
    ("Expand", {"x": (3, 1)}, {"s": np.array([2, 3, 4])}, 13, {}),
    ("Tile", {"x": (2, 3)}, {"r": np.array([2, 3])}, 13, {}),
    ("Mean", {"x": (2, 3), "z": (3,)}, {}, 13, {}),
    ("Max", {"x": (2, 3, 4), "z": (3, 1), "w": (4,)}, {}, 13, {}),
    ("Min", {"x": (2, 3), "z": (2, 3), "w": (3,)}, {}, 13, {}),
    ("Sum", {"x": (2, 3, 4), "z": (3, 1)}, {}, 13, {}),
    ("Trilu", {"x": (2, 4, 5)}, {"k": np.array(1)}, 14, dict(upper=0)),
    ("CumSum", {"x": (2, 4, 5)}, {"a": np.array(1)}, 14, dict(exclusive=1, reverse=1)),
]


@pytest.mark.parametrize("op,inputs,consts,opset,attrs", BROADCASTS, ids=[f"{c[0]}{c[4]}" for c in BROADCASTS])
def test_broadcasts_and_masks(op, inputs, consts, opset, attrs):
    check(behind_neg(node_model(op, inputs, consts, opset=opset, **attrs)))


@pytest.mark.parametrize("matmul", ["tiu", "tile"])
@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_cumsum_both_matmul_paths(matmul, axis):
    """The last axis multiplies by the triangle on the right, another axis on the left."""
    check(behind_neg(node_model("CumSum", {"x": (3, 16, 5)}, {"a": np.array(axis)}, opset=14, reverse=1)), matmul)


# ------------------------------------------------------------------ control flow and typed inputs

def test_if_on_a_pinned_input_verifies_and_estimates():
    from control_models import sample_rate_if
    from tpuflow.frontend import InputValue
    from tpuflow.pipeline import estimate
    pinned = {"sr": InputValue(np.array(16000))}
    check(sample_rate_if(nested=True), input_shapes=pinned)
    assert estimate(sample_rate_if(nested=True), None, CompileOptions(), pinned)["latency_us"] > 0


def test_unrolled_loop_verifies():
    from control_models import counting_loop
    check(counting_loop(3))


def _typed_model(elem, cast_to_float=True):
    from control_models import model, vi
    from onnx import TensorProto as T
    nodes = [helper.make_node("Cast", ["i"], ["f"], to=T.FLOAT), helper.make_node("Mul", ["f", "x"], ["y"])]
    return model(nodes, [vi("i", [2, 3], elem), vi("x", [2, 3])], [vi("y", [2, 3])])


@pytest.mark.parametrize("elem", ["INT64", "INT32", "BOOL"])
def test_integer_and_boolean_inputs(elem):
    from onnx import TensorProto as T
    from tpuflow.pipeline import estimate
    model = _typed_model(getattr(T, elem))
    check(model)
    assert estimate(model, None, CompileOptions())["latency_us"] > 0


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_fp16_inputs_and_weights(dtype):
    """An fp16 model (inputs, outputs, weights): at fp32 the reference's own fp16 rounding sets the bound."""
    from control_models import model, vi
    from onnx import TensorProto as T
    w = (rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float16)
    m = model([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])],
              [vi("x", [1, 3, 6, 6], T.FLOAT16)], [vi("y", [1, 4, 6, 6], T.FLOAT16)], [("w", w)])
    result = check(m, dtype=dtype)
    assert result["rtol"] == 2e-2


# ------------------------------------------------------------------ spatial ops off 2-D

SPATIAL = [
    ("Conv", {"x": (1, 4, 11)}, {"w": weights(rng, 6, 2, 3), "b": weights(rng, 6)},
     dict(group=2, strides=[2], pads=[1, 2], dilations=[2])),
    ("Conv", {"x": (1, 4, 11)}, {"w": weights(rng, 6, 4, 3)}, dict(auto_pad="SAME_UPPER")),
    ("Conv", {"x": (1, 1, 576)}, {"w": weights(rng, 34, 1, 256)}, dict(strides=[128])),   # silero-vad's STFT
    ("Conv", {"x": (1, 2, 100)}, {"w": weights(rng, 6, 2, 10), "b": weights(rng, 6)}, dict(strides=[4], pads=[3, 1])),
    ("Conv", {"x": (2, 4, 5, 6, 7)}, {"w": weights(rng, 6, 2, 3, 3, 2), "b": weights(rng, 6)},
     dict(group=2, strides=[2, 1, 2], pads=[1, 1, 0, 1, 0, 1], dilations=[1, 2, 1])),
    ("MaxPool", {"x": (1, 3, 10)}, {}, dict(kernel_shape=[3], strides=[2], pads=[1, 1])),
    ("AveragePool", {"x": (1, 3, 10)}, {}, dict(kernel_shape=[3], strides=[2], pads=[1, 1], count_include_pad=1)),
    ("MaxPool", {"x": (1, 3, 5, 6, 7)}, {}, dict(kernel_shape=[2, 3, 3], strides=[2, 2, 1], pads=[0, 1, 1, 1, 1, 1])),
    ("AveragePool", {"x": (1, 3, 5, 6, 7)}, {}, dict(kernel_shape=[2, 3, 3], strides=[2, 2, 1], pads=[0, 1, 1, 1, 1, 1])),
    ("MaxPool", {"x": (1, 3, 7, 6, 5)}, {}, dict(kernel_shape=[1, 1, 1], strides=[2, 2, 2], ceil_mode=1)),
    ("DepthToSpace", {"x": (1, 8, 3, 4)}, {}, dict(blocksize=2)),
    ("DepthToSpace", {"x": (1, 8, 3, 4)}, {}, dict(blocksize=2, mode="CRD")),
    ("SpaceToDepth", {"x": (1, 2, 4, 6)}, {}, dict(blocksize=2)),
    ("ConvTranspose", {"x": (1, 16, 10, 12)}, {"w": weights(rng, 16, 8, 2, 2), "b": weights(rng, 8)},
     dict(strides=[2, 2])),                                            # the YOLO / DB-neck k2 s2 shape
    ("ConvTranspose", {"x": (1, 4, 5, 6)}, {"w": weights(rng, 4, 3, 2, 2)}, dict(strides=[2, 2], group=2)),
    ("ConvTranspose", {"x": (1, 4, 5, 6)}, {"w": weights(rng, 4, 3, 3, 3), "b": weights(rng, 3)},
     dict(strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1])),
    ("ConvTranspose", {"x": (1, 4, 5, 6)}, {"w": weights(rng, 4, 2, 3, 2)},
     dict(strides=[1, 3], pads=[2, 0, 0, 1], dilations=[2, 1], group=2)),
    ("ConvTranspose", {"x": (1, 4, 5, 6)}, {"w": weights(rng, 4, 2, 3, 3)}, dict(strides=[2, 2], output_shape=[10, 12])),
    ("ConvTranspose", {"x": (1, 4, 9)}, {"w": weights(rng, 4, 2, 4), "b": weights(rng, 2)}, dict(strides=[2], pads=[1, 1])),
    ("ConvTranspose", {"x": (1, 4, 3, 4, 5)}, {"w": weights(rng, 4, 3, 2, 2, 2), "b": weights(rng, 3)},
     dict(strides=[2, 2, 2])),
    ("ConvTranspose", {"x": (1, 4, 3, 4, 5)}, {"w": weights(rng, 4, 2, 3, 3, 2)},
     dict(strides=[2, 1, 2], pads=[1, 0, 1, 0, 1, 0], group=2, output_padding=[1, 0, 1])),
]


@pytest.mark.parametrize("op,inputs,consts,attrs", SPATIAL, ids=[f"{c[0]}{c[3]}" for c in SPATIAL])
def test_spatial(op, inputs, consts, attrs):
    check(behind_neg(node_model(op, inputs, consts, **attrs)))


# ------------------------------------------------------------------ recurrent networks

RECURRENT = [
    ("LSTM", {}), ("LSTM", dict(direction="bidirectional", init="const", peepholes=True)),
    ("LSTM", dict(direction="reverse", init="runtime", clip=0.5)),
    ("GRU", dict(linear_before_reset=1, direction="bidirectional")), ("GRU", dict(init="runtime")),
    ("RNN", dict(direction="bidirectional", init="const", activations=["Relu", "Tanh"])),
]


@pytest.mark.parametrize("matmul", ["tiu", "tile"])
@pytest.mark.parametrize("op,kw", RECURRENT, ids=[f"{c[0]}{c[1]}" for c in RECURRENT])
def test_recurrent(op, kw, matmul):
    from rnn_models import rnn_model
    model = behind_neg(rnn_model(op, **kw))
    if kw.get("init") == "runtime":
        model = behind_neg(behind_neg(model, "h0"), "c0") if op == "LSTM" else behind_neg(model, "h0")
    check(model, matmul)


# ------------------------------------------------------------------ einsum

EINSUMS = [("bhqd,bhkd->bhqk", [(2, 3, 4, 5), (2, 3, 6, 5)]), ("bld,dh->blh", [(2, 4, 5), None]),
           ("nchw,nc->nhw", [(2, 3, 4, 5), (2, 3)]), ("i,j->ij", [(3,), (4,)]), ("ijk->i", [(3, 4, 5)])]


@pytest.mark.parametrize("matmul", ["tiu", "tile"])
@pytest.mark.parametrize("equation,shapes", EINSUMS, ids=[e for e, _ in EINSUMS])
def test_einsum(equation, shapes, matmul):
    runtime = {f"x{i}": s for i, s in enumerate(shapes) if s is not None}
    consts = {"w": weights(rng, 5, 3)} if None in shapes else {}
    model = node_model("Einsum", runtime, consts, equation=equation)
    for name in runtime:
        model = behind_neg(model, name)
    check(model, matmul)


@pytest.mark.parametrize("op,keepdims", [("ReduceMean", 1), ("ReduceMax", 0), ("ReduceL2", 1)])
def test_channel_reductions(op, keepdims):
    check(behind_neg(node_model(op, {"x": (1, 8, 16, 16)}, axes=[1], keepdims=keepdims)))


def test_split_with_an_unused_output():
    from control_models import model, vi
    nodes = [helper.make_node("Split", ["x", "sizes"], ["a", "b"], axis=1), helper.make_node("Relu", ["b"], ["y"])]
    m = model(nodes, [vi("x", [2, 6, 4])], [vi("y", [2, 4, 4])], [("sizes", np.array([2, 4]))])
    check(m)


@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
@pytest.mark.parametrize("op,inputs,consts,attrs", [
    ("InstanceNormalization", {"x": (1, 3, 4, 5)}, {"s": np.ones(3, np.float16), "b": np.zeros(3, np.float16)}, {}),
    ("Softmax", {"x": (1, 8, 4, 20)}, {}, dict(axis=1)),
    ("ConvTranspose", {"x": (1, 4, 5, 6)}, {"w": (rng.standard_normal((4, 3, 2, 2)) * 0.5).astype(np.float16)},
     dict(strides=[2, 2])),
], ids=["InstanceNormalization", "Softmax", "ConvTranspose"])
def test_fp16_models_through_decompositions(op, inputs, consts, attrs, dtype):
    """fp16 inputs, weights and outputs: the rewrites' constants take the model's dtype."""
    from onnx import TensorProto as T
    check(behind_neg(node_model(op, inputs, consts, elem=T.FLOAT16, **attrs)), dtype=dtype)


def test_unrolled_scan_verifies():
    from control_models import model, vi
    body = helper.make_graph([helper.make_node("Add", ["s", "xi"], ["s_out"]), helper.make_node("Tanh", ["s_out"], ["o"])],
                             "scan_body", [vi("s", [3]), vi("xi", [3])], [vi("s_out", [3]), vi("o", [3])])
    nodes = [helper.make_node("Scan", ["s0", "x"], ["sf", "ys"], body=body, num_scan_inputs=1,
                              scan_input_directions=[1])]
    check(model(nodes, [vi("s0", [3]), vi("x", [4, 3])], [vi("sf", [3]), vi("ys", [4, 3])]))


@pytest.mark.parametrize("matmul", ["tiu", "tile"])
def test_conv_transpose_interleave_on_both_matmul_paths(matmul):
    consts = {"w": weights(rng, 8, 4, 2, 2), "b": weights(rng, 4)}
    check(behind_neg(node_model("ConvTranspose", {"x": (1, 8, 6, 7)}, consts, strides=[2, 2])), matmul)


@pytest.mark.parametrize("matmul", ["tiu", "tile"])
def test_sum_over_a_middle_axis_on_both_matmul_paths(matmul):
    check(behind_neg(node_model("ReduceMean", {"x": (2, 40, 6, 5)}, axes=[1], keepdims=0, opset=13)), matmul)
