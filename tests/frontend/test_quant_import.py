"""Pre-quantized models made by onnxruntime's quantize_static (QDQ and QOperator formats, per-tensor and
per-channel int8 weights, int8 and uint8 activations) import into one canonical quantized graph:
the expected ops on quantized tensors, the model's scales, zero points and weight integers exactly,
int32 biases of scale input * weight, the same graph from both formats, and the canonical graph
(exported in QDQ form) computing what onnxruntime computes on the model."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from onnx import numpy_helper

from frontend_util import random_feeds, run_ort
from quant_models import MODELS, quantized
from tpuflow.frontend import load
from tpuflow.frontend.export import graph_to_onnx
from tpuflow.frontend.ops import OpKind as K

Q, DQ = K.QUANTIZE.value, K.DEQUANTIZE.value
CASES = list(itertools.product(MODELS, ("QDQ", "QOperator"), (False, True), ("QInt8", "QUInt8")))
IDS = [f"{m}-{f}-{'channel' if c else 'tensor'}-{a}" for m, f, c, a in CASES]

# canonical ops in graph order (onnxruntime folds Relu / Clip into the producer's output range)
EXPECTED_OPS = {
    "cnn": [Q, "Conv", "MaxPool", "Conv", "Add", "GlobalAveragePool", "Reshape", "MatMul", "Add", DQ],
    "matmul_chain": [Q, "MatMul", "Add", "MatMul", "Mul", "Transpose", DQ],
    "concat_net": [Q, "Conv", "Conv", "Concat", "AveragePool", "Reshape", "Slice", DQ],
    "attention": [Q, Q, "MatMul", DQ, "Softmax", Q, "MatMul", DQ],
}
FLOAT_OPS = {"Softmax"}            # stays float, between explicit DequantizeLinear and QuantizeLinear
# ONNX op -> positions of (output scale, output zero point), and of (weights, scale, zero point)
OUTPUT_PARAMS = {"QuantizeLinear": (1, 2), "QLinearConv": (6, 7), "QLinearMatMul": (6, 7), "QLinearAdd": (6, 7),
                 "QLinearMul": (6, 7), "QLinearGlobalAveragePool": (3, 4), "QLinearAveragePool": (3, 4),
                 "QLinearSoftmax": (3, 4), "QLinearConcat": (0, 1), "QGemm": (7, 8)}
TWO_OPERANDS = ((0, 1, 2), (3, 4, 5))
OPERAND_PARAMS = {"QLinearConv": TWO_OPERANDS, "QLinearMatMul": TWO_OPERANDS, "QGemm": TWO_OPERANDS,
                  "QLinearAdd": TWO_OPERANDS, "QLinearMul": TWO_OPERANDS, "DequantizeLinear": TWO_OPERANDS[:1]}


def model_and_graph(case):
    model = quantized(*case)
    return model, load(model)


def inits(model) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_canonical_ops_work_on_quantized_tensors(case):
    _, g = model_and_graph(case)
    assert [n.op_type for n in g.nodes()] == EXPECTED_OPS.get(case[:2], EXPECTED_OPS[case[0]])
    storage = "int8" if case[3] == "QInt8" else "uint8"
    for n in g.nodes():
        ins, outs = [g.tensor(t) for t in n.inputs], [g.tensor(t) for t in n.outputs]
        if n.op_type in FLOAT_OPS:
            assert all(t.quant is None and t.dtype == "float32" for t in ins + outs), n.name
        elif n.op_type == Q:
            assert ins[0].quant is None and outs[0].quant is not None and outs[0].dtype == storage, n.name
        elif n.op_type == DQ:
            assert ins[0].quant is not None and outs[0].quant is None, n.name
        else:
            assert all(t.quant is not None for t in ins + outs), n.name
            assert all(t.dtype == t.quant.storage for t in ins + outs), n.name
            assert outs[0].dtype in (storage, "int32"), n.name
    weights = [g.tensor(n.inputs[1]) for n in g.nodes() if n.op_type in ("Conv", "MatMul")
               and g.tensor(n.inputs[1]).is_const]
    assert weights and all(w.dtype == "int8" and w.quant.per_channel == case[2] for w in weights)
    for w in weights:
        assert w.quant.axis == (None if not case[2] else 0 if len(w.shape) == 4 else len(w.shape) - 1)
    if not case[2]:
        assert not any(t.quant.per_channel for t in g.tensors.values() if t.quant is not None)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_scales_and_zero_points_are_the_models(case):
    """Every quantized output the model names (QuantizeLinear / QLinear* outputs) that the canonical
    graph keeps has exactly the model's scale and zero point."""
    model, g = model_and_graph(case)
    values, checked = inits(model), 0
    for node in model.graph.node:
        if node.op_type not in OUTPUT_PARAMS or node.output[0] not in g.tensors:
            continue
        s, z = OUTPUT_PARAMS[node.op_type]
        q = g.tensor(node.output[0]).quant
        assert q is not None and not q.per_channel, node.name
        assert q.scale.dtype == np.float32 and float(q.scale) == float(values[node.input[s]].reshape(()))
        assert q.zero_point.dtype == values[node.input[z]].dtype and int(q.zero_point) == int(values[node.input[z]])
        checked += 1
    runtime = [t for t in g.tensors.values() if t.quant is not None and not t.is_const and t.dtype != "int32"]
    assert checked >= len(runtime) - 2 and checked >= 3          # flatten / reshape outputs may be renamed


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_weights_keep_the_models_integers_and_parameters(case):
    model, g = model_and_graph(case)
    values = inits(model)
    expected = []                       # every constant int8 operand the model quantizes: (values, scale, zero point)
    for node in model.graph.node:
        for w, s, z in ((node.input[i] for i in triple) for triple in OPERAND_PARAMS.get(node.op_type, ())):
            if w in values and values[w].dtype == np.int8:
                expected.append((values[w], values[s], values[z]))
    weights = [t for t in g.tensors.values() if t.is_const and t.dtype == "int8"]
    assert len(weights) == len(expected) > 0
    for t in weights:
        matches = [(v, s, z) for v, s, z in expected for v in (v, v.T)        # Gemm weights arrive transposed
                   if v.shape == t.shape and np.array_equal(v, t.const)]
        assert matches, t.name
        v, s, z = matches[0]
        assert np.array_equal(t.quant.scale.reshape(-1), s.reshape(-1).astype(np.float32))
        assert np.array_equal(t.quant.zero_point.reshape(-1), z.reshape(-1))
        assert t.quant.per_channel == (s.size > 1)


