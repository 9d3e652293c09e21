"""Small float models (onnx.helper, seeded weights) and their pre-quantized versions made by
onnxruntime.quantization.quantize_static with a seeded random calibration reader, for the tests of
the quantized-model import (tests/frontend/test_quant_*.py)."""

from __future__ import annotations

import functools
import logging
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto as T, helper, numpy_helper

OPSET = 17


def _init(rng, name: str, shape: tuple[int, ...], scale: float = 0.3) -> onnx.TensorProto:
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def _model(name: str, nodes, inputs: dict[str, tuple], outputs: dict[str, tuple], inits,
           opset: int = OPSET) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info(k, T.FLOAT, list(v)) for k, v in inputs.items()],
                              [helper.make_tensor_value_info(k, T.FLOAT, list(v)) for k, v in outputs.items()], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def cnn(opset: int = OPSET) -> onnx.ModelProto:
    """conv + relu + maxpool + conv (no bias) + residual add + global average pool + flatten + gemm."""
    rng = np.random.default_rng(1)
    n = helper.make_node
    nodes = [n("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             n("Relu", ["c1"], ["r1"], name="relu1"),
             n("MaxPool", ["r1"], ["p1"], name="pool1", kernel_shape=[2, 2], strides=[2, 2]),
             n("Conv", ["p1", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
             n("Add", ["c2", "p1"], ["a"], name="residual"),
             n("GlobalAveragePool", ["a"], ["g"], name="gap"),
             n("Flatten", ["g"], ["f"], name="flatten"),
             n("Gemm", ["f", "fw", "fb"], ["y"], name="fc", transB=1)]
    inits = [_init(rng, "w1", (8, 3, 3, 3)), _init(rng, "b1", (8,), 0.1), _init(rng, "w2", (8, 8, 3, 3), 0.2),
             _init(rng, "fw", (10, 8)), _init(rng, "fb", (10,), 0.1)]
    return _model("cnn", nodes, {"x": (1, 3, 12, 12)}, {"y": (1, 10)}, inits, opset)


def matmul_chain() -> onnx.ModelProto:
    """MatMul -> Add(bias) -> Relu -> MatMul -> Mul(constant) -> Transpose, on [1, 6, 16] activations."""
    rng = np.random.default_rng(2)
    n = helper.make_node
    nodes = [n("MatMul", ["x", "m1"], ["h"], name="mm1"), n("Add", ["h", "bias"], ["hb"], name="bias_add"),
             n("Relu", ["hb"], ["hr"], name="relu"), n("MatMul", ["hr", "m2"], ["o"], name="mm2"),
             n("Mul", ["o", "gain"], ["og"], name="gain_mul"),
             n("Transpose", ["og"], ["y"], name="transpose", perm=[0, 2, 1])]
    inits = [_init(rng, "m1", (16, 24)), _init(rng, "bias", (24,), 0.1), _init(rng, "m2", (24, 12)),
             _init(rng, "gain", (12,), 1.0)]
    return _model("matmul_chain", nodes, {"x": (1, 6, 16)}, {"y": (1, 12, 6)}, inits)


def concat_net() -> onnx.ModelProto:
    """two convs concatenated on channels, Clip (relu6), average pool, reshape, slice."""
    rng = np.random.default_rng(3)
    n = helper.make_node
    lo, hi = numpy_helper.from_array(np.float32(0), "lo"), numpy_helper.from_array(np.float32(6), "hi")
    nodes = [n("Conv", ["x", "wa", "ba"], ["ca"], name="conv_a"),
             n("Conv", ["x", "wb", "bb"], ["cb"], name="conv_b", pads=[1, 1, 1, 1]),
             n("Concat", ["ca", "cb"], ["cat"], name="concat", axis=1),
             n("Clip", ["cat", "lo", "hi"], ["cl"], name="relu6"),
             n("AveragePool", ["cl"], ["ap"], name="avgpool", kernel_shape=[2, 2], strides=[2, 2]),
             n("Reshape", ["ap", "shape"], ["rs"], name="reshape"),
             n("Slice", ["rs", "starts", "ends", "axes"], ["y"], name="slice")]
    inits = [_init(rng, "wa", (4, 3, 1, 1)), _init(rng, "ba", (4,), 0.1), _init(rng, "wb", (6, 3, 3, 3)),
             _init(rng, "bb", (6,), 0.1), lo, hi, numpy_helper.from_array(np.asarray([1, 10, 16], np.int64), "shape"),
             numpy_helper.from_array(np.asarray([2], np.int64), "starts"),
             numpy_helper.from_array(np.asarray([8], np.int64), "ends"),
             numpy_helper.from_array(np.asarray([1], np.int64), "axes")]
    return _model("concat_net", nodes, {"x": (1, 3, 8, 8)}, {"y": (1, 6, 16)}, inits)


def attention_softmax() -> onnx.ModelProto:
    """MatMul of two activations, Softmax (stays float between DQ and Q), MatMul with a weight."""
    rng = np.random.default_rng(4)
    n = helper.make_node
    nodes = [n("MatMul", ["q", "k"], ["s"], name="scores"), n("Softmax", ["s"], ["p"], name="softmax", axis=-1),
             n("MatMul", ["p", "v"], ["y"], name="context")]
    return _model("attention", nodes, {"q": (1, 4, 8), "k": (1, 8, 4)}, {"y": (1, 4, 6)}, [_init(rng, "v", (4, 6))])


MODELS = {"cnn": cnn, "matmul_chain": matmul_chain, "concat_net": concat_net, "attention": attention_softmax}
OTHER_MODELS = {"cnn_opset11": lambda: cnn(11)}


class RandomReader:
    """A seeded CalibrationDataReader: `count` standard-normal batches for every float input."""

    def __init__(self, model: onnx.ModelProto, count: int = 4, seed: int = 0):
        rng = np.random.default_rng(seed)
        consts = {t.name for t in model.graph.initializer}
        shapes = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input
                  if i.name not in consts}
        self.batches = iter([{k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
                             for _ in range(count)])

    def get_next(self):
        return next(self.batches, None)


@functools.lru_cache(maxsize=None)
def quantized(name: str, fmt: str, per_channel: bool, activation: str, extra: tuple = ()) -> onnx.ModelProto:
    """MODELS[name] (or a bundled model's name) quantized by onnxruntime (fmt "QDQ" | "QOperator",
    activations "QInt8" | "QUInt8", int8 weights; `extra`: quantize_static extra_options as pairs).
    uint8 activations come with reduce_range (7-bit weights): onnxruntime's uint8 x int8 kernels add
    product pairs in int16 with saturation on x86 CPUs without VNNI (its quantization docs advise
    reduce_range there), so a full-range per-channel model has no exact reference on such a machine.
    Cached: several tests look at one model."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from tpuflow import models
    logging.getLogger().setLevel(logging.ERROR)
    builder = MODELS.get(name) or OTHER_MODELS.get(name)
    model = builder() if builder else models.build_model(name)
    reader = type("Reader", (RandomReader, CalibrationDataReader), {})(model)
    with tempfile.TemporaryDirectory(prefix="tpuflow_quant_") as tmp:
        src, dst = Path(tmp) / "float.onnx", Path(tmp) / "quant.onnx"
        onnx.save(model, src)
        quantize_static(str(src), str(dst), reader, quant_format=getattr(QuantFormat, fmt), per_channel=per_channel,
                        activation_type=getattr(QuantType, activation), weight_type=QuantType.QInt8,
                        reduce_range=activation == "QUInt8", extra_options=dict(extra))
        return onnx.load(str(dst))
