"""QOperator models in QDQ form: every QLinear* / *Integer operator of the view is rewritten, before the
legality check, into DequantizeLinear per quantized input -> the float op -> QuantizeLinear, the
form onnxruntime's QDQ format writes, so both formats reach one canonical graph (frontend/imp_quant.py).

Covered (ai.onnx): QLinearConv, QLinearMatMul, MatMulInteger, ConvInteger; (com.microsoft):
QLinearAdd, QLinearMul, QLinearGlobalAveragePool, QLinearAveragePool, QLinearConcat, QGemm,
QLinearSoftmax, QLinearSigmoid, QLinearLeakyRelu. MatMulInteger / ConvInteger dequantize with scale
1 (their inputs' zero points), compute in float (exact: integer values) and Cast to int32, which the
canonical pass turns into an int32 result. Anything else stays as it is (and is reported by the
legality check if nothing imports it; DynamicQuantizeLinear is rejected there with its reason).
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from tpuflow.errors import ModelError
from tpuflow.frontend.onnx_view import ONode, OnnxView
from tpuflow.frontend.reader import parse_attrs

MS = "com.microsoft"


class _Rewriter:
    """Emits the replacement ONNX nodes of one QOperator node."""

    def __init__(self, view: OnnxView, node: ONode):
        self.view, self.node, self.out = view, node, []

    def name(self, tag: str) -> str:
        return f"{self.node.name}/{tag}"

    def add(self, op: str, inputs, outputs, tag: str | None = None, **attrs) -> None:
        proto = helper.make_node(op, list(inputs), list(outputs), name=self.name(tag) if tag else self.node.name,
                                 **attrs)
        self.out.append(ONode(proto.name, op, "", tuple(proto.input), tuple(proto.output), parse_attrs(proto), proto))

    def dq(self, x: str, scale: str, zp: str, tag: str, axis: int | None = None) -> str:
        y = self.name(f"{tag}_dequantized")
        self.add("DequantizeLinear", [x, scale, zp] if zp else [x, scale], [y], f"dequantize_{tag}",
                 **({} if axis is None else {"axis": axis}))
        return y

    def q(self, f: str, scale: str, zp: str, y: str) -> None:
        self.add("QuantizeLinear", [f, scale, zp] if zp else [f, scale], [y], "quantize")

    def float_out(self) -> str:
        return self.name("float")

    def ones_like(self, zp: str, tag: str) -> str:
        """A float32 constant of ones shaped like zero point `zp` (scale 1: integer real values);
        scalar when `zp` is absent or not an initializer (a runtime zero point is rejected later)."""
        name = self.name(f"{tag}_unit_scale")
        dims = list(self.view.initializers[zp].dims) if zp in self.view.initializers else []
        value = numpy_helper.from_array(np.ones(dims, np.float32), name)
        self.add("Constant", [], [name], f"{tag}_unit_scale", value=value)
        return name


def _conv(rw: _Rewriter) -> None:
    n = rw.node
    x, xs, xz, w, ws, wz, ys, yz = (n.input(i) for i in range(8))
    xf = rw.dq(x, xs, xz, "x")
    wf = rw.dq(w, ws, wz, "w", axis=0)
    inputs = [xf, wf]
    if n.input(8):
        bias_scale = rw.name("bias_scale")
        rw.add("Mul", [xs, ws], [bias_scale], "bias_scale")
        inputs.append(rw.dq(n.input(8), bias_scale, "", "bias", axis=0))
    rw.add("Conv", inputs, [rw.float_out()], **n.attrs)
    rw.q(rw.float_out(), ys, yz, n.outputs[0])


def _matmul(rw: _Rewriter) -> None:
    n = rw.node
    a, as_, az, b, bs, bz, ys, yz = (n.input(i) for i in range(8))
    rw.add("MatMul", [rw.dq(a, as_, az, "a"), rw.dq(b, bs, bz, "b", axis=-1)], [rw.float_out()])
    rw.q(rw.float_out(), ys, yz, n.outputs[0])


def _binary(op: str):
    def rewrite(rw: _Rewriter) -> None:
        n = rw.node
        a, as_, az, b, bs, bz, ys, yz = (n.input(i) for i in range(8))
        rw.add(op, [rw.dq(a, as_, az, "a"), rw.dq(b, bs, bz, "b")], [rw.float_out()])
        rw.q(rw.float_out(), ys, yz, n.outputs[0])
    return rewrite


def _unary(op: str, drop: tuple[str, ...] = ()):
    """(X, x_scale, x_zp, y_scale, y_zp) ops, NCHW only; `drop` lists contrib-only attributes."""
    def rewrite(rw: _Rewriter) -> None:
        n = rw.node
        if n.attr("channels_last", 0):
            raise ModelError(f"{rw.view.label}: node '{n.name}' ({n.op_type}): channels_last=1 is not supported")
        attrs = {k: v for k, v in n.attrs.items() if k not in drop + ("channels_last",)}
        rw.add(op, [rw.dq(n.input(0), n.input(1), n.input(2), "x")], [rw.float_out()], **attrs)
        rw.q(rw.float_out(), n.input(3), n.input(4), n.outputs[0])
    return rewrite


def _concat(rw: _Rewriter) -> None:
    n = rw.node
    ys, yz, rest = n.input(0), n.input(1), n.inputs[2:]
    parts = [rw.dq(rest[i], rest[i + 1], rest[i + 2], f"x{i // 3}") for i in range(0, len(rest), 3)]
    rw.add("Concat", parts, [rw.float_out()], axis=n.attr("axis"))
    rw.q(rw.float_out(), ys, yz, n.outputs[0])


def _gemm(rw: _Rewriter) -> None:
    n = rw.node
    a, as_, az, b, bs, bz, c, ys, yz = (n.input(i) for i in range(9))
    trans_b = int(n.attr("transB", 0))
    inputs = [rw.dq(a, as_, az, "a"), rw.dq(b, bs, bz, "b", axis=0 if trans_b else 1)]
    if c:
        bias_scale = rw.name("bias_scale")
        rw.add("Mul", [as_, bs], [bias_scale], "bias_scale")
        inputs.append(rw.dq(c, bias_scale, "", "bias", axis=0))
    attrs = {k: v for k, v in n.attrs.items() if k in ("alpha", "transA", "transB")}
    rw.add("Gemm", inputs, [rw.float_out() if ys else n.outputs[0]], **attrs)
    if ys:
        rw.q(rw.float_out(), ys, yz, n.outputs[0])


def _integer(op: str, weight_axis: int):
    """MatMulInteger / ConvInteger (A, B, a_zp, b_zp): scale-1 dequantization, Cast of the result."""
    def rewrite(rw: _Rewriter) -> None:
        n = rw.node
        a, b, az, bz = (n.input(i) for i in range(4))
        af = rw.dq(a, rw.ones_like(az, "a"), az, "a")
        bf = rw.dq(b, rw.ones_like(bz, "b"), bz, "b", axis=weight_axis)
        attrs = {} if op == "MatMul" else dict(n.attrs)
        rw.add(op, [af, bf], [rw.float_out()], **attrs)
        rw.add("Cast", [rw.float_out()], [n.outputs[0]], "to_int32", to=TensorProto.INT32)
    return rewrite


REWRITES = {
    ("", "QLinearConv"): _conv, ("", "QLinearMatMul"): _matmul,
    ("", "MatMulInteger"): _integer("MatMul", -1), ("", "ConvInteger"): _integer("Conv", 0),
    (MS, "QLinearAdd"): _binary("Add"), (MS, "QLinearMul"): _binary("Mul"),
    (MS, "QLinearGlobalAveragePool"): _unary("GlobalAveragePool"),
    (MS, "QLinearAveragePool"): _unary("AveragePool"),
    (MS, "QLinearSoftmax"): _unary("Softmax", drop=("opset",)),
    (MS, "QLinearSigmoid"): _unary("Sigmoid"), (MS, "QLinearLeakyRelu"): _unary("LeakyRelu"),
    (MS, "QLinearConcat"): _concat, (MS, "QGemm"): _gemm,
}


def to_qdq(view: OnnxView) -> int:
    """Rewrite every QOperator node of `view` in QDQ form (in place); returns how many were rewritten."""
    nodes, count = [], 0
    for node in view.nodes:
        rewrite = REWRITES.get(("" if node.domain == "ai.onnx" else node.domain, node.op_type))
        if rewrite is None:
            nodes.append(node)
            continue
        rw = _Rewriter(view, node)
        rewrite(rw)
        nodes += rw.out
        count += 1
    view.nodes = nodes
    return count
