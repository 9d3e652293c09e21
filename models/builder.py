"""ModelBuilder: a small onnx.helper wrapper for writing bundled models with seeded random weights."""

from __future__ import annotations

import hashlib

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

IR_VERSION = 8          # onnxruntime >= 1.14 reads it; covers opsets 9-18


def tensor_seed(*parts: str) -> int:
    """A seed derived from names only, so every weight is reproducible on its own."""
    return int.from_bytes(hashlib.sha256("/".join(parts).encode()).digest()[:8], "little")


class ModelBuilder:
    """Accumulates nodes and initializers; names are given or derived from a per-op counter, so the
    same builder code always yields byte-identical models."""

    def __init__(self, name: str, opset: int):
        self.name = name
        self.opset = opset
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self._count: dict[str, int] = {}

    # ---- tensors
    def input(self, name: str, shape, elem: int = TensorProto.FLOAT) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, elem, list(shape)))
        return name

    def output(self, name: str, shape, elem: int = TensorProto.FLOAT) -> str:
        self.outputs.append(helper.make_tensor_value_info(name, elem, list(shape)))
        return name

    def const(self, name: str, value) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def _rng(self, name: str) -> np.random.Generator:
        return np.random.default_rng(tensor_seed(self.name, name))

    def normal(self, name: str, shape, std: float) -> str:
        return self.const(name, (self._rng(name).standard_normal(shape) * std).astype(np.float32))

    def uniform(self, name: str, shape, low: float, high: float) -> str:
        return self.const(name, self._rng(name).uniform(low, high, shape).astype(np.float32))

    def linear_weight(self, name: str, fan_in: int, fan_out: int, gain: float = 1.0) -> str:
        """[fan_in, fan_out] with std gain / sqrt(fan_in) (activations keep their scale)."""
        return self.normal(name, (fan_in, fan_out), gain / np.sqrt(fan_in))

    # ---- nodes
    def op(self, op_type: str, inputs, name: str | None = None, outputs: int | list[str] = 1, **attrs):
        """Add a node; returns its output name (or the list of names when outputs > 1)."""
        if name is None:
            k = self._count.get(op_type, 0)
            self._count[op_type] = k + 1
            name = f"{op_type.lower()}_{k}"
        outs = outputs if isinstance(outputs, list) else ([name] if outputs == 1 else
                                                           [f"{name}:{i}" for i in range(outputs)])
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=name, **attrs))
        return outs[0] if len(outs) == 1 else outs

    def build(self) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, self.name, self.inputs, self.outputs, initializer=self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)],
                                  ir_version=IR_VERSION, producer_name="tpuflow.models")
        onnx.checker.check_model(model)
        return model
