"""Importers of elementwise ops: unary / binary math, activations, Clip, Cast, Sum, Where."""

from __future__ import annotations

import numpy as np
from onnx import helper

from tpuflow.frontend.onnx_view import ONode
from tpuflow.frontend.ops import SPECS, OpKind
from tpuflow.frontend.registry import importer

K = OpKind
PLAIN = {k.value: k for k, s in SPECS.items() if s.import_same and not s.kernel}   # 1:1, no attributes


@importer(*PLAIN)
def plain(node: ONode, ctx) -> None:
    ctx.emit(PLAIN[node.op_type], node.inputs, node.outputs)


@importer("LeakyRelu")
def leaky_relu(node: ONode, ctx) -> None:
    ctx.emit(K.LEAKY_RELU, node.inputs, node.outputs, alpha=float(node.attr("alpha", 0.01)))


@importer("HardSigmoid")
def hard_sigmoid(node: ONode, ctx) -> None:
    ctx.emit(K.HARD_SIGMOID, node.inputs, node.outputs, alpha=float(node.attr("alpha", 0.2)),
             beta=float(node.attr("beta", 0.5)))


@importer("Clip", const_inputs=((1, "min"), (2, "max")))
def clip(node: ONode, ctx) -> None:
    """Bounds are attributes before opset 11 and constant inputs after; missing bounds are infinite."""
    if ctx.opset < 11:
        low, high = node.attr("min", -np.inf), node.attr("max", np.inf)
    else:
        lo, hi = ctx.const(node.input(1)), ctx.const(node.input(2))
        low = -np.inf if lo is None else lo.item()
        high = np.inf if hi is None else hi.item()
    ctx.emit(K.CLIP, node.inputs[:1], node.outputs, min=float(low), max=float(high))


@importer("Cast")
def cast(node: ONode, ctx) -> None:
    target = np.dtype(helper.tensor_dtype_to_np_dtype(int(node.attr("to")))).name
    x = node.input(0)
    if ctx.dtype(x) == target:
        ctx.alias(x, node.outputs[0])
        return
    ctx.emit(K.CAST, (x,), node.outputs, to=target)


@importer("Sum")
def sum_(node: ONode, ctx) -> None:
    """Sum(a, b, c, ...) -> Add(Add(a, b), c) ...; a one-input Sum is its input."""
    terms, y = list(node.inputs), node.outputs[0]
    if len(terms) == 1:
        ctx.alias(terms[0], y)
        return
    current = terms[0]
    for i, term in enumerate(terms[1:], start=1):
        last = i == len(terms) - 1
        out = y if last else ctx.temp(f"partial{i}", np.broadcast_shapes(ctx.shape(current), ctx.shape(term)),
                                      ctx.dtype(y))
        ctx.emit(K.ADD, (current, term), (out,), suffix=None if i == 1 else f"add{i}")
        current = out


@importer("Where", const_inputs=((0, "condition"),))
def where(node: ONode, ctx) -> None:
    ctx.emit(K.WHERE, node.inputs, node.outputs)