@pytest.mark.parametrize("case", [c for c in CASES if c[0] in ("cnn", "concat_net")],
                         ids=[i for i, c in zip(IDS, CASES) if c[0] in ("cnn", "concat_net")])
def test_biases_are_int32_of_input_times_weight_scale(case):
    model, g = model_and_graph(case)
    int32_inits = [v for v in inits(model).values() if v.dtype == np.int32]
    biased = 0
    for n in g.nodes():
        if n.op_type not in ("Conv", "Add") or len(n.inputs) < 2 or g.tensor(n.inputs[-1]).dtype != "int32":
            continue
        x = g.tensor(n.inputs[0])
        bias = g.tensor(n.inputs[-1])
        if n.op_type == "Conv":
            acc = (x.quant.scale * g.tensor(n.inputs[1]).quant.scale).astype(np.float32)
        else:                                       # MatMul -> int32 accumulator -> Add(bias)
            assert x.dtype == "int32" and x.quant.axis in (None, len(x.shape) - 1)
            acc = x.quant.scale
        assert bias.is_const and bias.quant.storage == "int32" and np.all(bias.quant.zero_point == 0)
        assert np.array_equal(bias.quant.scale, acc)
        assert any(np.array_equal(bias.const, v) for v in int32_inits), n.name
        biased += 1
    assert biased == 2, biased


def signature(g, exact: bool) -> list:
    """Node for node: op, and for every input and output dtype, shape, quantization granularity and
    axis; with `exact` also the scales, zero points and constant integers."""
    def tensor(t):
        info, q = g.tensor(t), g.tensor(t).quant
        form = (info.dtype, info.shape, None if q is None else q.axis)
        if exact and q is not None:
            form += (q.scale.tobytes(), q.zero_point.tobytes(), info.const.tobytes() if info.is_const else None)
        return form
    return sorted((n.op_type, tuple(tensor(t) for t in n.inputs), tuple(tensor(t) for t in n.outputs))
                  for n in g.nodes())


SAME_FORM = list(itertools.product(MODELS, (False, True), ("QInt8", "QUInt8")))


