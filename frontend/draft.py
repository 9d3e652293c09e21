"""Draft: the mutable canonical graph the frontend passes rewrite before it is frozen into a Graph."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

import numpy as np

from tpuflow.frontend.graph import Graph, OpNode, TensorInfo


def make_node(name: str, op_type: str, inputs, outputs, attrs: dict[str, Any] | None = None) -> OpNode:
    return OpNode(name, str(op_type), tuple(inputs), tuple(outputs), MappingProxyType(dict(attrs or {})))


@dataclass
class Draft:
    name: str
    nodes: list[OpNode] = field(default_factory=list)
    tensors: dict[str, TensorInfo] = field(default_factory=dict)
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    _names: set[str] = field(default_factory=set)
    _node_names: set[str] = field(default_factory=set)

    # ---- naming
    def fresh(self, base: str) -> str:
        """A tensor or node name not used yet, derived from `base`."""
        name, k = base, 1
        while name in self._names or name in self.tensors:
            name, k = f"{base}_{k}", k + 1
        self._names.add(name)
        return name

    def claim(self, name: str) -> None:
        self._names.add(name)

    def node_name(self, base: str) -> str:
        """Reserve and return a node name derived from `base` (suffixed when taken)."""
        name, k = base, 1
        while name in self._node_names:
            name, k = f"{base}_{k}", k + 1
        self._node_names.add(name)
        return name

    def add_node(self, base: str, op_type: str, inputs, outputs, attrs: dict[str, Any] | None = None) -> OpNode:
        """Append a node named `base` (suffixed when taken)."""
        node = make_node(self.node_name(base), op_type, inputs, outputs, attrs)
        self.nodes.append(node)
        return node

    # ---- tensors
    def add_const(self, base: str, value: np.ndarray) -> str:
        name = self.fresh(base)
        value = np.asarray(value)
        self.tensors[name] = TensorInfo(name, tuple(value.shape), value.dtype.name, value)
        return name

    def add_tensor(self, base: str, shape: tuple[int, ...], dtype: str) -> str:
        name = self.fresh(base)
        self.tensors[name] = TensorInfo(name, tuple(int(d) for d in shape), dtype)
        return name

    def const(self, name: str) -> np.ndarray | None:
        info = self.tensors.get(name)
        return None if info is None else info.const

    # ---- structure
    def consumers(self, tensor: str) -> list[OpNode]:
        return [n for n in self.nodes if tensor in n.inputs]

    def producer(self, tensor: str) -> OpNode | None:
        for n in self.nodes:
            if tensor in n.outputs:
                return n
        return None

    def replace_node(self, old: OpNode, new: OpNode) -> None:
        self.nodes[self.nodes.index(old)] = new

    def prune(self) -> None:
        """Drop nodes whose outputs nobody uses, then tensors nobody references."""
        changed = True
        while changed:
            used = {t for n in self.nodes for t in n.inputs} | set(self.outputs)
            keep = [n for n in self.nodes if any(t in used for t in n.outputs)]
            changed = len(keep) != len(self.nodes)
            self.nodes = keep
        live = {t for n in self.nodes for t in (*n.inputs, *n.outputs)} | set(self.inputs) | set(self.outputs)
        self.tensors = {k: v for k, v in self.tensors.items() if k in live}

    def to_graph(self, model: Any, opset: int) -> Graph:
        return Graph(self.name, list(self.nodes), dict(self.tensors), self.inputs, self.outputs, model, opset)


def rename_tensors(draft: Draft, mapping: dict[str, str]) -> None:
    """Rewrite every reference to a tensor name through `mapping` (nodes, tensors, outputs)."""
    if not mapping:
        return
    def m(t: str) -> str:
        return mapping.get(t, t) if t else t
    draft.nodes = [replace(n, inputs=tuple(m(t) for t in n.inputs), outputs=tuple(m(t) for t in n.outputs))
                   for n in draft.nodes]
    tensors = {}
    for name, info in draft.tensors.items():
        new = m(name)
        if new in tensors and new != name:
            continue
        tensors[new] = info if new == name else replace(info, name=new)
    draft.tensors = tensors
    draft.outputs = [m(t) for t in draft.outputs]
