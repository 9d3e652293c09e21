"""Graph preparation before fusion: duplicate nodes merged, scalar scales folded into row reductions,
Transposes folded into MatMuls, and elementwise operands whose broadcast fits no rows x cols view
materialised at full shape (constants expanded at compile time, runtime tensors by an Expand node
that the movement emitter lowers to a stride-0 DMA)."""

from __future__ import annotations

from dataclasses import replace

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


def _with_nodes(graph: Graph, nodes: list[OpNode], tensors: dict | None = None) -> Graph:
    """`graph` rewritten to `nodes` (and `tensors`, else its own), with its inputs and outputs."""
    tensors = dict(graph.tensors) if tensors is None else tensors
    return Graph(graph.name, nodes, tensors, graph.inputs, graph.outputs, graph.model, graph.opset)


def merge_duplicates(graph: Graph) -> Graph:
    """The graph with every node that computes what an earlier node computes (same kind, same runtime
    inputs, constants of equal value, equal attributes, outputs of equal shape, dtype and Quant)
    removed and its readers reading the earlier node's outputs (a quantizer's one QuantizeLinear per
    reader of a tensor, each after its own Reshape: one load and one requantisation instead of
    several). A node making a graph output stays."""
    rename: dict[str, str] = {}
    seen: dict[tuple, OpNode] = {}
    nodes: list[OpNode] = []
    for node in graph.nodes():
        node = replace(node, inputs=tuple(rename.get(t, t) for t in node.inputs))
        key = _computation(graph, node)
        first = seen.get(key)
        if first is not None and not set(node.outputs) & set(graph.outputs):
            rename.update((t, u) for t, u in zip(node.outputs, first.outputs) if t)
            continue
        seen.setdefault(key, node)
        nodes.append(node)
    if not rename:
        return graph
    tensors = {name: info for name, info in graph.tensors.items() if name not in rename}
    return _with_nodes(graph, nodes, tensors)


def _computation(graph: Graph, node: OpNode) -> tuple:
    """What a node computes, as a hashable key (constants by value)."""
    def operand(t: str):
        info = graph.tensor(t) if t else None
        if info is None or not info.is_const:
            return ("runtime", t)
        return ("const", info.shape, info.dtype, np.ascontiguousarray(info.const).tobytes(), info.quant)
    outputs = tuple((info.shape, info.dtype, info.quant) for info in (graph.tensor(t) for t in node.outputs if t))
    return (node.op_type, tuple(operand(t) for t in node.inputs), _frozen(node.attrs), outputs,
            tuple(bool(t) for t in node.outputs))


def _frozen(value):
    """An attribute value (dicts, sequences, arrays, scalars) as a hashable equal-by-value key."""
    if hasattr(value, "items"):
        return tuple(sorted((k, _frozen(v)) for k, v in value.items()))
    if isinstance(value, np.ndarray):
        return ("array", value.shape, value.dtype.str, value.tobytes())
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    return value


def fold_reduction_scales(graph: Graph) -> Graph:
    """A ReduceSum / ReduceMean whose only reader multiplies (or divides) it by a scalar constant takes
    that scale (attr "scale", lowering.ewise.apply_row_reduce) and writes the reader's output: the
    row is summed and scaled in fp32 before it is stored at the program's float type, so a layer
    norm written as a sum of squares over the count (magika's: 1.02e5 before the division) does not
    overflow fp16 in between."""
    drop, rewrite = set(), {}
    for node in graph.nodes():
        if node.op_type not in ("ReduceSum", "ReduceMean") or node.outputs[0] in graph.outputs:
            continue
        readers = graph.consumers(node.outputs[0])
        scale = _scalar_scale(graph, readers[0], node.outputs[0]) if len(readers) == 1 else None
        if scale is None or graph.tensor(node.outputs[0]).quant is not None:
            continue
        attrs = dict(node.attrs, scale=float(node.attr("scale", 1.0)) * scale)
        rewrite[node.name] = OpNode(node.name, node.op_type, node.inputs, readers[0].outputs, attrs)
        drop.add(readers[0].name)
    if not rewrite:
        return graph
    nodes = [rewrite.get(n.name, n) for n in graph.nodes() if n.name not in drop]
    return _with_nodes(graph, nodes)


def _scalar_scale(graph: Graph, reader: OpNode, value: str) -> float | None:
    """c when `reader` is value * c, c * value or value / c with c a float scalar constant, else None."""
    if reader.op_type not in ("Mul", "Div") or len(reader.inputs) != 2 or reader.inputs.count(value) != 1:
        return None
    other = reader.inputs[1] if reader.inputs[0] == value else reader.inputs[0]
    info = graph.tensor(other)
    if not info.is_const or info.quant is not None or np.size(info.const) != 1 or \
            graph.tensor(reader.outputs[0]).shape != graph.tensor(value).shape:
        return None
    c = float(np.asarray(info.const).reshape(-1)[0])
    if reader.op_type == "Div":
        return 1.0 / c if reader.inputs[1] == other and c != 0 else None
    return c


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
    return _with_nodes(graph, nodes)


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
    return _with_nodes(graph, nodes, tensors)
