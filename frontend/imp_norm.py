"""Importers of normalisations and reductions: Softmax, LogSoftmax, LayerNormalization, Reduce*."""

from __future__ import annotations

import math

from tpuflow.frontend.onnx_view import ONode
from tpuflow.frontend.ops import REDUCE as REDUCE_KINDS, OpKind
from tpuflow.frontend.registry import importer, unused_outputs
from tpuflow.frontend.rewrite import Rewriter

K = OpKind
SOFTMAX = {"Softmax": K.SOFTMAX, "LogSoftmax": K.LOG_SOFTMAX}
REDUCE = {k.value: k for k in OpKind if k in REDUCE_KINDS}
AXES_INPUT_SINCE = {"ReduceSum": 13, "ReduceMean": 18, "ReduceMax": 18}


@importer(*SOFTMAX)
def softmax(node: ONode, ctx) -> None:
    """Opset >= 13 normalises along `axis` (default -1). Before 13 the input is coerced to 2-D at
    `axis` (default 1) and normalised along the second dimension: when `axis` is not the last one
    that is Reshape -> Softmax(last) -> Reshape."""
    x, y = node.input(0), node.outputs[0]
    shape, kind = ctx.shape(x), SOFTMAX[node.op_type]
    rank = len(shape)
    axis = int(node.attr("axis", -1 if ctx.opset >= 13 else 1))
    axis = axis + rank if axis < 0 else axis
    if ctx.opset >= 13 or axis == rank - 1:
        Rewriter(ctx).last_axis(kind, x, axis, out=y)
        return
    flat = (math.prod(shape[:axis]), math.prod(shape[axis:]))
    dtype = ctx.dtype(x)
    x2, y2 = ctx.temp("flat_in", flat, dtype), ctx.temp("flat_out", flat, dtype)
    ctx.emit(K.RESHAPE, (x,), (x2,), suffix="flatten", shape=flat, view=True)
    ctx.emit(kind, (x2,), (y2,), axis=1)
    ctx.emit(K.RESHAPE, (y2,), (y,), suffix="unflatten", shape=tuple(shape), view=True)


@importer("LayerNormalization", const_inputs=((1, "scale"), (2, "bias")),
          check=unused_outputs(1, "mean / inv-std outputs used"))
def layer_norm(node: ONode, ctx) -> None:
    x = node.input(0)
    axis = int(node.attr("axis", -1))
    axis = axis + ctx.rank(x) if axis < 0 else axis
    ctx.emit(K.LAYER_NORM, tuple(t for t in node.inputs[:3] if t), node.outputs[:1], axis=axis,
             epsilon=float(node.attr("epsilon", 1e-5)))


def _reduce_axes(node: ONode, ctx) -> list[int] | None:
    if ctx.opset >= AXES_INPUT_SINCE[node.op_type]:
        value = ctx.const(node.input(1))
        return None if value is None else [int(a) for a in value.reshape(-1)]
    axes = node.attr("axes")
    return None if axes is None else [int(a) for a in axes]


@importer(*REDUCE, const_inputs=((1, "axes"),))
def reduce(node: ONode, ctx) -> None:
    """axes as a sorted non-negative tuple (all axes when absent, unless noop_with_empty_axes)."""
    x, y = node.input(0), node.outputs[0]
    rank = ctx.rank(x)
    axes = _reduce_axes(node, ctx)
    if not axes:
        if node.attr("noop_with_empty_axes", 0):
            ctx.alias(x, y)
            return
        axes = list(range(rank))
    axes = tuple(sorted({a + rank if a < 0 else a for a in axes}))
    Rewriter(ctx).reduce(REDUCE[node.op_type], x, axes, bool(node.attr("keepdims", 1)), out=y)
