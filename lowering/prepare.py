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


def fold_matmul_transposes(graph: Graph) -> Graph:
    """MatMul operands produced by a Transpose that nothing else reads are read through the
    permutation instead (attrs a_perm / b_perm): a batch-dim permutation is a strided view, a
    swap of B's last two dims makes B^T rows (mm2.nt / column-major tile loads). Saves the DDR
    round trip of the transposed copy."""
    drop, rewrite = set(), {}
    for node in graph.nodes():
        if node.op_type != "MatMul":
            continue
        attrs = dict(node.attrs)
        inputs = list(node.inputs)
        for i, key in ((0, "a_perm"), (1, "b_perm")):
            producer = graph.producer(inputs[i])
            if producer is None or producer.op_type != "Transpose" or _escapes(graph, producer.outputs[0]):
                continue
            perm = tuple(producer.attr("perm"))
            rank = len(perm)
            if rank < 2 or graph.tensor(producer.inputs[0]).is_const:
                continue
            if perm[-1] != rank - 1 and not (i == 1 and perm[-2] == rank - 1):
                continue
            inputs[i], attrs[key] = producer.inputs[0], perm
            drop.add(producer.name)
        outputs = node.outputs
        consumer = graph.consumers(node.outputs[0])
        if len(consumer) == 1 and consumer[0].op_type == "Transpose" and not _escapes(graph, node.outputs[0]):
            perm = tuple(consumer[0].attr("perm"))
            if len(perm) >= 3 and perm[-1] == len(perm) - 1:       # store straight into the permuted layout
                outputs, attrs["y_perm"] = consumer[0].outputs, perm
                drop.add(consumer[0].name)
        if inputs != list(node.inputs) or outputs != node.outputs:
            rewrite[node.name] = OpNode(node.name, node.op_type, tuple(inputs), tuple(outputs), attrs)
    if not rewrite:
        return graph
    nodes = [rewrite.get(n.name, n) for n in graph.nodes() if n.name not in drop]
    return Graph(graph.name, nodes, dict(graph.tensors), graph.inputs, graph.outputs, graph.model, graph.opset)


def _escapes(graph: Graph, tensor: str) -> bool:
    return tensor in graph.outputs or len(graph.consumers(tensor)) != 1


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
