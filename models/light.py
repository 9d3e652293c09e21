"""Random-weight copies of the nine onnx "light" models (onnx/backend/test/data/light/).

Those files build every weight with ConstantOfShape(0.02) (and keep a few real-valued
initializers, some with near-zero BatchNormalization variances), so every output is uniform and
numerical bugs stay hidden. The copy keeps the graph identical (nodes, names, attributes, IR
version, opset, the old-IR habit of listing initializers among the graph inputs) except that every
weight becomes an initializer with seeded random values, chosen by the weight's role so that
activations stay O(1) through the network:

- Conv weight [Cout, Cin/g, kh, kw] and Gemm weight: normal, std = sqrt(gain / fan_in), fan_in =
  Cin/g*kh*kw for Conv and the reduced dimension K for Gemm (seen through any Reshape in between),
  gain 2 (He) when the layer's input comes from a Relu (through pools / Concat), else 1;
- Conv / Gemm bias: uniform(-0.05, 0.05);
- BatchNormalization: gamma ~ U(0.5, 1.5), beta ~ U(-0.1, 0.1), running mean ~ U(-0.1, 0.1),
  running var ~ U(0.5, 1.5);
- per-channel Mul / Add operands (DenseNet's extra scale/shift): U(0.5, 1.5) / U(-0.1, 0.1).

The Conv weights are then rescaled per channel by models/light_gain.py so that the random
BatchNormalization gains (gamma / sqrt(var)) and residual sums do not compound with depth: with
this scheme every activation of the nine models has a standard deviation between about 0.3 and 6
for a standard-normal input (tests/test_models.py checks the bounds).

Each tensor's generator is seeded from sha256("<model>/<tensor name>"), so the bytes are
deterministic and independent of traversal order. The ConstantOfShape nodes and their shape
initializers are removed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from tpuflow.errors import InputFileError
from tpuflow.frontend.reader import run_checker
from tpuflow.models.builder import tensor_seed
from tpuflow.models.light_gain import balance_gains

LIGHT_FILES = {
    "alexnet": "light_bvlc_alexnet.onnx", "densenet121": "light_densenet121.onnx",
    "inception_v1": "light_inception_v1.onnx", "inception_v2": "light_inception_v2.onnx",
    "resnet50": "light_resnet50.onnx", "shufflenet": "light_shufflenet.onnx",
    "squeezenet": "light_squeezenet.onnx", "vgg19": "light_vgg19.onnx", "zfnet512": "light_zfnet512.onnx",
}
PASS_THROUGH = ("Reshape", "Unsqueeze", "Squeeze", "Flatten", "Transpose")
LAYOUT = PASS_THROUGH + ("MaxPool", "AveragePool", "GlobalAveragePool", "Concat", "Dropout")


def light_path(name: str) -> Path:
    path = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / LIGHT_FILES[name]
    if not path.exists():
        raise InputFileError(f"{path}: the onnx package ships no light model '{name}' (reinstall onnx)")
    return path


@dataclass(frozen=True)
class Weight:
    name: str
    shape: tuple[int, ...]
    dtype: np.dtype


def _weights(graph: onnx.GraphProto) -> dict[str, Weight]:
    """ConstantOfShape outputs with a constant shape, and float initializers that nodes read."""
    inits = {t.name: t for t in graph.initializer}
    used = {t for n in graph.node for t in n.input}
    out = {t.name: Weight(t.name, tuple(t.dims), helper.tensor_dtype_to_np_dtype(t.data_type))
           for t in graph.initializer if t.name in used and t.data_type == onnx.TensorProto.FLOAT}
    for n in graph.node:
        if n.op_type == "ConstantOfShape" and n.input[0] in inits:
            shape = tuple(int(d) for d in numpy_helper.to_array(inits[n.input[0]]))
            value = next((a.t for a in n.attribute if a.name == "value"), None)
            dtype = helper.tensor_dtype_to_np_dtype(value.data_type) if value is not None else np.float32
            out[n.output[0]] = Weight(n.output[0], shape, np.dtype(dtype))
    return out


def _consumers(graph: onnx.GraphProto) -> dict[str, list[tuple[onnx.NodeProto, int]]]:
    out: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for n in graph.node:
        for i, t in enumerate(n.input):
            out.setdefault(t, []).append((n, i))
    return out


def _use(consumers, name: str, shapes: dict[str, tuple[int, ...]]):
    """(consumer node, input position, shape at that input), looking through reshape-like ops."""
    while True:
        node, pos = consumers[name][0]
        if node.op_type not in PASS_THROUGH:
            return node, pos, shapes[name]
        name = node.output[0]


def _attr(node: onnx.NodeProto, key: str, default):
    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == key), default)


def _after_relu(producers: dict[str, onnx.NodeProto], tensor: str) -> bool:
    """Whether `tensor` is a Relu output, looking back through pools, Concat and reshape-likes."""
    while (node := producers.get(tensor)) is not None:
        if node.op_type == "Relu":
            return True
        if node.op_type not in LAYOUT:
            return False
        tensor = node.input[0]
    return False


def _normal(rng: np.random.Generator, shape, std: float) -> np.ndarray:
    values = rng.standard_normal(shape, dtype=np.float32)
    values *= np.float32(std)
    return values


def _sample(rng: np.random.Generator, node: onnx.NodeProto, pos: int, use_shape, shape, relu_input: bool):
    op = node.op_type
    gain = 2.0 if relu_input else 1.0
    if op == "Conv" and pos == 1:
        return _normal(rng, shape, np.sqrt(gain / np.prod(use_shape[1:])))
    if op == "Gemm" and pos == 1:
        fan_in = use_shape[1] if _attr(node, "transB", 0) else use_shape[0]
        return _normal(rng, shape, np.sqrt(gain / fan_in))
    if op in ("Conv", "Gemm") and pos == 2:
        return rng.uniform(-0.05, 0.05, shape)
    if op == "BatchNormalization":
        low, high = {1: (0.5, 1.5), 2: (-0.1, 0.1), 3: (-0.1, 0.1), 4: (0.5, 1.5)}[pos]
        return rng.uniform(low, high, shape)
    if op == "Mul":
        return rng.uniform(0.5, 1.5, shape)
    if op == "Add":
        return rng.uniform(-0.1, 0.1, shape)
    raise RuntimeError(f"no random-weight rule for a weight read by {op} input {pos}")


def _shapes(model: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    inferred = onnx.shape_inference.infer_shapes(model)
    out = {t.name: tuple(t.dims) for t in model.graph.initializer}
    for vi in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]:
        out[vi.name] = tuple(d.dim_value for d in vi.type.tensor_type.shape.dim)
    return out


def randomized_light(name: str) -> onnx.ModelProto:
    """The light model `name` with every weight replaced by a seeded random initializer."""
    model = onnx.load(str(light_path(name)))
    g = model.graph
    weights, shapes = _weights(g), _shapes(model)
    producers = {t: n for n in g.node for t in n.output}
    consumers = _consumers(g)
    arrays = {}
    for w in weights.values():
        node, pos, use_shape = _use(consumers, w.name, shapes)
        rng = np.random.default_rng(tensor_seed(name, w.name))
        arrays[w.name] = _sample(rng, node, pos, use_shape, w.shape, _after_relu(producers, node.input[0]))
    balance_gains(g, arrays)
    arrays = {k: v.astype(weights[k].dtype, copy=False) for k, v in arrays.items()}
    _rewrite_graph(g, weights, arrays, model.ir_version)
    model.doc_string = f"tpuflow random-weight copy of {LIGHT_FILES[name]} (see tpuflow.models.light)"
    run_checker(model, name)
    return model


def _rewrite_graph(g: onnx.GraphProto, weights: dict[str, Weight], arrays: dict[str, np.ndarray],
                   ir_version: int) -> None:
    """Drop the weights' ConstantOfShape nodes and unused initializers; weights become initializers
    (in the original initializer order, new ones after), listed as inputs too for IR < 4."""
    nodes = [_copy(n) for n in g.node if not (n.op_type == "ConstantOfShape" and n.output[0] in weights)]
    needed = {t for n in nodes for t in n.input} | {o.name for o in g.output}
    kept = [t.name if t.name in arrays else _copy(t) for t in g.initializer if t.name in needed]
    kept += [w for w in weights if w not in {t.name for t in g.initializer}]
    inputs = [_copy(vi) for vi in g.input if vi.name in needed]
    listed = {vi.name for vi in inputs}
    if ir_version < 4:
        inputs += [helper.make_tensor_value_info(w, helper.np_dtype_to_tensor_dtype(arrays[w].dtype),
                                                 list(arrays[w].shape)) for w in arrays if w not in listed]
    for field, items in (("node", nodes), ("input", inputs)):
        g.ClearField(field)
        getattr(g, field).extend(items)
    g.ClearField("initializer")
    for item in kept:
        if isinstance(item, str):
            t = g.initializer.add()
            t.name, t.data_type = item, helper.np_dtype_to_tensor_dtype(arrays[item].dtype)
            t.dims.extend(arrays[item].shape)
            t.raw_data = arrays[item].tobytes()
        else:
            g.initializer.append(item)


def _copy(proto):
    out = type(proto)()
    out.CopyFrom(proto)
    return out