@pytest.mark.parametrize("name,per_channel,activation", SAME_FORM)
def test_qdq_and_qoperator_give_the_same_graph(name, per_channel, activation):
    """One canonical form from both formats. onnxruntime picks some parameters differently per format
    (QLinearSoftmax's fixed 1/256 output scale, symmetric int8 for an Add's constant in QOperator),
    so scales and integers are compared exactly where it picks the same ones (the CNN)."""
    qdq = load(quantized(name, "QDQ", per_channel, activation))
    qop = load(quantized(name, "QOperator", per_channel, activation))
    assert signature(qdq, exact=False) == signature(qop, exact=False)
    if name == "cnn":
        assert signature(qdq, exact=True) == signature(qop, exact=True)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_the_canonical_graph_computes_what_onnxruntime_computes(case):
    """onnxruntime on the model vs onnxruntime on the canonical graph exported in QDQ form: equal for
    QDQ models, within one output quantization step for QOperator ones (integer kernels)."""
    model, g = model_and_graph(case)
    for seed in range(2):
        feeds = random_feeds(g, seed=seed)
        expected, actual = run_ort(model, feeds), run_ort(graph_to_onnx(g), feeds)
        steps = [float(t.quant.scale.max()) for t in g.tensors.values() if t.quant is not None and not t.is_const]
        for name, e, a in zip(g.outputs, expected, actual):
            assert e.shape == a.shape and np.max(np.abs(e - a)) <= (0 if case[1] == "QDQ" else max(steps)), name
            assert np.unique(e).size > 3, name                  # a real signal, not a saturated constant


@pytest.mark.parametrize("fmt", ["QDQ", "QOperator"])
def test_asymmetric_weights_and_symmetric_activations(fmt):
    """WeightSymmetric off (int8 weights with zero points), ActivationSymmetric on (zero point 0)."""
    extra = (("WeightSymmetric", False), ("ActivationSymmetric", True))
    model = quantized("cnn", fmt, True, "QInt8", extra)
    g = load(model)
    # Relu stays (the int8 range has negatives); QOperator's float DQ -> Relu -> MaxPool -> Q runs on integers
    assert [n.op_type for n in g.nodes()] == [Q, "Conv", "Relu", "MaxPool", *EXPECTED_OPS["cnn"][3:]]
    weights = [g.tensor(n.inputs[1]) for n in g.nodes() if n.op_type in ("Conv", "MatMul")]
    # onnxruntime 1.32 honours WeightSymmetric=False in the QOperator format only
    assert any(np.any(w.quant.zero_point != 0) for w in weights) == (fmt == "QOperator")
    activations = [t for t in g.tensors.values() if t.quant is not None and not t.is_const and t.dtype == "int8"]
    assert activations and all(np.all(t.quant.zero_point == 0) for t in activations)
    feeds = random_feeds(g, seed=1)
    steps = max(float(t.quant.scale) for t in activations)
    for e, a in zip(run_ort(model, feeds), run_ort(graph_to_onnx(g), feeds)):
        assert np.max(np.abs(e - a)) <= (0 if fmt == "QDQ" else steps)


@pytest.mark.parametrize("fmt", ["QDQ", "QOperator"])
def test_bundled_transformer_layer(fmt):
    """bert_layer quantized by onnxruntime: every MatMul / Add / Mul that onnxruntime quantizes works
    on quantized tensors; LayerNormalization, Softmax stay float between DQ and Q; the GELU's Div and Erf,
    functions of one quantized tensor, became lookup tables (frontend/lookup.py)."""
    model = quantized("bert_layer", fmt, True, "QUInt8")
    g = load(model)
    kinds = {n.op_type for n in g.nodes() if any(g.tensor(t).quant is not None for t in (*n.inputs, *n.outputs))}
    floats = {n.op_type for n in g.nodes() if all(g.tensor(t).quant is None for t in (*n.inputs, *n.outputs))}
    assert {"MatMul", "Add", Q, DQ, "LookupTable"} <= kinds and floats == {"LayerNormalization", "Softmax"}
    assert sum(n.op_type == "MatMul" and g.tensor(n.outputs[0]).quant is not None for n in g.nodes()) >= 6
    feeds = random_feeds(g, seed=2)
    steps = max(float(t.quant.scale.max()) for t in g.tensors.values() if t.quant is not None and not t.is_const)
    for e, a in zip(run_ort(model, feeds), run_ort(graph_to_onnx(g), feeds)):
        assert np.max(np.abs(e - a)) <= (0 if fmt == "QDQ" else steps)


def test_qoperator_per_channel_below_opset_13():
    """QLinearConv / QGemm with per-channel weights are valid at opset 11; their QDQ form needs
    DequantizeLinear's axis (opset 13): the model is checked as given, the rewrite is internal."""
    model = quantized("cnn_opset11", "QOperator", True, "QUInt8")
    assert model.opset_import[0].version == 11
    g = load(model)
    assert [n.op_type for n in g.nodes()] == EXPECTED_OPS["cnn"]
    assert g.tensor(g.node("conv1_quant").inputs[1]).quant.axis == 0
    feeds = random_feeds(g, seed=0)
    steps = max(float(t.quant.scale.max()) for t in g.tensors.values() if t.quant is not None and not t.is_const)
    for e, a in zip(run_ort(model, feeds), run_ort(graph_to_onnx(g), feeds)):
        assert np.max(np.abs(e - a)) <= steps
