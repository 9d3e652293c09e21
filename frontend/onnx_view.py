"""The frontend's view of an ONNX model before import: nodes, constants, inputs and inferred types."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Union

import numpy as np
import onnx
from onnx import helper, numpy_helper

from tpuflow.errors import ModelError

Dims = tuple[Union[int, str, None], ...]      # a dimension may be symbolic (str) or unknown (None)
SMALL_CONST_ELEMENTS = 4096                   # constants up to this size go to shape inference by value


def one_line(exc: BaseException | str, limit: int = 400) -> str:
    """An exception message squeezed onto one line (error messages are one line)."""
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def node_reads(node: onnx.NodeProto) -> list[str]:
    """Tensors a node reads, including the outer-scope reads of its subgraphs (If / Loop bodies)."""
    names = list(node.input)
    for a in node.attribute:
        for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
            for n in g.node:
                names += node_reads(n)
    return names


@dataclass
class ONode:
    """An ONNX node with a unique name and parsed attributes; `proto` is the original NodeProto."""

    name: str
    op_type: str
    domain: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: dict[str, Any]
    proto: onnx.NodeProto

    def attr(self, key: str, default: Any = None) -> Any:
        return self.attrs.get(key, default)

    def input(self, i: int) -> str:
        """Name of input i, '' when absent (optional inputs may be missing or empty)."""
        return self.inputs[i] if i < len(self.inputs) else ""


@dataclass
class OnnxView:
    label: str                                   # file name (or "<bytes>") for messages
    name: str
    opset: int
    proto: onnx.ModelProto
    nodes: list[ONode]
    initializers: dict[str, onnx.TensorProto]
    inputs: dict[str, tuple[Dims | None, int]]   # runtime inputs: dims, ONNX elem type
    outputs: list[str]
    consts: dict[str, np.ndarray] = field(default_factory=dict)
    types: dict[str, tuple[Dims | None, int]] = field(default_factory=dict)
    # float constants folded from DequantizeLinear(constant): name -> imp_quant.Dequantized (integers, Quant)
    dequantized: dict[str, tuple[np.ndarray, Any]] = field(default_factory=dict)

    def load_constants(self) -> None:
        """Initializers as numpy arrays (the runtime inputs were set apart by the reader)."""
        for name, t in self.initializers.items():
            try:
                self.consts[name] = numpy_helper.to_array(t)
            except Exception as exc:  # noqa: BLE001 - any decode problem is the model's
                raise ModelError(f"{self.label}: initializer '{name}' cannot be read: {one_line(exc)}") from None

    def static_shape(self, name: str) -> tuple[int, ...] | None:
        if name in self.consts:
            return tuple(self.consts[name].shape)
        dims = self.types.get(name, (None, 0))[0]
        if dims is None or any(not isinstance(d, int) or d < 0 for d in dims):
            return None
        return tuple(dims)

    def elem_type(self, name: str) -> int:
        if name in self.consts:
            return helper.np_dtype_to_tensor_dtype(self.consts[name].dtype)
        return self.types.get(name, (None, 0))[1]


def value_info(name: str, elem: int, dims: Dims | None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, None if dims is None else list(dims))


def inference_model(view: OnnxView, declared: bool) -> onnx.ModelProto:
    """A model for shape inference: small constants by value, large ones as typed inputs (their
    values never matter to shapes, and copying them would cost time and memory)."""
    small = {k: a for k, a in view.consts.items() if a.size <= SMALL_CONST_ELEMENTS}
    inputs = [value_info(n, e, d) for n, (d, e) in view.inputs.items()]
    inputs += [value_info(k, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
               for k, a in view.consts.items() if k not in small]
    g = view.proto.graph
    outputs = list(g.output) if declared else [helper.make_empty_tensor_value_info(o) for o in view.outputs]
    graph = helper.make_graph([n.proto for n in view.nodes], view.name or "model", inputs, outputs,
                              initializer=[numpy_helper.from_array(np.require(a, requirements="C"), k)
                                           for k, a in small.items()],
                              value_info=list(g.value_info) if declared else [])
    return helper.make_model(graph, opset_imports=list(view.proto.opset_import),
                             ir_version=max(view.proto.ir_version, 4))


def infer_types(view: OnnxView, declared: bool = False) -> None:
    """Strict ONNX shape inference; fills view.types. Contradictions are ModelErrors."""
    model = inference_model(view, declared)
    try:
        inferred = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError) as exc:
        raise ModelError(f"{view.label}: contradictory or invalid shapes: {one_line(exc)}") from None
    types: dict[str, tuple[Dims | None, int]] = {}
    for vi in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
        if vi.type.HasField("tensor_type"):
            tt = vi.type.tensor_type
            dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                         for d in tt.shape.dim) if tt.HasField("shape") else None
            types[vi.name] = (dims, tt.elem_type)
    for name, (dims, elem) in view.inputs.items():
        types[name] = (dims, elem)
    view.types = types
