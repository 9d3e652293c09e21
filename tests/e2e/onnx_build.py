"""Tiny ONNX models for end-to-end tests: one or a few nodes with seeded random weights."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


class ModelBuilder:
    def __init__(self, seed: int = 0, opset: int = 17):
        self.rng = np.random.default_rng(seed)
        self.opset = opset
        self.nodes, self.inits, self.inputs, self.outputs = [], [], [], []

    def input(self, name: str, shape) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape)))
        return name

    def weight(self, name: str, shape, scale: float | None = None, positive: bool = False) -> str:
        a = self.rng.standard_normal(shape)
        if positive:
            a = np.abs(a) + 0.5
        if scale is None:
            fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
            scale = 1.0 / np.sqrt(max(fan_in, 1))
        self.inits.append(numpy_helper.from_array((a * scale).astype(np.float32), name))
        return name

    def const(self, name: str, value) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(self, op: str, inputs, outputs, **attrs) -> str:
        outs = [outputs] if isinstance(outputs, str) else list(outputs)
        self.nodes.append(helper.make_node(op, list(inputs), outs, name=f"{op.lower()}_{len(self.nodes)}", **attrs))
        return outs[0]

    def output(self, name: str) -> None:
        self.outputs.append(name)

    def model(self) -> onnx.ModelProto:
        """The model, with output shapes filled in by ONNX shape inference."""
        def build(outputs):
            graph = helper.make_graph(self.nodes, "test", self.inputs, outputs, self.inits)
            m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)])
            m.ir_version = 8
            return m
        probe = onnx.shape_inference.infer_shapes(build([helper.make_tensor_value_info(
            n, TensorProto.FLOAT, None) for n in self.outputs]))
        known = {v.name: v for v in list(probe.graph.value_info) + list(probe.graph.output)}
        outs = []
        for n in self.outputs:
            dims = [d.dim_value for d in known[n].type.tensor_type.shape.dim]
            outs.append(helper.make_tensor_value_info(n, TensorProto.FLOAT, dims))
        return build(outs)
