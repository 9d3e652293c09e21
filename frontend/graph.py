"""The Graph contract between the frontend and the lowering: typed frozen nodes on a networkx DiGraph."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Iterator, Mapping

import networkx as nx
import numpy as np

from tpuflow.frontend.quant import Quant


@dataclass(frozen=True, eq=False)
class TensorInfo:
    """A tensor of the graph. `shape` is fully static after the frontend; `const` holds the
    value of constants (weights, folded tensors), None for runtime tensors. `quant` is set on
    quantized tensors only (dtype = quant.storage; frontend/quant.py says what they mean)."""

    name: str
    shape: tuple[int, ...]
    dtype: str                      # numpy dtype name: "float32", "int64", "bool", ...
    const: np.ndarray | None = None
    quant: Quant | None = None

    @property
    def is_const(self) -> bool:
        return self.const is not None

    @property
    def size(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class OpNode:
    """One operator. `op_type` is a canonical op kind (frontend.ops.OpKind value); `attrs`
    holds normalised attributes (ints, floats, tuples, strings)."""

    name: str
    op_type: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def attr(self, key: str, default: Any = None) -> Any:
        return self.attrs.get(key, default)


class Graph:
    """A static-shape model: nodes in a networkx DiGraph (node key = OpNode.name, data key 'op'),
    edges producer -> consumer labelled with the tensor name; tensors by name; graph inputs and
    outputs in model order; the original ONNX model (for onnxruntime) and its opset."""

    def __init__(self, name: str, nodes: list[OpNode], tensors: dict[str, TensorInfo],
                 inputs: list[str], outputs: list[str], model: Any = None, opset: int = 0):
        self.name = name
        self.tensors = tensors
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.model = model
        self.opset = opset
        self.nx = nx.DiGraph()
        self._order = [n.name for n in nodes]
        self._producer: dict[str, str] = {}
        self._consumers: dict[str, list[str]] = {}
        for n in nodes:
            self.nx.add_node(n.name, op=n)
            for t in n.outputs:
                self._producer[t] = n.name
        for n in nodes:
            for t in n.inputs:
                if not t:
                    continue
                self._consumers.setdefault(t, []).append(n.name)
                if t in self._producer:
                    self.nx.add_edge(self._producer[t], n.name, tensor=t)

    def node(self, name: str) -> OpNode:
        return self.nx.nodes[name]["op"]

    def nodes(self) -> Iterator[OpNode]:
        """Nodes in a deterministic topological order (the model's order, which ONNX requires
        to be topological)."""
        for name in self._order:
            yield self.nx.nodes[name]["op"]

    def producer(self, tensor: str) -> OpNode | None:
        name = self._producer.get(tensor)
        return self.node(name) if name else None

    def consumers(self, tensor: str) -> list[OpNode]:
        return [self.node(n) for n in self._consumers.get(tensor, [])]

    def tensor(self, name: str) -> TensorInfo:
        return self.tensors[name]

    def __len__(self) -> int:
        return len(self._order)
