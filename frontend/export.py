"""Canonical Graph -> ONNX (opset 18), so onnxruntime can run exactly what the lowering receives."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from tpuflow.frontend.graph import Graph, OpNode
from tpuflow.frontend.ops import REDUCE, OpKind, spec
from tpuflow.frontend.shapes import pool_output_choices

EXPORT_OPSET = 18
EXPORT_IR_VERSION = 9
K = OpKind


class _Exporter:
    def __init__(self, graph: Graph):
        self.graph = graph
        self.nodes: list[onnx.NodeProto] = []
        self.extra: list[onnx.TensorProto] = []

    def const(self, node: OpNode, tag: str, value) -> str:
        name = f"{node.name}/export_{tag}"
        self.extra.append(numpy_helper.from_array(np.require(value, requirements="C"), name))
        return name

    def add(self, op: str, node: OpNode, inputs, **attrs) -> None:
        self.nodes.append(helper.make_node(op, list(inputs), list(node.outputs), name=node.name, **attrs))

    def node(self, n: OpNode) -> None:
        k, a = OpKind(n.op_type), n.attrs
        if spec(k).export_same:
            self.add(k.value, n, n.inputs, **{x: _plain(a[x]) for x in spec(k).attrs})
        elif k == K.CLIP:
            dtype = self.graph.tensor(n.inputs[0]).dtype
            self.add("Clip", n, [n.inputs[0], self.const(n, "min", np.asarray(a["min"], dtype)),
                                 self.const(n, "max", np.asarray(a["max"], dtype))])
        elif k == K.CAST:
            self.add("Cast", n, n.inputs, to=helper.np_dtype_to_tensor_dtype(np.dtype(a["to"])))
        elif k in REDUCE:
            self.add(k.value, n, [n.inputs[0], self.const(n, "axes", np.asarray(a["axes"], np.int64))],
                     keepdims=int(a["keepdims"]))
        elif k == K.RESHAPE:
            self.add("Reshape", n, [n.inputs[0], self.const(n, "shape", np.asarray(a["shape"], np.int64))])
        elif k == K.SPLIT:
            self.add("Split", n, [n.inputs[0], self.const(n, "split", np.asarray(a["sizes"], np.int64))],
                     axis=a["axis"])
        elif k == K.SLICE:
            ints = {t: self.const(n, t, np.asarray(a[t], np.int64)) for t in ("starts", "ends", "steps")}
            axes = self.const(n, "axes", np.arange(len(a["starts"]), dtype=np.int64))
            self.add("Slice", n, [n.inputs[0], ints["starts"], ints["ends"], axes, ints["steps"]])
        elif k == K.PAD:
            dtype = self.graph.tensor(n.inputs[0]).dtype
            self.add("Pad", n, [n.inputs[0], self.const(n, "pads", np.asarray(a["pads"], np.int64)),
                                self.const(n, "value", np.asarray(a["value"], dtype))], mode="constant")
        elif k == K.EXPAND:
            self.add("Expand", n, [n.inputs[0], self.const(n, "shape", np.asarray(a["shape"], np.int64))])
        elif spec(k).ceil_mode:
            self.pool(n, k)
        else:
            raise NotImplementedError(f"node '{n.name}': {k} has no ONNX export")

    def pool(self, n: OpNode, k: OpKind) -> None:
        a = n.attrs
        floor, _ = pool_output_choices(n, self.graph.tensor(n.inputs[0]).shape)
        attrs = dict(kernel_shape=list(a["kernel_shape"]), strides=list(a["strides"]), pads=list(a["pads"]),
                     ceil_mode=int(self.graph.tensor(n.outputs[0]).shape != floor))
        if k == K.MAX_POOL:
            attrs["dilations"] = list(a["dilations"])
        else:
            if tuple(a["dilations"]) != (1, 1):
                raise ValueError(f"node '{n.name}': dilated AveragePool needs opset 19")
            attrs["count_include_pad"] = int(a["count_include_pad"])
        self.add(k.value, n, n.inputs, **attrs)


def _plain(v):
    return list(v) if isinstance(v, tuple) else v


def _info(graph: Graph, name: str) -> onnx.ValueInfoProto:
    t = graph.tensor(name)
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(t.dtype)), list(t.shape))


def graph_to_onnx(graph: Graph) -> onnx.ModelProto:
    """An ONNX model computing what the canonical graph computes (same tensor and node names)."""
    ex = _Exporter(graph)
    for n in graph.nodes():
        ex.node(n)
    inits = [numpy_helper.from_array(np.require(t.const, requirements="C"), t.name)
             for t in graph.tensors.values() if t.is_const]
    g = helper.make_graph(ex.nodes, graph.name or "canonical", [_info(graph, i) for i in graph.inputs],
                          [_info(graph, o) for o in graph.outputs], initializer=inits + ex.extra)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", EXPORT_OPSET)],
                             ir_version=EXPORT_IR_VERSION, producer_name="tpuflow")
