"""Canonical Graph -> ONNX (opset 18), so onnxruntime can run exactly what the lowering receives.

A quantized graph (frontend/quant.py) is exported in QDQ form: an op on quantized tensors becomes
DequantizeLinear of each quantized input -> the float op -> QuantizeLinear of its output; an int32
runtime tensor (a product's accumulator, an integer product's result) is exported as the float
tensor of its real values."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from dataclasses import replace

from tpuflow.frontend.graph import Graph, OpNode, TensorInfo
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
        self.real: dict[str, TensorInfo] = {}        # float stand-ins of quantized tensors

    def tensor(self, name: str) -> TensorInfo:
        return self.real[name] if name in self.real else self.graph.tensor(name)

    def is_real(self, name: str) -> bool:
        """An int32 runtime tensor, exported as its real values."""
        t = self.graph.tensor(name)
        return t.quant is not None and t.dtype == "int32" and not t.is_const

    def const(self, node: OpNode, tag: str, value) -> str:
        name = f"{node.name}/export_{tag}"
        self.extra.append(numpy_helper.from_array(np.require(value, requirements="C"), name))
        return name

    def add(self, op: str, node: OpNode, inputs, **attrs) -> None:
        self.nodes.append(helper.make_node(op, list(inputs), list(node.outputs), name=node.name, **attrs))

    def quant_params(self, node: OpNode, t: TensorInfo, float_dtype: str) -> tuple[list[str], dict]:
        """Scale (in the float side's dtype, as ONNX requires) and zero point constants, and the axis."""
        q = t.quant
        inputs = [self.const(node, f"{t.name}_scale", q.scale.astype(float_dtype)),
                  self.const(node, f"{t.name}_zero_point", q.zero_point)]
        return inputs, ({"axis": q.axis} if q.per_channel else {})

    def convert(self, op: str, node: OpNode, x: str, t: TensorInfo, out: str, name: str) -> None:
        """QuantizeLinear / DequantizeLinear `x` -> `out`, `t` the integer side."""
        float_side = x if op == "QuantizeLinear" else out
        known = float_side in self.real or float_side in self.graph.tensors
        params, attrs = self.quant_params(node, t, self.tensor(float_side).dtype if known else "float32")
        self.nodes.append(helper.make_node(op, [x, *params], [out], name=name, **attrs))

    def quantized(self, n: OpNode) -> bool:
        """Export `n` in QDQ form when it touches quantized tensors; False when it does not."""
        tensors = [self.graph.tensor(t) for t in (*n.inputs, *n.outputs)]
        if all(t.quant is None for t in tensors):
            return False
        if n.op_type in (K.QUANTIZE, K.DEQUANTIZE):
            side = self.graph.tensor(n.outputs[0] if n.op_type == K.QUANTIZE else n.inputs[0])
            if self.is_real(side.name):
                self.nodes.append(helper.make_node("Identity", list(n.inputs), list(n.outputs), name=n.name))
            else:
                self.convert(n.op_type, n, n.inputs[0], side, n.outputs[0], n.name)
            return True
        inputs = []
        for i, name in enumerate(n.inputs):
            t = self.graph.tensor(name)
            if t.quant is None or self.is_real(name):
                inputs.append(name)
                continue
            real = f"{n.name}/export_real{i}"
            self.convert("DequantizeLinear", n, name, t, real, f"{real}/dequantize")
            self.real[real] = TensorInfo(real, t.shape, "float32")
            inputs.append(real)
        out = self.graph.tensor(n.outputs[0])
        needs_q = out.quant is not None and not self.is_real(out.name)
        result = f"{n.name}/export_float" if needs_q else out.name
        self.real[result] = TensorInfo(result, out.shape, "float32")
        self.float_node(replace(n, inputs=tuple(inputs), outputs=(result,)))
        if needs_q:
            self.convert("QuantizeLinear", n, result, out, out.name, f"{n.name}/export_quantize")
        return True

    def node(self, n: OpNode) -> None:
        if n.op_type == K.LOOKUP_TABLE:
            self.lookup_table(n)
        elif not self.quantized(n):
            self.float_node(n)

    def lookup_table(self, n: OpNode) -> None:
        """y = table[x's stored byte] as a Gather on the codes: the table reordered by code, indexed by
        int32(x) - the storage's lowest code."""
        x, table = self.graph.tensor(n.inputs[0]), self.graph.tensor(n.inputs[1])
        low = int(np.iinfo(np.dtype(x.dtype)).min)
        by_code = table.const[np.arange(low, low + table.const.size).astype(x.dtype).view(np.uint8)]
        wide, index = f"{n.name}/export_codes", f"{n.name}/export_index"
        self.nodes.append(helper.make_node("Cast", [x.name], [wide], name=wide, to=onnx.TensorProto.INT32))
        self.nodes.append(helper.make_node("Sub", [wide, self.const(n, "low", np.asarray(low, np.int32))], [index],
                                           name=index))
        self.add("Gather", n, [self.const(n, "table", by_code), index], axis=0)

    def float_node(self, n: OpNode) -> None:
        k, a = OpKind(n.op_type), n.attrs
        if spec(k).export_same:
            self.add(k.value, n, n.inputs, **{x: _plain(a[x]) for x in spec(k).attrs})
        elif k == K.CLIP:
            dtype = self.tensor(n.inputs[0]).dtype
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
            dtype = self.tensor(n.inputs[0]).dtype
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
        floor, _ = pool_output_choices(n, self.tensor(n.inputs[0]).shape)
        attrs = dict(kernel_shape=list(a["kernel_shape"]), strides=list(a["strides"]), pads=list(a["pads"]),
                     ceil_mode=int(self.tensor(n.outputs[0]).shape != floor))
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
