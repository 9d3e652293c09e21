"""`--dtype int8` on a float model: post-training quantization by onnxruntime's quantizer into a QDQ
model (per-channel symmetric int8 weights, per-tensor int8 activations calibrated on seeded random
inputs), which the int8 lowering then compiles; the rest of the program runs in fp16.

Only the op kinds the int8 lowering computes are quantized (INT8_OPS); everything else stays float
between DequantizeLinear and QuantizeLinear. onnxruntime's pre-processing (shape inference and its
graph optimizer: BatchNormalization folded into Conv) runs first."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import numpy as np

from tpuflow.errors import ModelError

INT8_OPS = ("Conv", "MatMul", "Gemm", "Add", "Mul", "Relu", "Clip", "MaxPool", "AveragePool", "GlobalAveragePool",
            "Concat")
FLOAT_REST = "fp16"          # the precision of what stays float in an --dtype int8 program
CALIBRATION_SAMPLES = 8      # seeded random calibration inputs (the default)
QDQ_OPSET = 13               # per-channel QuantizeLinear / DequantizeLinear (axis) need opset 13
MIN_IR_VERSION = 7           # ONNX IR version of opset 13


def model_proto(model, input_shapes=None):
    """The ONNX ModelProto of a bundled model name, a file path, a ModelProto or serialized bytes,
    with the inputs `input_shapes` pins (--input-value) as initializers (frontend.pinning)."""
    from tpuflow import models
    from tpuflow.frontend import pinning, reader
    if model is None or (isinstance(model, str) and models.is_bundled(model) and not Path(model).is_file()):
        proto, label = models.build_model(model or models.DEFAULT_MODEL), str(model)
    else:
        proto, label = reader.read_model(model)
    return pinning.pin_inputs(proto, label, pinning.split_inputs(input_shapes)[1])


def quantized_model(model, input_shapes=None, samples: int = CALIBRATION_SAMPLES, seed: int = 0):
    """The QDQ ModelProto of a float model, calibrated on `samples` seeded random inputs shaped as
    the frontend fixes them (`input_shapes`)."""
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process
    from tpuflow.pipeline import load_graph
    graph = load_graph(model, input_shapes)
    feeds = _calibration_feeds(graph, samples, seed)
    reader = type("SeededInputs", (CalibrationDataReader,), {"get_next": lambda self: next(self.it, None)})()
    reader.it = iter(feeds)
    logging.getLogger().setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="tpuflow-ptq-") as tmp:
        src, pre, dst = (Path(tmp) / f for f in ("float.onnx", "pre.onnx", "int8.onnx"))
        onnx.save(_sums_as_adds(_at_least_qdq_opset(model_proto(model, input_shapes))), src)
        try:
            quant_pre_process(str(src), str(pre), skip_symbolic_shape=True)
            quantize_static(str(pre), str(dst), reader, quant_format=QuantFormat.QDQ, per_channel=True,
                            activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                            op_types_to_quantize=list(INT8_OPS), nodes_to_exclude=_products_of_activations(pre))
        except Exception as err:        # the quantizer's own failures, one line (exit 2)
            raise ModelError(f"{graph.name}: onnxruntime's post-training quantizer failed on this model "
                             f"({type(err).__name__}: {err}); quantize it yourself and pass the QDQ model") from None
        quantized = onnx.load(str(dst))
    # an old model (IR < 4) requires initializers to be graph inputs; the quantizer adds some and
    # raises the opset (QuantizeLinear): the IR version of that opset
    quantized.ir_version = max(quantized.ir_version, MIN_IR_VERSION)
    return quantized


def _at_least_qdq_opset(model):
    """The model converted to opset 13 when older (per-channel DequantizeLinear needs its axis)."""
    from onnx import version_converter
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
    return version_converter.convert_version(model, QDQ_OPSET) if opset < QDQ_OPSET else model


def _sums_as_adds(model):
    """Each Sum as a chain of Adds (the quantizer quantizes Add, not Sum: a float Sum would cut
    the int8 layers around every residual join)."""
    import onnx
    from onnx import helper
    if not any(n.op_type == "Sum" for n in model.graph.node):
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    nodes = []
    for n in model.graph.node:
        if n.op_type != "Sum" or len(n.input) < 2:
            nodes.append(n)
            continue
        acc = n.input[0]
        for k, term in enumerate(n.input[1:], 1):
            target = n.output[0] if k == len(n.input) - 1 else f"{n.output[0]}/sum{k}"
            nodes.append(helper.make_node("Add", [acc, term], [target], name=f"{n.name or n.output[0]}/add{k}"))
            acc = target
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out


def _products_of_activations(path: Path) -> list[str]:
    """MatMul / Gemm nodes multiplying two runtime tensors (attention): the int8 lowering computes
    products by constant weights only, so these stay float."""
    import onnx
    model = onnx.load(str(path))
    constants = {i.name for i in model.graph.initializer}
    constants |= {o for n in model.graph.node if n.op_type == "Constant" for o in n.output}
    return [n.name for n in model.graph.node
            if n.op_type in ("MatMul", "Gemm") and not {n.input[0], n.input[1]} & constants]


def _calibration_feeds(graph, samples: int, seed: int) -> list[dict]:
    """`samples` feeds of standard-normal floats (integer inputs: zeros) for the graph's inputs."""
    rng = np.random.default_rng(seed)
    feeds = []
    for _ in range(samples):
        feed = {}
        for name in graph.inputs:
            info = graph.tensor(name)
            dtype = np.dtype(info.dtype)
            feed[name] = (rng.standard_normal(info.shape).astype(dtype) if dtype.kind == "f"
                          else np.zeros(info.shape, dtype))
        feeds.append(feed)
    return feeds
