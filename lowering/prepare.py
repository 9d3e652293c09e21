"""Graph preparation before fusion: elementwise operands whose broadcast fits no rows x cols view
are materialised at full shape (constants expanded at compile time, runtime tensors by an Expand
node that the movement emitter lowers to a stride-0 DMA)."""

from __future__ import annotations

import numpy as np

from tpuflow.frontend.graph import Graph, OpNode, TensorInfo
from tpuflow.lowering.ewise import ELEMENTWISE, Kind, classify


def _fits_some_view(graph: Graph, node: OpNode) -> bool:
    out = graph.tensor(node.outputs[0]).shape
    for split in range(len(out) + 1):
        kinds = [classify(graph.tensor(t).shape, out, split) for t in node.inputs if t]
        if all(k is not None for k in kinds):
            return True
    return False


def materialize_broadcasts(graph: Graph) -> Graph:
    """The graph with every elementwise node row-wise representable (or the graph itself)."""
    nodes, tensors, changed = [], dict(graph.tensors), False
    for node in graph.nodes():
        if node.op_type not in ELEMENTWISE or _fits_some_view(graph, node):
            nodes.append(node)
            continue
        changed = True
        out_shape = graph.tensor(node.outputs[0]).shape
        inputs = []
        for t in node.inputs:
            info = graph.tensor(t) if t else None
            if info is None or tuple(info.shape) == tuple(out_shape) or classify(info.shape, out_shape, 0) is Kind.SCALAR:
                inputs.append(t)
                continue
            name = f"{t}__expanded_for_{node.name}"
            if info.is_const:
                full = np.ascontiguousarray(np.broadcast_to(info.const, out_shape))
                tensors[name] = TensorInfo(name, tuple(out_shape), info.dtype, full)
            else:
                tensors[name] = TensorInfo(name, tuple(out_shape), info.dtype)
                nodes.append(OpNode(f"{node.name}/expand_{len(inputs)}", "Expand", (t,), (name,)))
            inputs.append(name)
        nodes.append(OpNode(node.name, node.op_type, tuple(inputs), node.outputs, node.attrs))
    if not changed:
        return graph
    return Graph(graph.name, nodes, tensors, graph.inputs, graph.outputs, graph.model, graph.opset)
