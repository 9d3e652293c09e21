"""Softmax and LogSoftmax over rows too long for one lane (a vocabulary-sized softmax, very long
attention rows): when their row group fits no LMEM region, each is rewritten into pieces that run
in column chunks: m = ReduceMax(x), e = Exp(x - m), s = ReduceSum(e), then e / s (or
(x - m) - Log(s)). The row is read three times instead of once, so this applies only where the
whole-row form cannot run at all."""

from __future__ import annotations

from types import MappingProxyType

from tpuflow.frontend.graph import Graph, OpNode, TensorInfo

SPLITTABLE = ("Softmax", "LogSoftmax")


def split_long_rows(graph: Graph, names) -> Graph | None:
    """The graph with the Softmax / LogSoftmax nodes among `names` (a group that fits no region)
    decomposed, or None when there is none to decompose."""
    targets = {n for n in names if graph.node(n).op_type in SPLITTABLE} if names else set()
    if not targets:
        return None
    tensors = dict(graph.tensors)
    nodes = []
    for node in graph.nodes():
        nodes.extend(_decomposed(node, tensors) if node.name in targets else [node])
    return Graph(graph.name, nodes, tensors, graph.inputs, graph.outputs, graph.model, graph.opset)


def _decomposed(node: OpNode, tensors: dict[str, TensorInfo]) -> list[OpNode]:
    x, y = node.inputs[0], node.outputs[0]
    info = tensors[x]
    last = len(info.shape) - 1
    row = info.shape[:-1] + (1,)

    def tensor(suffix: str, shape) -> str:
        name = f"{y}/{suffix}"
        tensors[name] = TensorInfo(name, tuple(shape), info.dtype)
        return name

    def op(suffix: str, kind: str, inputs, out: str, **attrs) -> OpNode:
        return OpNode(f"{node.name}/{suffix}", kind, tuple(inputs), (out,), MappingProxyType(attrs))

    peak, shifted = tensor("max", row), tensor("shifted", info.shape)
    total = tensor("sum", row)
    out = [op("max", "ReduceMax", [x], peak, axes=(last,), keepdims=True),
           op("shift", "Sub", [x, peak], shifted)]
    if node.op_type == "Softmax":
        exp = tensor("exp", info.shape)
        return out + [op("exp", "Exp", [shifted], exp), op("sum", "ReduceSum", [exp], total, axes=(last,), keepdims=True),
                      op("normalize", "Div", [exp, total], y)]
    exp, log = tensor("exp", info.shape), tensor("log", row)
    return out + [op("exp", "Exp", [shifted], exp), op("sum", "ReduceSum", [exp], total, axes=(last,), keepdims=True),
                  op("log", "Log", [total], log), op("normalize", "Sub", [shifted, log], y)]
